"""One assumption for every name a capture read that holds a module, or a library module's
function: it keeps that very object.

Place in the pipeline: runtime, asked by ``assumptions.assumptions_of``. The tracer reads a
place holding a module (``MATHLIB`` in ``MATHLIB.cos(p)``, ``F``, ``torch``, ``Cfg.lib``) as any
other read place (``tracer.module_reads``); what the code computed through it depends on which
module it is, so the capture holds while each such place holds the very module it held at
capture. Nearly every Function reads ``torch`` or ``F``: rather than one value guard per name
(a key built per call), all of a capture's module-holding places are one record whose check
is one generated ``is`` per name (``holds_modules``), and, for the names backward reads, one
record checked when backward runs (``runtime.backwards``: another module traces backward
again, as eager's backward would call the new one).

A library module's name bound to a function or a class (``torch.sin``, ``F.gelu``: chains read
them as places, ``tracer.module_reads``), and a library class's function the call ran
(``Linear.forward``: ``tracer.library_ran``), are in the same record: anyone may rebind them
(``F.gelu = fast_gelu``), and what the graphs compute is the object bound at capture.

Invariant: a read place whose value at capture is a module, or a library module's callable, is
in exactly these records, and in no per-place value assumption.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

from ..errors import GuardMismatchError
from ..library_state import Same, own_attr
from ..spec import MISSING, Place, PythonState, StateRead
from .guards import library_name, value_key

__all__ = ["holds_modules", "module_assumptions"]

Args = tuple[Any, ...]


def holds_modules(state: PythonState, args: Args) -> frozenset[str]:
    """The read places (by description) that hold a module at capture, or a library module's
    function or class (``torch.sin``, ``F.gelu``: a binding anyone may rebind)."""
    found = set()
    for r in state.reads:
        try:
            value = r.place.get(args)
            owner = r.place.owner(args) if r.place.steps else None
        except Exception:
            continue
        if issubclass(type(value), types.ModuleType) or (value is MISSING and not r.place.steps and r.place.root.kind == "global") or (
                issubclass(type(owner), types.ModuleType) and library_name(owner.__name__) and callable(value)) or (
                issubclass(type(owner), type) and library_name(own_attr(owner, "__module__"))
                and issubclass(type(value), types.FunctionType)):
            found.add(r.place.description)
    return frozenset(found)


def _shown(value: Any) -> str:
    if issubclass(type(value), types.ModuleType):
        return f"module {value.__name__}"
    if callable(value) and issubclass(type(getattr(value, "__module__", None)), str) and hasattr(value, "__name__"):
        return f"{value.__module__}.{value.__name__}"  # torch.sin (its qualname is a C class's)
    return "nothing" if value is MISSING else f"{type(value).__name__} {getattr(value, '__qualname__', value)!r}"


def _reader(place: Place, i: int, consts: dict[str, Any]) -> str:
    """Python text reading ``place`` from ``args`` (its constants put in ``consts``): a
    global or cell read directly (most of these are ``torch``, ``F``: the hot path), any other
    place by its reader."""
    root = place.root
    if not place.steps and root.kind == "global" and issubclass(type(root.home), dict):
        consts[f"h{i}"], consts[f"k{i}"], consts["MISSING"] = root.home, root.key, MISSING
        return f"h{i}.get(k{i}, MISSING)"  # (a builtin's name: no global of that name)
    if root.kind == "global" and issubclass(type(root.home), dict) and place.steps and all(
            kind == "attr" and issubclass(type(name), str) and name.isidentifier() for kind, name in place.steps):
        consts[f"h{i}"], consts[f"k{i}"] = root.home, root.key  # torch.sin, F.gelu: attribute loads
        return f"h{i}[k{i}]" + "".join(f".{name}" for _, name in place.steps)
    if root.kind == "value" and root.home is not None and len(place.steps) == 1 and place.steps[0][0] == "attr" \
            and place.steps[0][1].isidentifier():
        consts[f"h{i}"] = root.home  # a library function's home (tracer.library_ran): Linear.forward
        return f"h{i}.{place.steps[0][1]}"
    if not place.steps and root.kind == "cell" and root.home is not None:
        consts[f"c{i}"] = root.home
        return f"c{i}.cell_contents"  # an empty cell raises: the check fails
    consts[f"f{i}"] = place.get
    return f"f{i}(args)"


def _generated(name: str, source: str, consts: dict[str, Any]) -> Any:
    exec(source, consts)  # noqa: S102 (our own text: one read per place)
    return consts[name]


def _compiled(places: tuple[Place, ...], modules: tuple[Any, ...]) -> Callable[[Args], bool]:
    """``args -> bool``: each place holds its module, by identity, generated as one expression."""
    consts: dict[str, Any] = {f"m{i}": m for i, m in enumerate(modules)}
    test = " and ".join(f"{_reader(p, i, consts)} is m{i}" for i, p in enumerate(places))
    check: Callable[[Args], bool] = _generated(
        "holds", f"def holds(args):\n    try:\n        return {test}\n    except Exception:\n        return False\n",
        consts)
    return check


def _identity(place: Place) -> Callable[[Args], Same]:
    """``args -> Same``: what ``place`` holds, equal only to that very object (an empty cell:
    MISSING). Held, not its id: a variant of backward keyed by a user's function set there
    (``pow = lambda ...`` shadowing a builtin) must not match another one that got its id."""
    consts: dict[str, Any] = {"MISSING": MISSING, "Same": Same}
    read = _reader(place, 0, consts)
    ident: Callable[[Args], Same] = _generated(
        "identity", f"def identity(args):\n    try:\n        return Same({read})\n    except Exception:\n"
        "        return Same(MISSING)\n", consts)
    return ident


def module_assumptions(name: str, state: PythonState, args: Args, held: frozenset[str],
                       make: Callable[..., Any]) -> list[Any]:
    """The capture's record of the module-holding places (``held``) read by forward or
    backward (checked at each call), and of those backward reads (checked again when backward
    runs). ``make`` is ``assumptions.Assumption``."""
    places: dict[str, StateRead] = {}
    in_backward: dict[str, StateRead] = {}
    for r in state.reads:
        if r.place.description in held:
            places.setdefault(r.place.description, r)
            if r.phase == "backward":
                in_backward.setdefault(r.place.description, r)
    if not places:
        return []
    fetches = tuple(r.place.get for r in places.values())
    modules = tuple(f(args) for f in fetches)
    listed = ", ".join(f"{p} is {_shown(m)}" for p, m in zip(places, modules, strict=True))

    def failure(call: Args) -> GuardMismatchError | None:
        for (place, r), fetch, old in zip(places.items(), fetches, modules, strict=True):
            try:
                new = fetch(call)
            except Exception:
                new = MISSING
            if new is not old:
                return GuardMismatchError(
                    f"Capture of {name}: {place} holds another module (or value) than at capture: "
                    f"it held {_shown(old)}, it holds {_shown(new)}.",
                    "What the code computed through that name (its functions, its constants) is "
                    "baked into the graphs for the module it held then.",
                    "Capture again (minihop.apply does this by itself).", where=r.line)
        return None

    check = _compiled(tuple(r.place for r in places.values()), modules)
    found = [make("names holding modules", "forward", listed, check,
                  f"names holding modules, and library names' functions, keep them (by identity, at each call): {listed}",
                  next(iter(places.values())).line, explain_failure=failure)]
    for place, r in in_backward.items():
        # Keyed by the very object (``Same``: a module's key would cost ~1 µs), compared when
        # backward runs (guard_checks.compile_live_check).
        identity = _identity(r.place)
        old = value_key(identity(args))
        shown = f"{place} is {_shown(r.place.get(args))}"
        found.append(make(
            place, "backward", shown, lambda call, identity=identity, old=old: value_key(identity(call)) == old,
            f"name holding a module or a library function read by backward keeps it: {shown} (checked "
            "again when backward runs; another one: backward traced again)", r.line, fetch=identity, key=old))
    return found
