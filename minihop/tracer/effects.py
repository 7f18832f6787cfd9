"""Effects of the user's code that are not Python-state writes: torch generators handed to
ops, and messages (``logging``) sent while it is traced.

Place in the pipeline: tracer, beside the heap watch (``heap``). The recorder notes each
``torch.Generator`` that reaches a recorded op (``note_generator``); the trace asks
``refuse_generators`` once the phase's code has run. ``MessageWatch`` sees ``logging`` calls
made while the user's code runs.

Why a generator is refused: a graph can only hold it as a constant, the object seen while
tracing. A generator made and seeded inside forward (``torch.Generator().manual_seed(0)``)
would then advance from call to call where eager makes a fresh one each time; one passed as an
argument would be the traced call's object on every later call. Either is a silently wrong
random stream. The refusal is deferred to the end of the phase so that a value read made
from the same draw (``torch.rand((), generator=g).item()``) still reports as the value read
it also is.

Why logging and ``warnings.warn`` are refused: a message is sent once, while tracing, and
never by the graphs, where eager sends it (with that call's values) on every call. Calls through
the modules are watched here (``warnings.warn``, ``log.info``, from any code); a name the
user's code binds (``from warnings import warn``) is watched by ``hidden.ReadWatch``.

Invariant: no graph holds a ``torch.Generator``; a phase whose code logs or warns is never
captured.
"""

from __future__ import annotations

import logging
import sys
import warnings
import threading
from collections.abc import Callable
from typing import Any

from ..errors import SideEffectError
from .atoms import CONSTANTS

__all__ = ["MessageWatch", "constant_container", "refuse_generators", "ctx_as_forward_left_it"]



def constant_container(value: Any, depth: int = 0) -> bool:
    """A list, dict, tuple or set built only of constants (nested, at most a few levels): a
    value a write can replay by setting a fresh copy of it on each call."""
    if isinstance(value, CONSTANTS):
        return depth > 0
    if depth > 4 or type(value) not in (list, dict, tuple, set, frozenset):
        return False
    items = (*value.keys(), *value.values()) if type(value) is dict else tuple(value)
    return all(constant_container(v, depth + 1) for v in items)


def refuse_generators(generators: list[str | None], describe: str) -> None:
    """Raise MH106 when a ``torch.Generator`` reached an op of this phase (``generators``:
    where each did, in the user's code)."""
    if not generators:
        return
    raise SideEffectError(
        f"{describe} passes a torch.Generator to a random op (generator=...).",
        "A graph can hold a generator only as the object seen while tracing: a generator made "
        "and seeded in the Function would keep advancing from call to call, and one passed as "
        "an argument would be the traced call's, where eager draws from the one of each call.",
        "Draw from torch's default generator (seed it outside the Function), or run it eagerly "
        "with minihop.function(F, fallback='eager').", where=generators[0])


class MessageWatch:
    """``logging`` and ``warnings.warn`` calls made in the tracing thread by the user's code
    while it runs: each is recorded (what, where) and not sent. Enabled only around the trace."""

    _METHODS = ("debug", "info", "warning", "warn", "error", "exception", "critical", "log")

    def __init__(self, is_user: Callable[[Any], bool]) -> None:
        self.calls: list[tuple[str, str | None]] = []
        self.thread = threading.get_ident()
        self.is_user = is_user
        self.saved: list[tuple[Any, str, Any]] = []
        for name in self._METHODS:
            for home in (logging.Logger, logging):
                self._swap(home, name)
        for name in ("warn", "warn_explicit"):
            self._swap(warnings, name)

    def _swap(self, home: Any, name: str) -> None:
        real = vars(home)[name]
        label = f"`warnings.{name}`" if home is warnings else f"logging's `{name}`"

        def call(*args: Any, **kwargs: Any) -> Any:
            if threading.get_ident() == self.thread:
                frame = sys._getframe(1)
                if self.is_user(frame):
                    self.calls.append((label, f'File "{frame.f_code.co_filename}", '
                                             f'line {frame.f_lineno}'))
                    return None  # sent by eager on the call itself, not by the trace
            return real(*args, **kwargs)

        self.saved.append((home, name, real))
        setattr(home, name, call)

    def stop(self) -> None:
        for home, name, real in reversed(self.saved):
            setattr(home, name, real)
        self.saved.clear()

    def refuse(self, describe: str, named: Any = None) -> None:
        """MH106 for the first message: one seen here, or one ``named`` (pystate's
        ``hidden.ReadWatch``) saw through a name the code bound (``from warnings import warn``)."""
        calls = [*self.calls, *((f"`{r[2]}`", r[4]) for r in getattr(named, "reads", ()) if r[1] == "message")]
        if not calls:
            return
        what, where = calls[0]
        raise SideEffectError(
            f"{describe} gives a message ({what}).",
            "A capture replays tensor operations: the message would be sent once, while "
            "tracing, and never when the graphs run, where eager sends it on every call with "
            "that call's values.",
            "Give it outside the Function, or behind a flag that is off, or run it eagerly with "
            "minihop.function(F, fallback='eager').", where=where)


class ctx_as_forward_left_it:  # noqa: N801  (used as a context manager, named as one)
    """While active, the user's attributes on ``ctx`` are as forward left them (the lists,
    dicts and sets among them with their contents then), and again so afterwards; made once,
    after forward, and entered for each trace of backward. Eager's backward runs once on the
    ctx forward filled; minihop may trace backward more than once (grads laid out otherwise,
    values it reads again), and a backward that writes ctx (``ctx.calls += 1``,
    ``ctx.trail.append(...)``) must not see its own earlier trace.

    Only containers forward made are put back: one that existed before forward (an argument
    list, a global dict: ``existed``) is the caller's, and backward must see it as it is when
    backward runs (eager's does; the caller may change it in between). Putting its old
    contents back would also write the caller's object."""

    def __init__(self, ctx: Any, existed: Callable[[Any], bool] = lambda value: False) -> None:
        self.ctx = ctx
        self.saved = [(k, v, None if existed(v) else _contents(v))
                      for k, v in vars(ctx).items() if not k.startswith("_minihop")]

    def __enter__(self) -> None:
        _put_back(self.ctx, self.saved)

    def __exit__(self, *exc: Any) -> None:
        _put_back(self.ctx, self.saved)


def _contents(value: Any) -> Any:
    return list(value) if type(value) is list else dict(value) if type(value) is dict else \
        set(value) if type(value) is set else None


def _put_back(ctx: Any, saved: list[tuple[str, Any, Any]]) -> None:
    names = {k for k, _, _ in saved}
    for k in [k for k in vars(ctx) if not k.startswith("_minihop") and k not in names]:
        object.__delattr__(ctx, k)
    for k, v, contents in saved:
        object.__setattr__(ctx, k, v)
        if contents is None:
            continue
        if type(v) is list:
            v[:] = contents
        elif type(v) in (dict, set):
            v.clear()
            v.update(contents)
