"""Messages and ``print`` of the user's code while it is traced: each is refused, or given by
the graphs, never only once by the trace.

Place in the pipeline: tracer, beside the heap watch. ``pystate`` starts ``PrintWatch`` and
``MessageWatch`` around the user's code; the recorder brackets each op it runs on fakes
(``op_begin``/``op_end``/``op_recorded``); the cache shows what a trace held back around the
call's real run (``take_held``; ``runtime.located.real_run_shows``).

Why logging and ``warnings.warn`` are refused: a message is sent once, while tracing, and
never by the graphs, where eager sends it (with that call's values) on every call. Calls through
the modules are watched here (``warnings.warn``, ``log.info``, from any code); a name the
user's code binds (``from warnings import warn``) is watched by ``hidden.ReadWatch``.

A library's warning given inside an op the graph records (``F.softmax``'s implicit-dim one)
is the graph's to give: the graph calls that op on every call. One given by an op that is not
recorded (a query), or by library code the user called outside any op, is refused like the
user's own, but for a library's deprecation, a constant text given again on every call where
eager gives it (``replay_writes``). What a forward trace held back is shown around the call's real run when that run
does not give it itself (a library's warn-once flag the trace used up).

Invariant: a phase whose code logs or warns (itself, or through a library outside an op) is
never captured; the trace itself shows no message eager would not.
"""

from __future__ import annotations

import builtins
import logging
import os
import sys
import threading
import warnings
from collections.abc import Callable
from typing import Any

from ..errors import SideEffectError
from ..spec import Place, Root, StateWrite

__all__ = ["MessageWatch", "PrintWatch", "op_begin", "op_end", "op_recorded", "take_held"]

_MINIHOP_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class PrintWatch:
    """``print`` while the user's code is traced (in the tracing thread): recorded, not run."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, int, str]] = []  # (function, line in it, where)
        self.thread = threading.get_ident()
        self.real = builtins.print

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        if threading.get_ident() != self.thread:
            return self.real(*args, **kwargs)
        frame = sys._getframe(1)
        self.lines.append((frame.f_code.co_name, frame.f_lineno,
                           f'File "{frame.f_code.co_filename}", line {frame.f_lineno}'))
        return None

    def refuse(self, name: str) -> None:
        """A ``print`` ran while the code was traced: refused (it would print once, never again)."""
        if not self.lines:
            return
        method, line, where = self.lines[0]
        raise SideEffectError(
            f"{name}.{method} calls `print` (line {line}).",
            "A capture replays only tensor operations and the simple Python writes "
            "minihop can repeat (counters, appends, constants); printing happens once, "
            "while tracing, and never again when the graphs run.",
            "Print outside the Function, or behind a flag that is off (if DEBUG: ...), "
            "or run it eagerly with minihop.function(F, fallback='eager').",
            where=where)


class MessageWatch:
    """``logging`` and ``warnings.warn`` calls made in the tracing thread by the user's code
    while it runs: each is recorded (what, where) and not sent. Enabled only around the trace."""

    _METHODS = ("debug", "info", "warning", "warn", "error", "exception", "critical", "log")

    def __init__(self, is_user: Callable[[Any], bool], passing: bool = False, modules: Any = ()) -> None:
        self.calls: list[tuple[str, str | None]] = []
        # What ``warnings`` noted as given, in the user's modules and process-wide: a trace
        # that runs a warning (a C++ one under an "ignore" filter torch sets while tracing,
        # one held back) notes it there too, and eager's real run would then not give it. Put
        # back when the watch stops (but for a trace that stands for its call: ``passing``); a
        # module with none is given none (one the trace made is emptied: the same as none).
        self.spaces = [(g, dict(g.get("__warningregistry__") or {})) for g in {id(g): g for g in modules}.values()]
        self.once: dict[Any, Any] | None = dict(warnings.onceregistry)
        # A backward traced again for one call (``StateTracker.standing``): its messages are
        # that call's, sent as the user's code gives them (``sent``), and the trace serves
        # that call only.
        self.passing = passing
        self.sent: list[str] = []
        self.thread = threading.get_ident()
        self.is_user = is_user
        self.saved: list[tuple[Any, str, Any]] = []
        for name in self._METHODS:
            for home in (logging.Logger, logging):
                self._swap(home, name)
        for name in ("warn", "warn_explicit"):
            self._swap(warnings, name)
        # A warning torch's C++ gives while an op is traced (``torch.tensor(t)``'s) is shown
        # by eager once per call, and by the graphs, which call that op again, once per call
        # too: the trace's own showing would be one more. Python-level ones pass through
        # ``call`` below (``python_warn``), and are shown or refused there.
        self.python_warn = 0
        self.show = warnings.showwarning
        warnings.showwarning = self._show
        # Messages heard while an op runs on fakes (None outside one), and those of the op that
        # ran last until the recorder says it recorded it (``op_begin``/``op_recorded``).
        self.op_heard: list[tuple[str, str | None]] | None = None
        self.op_left: list[tuple[str, str | None]] = []
        # Where eager's ``warnings.warn`` of each such message is (``_eager_location``): the
        # graph's node gives it from there (``runtime.located``).
        self.op_located: list[tuple[Any, ...]] = []
        self.located_left: list[tuple[Any, ...]] = []
        # The filters as the call found them, and (while an op runs) the user's own
        # ``catch_warnings`` filters around it, if any: the op then runs under the call's, as
        # the graph will, and a warning it gives is refused (what the user's context does
        # with it, record or hide it, is the user's code, which no graph repeats).
        self.filters = warnings.filters
        self.op_context: Any = None
        # Forward's op warnings, not shown: the call's real run (graph or eager) shows them,
        # and those it does not give (a library's warn-once flag the trace used up) are shown
        # after it (``real_run_shows``); backward's are its graph's to give.
        self.held: list[tuple[Any, ...]] = []  # (text, category, filename, line, module)
        self.published = False
        self.phase = "forward"  # (set by pystate when backward is traced)
        self.replays: list[tuple[Any, ...]] = []  # library deprecations given again per call
        _WATCH.now = self

    def _swap(self, home: Any, name: str) -> None:
        real = vars(home)[name]
        label = f"`warnings.{name}`" if home is warnings else f"logging's `{name}`"

        def call(*args: Any, **kwargs: Any) -> Any:
            if threading.get_ident() == self.thread:
                frame = sys._getframe(1)
                if home is warnings and self.op_heard is not None and warnings.filters is not self.filters:
                    return self._python(real, args, kwargs)  # (a library's own catch_warnings inside the op)
                if home is warnings and self.op_heard is not None:
                    # Inside an op run on fakes (``F.softmax``'s implicit-dim warning): the
                    # graph's call of that op gives it on every call; an op not recorded cannot.
                    if self.op_context is not None:
                        self.calls.append((_IN_CONTEXT, _user_where(frame, self.is_user)))
                        return None
                    self.op_heard.append((label, _user_where(frame, self.is_user)))
                    located = _eager_location(frame, name, args, kwargs, self.is_user)
                    self.op_located.append(located)
                    self.held.append(located)
                    return None
                # A library's warning about the user's call (``F.upsample``'s deprecation, its
                # stacklevel naming the user's line) is the user's message as much as their own.
                blamed = self._blamed(frame, home, name, args, kwargs)
                if blamed is None and home is warnings and _called_for_user(frame, self.is_user):
                    blamed = frame  # a library helper the user called, not a recorded op: no graph gives it
                if blamed is not None and home is warnings and name == "warn" and not self.passing \
                        and not self.is_user(frame) and self._replayed(frame, args, kwargs):
                    # A library's deprecation (``@deprecated``'s wrapper of
                    # ``dist.all_gather_into_tensor``, ``torch.cpu.amp.autocast``): a constant
                    # text, given again on every call where eager gives it.
                    return None
                if blamed is not None and self.passing:
                    self.sent.append(label)
                    up_args, up_kwargs = _one_frame_up(home, name, args, kwargs) if blamed is frame else (args, kwargs)
                    return self._python(real, up_args, up_kwargs)  # attributed to the user's line
                if blamed is not None:
                    self.calls.append((label, _user_where(blamed, self.is_user)))
                    return None  # sent by eager on the call itself, not by the trace
            return self._python(real, args, kwargs) if home is warnings else real(*args, **kwargs)

        self.saved.append((home, name, real))
        setattr(home, name, call)

    def _replayed(self, frame: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        """A library's deprecation warning: noted to be given again on every call, from the
        location and with the registry eager's ``warnings.warn`` would use (``replays``)."""
        text, category = _message_of("warn", args, kwargs)
        if not issubclass(category, (DeprecationWarning, PendingDeprecationWarning, FutureWarning)):
            return False
        named = frame
        for _ in range(max(int(kwargs.get("stacklevel", args[2] if len(args) > 2 else 1)) - 1, 0)):
            named = named.f_back if named is not None and named.f_back is not None else named
        g = named.f_globals
        self.replays.append((self.phase, text, category, named.f_code.co_filename, named.f_lineno,
                             g.get("__name__", "<string>"), g.setdefault("__warningregistry__", {}),
                             _user_where(frame, self.is_user)))
        return True

    def replay_writes(self) -> list[StateWrite]:
        """The deprecations library code gave while traced, given again on every call
        (``StateWrite`` kind "call" of ``warnings.warn_explicit``; forward's after fwd,
        backward's when backward runs)."""
        home = vars(warnings)
        root = Root("global", "warn_explicit", "warnings.warn_explicit",
                    lambda a: home["warn_explicit"], home=home)
        place = Place(root, (), root.fetch)
        return [StateWrite(place, "call", ((text, category, filename, line, module, registry), {}), phase, where)
                for phase, text, category, filename, line, module, registry, where in self.replays]

    def _blamed(self, frame: Any, home: Any, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The user's frame a message is about: the caller's own, or the one a library's
        ``warnings.warn(..., stacklevel=n)`` names; None for a library's own message."""
        if self.is_user(frame):
            return frame
        if home is not warnings or name != "warn":
            return None
        level = kwargs.get("stacklevel", args[2] if len(args) > 2 else 1)
        named = frame
        for _ in range(max(int(level) - 1, 0)):
            named = named.f_back if named is not None else None
        return named if named is not None and self.is_user(named) else None

    def _python(self, real: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        self.python_warn += 1
        try:
            return real(*args, **kwargs)
        finally:
            self.python_warn -= 1

    def _show(self, *args: Any, **kwargs: Any) -> Any:
        if threading.get_ident() == self.thread and not self.python_warn:
            if self.op_heard is not None:
                frame = sys._getframe(1)
                if self.op_context is not None:
                    self.calls.append((_IN_CONTEXT, _user_where(frame, self.is_user)))
                    return None
                self.op_heard.append(("a warning of torch's", _user_where(frame, self.is_user)))
                while frame is not None and not self.is_user(frame):  # (C++'s names the op's caller)
                    frame = frame.f_back
                if frame is not None and args:
                    message, category = args[0], args[1] if len(args) > 1 else UserWarning
                    self.op_located.append((str(message), type(message) if issubclass(type(message), Warning) else category,
                                            frame.f_code.co_filename, frame.f_lineno,
                                            frame.f_globals.get("__name__", "<string>")))
            return None  # (C++'s, while an op is traced: the graphs give it when they run)
        return self.show(*args, **kwargs)

    def publish(self) -> None:
        """Forward has run (or stopped): its held op warnings are the call's, from now on."""
        if not self.published and not self.passing:
            _WATCH.held = [*getattr(_WATCH, "held", ()), *self.held]
        self.published = True

    def stop(self) -> None:
        self.publish()
        for g, before in self.spaces if not self.passing else ():
            registry = g.get("__warningregistry__")
            if issubclass(type(registry), dict):  # (in place: a replay holds this very dict)
                registry.clear()
                registry.update(before)
        if not self.passing and self.once is not None:
            warnings.onceregistry.clear()
            warnings.onceregistry.update(self.once)
        self.spaces, self.once = [], None  # (stopped once: a later stop puts nothing back)
        if getattr(_WATCH, "now", None) is self:
            _WATCH.now = None
        for home, name, real in reversed(self.saved):
            setattr(home, name, real)
        self.saved.clear()
        if warnings.showwarning == self._show:
            warnings.showwarning = self.show

    def refuse(self, describe: str, named: Any = None) -> None:
        """MH106 for the first message: one seen here, or one ``named`` (pystate's
        ``hidden.ReadWatch``) saw through a name the code bound (``from warnings import warn``)."""
        self.publish()
        self.calls.extend(self.op_left)  # (the last op's, not recorded)
        self.op_left = []
        calls = [*self.calls, *((f"`{r[2]}`", r[4]) for r in getattr(named, "reads", ()) if r[1] == "message")]
        if not calls:
            return
        what, where = calls[0]
        if what == _IN_CONTEXT:
            raise SideEffectError(
                f"{describe} runs an op that warns inside its own `warnings.catch_warnings` block.",
                "The graph calls that op on every call, outside the block: the warning would be "
                "shown where eager's block records or hides it, and what the block does with it "
                "is Python code no graph repeats.",
                "Pass the argument that silences the warning (F.softmax(x, dim=...)), move the "
                "block outside the Function, or run it eagerly with "
                "minihop.function(F, fallback='eager').", where=where)
        raise SideEffectError(
            f"{describe} gives a message ({what}).",
            "A capture replays tensor operations: the message would be sent once, while "
            "tracing, and never when the graphs run, where eager sends it on every call with "
            "that call's values.",
            "Give it outside the Function, or behind a flag that is off, or run it eagerly with "
            "minihop.function(F, fallback='eager').", where=where)


_WATCH = threading.local()  # .now: the MessageWatch of this thread's running trace


def op_begin() -> MessageWatch | None:
    """An op is about to run on fakes: messages it gives are held (``op_end``) until the
    recorder records it (``op_recorded``: the graph's call gives them) or the next op begins
    (not recorded: no graph gives them, so they are refused like the user's own)."""
    watch = getattr(_WATCH, "now", None)
    if watch is None or watch.thread != threading.get_ident():
        return None
    watch.calls.extend(watch.op_left)
    watch.op_left, watch.op_heard, watch.op_located = [], [], []
    if warnings.filters is not watch.filters:  # (the user's catch_warnings around the op)
        watch.op_context, warnings.filters = warnings.filters, watch.filters
    return watch


def op_end(watch: MessageWatch | None) -> None:
    if watch is not None:
        watch.op_left, watch.op_heard = watch.op_heard or [], None
        watch.located_left, watch.op_located = watch.op_located, []
        if watch.op_context is not None:
            warnings.filters, watch.op_context = watch.op_context, None


_IN_CONTEXT = "a warning inside the user's `warnings.catch_warnings`"


def op_recorded() -> tuple[tuple[Any, ...], ...]:
    """The op that ran last is in the graph: its messages are the graph's to give, each from
    where eager's is (returned, for its node: ``(text, category, filename, line, module)``)."""
    watch = getattr(_WATCH, "now", None)
    if watch is None:
        return ()
    watch.op_left, located, watch.located_left = [], tuple(watch.located_left), []
    return located


def take_held() -> list[tuple[Any, ...]]:
    """The op warnings the forward traces of this thread held since the last take."""
    held, _WATCH.held = getattr(_WATCH, "held", []), []
    return held


def _message_of(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[str, type]:
    """``warnings.warn``'s (or ``warn_explicit``'s) message text and category."""
    message = args[0] if args else kwargs.get("message", "")
    category = args[1] if len(args) > 1 else kwargs.get("category")
    if issubclass(type(message), Warning):
        return str(message), type(message)
    return str(message), category if issubclass(type(category), type) else UserWarning


def _eager_location(frame: Any, name: str, args: tuple[Any, ...], kwargs: dict[str, Any],
                    is_user: Callable[[Any], bool]) -> tuple[Any, ...]:
    """``(text, category, filename, line, module)`` of eager's ``warnings.warn`` called at
    ``frame`` (the frame its ``stacklevel`` names), or of a ``warn_explicit``'s own. Where that
    frame is minihop's (the recorder runs the op for the user's line), the user's line."""
    text, category = _message_of(name, args, kwargs)
    if name == "warn_explicit":
        explicit = dict(zip(("message", "category", "filename", "lineno", "module"), args)) | kwargs
        return (text, category, explicit.get("filename"), explicit.get("lineno"), explicit.get("module"))
    named = frame
    for _ in range(max(int(kwargs.get("stacklevel", args[2] if len(args) > 2 else 1)) - 1, 0)):
        named = named.f_back if named is not None and named.f_back is not None else named
    if named.f_code.co_filename.startswith(_MINIHOP_DIR):
        while named.f_back is not None and not is_user(named):
            named = named.f_back
    return (text, category, named.f_code.co_filename, named.f_lineno, named.f_globals.get("__name__", "<string>"))


def _user_where(frame: Any, is_user: Callable[[Any], bool]) -> str | None:
    """Where the user's code is at ``frame`` or above it, as a traceback line."""
    while frame is not None and not is_user(frame):
        frame = frame.f_back
    return None if frame is None else f'File "{frame.f_code.co_filename}", line {frame.f_lineno}'


def _called_for_user(frame: Any, is_user: Callable[[Any], bool]) -> bool:
    """Whether library code at ``frame`` runs because the user's code called it (the first
    frame above it that is the user's comes before any of minihop's own)."""
    while frame is not None and not is_user(frame):
        if frame.f_code.co_filename.startswith(_MINIHOP_DIR):
            return False
        frame = frame.f_back
    return frame is not None


def _one_frame_up(home: Any, name: str, args: tuple[Any, ...],
                  kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``(args, kwargs)`` for the real call, one more frame up (this module's wrapper is not
    the caller: the warning's or record's location is the user's line, as in eager)."""
    if home is warnings and name == "warn" and len(args) >= 3:
        return (*args[:2], args[2] + 1, *args[3:]), kwargs
    if home is warnings and name != "warn":
        return args, kwargs  # warn_explicit: its location is given
    return args, {**kwargs, "stacklevel": kwargs.get("stacklevel", 1) + 1}
