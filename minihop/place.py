"""One place model: where a Python value lives, found again on every call.

Job: the one record (``Place``: a ``Root`` plus ``structure.Step`` steps) that every stage
uses to name and reach a value outside a graph's tensors: the Python-state guards and the
writes they replay (``tracer.pystate``/``roots``, ``runtime.capture``), forward's writes
outside its return value (``tracer.outside``, ``runtime.writes``), and the messages and
``explain`` text that name them (``describe``). Place in the pipeline: part of the contract
(``spec`` re-exports it); it imports only ``structure`` and ``library_state``.

Invariant: a place holds no value, only the way to it: its root is fetched anew on each call
(an argument from that call, a global or cell as it is bound now), as eager would read it.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import torch

from .library_state import del_attr, library_module, set_attr
from .user_code import item_served_by_code, served_by_user_code
from .structure import Path, Step, argname

__all__ = ["MISSING", "UNMATCHED", "Place", "Root", "arg_place", "walk_plain"]


class _Missing:
    """The value of a place that does not exist (an attribute not set yet)."""

    def __repr__(self) -> str:
        return "<missing>"

    def __reduce__(self) -> str:
        return "MISSING"


MISSING = _Missing()
UNREAD = object()  # what a check finds where reading would run the user's getter (``walk_plain``)


class _Unmatched:
    """A backward read's ``seen`` that no value equals: backward is traced again whenever it
    runs (its code ran code minihop did not analyse: what it reads now is unknown)."""

    def __eq__(self, other: object) -> bool:
        return False

    def __hash__(self) -> int:
        return 0

    def __repr__(self) -> str:
        return "unknown (traced again when backward runs)"


UNMATCHED = _Unmatched()

# What a root may be: a call argument (``key`` its index) or keyword; a global or closure
# cell (``key`` its name); the Function class or a user object a method is bound to; ctx;
# fwd output ``key``; or ``value``: an answer fetched per call (``torch.get_num_threads()``).
ROOT_KINDS = frozenset({"arg", "kw", "global", "cell", "class", "ctx", "output", "value"})


@dataclasses.dataclass(frozen=True)
class Root:
    """Where a place starts. ``fetch(args)`` reads a root that is not simply an argument
    (a global, a cell, a fetched answer, an argument with its default); ``home`` is where a
    global (its globals dict) or a cell (the cell) is stored, for a write to the root itself."""

    kind: str
    key: Any
    description: str = ""
    fetch: Callable[[tuple[Any, ...]], Any] | None = dataclasses.field(default=None, compare=False, repr=False)
    home: Any = dataclasses.field(default=None, compare=False, repr=False)

    @property
    def uses_args(self) -> bool:
        return self.kind in ("arg", "kw")

    def get(self, args: tuple[Any, ...]) -> Any:
        if self.fetch is not None:
            return self.fetch(args)
        if self.kind == "arg":
            return args[self.key] if self.key < len(args) else MISSING
        raise ValueError(f"minihop bug: a {self.kind} root without a way to read it")

    def name(self, argnames: tuple[str, ...] = ()) -> str:
        if self.description:
            return self.description
        if self.kind == "arg":
            return argname(self.key, argnames)
        return f"output[{self.key}]" if self.kind == "output" else str(self.key)


class _Box:
    """A root value seen as a place (its ``value`` attribute): the owner of a place with no
    steps whose root has no home (an argument, a fetched answer)."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


@dataclasses.dataclass(frozen=True)
class Place:
    """``root``, then ``steps`` (``("attr", name)``, ``("item", i)``, ``("key", k)``, and as a
    last step ``("cell", None)`` or ``("append", None)``). ``read`` is a reader the finder
    compiled (the guards' hot path: ``tracer.roots`` stops at user-computed attributes)."""

    root: Root
    steps: Path = ()
    read: Callable[[tuple[Any, ...]], Any] | None = dataclasses.field(default=None, compare=False, repr=False)
    # What is done there needs the call's arguments although the place is not in them (an
    # lru_cache helper called again with sizes computed from them).
    needs_args: bool = False

    @property
    def uses_args(self) -> bool:
        """Whether the place is inside the call's arguments (its owner needs them), or what is
        done there needs them."""
        return self.root.uses_args or self.needs_args

    @property
    def step(self) -> Step:
        """The last step: which part of ``owner`` the place is."""
        if self.steps:
            return self.steps[-1]
        if self.root.kind == "global" and self.root.home is not None:
            return ("key", self.root.key)
        if self.root.kind == "cell" and self.root.home is not None:
            return ("cell", None)
        return ("attr", "value")

    def owner(self, args: tuple[Any, ...]) -> Any:
        """The object holding the place (a container, an object, a globals dict, a cell)."""
        if not self.steps:
            home = self.root.home
            return home if home is not None else _Box(self.root.get(args))
        return walk_plain(self.root.get(args), self.steps[:-1])

    @functools.cached_property
    def description(self) -> str:
        return self.describe()

    def describe(self, argnames: tuple[str, ...] = ()) -> str:
        """The user's spelling: ``sink.append(...)``, ``obj.cache``, ``_CACHE['k']``, ``out._soft``."""
        out = self.root.name(argnames)
        for kind, key in self.steps:
            if kind == "append":
                out += ".append(...)"
            elif kind == "attr":
                out += f".{key}"
            elif kind != "cell":
                out += f"[{key!r}]"
        return out

    def get(self, args: tuple[Any, ...]) -> Any:
        if self.read is not None:
            return self.read(args)
        if not self.steps:
            return self.root.get(args)
        kind, key = self.steps[-1]
        owner = self.owner(args)
        if kind == "cell":
            try:
                return owner.cell_contents
            except ValueError:
                return MISSING
        return walk_plain(owner, self.steps[-1:])

    def set(self, args: tuple[Any, ...], value: Any) -> None:
        owner = self.owner(args)
        kind, key = self.step
        if kind == "attr":
            # As the heap watch put it back while tracing: the state eager's code left (past a
            # user's ``__setattr__``, which ran in eager and whose other changes are writes too).
            if value is MISSING:
                del_attr(owner, key)
            else:
                set_attr(owner, key, value)
        elif kind == "cell":
            owner.cell_contents = value
        elif value is MISSING:
            del owner[key]
        else:
            owner[key] = value


def arg_place(path: Path) -> Place:
    """The place at ``path`` (``(("arg", i), *steps)`` or ``(("kw", name), ...)``) in a call's arguments."""
    (kind, key), *steps = path
    return Place(Root(kind, key), tuple(steps))


def walk_plain(value: Any, steps: Path) -> Any:
    """The value at ``steps`` from ``value``, or MISSING where a step finds nothing."""
    for kind, key in steps:
        if value is MISSING:
            return MISSING
        if kind == "attr":
            if issubclass(type(value), torch.Tensor) and key not in value.__dict__:
                return MISSING  # a tensor's own attributes are its properties, keyed elsewhere
            if served_by_user_code(value, key, library_module):
                # The user's getter (a property, a cached_property whose value was dropped):
                # its code runs where the user's code reads it, never in a check, which sees
                # a value nothing recorded.
                return UNREAD
            try:
                value = getattr(value, key)
            except Exception:
                return MISSING
        else:
            if item_served_by_code(value, key, library_module):
                return UNREAD  # as for a getter: no code of the user's runs in a check
            try:
                value = value[key]
            except Exception:
                return MISSING
    return value
