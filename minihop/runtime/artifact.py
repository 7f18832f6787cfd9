"""Capture artifacts: ``Capture.save(path)`` and ``minihop.load(path)``.

Place in the pipeline: runtime. A saved capture runs (and differentiates) without the user's
Function class being importable: it holds the two graphs and everything the runtime needs.

Format ``minihop-capture`` version 1: one file written by ``torch.save`` holding a dict
  ``manifest``  JSON text: format, version, function name, argument names, fwd inputs (name,
                description, path in the arguments, argument index, size dimension), output
                structure, the index lists (``non_differentiable_idx``, ``dirty_idx``,
                ``saved_for_backward_idx``), what the user saved (``ctx_saved``), the number
                and names of saved values, ``top_level``, ``materialize_grads``,
                ``once_differentiable``, shape guards, and a readable copy of the call guards;
  ``fwd``, ``bwd``  the graphs as JSON node lists (name, op, target by qualified name, args
                with node references, and each value's dtype and shape), rebuilt node by node
                on load, so names, grad-mode calls and annotations survive (the body's own
                grad toggles are marked ``grad_toggle``: a loaded backward differentiates
                under ``create_graph=True`` as the capture did);
  ``constants``  tensors the Function reached through closures/globals/modules, as they were
                when saved (a loaded capture uses these values);
  ``key``       the call guard key (pickled), checked by ``cap(*args)`` as before.
Loading runs pickle (``torch.load(weights_only=False)``): load only files you trust.

Not saved: the route to live closure values (a loaded capture uses the saved constants) and
the ability to retrace backward (a backward that needs retracing raises a clear error).
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import pickle
import types
from typing import Any

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.node import _get_qualified_name

from ..errors import GuardMismatchError, UnsupportedOutputError
from ..spec import GRAD_TOGGLE, MISSING, NO_STATE, NO_WORLD, InputSource, Pair, PythonState, Root, StateRead, arg_place
from ..place import Place, walk_plain
from ..structure import Computed
from ..returned import OutputSpec, has_computed
from .guards import library_name

__all__ = ["FORMAT", "SavedCapture", "VERSION", "read_capture", "save_capture"]

FORMAT = "minihop-capture"
VERSION = 1


def _spec_to_json(spec: OutputSpec, name: str) -> dict[str, Any]:
    if spec.kind in ("object", "namedtuple") or spec.template is not None and spec.kind in ("tuple", "list", "dict"):
        raise UnsupportedOutputError(
            f"Cannot save the capture of {name}: its output holds a "
            f"{type(spec.template).__name__} ({spec.kind}).",
            "An artifact must load without the user's classes being importable.",
            "Return tuples, lists or dicts of tensors from forward to save the capture.")
    out: dict[str, Any] = {"kind": spec.kind}
    if spec.kind == "tensor":
        out["index"] = spec.index
    elif spec.kind == "arg":  # the call's own object, found by its path (JSON keys only: object_paths)
        out["path"] = [list(step) for step in spec.value]
    elif spec.kind == "const" and has_computed(spec.value):
        out["computed"] = _computed_to_json(spec.value)
    elif spec.kind == "const":
        json.dumps(spec.value)  # raises for values JSON cannot hold
        out["value"] = spec.value
    else:
        out["children"] = [_spec_to_json(c, name) for c in spec.children]
        if spec.kind == "dict":
            out["keys"] = list(spec.keys)
    return out


def _computed_to_json(value: Any) -> Any:
    """A number computed per call from sizes (``structure.Computed``): its code, in JSON."""
    if issubclass(type(value), Computed):
        return {"code": value.code}
    if issubclass(type(value), (tuple, list)):
        return {"items": [_computed_to_json(v) for v in value], "list": issubclass(type(value), list)}
    json.dumps(value)  # raises for values JSON cannot hold
    return {"value": value}


def _computed_from_json(data: dict[str, Any]) -> Any:
    if "code" in data:
        return Computed(data["code"])
    if "items" in data:
        items = [_computed_from_json(v) for v in data["items"]]
        return items if data["list"] else tuple(items)
    return data["value"]


def _spec_from_json(data: dict[str, Any]) -> OutputSpec:
    kind = data["kind"]
    if kind == "tensor":
        return OutputSpec("tensor", index=data["index"])
    if kind == "arg":
        return OutputSpec("arg", value=tuple(tuple(step) for step in data["path"]))
    if kind == "const" and "computed" in data:
        return OutputSpec("const", value=_computed_from_json(data["computed"]))
    if kind == "const":
        return OutputSpec("const", value=data["value"])
    children = tuple(_spec_from_json(c) for c in data["children"])
    return OutputSpec(kind, keys=tuple(data.get("keys", ())), children=children)


def _source_to_json(source: InputSource) -> dict[str, Any]:
    return {"name": source.name, "description": source.description,
            "path": None if source.path is None else [list(step) for step in source.path],
            "arg_index": source.arg_index, "dim": source.dim}


def save_capture(cap: Any, path: str) -> None:
    """Write ``cap`` (a ``Capture``) to ``path``."""
    pair: Pair = cap.pair
    if pair.outside_writes:
        raise UnsupportedOutputError(
            f"Cannot save the capture of {pair.function_name}: its forward writes outside its "
            f"return value ({pair.outside_writes[0].location.describe(pair.argnames)}).",
            "An artifact holds graphs and plain data; the routes to those places (the caller's "
            "containers, objects and globals) are not stored.",
            "Return such tensors from forward instead, to save the capture.")
    if any(r.kind == "guarded" for r in cap.data_reads):
        raise UnsupportedOutputError(
            f"Cannot save the capture of {pair.function_name}: its forward or backward "
            "branches on (or reads numbers from) the values of its inputs, grads or saved "
            "values, which it guards with small graphs (backward: by tracing it again for "
            "other values).",
            "An artifact holds the pair and plain guards; value guards are not stored, and "
            "a loaded capture without them could give another value's result.",
            "Save a capture whose forward and backward read no values from tensor data.")
    outside = _outside_reads_and_writes(cap)
    if outside:
        raise UnsupportedOutputError(
            f"Cannot save the capture of {pair.function_name}: {outside[0]}"
            + (f" (and {len(outside) - 1} more such)" if len(outside) > 1 else "") + ".",
            "A loaded capture checks only its call's arguments: it has no route to the Python "
            "state the Function reads or writes, so it would run with the values seen when "
            "saving and skip the writes, where the Function itself would not.",
            "Pass such values as arguments (and return what forward writes), to save the capture.")
    if cap.python_state.ctx_state is not None:
        raise UnsupportedOutputError(
            f"Cannot save the capture of {pair.function_name}: its backward writes ctx "
            "(a second backward of a call, retain_graph=True, reads what the first left).",
            "minihop traces backward again for the values left on ctx; a loaded capture "
            "cannot trace, and would run the first backward's bwd again.",
            "Save a capture whose backward does not write ctx.")
    constants = {s.name: (s.place.get(()) if s.fetched else s.constant)
                 for s in pair.inputs if s.path is None}
    manifest = {
        "format": FORMAT, "version": VERSION, "function": pair.function_name,
        "argnames": list(pair.argnames),
        "inputs": [_source_to_json(s) for s in pair.inputs],
        "output": _spec_to_json(pair.output_spec, pair.function_name),
        "top_level": list(pair.top_level),
        "non_differentiable_idx": list(pair.non_differentiable_idx),
        "dirty_idx": list(pair.dirty_idx),
        "saved_for_backward_idx": list(pair.saved_for_backward_idx),
        "ctx_saved": [None if r is None else list(r) for r in pair.ctx_saved],
        "num_saved": pair.num_saved, "saved_names": list(pair.saved_names),
        "materialize_grads": pair.materialize_grads,
        "once_differentiable": pair.once_differentiable,
        "dynamic_dims": {str(k): list(v) for k, v in cap.dynamic_dims.items()},
        "shape_guards": None if cap.shape_guards is None else {
            "arg_indices": list(cap.shape_guards.arg_indices),
            "expression": cap.shape_guards.expression},
        "guards_readable": repr(cap.key),
        "library_reads": [found for found in map(_library_read, cap.python_state.reads) if found is not None],
    }
    try:
        key_bytes = pickle.dumps(cap.key)
        assumptions = pickle.dumps(pair.grad_assumptions)
    except (pickle.PicklingError, AttributeError, TypeError) as e:
        raise UnsupportedOutputError(
            f"Cannot save the capture of {pair.function_name}: its guards hold values that "
            f"cannot be stored ({e}).",
            "An artifact must load without the user's classes being importable.",
            "Pass plain Python values (numbers, strings, tuples) as non-tensor arguments.") from e
    torch.save({"manifest": json.dumps(manifest, indent=1), "fwd": graph_to_json(pair.fwd),
                "bwd": graph_to_json(pair.bwd),
                "constants": constants, "key": key_bytes, "grad_assumptions": assumptions}, path)


def _outside_reads_and_writes(cap: Any) -> list[str]:
    """What ``cap`` read or wrote of Python state outside its arguments, as phrases: the
    assumptions and replays an artifact cannot carry (its guard is the call key alone)."""
    state, argnames = cap.python_state, cap.pair.argnames
    found = [f"its {w.phase} writes {w.place.describe(argnames)}" for w in state.writes]
    found += [f"its {r.phase} reads {r.place.describe(argnames)}" for r in state.reads
              if not _resolved_in_graphs(r.place, argnames) and _library_read(r) is None]
    found += [f"it may serve only the call it was traced for ({why})" for why in state.single_use]
    found += [f"its forward reads the tensor at {s.description}" for s in cap.pair.inputs if s.fetched]
    return found


# What a read may hold and still be carried by an artifact: code its graphs call (resolved
# there to the ops it ran, named by qualified name) rather than a value they hold.
_CODE = (types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType, type)


def _resolved_in_graphs(place: Any, argnames: tuple[str, ...]) -> bool:
    """Whether a read of ``place`` needs no check on a loaded capture: the process group when
    none is initialised (no rank in the graphs), or a module, function or class outside the
    arguments (the graphs hold the ops it resolved to). A value read is not: the graphs would
    keep the one seen when saving."""
    if place.describe(argnames) == NO_WORLD:
        return True
    if place.uses_args:
        return False
    try:
        return issubclass(type(place.get(())), _CODE)
    except Exception:  # gone since the capture: nothing to carry
        return False


# A library's constant its code read (``tracer.library_ran``: ``Distribution._validate_args``,
# ``torch.preserve_format`` in ``torch.autograd``): carried by module and path with its value
# as text, checked when the capture is loaded and guarded as a read from then on.
_CONSTANTS = (bool, int, float, complex, str, bytes, type(None), torch.dtype, torch.memory_format, torch.layout)


def _library_read(r: Any) -> dict[str, Any] | None:
    """``r`` as the manifest carries it, where its place is a library module's global (and
    attributes below it) or a library class's attribute holding a constant; else None."""
    root, steps = r.place.root, r.place.steps
    if any(kind != "attr" for kind, _ in steps):
        return None
    if root.kind == "global" and issubclass(type(root.home), dict):
        module, path = root.home.get("__name__"), [root.key, *(name for _, name in steps)]
    elif root.kind == "value" and issubclass(type(root.home), type) and len(steps) == 1:
        module, path = root.home.__module__, [*root.home.__qualname__.split("."), steps[0][1]]
    else:
        return None
    if not issubclass(type(module), str) or not library_name(module) or "<" in ".".join(map(str, path)):
        return None
    try:
        value = r.place.get(())
    except Exception:
        return None
    if type(value) not in _CONSTANTS:
        return None
    return {"module": module, "path": path, "phase": r.phase, "line": r.line, "value": repr(value)}


def _library_state(entries: list[dict[str, Any]], function: str) -> PythonState:
    """The loaded capture's reads of the library constants it was saved with: each must hold
    the value it held when saved (else the graphs are not this process's), then is guarded."""
    reads = []
    for e in entries:
        module = importlib.import_module(e["module"])
        root = Root("global", e["path"][0], f"{e['module']}:{'.'.join(e['path'])}",
                    lambda args, g=vars(module), k=e["path"][0]: g.get(k, MISSING), home=vars(module))
        steps = tuple(("attr", name) for name in e["path"][1:])
        place = Place(root, steps, lambda args, f=root.fetch, s=steps: walk_plain(f(args), s))
        now = place.get(())
        if repr(now) != e["value"] or type(now) not in _CONSTANTS:
            raise GuardMismatchError(
                f"Capture of {function}, loaded: {root.description} was {e['value']} when it was saved, "
                f"it is {now!r} here.", "What the library's code computed with it is baked into the graphs.",
                "Set it as it was, or capture the Function again in this process.")
        reads.append(StateRead(place, e["phase"], e["line"]))
    return PythonState(reads=tuple(reads))


def _qualified_name(target: Any) -> str:
    name = _get_qualified_name(target)
    if _resolve(name) is not target:
        raise UnsupportedOutputError(
            f"Cannot save a graph that calls {target!r}: it cannot be found again by name.",
            "Artifacts name the functions their graphs call, to load without pickled code.",
            "Use torch operations (or register a custom op) in forward/backward.")
    return name


def _resolve(qualified: str) -> Any:
    """``torch._C._nn.linear`` -> the object: the longest importable prefix, then attributes."""
    parts = qualified.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for part in parts[cut:]:
            obj = getattr(obj, part, None)
            if obj is None:
                break
        else:
            return obj
    return None


def _arg_to_json(arg: Any) -> Any:
    if issubclass(type(arg), fx.Node):
        return {"node": arg.name}
    if issubclass(type(arg), (tuple, list)):
        return {"tuple" if issubclass(type(arg), tuple) else "list": [_arg_to_json(a) for a in arg]}
    if issubclass(type(arg), dict):
        return {"dict": [[k, _arg_to_json(v)] for k, v in arg.items()]}
    if issubclass(type(arg), slice):
        return {"slice": [_arg_to_json(arg.start), _arg_to_json(arg.stop), _arg_to_json(arg.step)]}
    if issubclass(type(arg), torch.dtype):
        return {"dtype": str(arg).removeprefix("torch.")}
    if issubclass(type(arg), torch.device):
        return {"device": str(arg)}
    if issubclass(type(arg), (torch.memory_format, torch.layout)):
        return {"torch": str(arg).removeprefix("torch.")}
    if arg is Ellipsis:
        return {"ellipsis": True}
    if arg is None or issubclass(type(arg), (bool, int, float, str)):
        return arg
    raise UnsupportedOutputError(
        f"Cannot save a graph argument of type {type(arg).__name__} ({arg!r}).",
        "Artifacts store graph constants as plain data.",
        "Keep graph constants to numbers, strings, dtypes, devices and slices.")


def _arg_from_json(data: Any, env: dict[str, fx.Node]) -> Any:
    if not issubclass(type(data), dict):
        return data
    kind, value = next(iter(data.items()))
    if kind == "node":
        return env[value]
    if kind in ("tuple", "list"):
        items = [_arg_from_json(v, env) for v in value]
        return tuple(items) if kind == "tuple" else items
    if kind == "dict":
        return {k: _arg_from_json(v, env) for k, v in value}
    if kind == "slice":
        return slice(*(_arg_from_json(v, env) for v in value))
    if kind in ("dtype", "torch"):  # a dtype, memory format or layout
        return getattr(torch, value)
    if kind == "device":
        return torch.device(value)
    return Ellipsis


def graph_to_json(gm: fx.GraphModule) -> list[dict[str, Any]]:
    """The nodes of ``gm`` as plain data (names, ops, targets by name, args, value metadata)."""
    nodes = []
    for node in gm.graph.nodes:
        val = node.meta.get("val")
        meta = None
        if issubclass(type(val), torch.Tensor) and not any(issubclass(type(d), torch.SymInt) for d in val.shape):
            meta = [str(val.dtype).removeprefix("torch."), list(val.shape), str(val.device)]
        nodes.append({"name": node.name, "op": node.op,
                      "target": _qualified_name(node.target) if node.op == "call_function" else node.target,
                      "args": _arg_to_json(node.args), "kwargs": _arg_to_json(node.kwargs), "val": meta,
                      "stack_trace": node.meta.get("stack_trace")})
        if node.meta.get(GRAD_TOGGLE):
            # The body's own grad toggles (not the user's): dropped under create_graph=True.
            nodes[-1]["grad_toggle"] = True
    return nodes


def graph_from_json(nodes: list[dict[str, Any]], class_name: str) -> fx.GraphModule:
    """Rebuild a GraphModule saved by ``graph_to_json`` (metadata as fake tensors, for printing)."""
    graph = fx.Graph()
    env: dict[str, fx.Node] = {}
    fake_mode = FakeTensorMode()
    for data in nodes:
        target = _resolve(data["target"]) if data["op"] == "call_function" else data["target"]
        node = graph.create_node(data["op"], target, _arg_from_json(data["args"], env),
                                 _arg_from_json(data["kwargs"], env), name=data["name"])
        if data["val"] is not None:
            dtype, shape, device = data["val"]
            with fake_mode:
                node.meta["val"] = torch.empty(shape, dtype=getattr(torch, dtype), device=device)
        if data.get("stack_trace"):
            node.meta["stack_trace"] = data["stack_trace"]
        if data.get("grad_toggle"):
            node.meta[GRAD_TOGGLE] = True
        env[data["name"]] = node
    return fx.GraphModule(torch.nn.Module(), graph, class_name=class_name)


@dataclasses.dataclass(frozen=True)
class _ShapeGuards:
    arg_indices: tuple[int, ...]
    expression: str


@dataclasses.dataclass(frozen=True)
class SavedCapture:
    """What a file written by ``save_capture`` holds: the pair and the call guards; the
    pipeline (``pipeline.load``) builds the runnable capture from it."""

    pair: Pair
    key: tuple[Any, ...]
    dynamic_dims: dict[int, tuple[int, ...]]
    shape_guards: _ShapeGuards | None
    python_state: PythonState = NO_STATE


def read_capture(path: str) -> SavedCapture:
    """Read a capture saved by ``Capture.save``."""
    data = torch.load(path, weights_only=False)
    manifest = json.loads(data["manifest"])
    if manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
        raise ValueError(f"{path} is not a {FORMAT} version {VERSION} file "
                         f"(found {manifest.get('format')!r} version {manifest.get('version')!r})")
    constants = data["constants"]
    inputs = tuple(
        InputSource(s["name"], s["description"],
                    None if s["path"] is None else arg_place(tuple(tuple(step) for step in s["path"])),
                    s["arg_index"], constants.get(s["name"]) if s["path"] is None else None,
                    dim=s["dim"])
        for s in manifest["inputs"])
    pair = Pair(
        function_name=manifest["function"], fwd_graph=graph_from_json(data["fwd"], "fwd_body_0").graph,
        bwd_graph=graph_from_json(data["bwd"], "bwd_body_0").graph, inputs=inputs,
        top_level=tuple(manifest["top_level"]),
        non_differentiable_idx=tuple(manifest["non_differentiable_idx"]),
        dirty_idx=tuple(manifest["dirty_idx"]),
        saved_for_backward_idx=tuple(manifest["saved_for_backward_idx"]),
        num_saved=manifest["num_saved"], output_spec=_spec_from_json(manifest["output"]),
        materialize_grads=manifest["materialize_grads"], argnames=tuple(manifest["argnames"]),
        once_differentiable=manifest["once_differentiable"],
        grad_assumptions=pickle.loads(data["grad_assumptions"]),
        saved_names=tuple(manifest["saved_names"]),
        ctx_saved=tuple(None if r is None else (r[0], r[1]) for r in manifest["ctx_saved"]),
    )
    guards = manifest["shape_guards"]
    return SavedCapture(
        pair, _key_of_v1(pickle.loads(data["key"])),
        {int(k): tuple(v) for k, v in manifest["dynamic_dims"].items()},
        None if guards is None else _ShapeGuards(tuple(guards["arg_indices"]), guards["expression"]),
        _library_state(manifest.get("library_reads", []), manifest["function"]))


def _key_of_v1(key: tuple[Any, ...]) -> tuple[Any, ...]:
    """Keys written before the autocast state was part of them: made without autocast; and
    before tensors' Python attributes were: tensors without any."""
    key = key if len(key) > 2 else (*key, None)
    args = tuple((*k, ()) if issubclass(type(k), tuple) and len(k) == 7 and k[0] == "T" else k for k in key[1])
    return (key[0], args, *key[2:])
