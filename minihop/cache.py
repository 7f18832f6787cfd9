"""The guarded capture cache behind ``minihop.apply``, ``minihop.function`` and ``@captured``.

Place in the pipeline: above it (it calls ``pipeline.run_pipeline``). One ``CapturedFunction`` per
user Function and policy; all entry points (``entries``) share this one implementation.

The key of an entry (its guards) is: the Function class and what its callers and autograd load
of it (``function_keys.methods_key``: ``forward``/``backward``/``vjp``/``setup_context``, ``apply``,
``boxed_grads_call``); per argument, what ``runtime.guards.call_key`` records (tensor shape, dtype,
device, layout, ``requires_grad``; non-tensor values; the structure around them; grad mode);
and, checked on each hit (``Capture.fits``), the properties of tensors reached through closures,
globals and modules and, for dynamic captures, the shape guards.

Policies: ``fallback="raise"`` (default) re-raises a capture's ``MinihopError``;
``fallback="eager"`` runs ``F.apply`` instead (as its caller loads it, per call), warns once per
Function with the reason, and remembers the decision for that key. Past ``cache_limit`` entries
a warning is given once; then with ``"raise"`` the least recently used entry is evicted (always
correct, costs a recapture) and with ``"eager"`` new keys run eagerly, as Dynamo does past its
recompile limit; the oldest capture is evicted (first in, first out: no bookkeeping on the hit path).

Shapes (``dynamic=``): ``None`` (default) is automatic, as ``torch.compile``'s: the first call is
captured static; a later miss whose tensor argument has a size unlike one seen before at that
position makes that dimension symbolic from then on, and the symbolic capture serves every size
its shape guards admit (sizes 0 and 1 are specialised, as Dynamo does). ``False``: static, one
capture per size; ``True``: every dimension symbolic from the first call; a mapping names
dimensions. Dynamo's ``mark_dynamic``/``maybe_mark_dynamic``/``mark_static`` marks hold under every
policy (``pipeline.dynamic_dims``). An int argument is a shape of no dimensions: a changed value
makes it a SymInt under the automatic policy; floats and bools stay part of the key.
"""

from __future__ import annotations

import dataclasses
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import torch

from .errors import MinihopError, UnsupportedOperationError, notice, release_frames
from .pipeline import (Capture, as_called, class_apply, dynamic_dims, guard_key, methods_check, methods_held, methods_key, modes_refusal, observing_modes,
                       real_run_shows, run_pipeline, take_held, tracing)
from .arguments import bind_arguments
from .copying import CopiedAsFunction
from .user_code import class_answering_refusal, lazy_module_refusal

__all__ = ["ALIVE", "TOTALS", "CacheStats", "CapturedFunction", "DynamicSpec", "Fallback"]

Fallback = Literal["raise", "eager"]
_is_compiling = torch.compiler.is_compiling
_fw_ad = torch.autograd.forward_ad  # its _current_level: -1 unless a dual_level (or torch.func.jvp) is open
_NOTHING: dict[str, Any] = {}
_RECENT = 8  # captures a call is checked against before a key is built
# (the methods key they were made for, its generated check, the captures): see ``_recent``
_Recent = tuple[tuple[Any, ...], Callable[[type], bool], tuple[Capture, ...]]
_NO_RECENT: _Recent = ((), lambda F: False, ())
_NOTHING_HELD = real_run_shows([])  # (a hit: nothing to show; with nothing held it keeps no state)
DynamicSpec = bool | Mapping[int | str, Sequence[int]]


@dataclasses.dataclass
class CacheStats:
    """Counts for one CapturedFunction (read them in tests; never time them)."""

    hits: int = 0
    captures: int = 0
    eager_calls: int = 0
    evictions: int = 0


@dataclasses.dataclass(frozen=True)
class _Refused:
    """A key minihop could not capture, run eagerly under ``fallback="eager"``."""

    error: Exception
    # A trace that raised in minihop's own code (what, where): minihop's failure if eager then
    # runs without error (``CapturedFunction._failed``).
    suspect: str | None = None


def capture(fn_cls: type, /, *args: Any, dynamic: Any = None, eager_backward: bool = False) -> Capture:
    """The cache's capture of ``fn_cls`` for bound ``args``: ``pipeline.run_pipeline``, not
    ``pipeline.capture``, whose check for a keyword shadowing a forward parameter is for a
    caller's own keywords (here ``dynamic`` is this cache's, never the user's).
    ``eager_backward`` (``fallback="eager"``): a backward refused when it runs, after forward
    ran captured, runs the user's backward eagerly, as the rest of that policy does."""
    return run_pipeline(fn_cls, args, {}, dynamic, eager_backward=eager_backward)[1]


def _tangent_in(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether a tensor among the arguments carries a forward-mode tangent."""
    return any(issubclass(type(t), torch.Tensor) and _fw_ad.unpack_dual(t).tangent is not None
               for t in torch.utils._pytree.tree_leaves((args, kwargs)))


def _jvp_transform() -> bool:
    """Whether a functorch forward-mode transform is active (``torch.func.jvp``, ``jacfwd``,
    ``hessian``): under it a call's tangents are functorch's, which ``unpack_dual`` does not
    show (``jvp(grad(f))``: the tensors the Function gets are the grad level's)."""
    return any(i.key() == _JVP for i in _functorch.get_interpreter_stack() or ())


_modes_active = (torch._C._len_torch_function_stack, torch._C._len_torch_dispatch_stack)
_transforms_active = torch._C._are_functorch_transforms_active
_functorch = torch._C._functorch
_JVP = _functorch.TransformType.Jvp


def _slot(i: int, value: Any) -> tuple[int, Any] | None:
    """Where the automatic policy records argument ``i``'s sizes: per rank for a tensor, once
    for an int (not a bool); None for anything else (keyed by value)."""
    if issubclass(type(value), torch.Tensor):
        return (i, value.dim())
    return (i, "int") if type(value) is int else None


class CapturedFunction(CopiedAsFunction):
    """``F.apply`` through a guarded cache of captures; ``.apply`` is the drop-in."""

    # Not the user's state where it sits on a user's class or object (``library_state.minihops``):
    # what it runs is keyed when it runs.
    _minihop_own = True

    def __init__(self, fn_cls: type, *, fallback: Fallback = "raise", dynamic: DynamicSpec | None = None,
                 cache_limit: int = 8, eager_apply: Any = None, compile_cls: type | None = None) -> None:
        if fallback not in ("raise", "eager"):
            raise ValueError(f"fallback must be 'raise' or 'eager', got {fallback!r}")
        self.fn_cls = fn_cls
        self.fallback: Fallback = fallback
        self.dynamic = dynamic
        self.cache_limit = cache_limit
        self.stats = CacheStats()
        # (called as from the user's frames: a warning's stacklevel names eager's frame; inside
        # another Function's trace, inlined as it is: stand-ins there would be code no analysis reached)
        self._inline_apply = eager_apply  # (else the class's, as eager loads it per call: class_apply)
        self._eager_apply = as_called(eager_apply, None if eager_apply else lambda again: class_apply(fn_cls, again))
        # The class whose ``.apply`` the compiler is given (it recognises only a Function
        # class's own apply): fn_cls, or for @captured an undecorated twin of it.
        self._compile_cls = compile_cls or fn_cls
        self._entries: OrderedDict[Any, list[Capture | _Refused]] = OrderedDict()
        self._lock = threading.RLock()
        self._warned: set[str] = set()
        # The captures that ran most recently (newest first, at most _RECENT), with the
        # Function's methods they were made for and that key's generated check
        # (``methods_check``): a call like a recent one (the steady state of a training loop,
        # where one Function may serve several layers) is checked against their compiled guards
        # before any key is built. One tuple, replaced whole and never mutated, so a reader in
        # another thread sees captures and the methods they were made for together.
        self._recent: _Recent = _NO_RECENT
        self._holding: dict[int, Any] = {}  # what the keys' ids name (see methods_key)
        # Automatic policy (dynamic=None): per (argument position, rank) the sizes seen on
        # misses, None where they differed; and whether a symbolic trace was refused.
        self._seen: dict[tuple[int, int], tuple[int | None, ...]] = {}
        self._auto_failed = False
        ALIVE.add(self)

    def __repr__(self) -> str:
        return (f"<minihop.function {self.fn_cls.__qualname__} fallback={self.fallback!r} "
                f"entries={len(self._entries)} {self.stats}>")

    @property
    def captures(self) -> list[Capture]:
        """The captures currently cached."""
        return [e for entries in self._entries.values() for e in entries if issubclass(type(e), Capture)]

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._recent = _NO_RECENT
            self._seen = {}
            self._auto_failed = False

    def _find(self, key: Any, args: tuple[Any, ...]) -> Capture | _Refused | None:
        for entry in self._entries.get(key, ()):
            if issubclass(type(entry), _Refused):
                return entry
            if entry.fits(args):
                # Anything else is a miss (a closure value, a value forward read from tensor
                # data that changed): captured again, kept beside the old (within cache_limit).
                return entry
        return None

    def apply(self, *args: Any, **kwargs: Any) -> Any:
        if _is_compiling():
            # Under torch.compile: hand the Function to the compiler as it is, which captures it
            # the way minihop models (its own autograd_function_apply); minihop's cache, locks
            # and generated code are not for it to trace.
            return self._compile_cls.apply(*args, **kwargs)
        return self._apply(args, kwargs)

    def _forward_ad(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """A call with a forward-mode tangent: eager runs the Function's own ``jvp`` on a ctx
        forward filled, which a capture does not trace. Refused (fallback: eager's)."""
        return self._refused_call("forward ad", args, kwargs, UnsupportedOperationError(
            f"{self.fn_cls.__qualname__} was called with a dual tensor (forward-mode AD: "
            "torch.autograd.forward_ad.make_dual, or torch.func.jvp, jacfwd, hessian).",
            "Eager runs the Function's jvp for the tangents; minihop captures forward and "
            "backward only, so its capture has no jvp to run.",
            "Call F.apply for forward-mode AD, or use minihop.function(F, fallback=\"eager\")."))

    def _under_modes(self, modes: list[str], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """A call made while torch function or dispatch modes are active:
        refused (fallback: eager's), whether or not a capture would fit (``run_context.observing_modes``)."""
        return self._refused_call("modes", args, kwargs, modes_refusal(self.fn_cls.__qualname__, modes))

    def _refused_call(self, kind: str, args: tuple[Any, ...], kwargs: dict[str, Any],
                      error: MinihopError) -> Any:
        if self.fallback == "raise":
            raise error
        self._warn_once(kind, f"minihop: running {self.fn_cls.__qualname__} eagerly (fallback='eager'): {error}")
        with self._lock:
            self.stats.eager_calls += 1
        return self._eager_apply(*args, **kwargs)

    __call__ = apply

    def _apply(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if _fw_ad._current_level >= 0 and _tangent_in(args, kwargs) or _transforms_active() and _jvp_transform():
            return self._forward_ad(args, kwargs)
        if (_modes_active[0]() or _modes_active[1]()) and not tracing():
            modes = observing_modes()
            if modes:
                return self._under_modes(modes, args, kwargs)
        _, same_methods, recent = self._recent
        if recent and not kwargs and same_methods(self.fn_cls):
            for cap in recent:
                if cap.fits(args):
                    if tracing():
                        break
                    lock = self._lock
                    lock.acquire()  # (not ``with``: its protocol costs more than the two counts)
                    self.stats.hits += 1
                    TOTALS["cache_hits"] += 1
                    lock.release()
                    return cap.run(args)
        refusal = class_answering_refusal(self.fn_cls.__qualname__, (*args, *kwargs.values()), "argument")
        if refusal is not None:
            return self._refused_call("class", args, kwargs, refusal)
        if tracing():
            # Applied inside another Function being traced: inline it, as eager's no-grad
            # forward would run it.
            return (self._inline_apply or class_apply(self.fn_cls))(*args, **kwargs)
        args = bind_arguments(self.fn_cls, args, kwargs)
        dims = self._dims(args)
        try:
            key = self._key(args, dims)
        except RuntimeError:  # (a lazy module's parameter has no shape: refused, not torch's error)
            lazy = lazy_module_refusal(self.fn_cls.__qualname__, args)
            if lazy is None:
                raise
            return self._refused_call("lazy", args, kwargs, lazy)
        entry = self._find(key, args)
        shows = _NOTHING_HELD  # (the warnings a trace of this call held back: tracer.messages)
        with self._lock:
            if entry is None:
                entry = self._find(key, args)
            if entry is None and self._note_sizes(args) | (self._dims(args) != dims):
                # Automatic dynamic: a size changed (in this call, or in another thread's since
                # this one read the state), so that dimension is symbolic from now on.
                dims = self._dims(args)
                key = self._key(args, dims)
                entry = self._find(key, args)
            if entry is None:
                # Filed under another key (made before a dimension turned symbolic, or for a
                # size of 0 or 1), yet fit for this call.
                entry = self._any_hit(key[0], args)
            if entry is None:
                take_held()  # (an earlier trace's, not this call's)
                entry = self._capture(key, args, dims)
                shows = real_run_shows(take_held())
            else:
                self.stats.hits += 1
                TOTALS["cache_hits"] += 1
            if issubclass(type(entry), _Refused):
                self.stats.eager_calls += 1
                TOTALS["fallbacks"] += 1
        if issubclass(type(entry), _Refused):
            with shows:
                out = self._eager_apply(*args)
            if entry.suspect is not None:
                self._failed(entry.suspect)
            return out
        if entry.python_state.single_use:
            with shows:
                return entry.run(args)  # serves this call only (see _capture): never a recent hit
        methods, same_methods, recent = self._recent
        if key[0] != methods:
            methods, same_methods, recent = key[0], methods_check(self.fn_cls, key[0]), ()
        self._recent = (methods, same_methods, (entry, *(c for c in recent if c is not entry))[:_RECENT])
        with shows:
            return entry.run(args)

    def _dims(self, args: tuple[Any, ...]) -> dict[int, tuple[int, ...]]:
        """The dynamic dimensions of a capture for these (bound) arguments: the policy's (for
        the automatic one, the dimensions whose size has changed), with the tensors' marks."""
        policy = self.dynamic
        if policy is None:
            policy = {} if self._auto_failed else {
                i: () if type(a) is int else tuple(d for d, n in enumerate(seen) if n is None)
                for i, a in enumerate(args) for seen in (self._seen.get(_slot(i, a)),)
                if seen is not None and None in seen}
        return dynamic_dims(self.fn_cls, args, policy)

    def _key(self, args: tuple[Any, ...], dims: dict[int, tuple[int, ...]]) -> Any:
        self._holding.update((id(o), o) for o in methods_held(self.fn_cls))  # (see methods_key)
        return (methods_key(self.fn_cls), guard_key(self.fn_cls, args, dims or None))

    def _note_sizes(self, args: tuple[Any, ...]) -> bool:
        """Record the tensor arguments' sizes (automatic policy, on a miss); whether a size
        differs from one seen before (its dimension is then dynamic, as Dynamo's automatic
        dynamic shapes make it). Per argument position and rank; a rank change is a new key."""
        if self.dynamic is not None or self._auto_failed:
            return False
        changed = False
        for i, a in enumerate(args):
            slot = _slot(i, a)
            if slot is None:
                continue
            # An int argument is recorded as a shape of no dimensions: a changed value makes it
            # a SymInt (dims ``()``), as Dynamo makes an int that changes.
            shape = tuple(a.shape) if issubclass(type(a), torch.Tensor) else (a,)
            seen = self._seen.setdefault(slot, shape)
            merged = tuple(s if s == n else None for s, n in zip(seen, shape, strict=True))
            if merged != seen:
                self._seen[slot] = merged
                changed = True
        return changed

    def _any_hit(self, methods: Any, args: tuple[Any, ...]) -> Capture | None:
        return next((e for key, entries in self._entries.items() if key[0] == methods
                     for e in entries if issubclass(type(e), Capture) and e.fits(args)), None)

    def _count(self) -> int:
        return sum(len(entries) for entries in self._entries.values())

    def _capture(self, key: Any, args: tuple[Any, ...], dims: dict[int, tuple[int, ...]]) -> Capture | _Refused:
        # Captures for other closure/global values stay (the value may come back) and count
        # toward the limit.
        if self._count() >= self.cache_limit:
            self._warn_once("limit", (
                f"minihop: {self.fn_cls.__qualname__} reached cache_limit={self.cache_limit} "
                "captures (arguments with many different shapes, dtypes or values?). "
                + ("New cases now run eagerly." if self.fallback == "eager" else
                   "The oldest capture is evicted for each new one; consider "
                   "dynamic=True or a higher cache_limit.")))
            if self.fallback == "eager":
                return _Refused(MinihopError(
                    f"{self.fn_cls.__qualname__} is past its cache limit.",
                    "Each distinct argument key needs its own capture.", "Raise cache_limit."))
            oldest_key = next(iter(self._entries))
            oldest = self._entries[oldest_key]
            evicted = oldest.pop(0)
            methods, same_methods, recent = self._recent
            self._recent = (methods, same_methods, tuple(c for c in recent if c is not evicted))
            if not oldest:
                del self._entries[oldest_key]
            self.stats.evictions += 1
        try:
            entry: Capture | _Refused = self._traced(args, dims)
            self.stats.captures += 1
            TOTALS["captures"] += 1
            key = (key[0], entry.key)  # its own dimensions' key (static, if it fell back)
        except MinihopError as e:
            if self.fallback == "raise":
                raise
            self._warn_once("fallback", (
                f"minihop: running {self.fn_cls.__qualname__} eagerly (fallback='eager'): "
                f"{e}"))
            release_frames(e)
            entry = _Refused(e)
        except Exception as e:
            # The user's own error, raised while traced (a backward that raises
            # NotImplementedError, which eager raises only if someone differentiates): eager
            # decides, as without minihop (its Python writes before the error stay made, its
            # exception propagates; the trace put back what it changed). Nothing is kept: the
            # next call traces again. One raised in minihop's own code that eager does not raise
            # is minihop's failure: eager's answer stands, and it is said, never hidden.
            where = _minihops_frame(e)
            release_frames(e)
            return _Refused(MinihopError(f"{type(e).__name__} while tracing: {e}", "", ""),
                            None if where is None else f"{type(e).__name__} at {where}: {e}")
        if issubclass(type(entry), Capture) and entry.python_state.single_use:
            # Its code read or ran what minihop cannot bound (tracer.opaque): right for the call
            # it was traced for, unknown for any other. Not filed: strict mode captures again
            # on the next call; fallback="eager" runs the next calls of this key eagerly.
            counters_single_use[self.fn_cls.__qualname__] = entry.python_state.single_use
            if self.fallback == "eager":
                self._entries.setdefault(key, []).append(_Refused(MinihopError(
                    f"{self.fn_cls.__qualname__}'s capture is single-use: "
                    + "; ".join(entry.python_state.single_use),
                    "minihop cannot bound what that code reads, so no later call can reuse it.",
                    "Pass what it reads as arguments, or keep running it eagerly.")))
            return entry
        self._entries.setdefault(key, []).append(entry)
        self._entries.move_to_end(key)
        return entry

    def _traced(self, args: tuple[Any, ...], dims: dict[int, tuple[int, ...]]) -> Capture:
        """``capture`` for ``dims``. Under the automatic policy, a Function whose symbolic
        trace fails where a static one works (a float made from sizes reaching an op, a size
        used as a dict key: symbolic sizes are an optimisation, never a new error) is captured
        static instead, and stays static per size from then on."""
        try:
            return capture(self.fn_cls, *args, dynamic=dims, eager_backward=self.fallback == "eager")
        except Exception:
            static = dynamic_dims(self.fn_cls, args, False)  # the marks' dimensions only
            if self.dynamic is not None or dims == static:
                raise
        cap = capture(self.fn_cls, *args, dynamic=static, eager_backward=self.fallback == "eager")  # fails too: the call's own error
        self._auto_failed = True
        return cap

    def _failed(self, what: str) -> None:
        """Tracing raised ``what`` in minihop's own code, and eager ran without error."""
        TOTALS["internal_errors"] += 1
        INTERNAL_ERRORS.append(what)
        self._warn_once("internal", (
            f"minihop: tracing {self.fn_cls.__qualname__} raised {what} inside minihop, where eager "
            "raises nothing. It ran eagerly; this is a bug in minihop, please report it."))

    def _warn_once(self, what: str, message: str) -> None:
        if what not in self._warned:
            self._warned.add(what)
            notice(message, stacklevel=4)


# Every CapturedFunction alive (for entries.reset()), and process-wide totals (entries.counters()).
ALIVE: weakref.WeakSet[CapturedFunction] = weakref.WeakSet()
TOTALS: dict[str, int] = {"captures": 0, "cache_hits": 0, "fallbacks": 0, "internal_errors": 0}
_PACKAGE = __file__.rsplit("/", 1)[0] + "/"
INTERNAL_ERRORS: list[str] = []  # each one, kept across ``reset()`` (the suite fails a test on one)


def _minihops_frame(error: BaseException) -> str | None:
    """Where ``error`` was raised, if in minihop's own code (not the user's, not torch's)."""
    tb = error.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None or not tb.tb_frame.f_code.co_filename.startswith(_PACKAGE):
        return None
    return f"{tb.tb_frame.f_code.co_filename[len(_PACKAGE):]}, line {tb.tb_lineno}"


# Function name -> why its last capture was single-use (for measuring; never read on a hit).
counters_single_use: dict[str, tuple[str, ...]] = {}


