"""One assumption record: what a capture assumed, how a call is checked against it, what it says.

Place in the pipeline: runtime. ``capture.make_capture`` turns what the tracer found (the call
key, Python values read outside the arguments, tensors fetched from places, the layout, shape
guards, values taken from tensor data, single-use reasons, what backward reads) into one tuple
of ``Assumption``s. ``Capture.fits`` is compiled from them, ``Capture.__call__`` raises the
first failing one's ``mismatch``, and ``explain`` prints them: nothing is listed that is not
checked, nothing checked is missing.

Invariant: ``fits(args)`` is true exactly when every assumption of phase ``"call"`` or
``"forward"`` holds (``check(args)``). A ``batch`` is one generated function checking several
assumptions at once (the call key, the live values), which ``fits`` calls once in their place:
the hot path stays one compiled ``and`` of a few calls. Assumptions of phase ``"backward"`` are
checked by the runtime when backward runs (``runtime.backwards``: another value takes another
bwd); ``fits`` leaves them out.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable
from typing import Any

import torch

from ..errors import GuardMismatchError, UnsupportedOperationError
from ..spec import MISSING, UNMATCHED, DataRead, Pair, PythonState
from ..structure import argname
from .display import describe_argument, show_key, show_value_key
from .graph_reads import reads_grad_mode
from .fetch import fetcher
from .module_reads import holds_modules, module_assumptions
from .sharing import sharing_of
from .guard_checks import compile_guard, compile_live_check, merge_checks
from .guards import argument_key, autocast_key, describe_autocast, unmet_marks, value_key

__all__ = ["Assumption", "assumptions_of", "backward_values", "compile_fits", "layout_key", "refuse_unlike_grads"]

Args = tuple[Any, ...]
_AGAIN = "Capture again (minihop.apply does this by itself)."


@dataclasses.dataclass(frozen=True, eq=False)
class Assumption:
    """One thing a capture assumed of the calls it serves.

    ``place``: what is read (an argument, a Python place, grad mode, the dynamic sizes, a
    value taken from data); ``phase``: ``"call"`` (a property of the call), ``"forward"``
    (a value forward read, checked before each call) or ``"backward"`` (checked when
    backward runs); ``seen``: its value at capture, as shown; ``check(args) -> bool``: whether
    a call's (bound) arguments meet it (None for a backward assumption checked on backward's
    own grads and saved values); ``description``: the line ``explain`` prints;
    ``line``: the user's source line that read it, if known.
    """

    place: str
    phase: str
    seen: str
    check: Callable[[Args], bool] | None = dataclasses.field(compare=False, repr=False)
    description: str
    line: str | None = None
    # The generated function ``fits`` calls for this assumption and its batch (None: ``check``).
    batch: Callable[[Args], bool] | None = dataclasses.field(default=None, compare=False, repr=False)
    # ``args -> GuardMismatchError``: the error for a call that breaks it.
    explain_failure: Callable[[Args], GuardMismatchError | None] | None = dataclasses.field(
        default=None, compare=False, repr=False)
    # For a value read from a place: how a call's value is fetched (``args -> value``) and its
    # ``value_key`` at capture. The live values' batch compares these; backward compares its
    # own (``runtime.backwards``, from ``backward_values``) when it runs.
    fetch: Callable[[Args], Any] | None = dataclasses.field(default=None, compare=False, repr=False)
    key: Any = dataclasses.field(default=None, compare=False, repr=False)

    def mismatch(self, args: Args) -> GuardMismatchError | None:
        """The error naming this assumption's place, its value at capture and in this call;
        None while it holds (and for a backward assumption, which backward checks)."""
        held = self.check is None or self.phase == "backward" or self.check(args)
        return None if held or self.explain_failure is None else self.explain_failure(args)

    def show(self) -> str:
        """The line ``explain`` prints: description, phase where it is not a call's property,
        source line."""
        late = self.phase == "backward" and "backward" not in self.description
        return self.description + (" (checked when backward runs)" if late else "") + (f"  [{self.line}]" if self.line else "")


def compile_fits(assumptions: tuple[Assumption, ...]) -> Callable[[Args], bool]:
    """``args -> bool``: every call and forward assumption's check (each batch once), generated
    as one ``and`` expression; the one check itself when there is one."""
    oks: list[Callable[[Args], bool]] = []
    for a in assumptions:
        ok = a.batch or a.check
        if a.phase != "backward" and ok is not None and not any(ok is o for o in oks):
            oks.append(ok)
    if len(oks) <= 1:
        return oks[0] if oks else (lambda args: True)
    merged = merge_checks(oks)
    if merged is not None:
        return merged
    names = {f"ok{i}": ok for i, ok in enumerate(oks)}
    return eval(f"lambda args: {' and '.join(f'{n}(args)' for n in names)}", names)  # type: ignore[no-any-return]


def _error(found: str, why: str, fix: str = _AGAIN, where: str | None = None) -> GuardMismatchError:
    return GuardMismatchError(found, why, fix, where=where)


def _key_assumptions(name: str, argnames: tuple[str, ...], key: Args, masks: dict[int, frozenset[str]] | None,
                     dynamic: dict[int, tuple[int, ...]]) -> list[Assumption]:
    """Grad mode, autocast, the default dtype, each argument, their number, Dynamo's marks:
    ``call_key``'s parts, all checked by one generated ``compile_guard``."""
    grad_mode, arg_keys = key[:2]
    autocast = key[2] if len(key) > 2 else None
    dtype = key[3] if len(key) > 3 else torch.float32
    batch = compile_guard(key, masks)
    unlike = f"Capture of {name} called with arguments unlike the captured ones: "
    why = ("A capture is specialised on its arguments' shapes (but for dynamic dimensions), dtypes, "
           "devices, requires_grad, non-tensor values, grad mode, autocast state and default dtype.")
    fix = ("Capture again for these arguments, or use minihop.apply, which captures once per "
           "distinct set of properties.")
    n = len(arg_keys)
    found = [
        Assumption("grad mode", "call", str(grad_mode), lambda args: torch.is_grad_enabled() is grad_mode,
                   f"grad mode enabled == {grad_mode}", batch=batch, explain_failure=lambda args: _error(
                       unlike + f"grad mode: captured with {grad_mode}, called with {torch.is_grad_enabled()}",
                       why, fix)),
        Assumption("autocast", "call", describe_autocast((autocast,)), lambda args: autocast_key() == autocast,
                   f"autocast == {describe_autocast((autocast,))}", batch=batch, explain_failure=lambda args: _error(
                       unlike + f"autocast: captured {describe_autocast((autocast,))}, called "
                       f"{describe_autocast((autocast_key(),))}", why, fix)),
        Assumption("default dtype", "call", str(dtype), lambda args: torch.get_default_dtype() is dtype,
                   f"torch.get_default_dtype() == {dtype}", batch=batch, explain_failure=lambda args: _error(
                       unlike + f"default dtype: captured with {dtype}, called with {torch.get_default_dtype()}",
                       why, fix))]
    for i, k in enumerate(arg_keys):
        place = argname(i, argnames)
        masked = (masks or {}).get(i)
        left_out = (f"; attributes {', '.join(sorted(masked))} left out (counters the Function itself "
                    "changes)") if masked else ""

        def check(args: Args, i: int = i, k: Any = k) -> bool:
            return len(args) > i and argument_key(args[i], i, dynamic, masks) == k

        def failure(args: Args, i: int = i, k: Any = k) -> GuardMismatchError:
            new = argument_key(args[i], i, dynamic, masks) if len(args) > i else value_key(MISSING)
            return _error(unlike + describe_argument(i, k, new, argnames), why, fix)

        found.append(Assumption(place, "call", show_key(k), check, f"{place}: {show_key(k)}{left_out}",
                                batch=batch, explain_failure=failure))
    found.append(Assumption("number of arguments", "call", str(n), lambda args: len(args) == n,
                            f"number of arguments == {n}", batch=batch, explain_failure=lambda args: _error(
                                unlike + f"number of arguments: captured {n}, called with {len(args)}",
                                why, fix)))

    def marks_failure(args: Args) -> GuardMismatchError | None:
        unmet = unmet_marks(args, dynamic)
        if unmet is None:
            return None
        return _error(
            f"Capture of {name} called with dimension {unmet[1]} of {argname(unmet[0], argnames)} "
            "marked dynamic (Dynamo's mark_dynamic), which it was captured static in.",
            "Its graphs have that size baked in; a mark_dynamic dimension must be symbolic.",
            "Capture again with the marked tensor (minihop.apply does this by itself).")

    found.append(Assumption("Dynamo's mark_dynamic marks", "call", "only on dynamic dimensions",
                            lambda args: unmet_marks(args, dynamic) is None,
                            "mark_dynamic marks only on the capture's dynamic dimensions",
                            batch=batch, explain_failure=marks_failure))
    return found


def _value_assumption(name: str, place: str, phase: str, fetch: Callable[[Args], Any], old: Any,
                      description: str, line: str | None, batch: Callable[[Args], bool] | None) -> Assumption:
    """A value read from a place outside the arguments (a global, a cell, an attribute, a
    tensor fetched from one): its key now must be its key at capture."""
    def current(args: Args) -> Any:
        try:
            return value_key(fetch(args))
        except Exception:  # its owner replaced by an object without it (see compile_live_check)
            return value_key(MISSING)

    def failure(args: Args) -> GuardMismatchError:
        return _error(
            f"Capture of {name}: {place} changed since it was captured: it was "
            f"{show_value_key(old)}, it is {show_value_key(current(args))}.",
            "The graphs were traced for the old value: Python values are constants in them, "
            "tensors' properties are baked into their shapes.", where=line)

    return Assumption(place, phase, show_value_key(old), lambda args: current(args) == old, description,
                      line, batch=batch, explain_failure=failure, fetch=fetch, key=old)


def _live_assumptions(name: str, pair: Pair, state: PythonState, args: Args,
                      held: frozenset[str]) -> list[Assumption]:
    """Tensors fetched from places for forward, and each Python place the capture read (once
    a place, checked at each call; again when backward runs for backward's reads), but for
    those holding modules (``held``: ``module_reads``)."""
    fetched = tuple(s for s in pair.inputs if s.fetched and not s.read_in_backward)
    places: dict[str, Any] = {}
    lines: dict[str, str | None] = {}
    phases: dict[str, str] = {}
    for r in state.reads:
        if r.place.description in held or r.seen is UNMATCHED:
            continue  # (UNMATCHED: backward's own, never true: checked when backward runs)
        places.setdefault(r.place.description, r.place.get)
        lines.setdefault(r.place.description, r.line)  # forward's line first
        phases[r.place.description] = "forward" if r.phase == "forward" else phases.get(r.place.description, r.phase)
    live = (*(s.place.get for s in fetched), *places.values())
    if not live:
        return _sharing_assumption(name, state, held, args, pair.argnames)
    captured = tuple(value_key(fetch(args)) for fetch in live)
    found = []
    for s, fetch, old in zip(fetched, live[:len(fetched)], captured[:len(fetched)], strict=True):
        found.append(_value_assumption(
            name, s.description, "forward", fetch, old,
            f"{s.name} ({s.description}): same shape, dtype, device, requires_grad as at capture "
            "(read anew each call)", None, None))
    for (place, fetch), old in zip(places.items(), captured[len(fetched):], strict=True):
        phase = phases[place]
        again = "" if phase == "forward" else " (checked at each call, and again when backward runs)"
        found.append(_value_assumption(
            name, place, "forward", fetch, old,
            f"Python value {place} read by {phase}: {show_key(old)}{again}", lines[place], None))
    # The batch is generated from the records themselves: what is checked is what they say.
    batch = compile_live_check(tuple(a.fetch for a in found), tuple(a.key for a in found))
    return [dataclasses.replace(a, batch=batch) for a in found] + _sharing_assumption(name, state, held, args, pair.argnames)


def _sharing_assumption(name: str, state: PythonState, held: frozenset[str], args: Args,
                      argnames: tuple[str, ...]) -> list[Assumption]:
    """Which argument objects and objects along the places read are one object (``sharing``)."""
    found = sharing_of(state, held, args, argnames)
    if found is None:
        return []
    old, now, show, fast = found

    def failure(call: Args) -> GuardMismatchError:
        return _error(
            f"Capture of {name}: which of its arguments and the places it read are one object "
            f"changed: at capture {show(old)}, now {show(now(call))}.",
            "A write through one of them was seen through the other while tracing (or not), and "
            "the graphs hold what was read then.", where=None)

    return [Assumption("sharing of argument objects and places read", "forward", show(old),
                       fast or (lambda call: now(call) == old),
                       f"objects shared between arguments and places read == {show(old)}",
                       None, explain_failure=failure)]


def _backward_assumptions(pair: Pair, state: PythonState, args: Args,
                          reads: tuple[DataRead, ...], held: frozenset[str]) -> list[Assumption]:
    """What backward reads when it runs: another value takes another bwd (traced again)."""
    found = []
    for r in state.reads_in("backward"):
        if r.place.description in held:
            continue  # in module_reads' record
        old = value_key(r.place.get(args)) if r.seen is None else r.seen  # as backward found it
        if r.seen is UNMATCHED:
            found.append(Assumption(
                r.place.description, "backward", "unknown", lambda call: False,
                "backward ran code minihop did not analyse: traced again each time backward runs "
                "(what that code reads may have changed since forward)", r.line,
                fetch=r.place.get, key=old))
            continue
        found.append(Assumption(
            r.place.description, "backward", show_value_key(old),
            lambda call, get=r.place.get, old=old: value_key(get(call)) == old,
            f"Python value {r.place.description} read by backward: {show_key(old)} (checked again "
            "when backward runs; another value: backward traced again)", r.line,
            fetch=r.place.get, key=old))
    if reads_grad_mode(pair.bwd_graph):
        found.append(Assumption(
            "grad mode in backward", "backward", "False", None,
            "backward read torch.is_grad_enabled() == False (under create_graph=True, where eager's "
            "reads True: backward traced again with grad mode on)"))
    for s in pair.inputs:
        if s.read_in_backward:
            found.append(Assumption(
                s.description, "backward", "the traced tensor's properties", None,
                f"{s.name} ({s.description}): fetched when backward runs; other shape, dtype, device "
                "or requires_grad: backward traced again"))
    for a in pair.grad_assumptions:
        query = getattr(a.query, "__name__", a.query)
        found.append(Assumption(
            f"output {a.index}'s grad", "backward", repr(a.expected), None,
            f"backward read {query} of output {a.index}'s grad == {a.expected!r} (else retraced)"))
    for read in reads:
        if read.guards_backward:
            found.append(Assumption(
                read.op, "backward", repr(read.value), None,
                f"value {read.op} in backward == {read.value!r} (recomputed from its grads and saved "
                "values before each backward; another value: backward traced again)", read.line))
    return found


def _data_assumption(name: str, read: DataRead) -> Assumption:
    """A value forward took out of tensor data: recomputed from each call's inputs."""
    fetch = fetcher(read.sources)
    check = _value_check(read)

    def failure(args: Args) -> GuardMismatchError:
        inputs = fetch(args, {})
        with torch.no_grad():  # as ``DataRead.holds`` computes it: recording nothing
            inputs = [(v.detach().clone() if read.clone_inputs else v.detach())
                      if issubclass(type(v), torch.Tensor) else v for v in inputs]
            new = read.graph(*inputs)
        return _error(
            f"Capture of {name}: a value its forward read from tensor data changed: "
            f"{read.op} gave {read.value!r} at capture" + (f" ({read.line})" if read.line else "")
            + f", gives {new!r} now.",
            "The trace took the Python value and went on with it (a branch, a number in "
            "the graph); other values may take other code.",
            "Capture again for these values (minihop.apply does this by itself).")

    return Assumption(read.op, "forward", repr(read.value), check,
                      f"value {read.op} in forward == {read.value!r} (recomputed from the inputs on "
                      "every call)", read.line, explain_failure=failure)


def _value_check(read: DataRead) -> Callable[[Args], bool]:
    """``args -> bool``: whether ``read``'s graph gives its captured value for these arguments
    (its inputs fetched as fwd inputs are)."""
    fetch = fetcher(read.sources)
    return lambda args: read.holds(read.graph, fetch(args, {}))


def layout_key(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """Each tensor argument's strides, storage offset, ``_is_view()`` and the flags no call
    key holds (conjugate and negative bits, an inference tensor): guarded only when the trace
    read one of them, or asked a tensor something the key does not answer
    (``tracer.identity.KEY_HELD``). A fake copy keeps them, and so do the views and
    results forward makes of it."""
    return tuple((a.stride(), a.storage_offset(), a._is_view(), a.is_conj(), a.is_neg(), a.is_inference())
                 if issubclass(type(a), torch.Tensor) and a.layout == torch.strided else None for a in args)


def _layout_assumptions(name: str, argnames: tuple[str, ...], layout: Args) -> list[Assumption]:
    """Each tensor argument's strides (and storage offset), where forward read a layout."""
    def show(entry: Any) -> str:
        if entry is None:
            return "None"
        flags = [f for f, on in zip((" conjugate", " negative", " an inference tensor"), entry[3:]) if on]
        return (f"{entry[0]}{f' at storage offset {entry[1]}' if entry[1] else ''}{' (a view)' if entry[2] else ''}"
                f"{',' + ','.join(flags) if flags else ''}")

    def batch(args: Args) -> bool:
        return layout_key(args) == layout

    found = []
    for i, entry in enumerate(layout):
        if entry is None:
            continue
        strides = show(entry)
        place = f"strides of {argname(i, argnames)}"

        def check(args: Args, i: int = i) -> bool:
            return len(args) > i and layout_key(args[i:i + 1]) == (layout[i],)

        def failure(args: Args, i: int = i, place: str = place) -> GuardMismatchError:
            new = layout_key(args[i:i + 1])[0] if len(args) > i else None
            return _error(
                f"Capture of {name} called with tensors laid out differently: {place} "
                f"were {show(layout[i])} at capture, are {show(new)}.",
                "Its trace read a tensor's layout or a flag no call key holds (stride(), "
                "is_contiguous(), is_conj(), is_inference(), ...), so the graphs may depend on it.",
                "Capture again for these arguments (minihop.apply does this by itself).")

        found.append(Assumption(place, "call", str(strides), check, f"{place} == {strides} (the trace read a layout or flag)",
                                batch=batch, explain_failure=failure))
    return found


def _shape_assumption(name: str, argnames: tuple[str, ...], shape_guards: Any, args: Args) -> Assumption:
    """The conditions on dynamic sizes its trace recorded (the ShapeEnv's guards)."""
    indices = shape_guards.arg_indices
    # Compiled once; the ShapeEnv wrote it as Python over ``T``, the dynamic arguments (with
    # math.* and, for float size arithmetic, torch.sym_float), read here from args.
    ok: Callable[[Args], bool] = eval(f"lambda args: {_over_args(shape_guards.expression, indices)}",
                                      {"math": math, "torch": torch})

    def sizes(call: Args) -> list[Any]:
        return [tuple(call[i].shape) if issubclass(type(call[i]), torch.Tensor) else call[i] for i in indices]

    seen = sizes(args) if len(args) > max(indices, default=-1) else "?"

    def failure(call: Args) -> GuardMismatchError:
        return _error(
            f"Capture of {name} called with dynamic sizes outside what it was traced for: "
            f"{shape_guards.expression} is False for T = {sizes(call)} (captured with T = {seen}).",
            "Tracing with symbolic sizes records the conditions (guards) its graphs rely on.",
            "Capture again for these sizes.")

    names = ", ".join(f"T[{k}] is {argname(i, argnames)}" for k, i in enumerate(indices))
    return Assumption("dynamic sizes", "call", str(seen), ok,
                      f"dynamic sizes: {shape_guards.expression}  ({names})", explain_failure=failure)


def _over_args(expression: str, arg_indices: tuple[int, ...]) -> str:
    """Shape-guard code over ``T`` (the dynamic arguments) rewritten over ``args``."""
    return re.sub(r"\bT\[(\d+)\]", lambda m: f"args[{arg_indices[int(m[1])]}]", expression)


def assumptions_of(pair: Pair, key: Args, masks: dict[int, frozenset[str]] | None,
                   dynamic_dims: dict[int, tuple[int, ...]], shape_guards: Any, state: PythonState,
                   layout: Args | None, args: Args, reads: tuple[DataRead, ...]) -> tuple[Assumption, ...]:
    """Everything a capture of ``pair`` (traced for ``args``) assumed, cheapest check first
    (value checks last: they run ops, on arguments whose properties fit): the call key, the
    values read outside the arguments, the layout, the shape guards, the data values; then
    what backward checks when it runs."""
    name, argnames = pair.function_name, pair.argnames
    found = _key_assumptions(name, argnames, key, masks, dynamic_dims)
    held = holds_modules(state, args)
    found += module_assumptions(name, state, args, held, Assumption)
    found += _live_assumptions(name, pair, state, args, held)
    if layout is not None:
        found += _layout_assumptions(name, argnames, layout)
    if shape_guards is not None:
        found.append(_shape_assumption(name, argnames, shape_guards, args))
    found += [_data_assumption(name, read) for read in reads if read.guards_forward]
    found += _backward_assumptions(pair, state, args, reads, held)
    return tuple(found)


def backward_values(assumptions: tuple[Assumption, ...]) -> tuple[Assumption, ...]:
    """The Python values backward reads, in the order it read them: what ``runtime.backwards``
    fetches and compares (``fetch``, ``key``) each time backward runs."""
    return tuple(a for a in assumptions if a.phase == "backward" and a.fetch is not None)


def _plain(v: Any) -> bool:
    return v is None or type(v) in (bool, int, float, str) or (issubclass(type(v), tuple) and all(map(_plain, v)))


def refuse_unlike_grads(name: str, variant: Pair, grads: Any) -> None:
    """A backward traced again for this call's grads (one per fwd output) asked its fake grads what
    they answer unlike the call's own (``g._is_view()``, ``g.storage_offset()``), or what only the fake
    answers, no plain value (``g._base``'s tensor, ``g.grad_fn``'s node): refused (MH104)."""
    for a in variant.grad_assumptions:
        g = grads[a.index] if a.index < len(grads) else None
        if issubclass(type(g), torch.Tensor) and not (_plain(a.expected) and _plain(
                answer := a.query(g, *a.args, **dict(a.kwargs))) and answer == a.expected):
            asked = a.query.__self__.__name__ if getattr(a.query, "__name__", "") == "__get__" else f"{getattr(a.query, '__name__', a.query)}()"
            shown = repr(a.expected) if _plain(a.expected) else "with an object of its own"
            raise UnsupportedOperationError(f"{name}.backward asks output {a.index}'s grad {asked}: the fake grad minihop "
                                            f"traces with answers {shown}, this call's grad otherwise.",
                "A fake grad is made with the grad's shape, dtype, strides and requires_grad; whether autograd "
                "hands backward a view, of which base, at which storage offset, with which history, it does not reproduce.",
                "Read only the grad's shape, dtype or strides in backward, or run it eagerly (minihop.function(F, fallback='eager')).")
