"""Checkpoint-style backwards: ``backward()`` inside a Function, and torch's random state.

Place in the pipeline: tracer, called by ``recorder.RecordingMode`` (``backward``) and installed
around each traced phase by ``trace`` (``rng_state_recorded``). Activation checkpointing
(``torch.utils.checkpoint``'s reentrant ``CheckpointFunction``), reversible networks and
model-parallel libraries write a backward that re-runs a computation under
``torch.enable_grad()`` on detached inputs, calls ``torch.autograd.backward(outputs, grads)``
and reads the detached inputs' ``.grad``; many save ``torch.get_rng_state()`` in forward and
put it back in backward (``torch.set_rng_state``, inside ``torch.random.fork_rng``) so the
recomputed dropout draws eager's masks again.

How they are captured:

- ``backward(outputs, grads)`` is recorded as ``torch.autograd.grad(outputs, leaves, grads,
  allow_unused=True)`` over the leaves it reaches, then one ``accumulate_grad`` node that adds
  each gradient into its leaf's ``.grad`` as autograd's ``AccumulateGrad`` does. The graph's
  own ops (the recomputation under ``enable_grad``) make the autograd graph at run time, so the
  bwd graph holds the recomputation and its differentiation; ``.grad`` reads after it are
  ordinary graph reads of the real leaves.
- ``torch.get_rng_state()`` and ``torch.set_rng_state(s)`` (and ``torch.cuda``'s, also as
  ``fork_rng(devices=[0])`` calls them) become graph nodes (the functions themselves), in
  program order: forward reads the generator's state when the capture runs,
  backward puts it back, draws, and ``fork_rng`` restores it, exactly as eager does. While
  tracing, random ops run on fake tensors and never touch the real generator, so nothing is
  set for real.

``rng_state_recorded`` also swaps in ``numpy_bridge.from_numpy`` for ``torch.from_numpy`` (like
the random-state functions, not a torch function a mode sees).

- A leaf from outside that ``backward()`` reaches -- a parameter of the module passed as
  ``run_function``, a closure or global tensor -- is read in the bwd graph as
  ``lifted_from(its input)``: the runtime hands the Function lifted inputs detached (they get
  no gradient from it, as in eager) and tags each copy with the tensor it came from, so the
  recomputation is differentiated with respect to the real leaf and ``accumulate_grad`` writes
  its ``.grad``, as eager's ``AccumulateGrad`` does during the outer backward.

Invariant (unknown means unsafe): ``.grad`` is accumulated only into leaves the traced code
made itself (``x.detach().requires_grad_()``) and into leaf tensors lifted from outside; a
``backward()`` that reaches one of the Function's own tensor inputs (not detached: eager's
reaches through it into the caller's graph) or a non-leaf is refused (MH106).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from ..errors import SideEffectError
from ..spec import EFFECT, LIFTED_FROM
from . import grad_modes, numpy_bridge
from .tensor_state import refuse_inner_function_nodes

__all__ = ["accumulate_grad", "backward", "lifted_from", "rng_state_recorded"]

_state = threading.local()
# The functions as torch defines them (graph nodes call these, never the tracing stand-ins).
_GET = torch.random.get_rng_state
_SET = torch.random.set_rng_state


def accumulate_grad(leaves: Sequence[torch.Tensor], grads: Sequence[torch.Tensor | None],
                    create_graph: bool = False) -> None:
    """Add each gradient into its leaf's ``.grad`` as autograd's ``AccumulateGrad`` does for
    ``backward()`` without ``create_graph``: a leaf without ``.grad`` takes the gradient (a
    detached copy: eager's may be the same storage, never one the user holds elsewhere), one
    with a ``.grad`` has it added in place. With ``create_graph`` (grad mode on, as the engine
    runs it) ``.grad`` keeps the gradient's graph: a copy of it, or ``.grad + g`` out of place."""
    for leaf, g in zip(leaves, grads, strict=True):
        if g is None:
            continue
        if create_graph:
            with torch.enable_grad():
                leaf.grad = g.clone(memory_format=torch.contiguous_format) if leaf.grad is None \
                    else leaf.grad + g
            continue
        with torch.no_grad():
            if leaf.grad is None:
                leaf.grad = g.detach().clone(memory_format=torch.contiguous_format) \
                    if g.layout == torch.strided else g.detach().clone()
            else:
                leaf.grad.add_(g)


def _leaves(outputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The leaves requiring grad that ``outputs``' autograd graph reaches, in the order a
    depth-first walk from the outputs meets them (each once)."""
    found: dict[int, torch.Tensor] = {}
    seen: set[int] = set()
    stack = [t.grad_fn for t in reversed(outputs) if t.grad_fn is not None]
    for t in outputs:
        if t.grad_fn is None and t.requires_grad:
            found.setdefault(id(t), t)
    while stack:
        fn = stack.pop()
        if id(fn) in seen:
            continue
        seen.add(id(fn))
        variable = getattr(fn, "variable", None)
        if issubclass(type(variable), torch.Tensor):
            found.setdefault(id(variable), variable)
        stack.extend(next_fn for next_fn, _ in reversed(fn.next_functions) if next_fn is not None)
    return list(found.values())


def _as_tuple(value: Any) -> tuple[Any, ...]:
    if value is None:
        return ()
    if issubclass(type(value), torch.Tensor):
        return (value,)
    return tuple(value)


def backward(recorder: Any, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
             describe: str, where: str | None, sources: dict[int, Any] | None = None) -> None:
    """Record ``torch.autograd.backward(...)`` or ``tensor.backward(...)`` (``func``) as a grad
    node and an ``accumulate_grad`` node, and do the same to the fake leaves."""
    if func is torch.Tensor.backward:
        names = ("self", "gradient", "retain_graph", "create_graph", "inputs")
        bound = dict(zip(names, args, strict=False), **kwargs)
        outputs = (bound["self"],)
        grads = _as_tuple(bound.get("gradient"))
    else:
        names = ("tensors", "grad_tensors", "retain_graph", "create_graph", "grad_variables", "inputs")
        bound = dict(zip(names, args, strict=False), **kwargs)
        outputs = _as_tuple(bound["tensors"])
        given = bound.get("grad_tensors")
        grads = _as_tuple(bound.get("grad_variables") if given is None else given)
    create_graph = bool(bound.get("create_graph"))
    refuse_inner_function_nodes(outputs, describe, where)
    inputs = _as_tuple(bound.get("inputs"))
    leaves = list(inputs) if inputs else _leaves(outputs)
    for leaf in leaves:
        node = recorder.node_of.get(id(leaf))
        source = (sources or {}).get(id(leaf))
        if node is not None and node.op == "placeholder" and source is not None and source.lifted \
                and leaf.is_leaf and recorder.graph is node.graph:
            _read_as_lifted_from(recorder, leaf, node)
            continue
        if node is None or node.op == "placeholder":
            raise SideEffectError(
                f"{describe} calls backward(), which reaches a tensor of shape "
                f"{list(leaf.shape)} that the Function did not make (one of its own tensor "
                "inputs, not detached, or a tensor from outside that is not a leaf) and "
                "accumulates into its .grad.",
                "minihop accumulates .grad, as eager does, into leaves the traced code made "
                "itself (x.detach().requires_grad_()) and into leaf tensors read from a module, "
                "closure or global (a run_function's parameters); eager's backward() through the "
                "Function's own input reaches the caller's graph, which a capture does not record.",
                "Detach the input inside backward (x.detach().requires_grad_()) and return its "
                "gradient, or run this Function eagerly.", where=where)
    if not leaves:
        return
    grad_kwargs = {"grad_outputs": grads or None, "retain_graph": bound.get("retain_graph"),
                   "allow_unused": True}
    if create_graph:  # the gradients (and so .grad) keep their graph, for a double backward
        grad_kwargs["create_graph"] = True
    result = torch.autograd.grad(outputs, leaves, **grad_kwargs)
    recorder.record(torch.autograd.grad, (outputs, tuple(leaves)), grad_kwargs, result)
    node = recorder.record(accumulate_grad, (tuple(leaves), tuple(result)),
                           {"create_graph": True} if create_graph else {}, None)
    recorder.note_mutation(node, tuple(leaves))
    node.meta[EFFECT] = (f"backward() [{where}]: recomputed: torch.autograd.grad over the graph's "
                         f"own recomputation, then .grad accumulated into its {len(leaves)} leaf "
                         "tensor(s) as eager's AccumulateGrad does")
    accumulate_grad(leaves, result, create_graph)


def lifted_from(value: torch.Tensor) -> torch.Tensor:
    """The tensor a lifted input's detached copy was made from at run time (the runtime
    detaches lifted inputs: the Function gives them no gradient, as eager's does not)."""
    return getattr(value, LIFTED_FROM, value)


def _read_as_lifted_from(recorder: Any, leaf: torch.Tensor, placeholder: Any) -> None:
    """A module's parameter (or a closure tensor) the recomputation reads, reached by
    ``backward()``: eager's recomputation reads the real leaf and accumulates into its
    ``.grad``. Every use of its placeholder in this graph reads ``lifted_from(placeholder)``
    instead (the real tensor; the placeholder holds its detached copy), so the graph's
    recomputation is differentiated with respect to it and ``accumulate_grad`` writes it."""
    graph = placeholder.graph
    first = min(placeholder.users, key=list(graph.nodes).index)
    with graph.inserting_before(first):
        live = graph.call_function(lifted_from, (placeholder,))
    live.meta["val"] = leaf
    placeholder.replace_all_uses_with(live, delete_user_cb=lambda user: user is not live)
    recorder.node_of[id(leaf)] = live


def _get_rng_state() -> torch.Tensor:
    mode = _recording()
    if mode is None:
        return _GET()
    with torch._C.DisableTorchFunction():
        # Outside the recording mode: from_tensor's own tensor calls (``is_quantized``) on the
        # real state would otherwise reach it and lift the trace-time state as an input.
        fake = mode.fake_mode.from_tensor(_GET())
    node = mode.recorder.record(_GET, (), {}, fake)
    node.meta[EFFECT] = "torch.get_rng_state(): replayed: the generator's state is read when the graph runs"
    mode.recorder.note_mutation(node, ())  # kept where it is: a read of changing state
    return fake


def _set_rng_state(new_state: torch.Tensor) -> None:
    mode = _recording()
    if mode is None:
        return _SET(new_state)
    node = mode.recorder.record(_SET, (new_state,), {}, None)
    node.meta[EFFECT] = "torch.set_rng_state(...): replayed: the generator's state is set when the graph runs"
    mode.recorder.note_mutation(node, ())
    return None


# torch.cuda's generator: the same, for Functions written for GPUs (Megatron, checkpoint's
# device states). ``device`` is recorded as passed. Without CUDA, eager's get raises
# (``_lazy_init``) and its set is queued for a CUDA initialisation that never comes: the
# stand-in's get calls torch's own to raise the same error, and the recorded set calls it when
# the graph runs, queueing just as eager does.
_CUDA_GET = torch.cuda.get_rng_state
_CUDA_SET = torch.cuda.set_rng_state


def _cuda_get_rng_state(device: Any = "cuda") -> torch.Tensor:
    mode = _recording()
    if mode is None:
        return _CUDA_GET(device)
    with torch._C.DisableTorchFunction():
        fake = mode.fake_mode.from_tensor(_CUDA_GET(device))
    node = mode.recorder.record(_CUDA_GET, (device,), {}, fake)
    node.meta[EFFECT] = "torch.cuda.get_rng_state(): replayed: the generator's state is read when the graph runs"
    mode.recorder.note_mutation(node, ())
    return fake


def _cuda_set_rng_state(new_state: torch.Tensor, device: Any = "cuda") -> None:
    mode = _recording()
    if mode is None:
        return _CUDA_SET(new_state, device)
    node = mode.recorder.record(_CUDA_SET, (new_state, device), {}, None)
    node.meta[EFFECT] = "torch.cuda.set_rng_state(...): replayed: the generator's state is set when the graph runs"
    mode.recorder.note_mutation(node, ())
    return None


def _recording() -> Any:
    mode = getattr(_state, "mode", None)
    return mode if mode is not None and mode.recorder is not None else None


# (module, name, stand-in): swapped in while any trace runs; each calls torch's own function
# outside a recording. torch.from_numpy is numpy_bridge's (not a torch function a mode sees).
_STAND_INS = [(home, name, stand_in) for home in (torch, torch.random)
              for name, stand_in in (("get_rng_state", _get_rng_state), ("set_rng_state", _set_rng_state))]
_STAND_INS += [(home, name, stand_in) for home in (torch.cuda, torch.cuda.random)
               for name, stand_in in (("get_rng_state", _cuda_get_rng_state),
                                      ("set_rng_state", _cuda_set_rng_state))]
_STAND_INS.append((torch, "from_numpy", numpy_bridge.from_numpy))


def _is_grad_enabled() -> bool:
    # torch.is_grad_enabled() read by backward (grad_modes.read): the real value, checked when
    # the graph runs.
    return grad_modes.read(_recording())


_STAND_INS.append((torch, "is_grad_enabled", _is_grad_enabled))
_lock = threading.Lock()
_users = [0]  # traces (any thread) inside rng_state_recorded: the stand-ins stay while any is
_originals: list[tuple[Any, str, Any]] = []


@contextlib.contextmanager
def rng_state_recorded(mode: Any) -> Iterator[None]:
    """While the user's code runs in ``mode`` (a ``RecordingMode``) in this thread, its reads
    and writes of torch's CPU random state are graph nodes (see the module docstring). The
    stand-ins call torch's own functions in every other thread, and outside a recording."""
    previous = getattr(_state, "mode", None)
    _state.mode = mode
    with _lock:
        if _users[0] == 0:
            for home, name, stand_in in _STAND_INS:
                _originals.append((home, name, getattr(home, name)))
                setattr(home, name, stand_in)
        _users[0] += 1
    try:
        yield
    finally:
        with _lock:
            _users[0] -= 1
            if _users[0] == 0:
                for home, name, fn in reversed(_originals):
                    setattr(home, name, fn)
                _originals.clear()
        _state.mode = previous
