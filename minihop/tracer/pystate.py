"""Python state a user's Function reads and writes: found, guarded, replayed or refused.

Place in the pipeline: tracer. A capture replays tensor operations only, so everything the
user's ``forward``/``setup_context``/``backward`` do with ordinary Python values outside their
arguments' tensors must be handled here, or the capture would silently disagree with eager:

- **Reads** (a class attribute ``MyFn.scale``, a module global, a closure cell, an attribute
  of an object reached from them or from ``ctx``, an attribute of a user module) are found in
  the bytecode of the three methods and of the user's helper functions they reach
  (``LOAD_GLOBAL``/``LOAD_DEREF``/``LOAD_FAST`` followed by ``LOAD_ATTR``/constant subscripts),
  and each becomes a ``StateRead``, valid only while its value is unchanged (checked on every
  call, and again when backward runs for backward's reads, and for what a function forward
  defines reads: backward may call it). Reading more only costs a recapture; reading less
  would be a stale answer. Arguments themselves are in the call key (``runtime.guards``).
- **Writes** are judged by what runs, not by what is written: the Python state reachable
  from those same roots (and from the arguments) is snapshotted before tracing and compared
  after forward and after backward. A counter incremented (``+=``), a list extended with
  Python values, an attribute or item set to a constant becomes a ``StateWrite``, replayed on
  every call (the trace's own writes are undone, so capture leaves Python state as it found
  it). Any other write, and any ``print`` that runs, is a ``SideEffectError`` naming the place
  and the source line (or, with ``fallback="eager"``, an eager run).

The pieces: ``roots`` finds the reads (bytecode chains resolved to roots), ``heap`` snapshots
and diffs the state below them by its rule table, ``library`` says what is the user's; this
module drives them around one capture and raises the refusals.

Invariant: after ``StateTracker.finish`` the Python state is as it was before tracing, and
every difference tracing made is either in ``PythonState.writes`` or was raised as an error.
"""

from __future__ import annotations

import contextlib
import builtins
import dataclasses
import functools
import logging
import types
from collections.abc import Callable, Iterable
from typing import Any

import torch

from ..errors import release_frames
from ..library_state import subclass_attributes
from ..spec import MISSING, UNMATCHED, Place, PythonState, Root, StateRead, StateWrite
from . import collectives, heap, hidden, identity, kinds, messages, opaque, store_marks
from .opaque import constant_getattrs
from .library_ran import LibraryRan
from .atoms import ATOMS
from .cache_entries import lru_sites, lru_sites_of
from .chains import STATE_DEPENDENT_CALLS
from .heap import Difference, Seen, argument_seen
from .iterators import refuse_iterator_read
from .library import NEVER_DRAW, bounded, is_library, library_module
from .method_reads import places_named
from .module_reads import builtin_places, note_through_library
from .names import code_of
from .roots import (ENVIRONMENT, FLAG_PLACES, MODULE_HOOKS, UNANALYSED, analysed, arg_masks, guarded_value, method_objects,
                    methods_and_passed, place_at, reads_environment, resolve_root, tensor_holder, walk)
from .settings import backends_place, setting_place
from .state_writes import drawn, refuse_hidden_reads, refused, too_much_state, write_of
from .tensor_attr_reads import tensor_attribute_reads
from .userattr import UserAttribute

__all__ = ["StateTracker", "arg_masks", "is_library"]



class StateTracker:
    """Watches Python state across one capture's tracing (see the module docstring)."""

    def __init__(self, parts: Any, args: tuple[Any, ...], fn_cls: type, real_args: tuple[Any, ...] | None = None) -> None:
        self.parts = parts
        self.name = parts.name
        self.args = args
        self.reads: list[StateRead] = []
        self.roots: list[tuple[Root, Any]] = []
        self.stores: dict[tuple[str, str], str] = {}  # (phase, name stored) -> where
        # (phase, root, name) written by ``+=``/``-=``: ``F.calls += 1`` is (.., "F", "calls")
        self.increments: set[tuple[str, str, str]] = set()
        self.watch: messages.PrintWatch | None = None
        self.hidden_reads: hidden.ReadWatch | None = None
        self.may_draw = False  # whether Python's generator may be drawn from where the code does not name it
        self.messages: messages.MessageWatch | None = None
        self.forward_writes: list[StateWrite] | None = None
        self.hidden_sites: dict[tuple[Any, ...], tuple[Any, str, Any, str, str]] = {}  # (id, where) -> (holder, name, fn, kind, what)
        self.fn_cls = fn_cls
        # ``(expr, where, how) -> error`` for a symbolic number written out (see unbacked).
        self.on_symbolic: Callable[[Any, str | None, str], Exception] | None = None
        self.ctx_view: Callable[[], Any] = contextlib.nullcontext
        self._read_keys: set[tuple[str, str]] = set()
        self.logs = False  # whether the code reaches logging or a logger (their levels are watched)
        self.opaque = opaque.Finder(self.name, library_module)  # why it may be single-use
        self.library = LibraryRan()  # the library code the call runs, where the CallWatch runs
        self.analysed = tuple(analysed(methods_and_passed(self.parts, self.args)))  # read once: three passes use it
        self._find_reads()
        self.marked = store_marks.mark(self.analysed, self.reads, self.args)
        reached: dict[int, list[Any]] = {}  # the tensors the walk reached, and where (identity)
        try:
            self.before = self._snapshot(reached)
            identity.outside_aliases(self.name, reached, real_args, parts.argnames)
        except BaseException:
            store_marks.unmark(self.marked)  # no tracker comes back to do it
            raise
        self.outside_tensors = identity.outside_tensors(reached)
        self.after_forward: dict[int, Seen] | None = None
        self.forward_diff: list[Difference] = []  # (heap.changes from before to after_forward)
        self.finished = False
        # A backward traced again for a real call stands for that call (``rerun_backward``):
        # a write it cannot repeat stays made, as eager's, and makes its trace serve that call only.
        self.standing = False
        self.unreplayable: list[str] = []

    # reads: every chain of the code whose value is the user's state
    def _find_reads(self) -> None:
        seen_roots: set[str] = set()
        for phase, fn, facts, params in self.analysed:
            code = code_of(fn)
            self.opaque.note_code(phase, code)
            kinds.refuse_class_reads(self.name, phase, code, self.args)
            for attr, line in facts.stores:
                self.stores.setdefault((phase, attr), f'File "{code.co_filename}", line {line}')
            for chain in facts.chains:
                if chain.use == "increment":
                    self.increments.add((phase, chain.root, str(chain.steps[-1][1]) if chain.steps else chain.root))
            through_getattr = constant_getattrs(code)  # (``getattr(torch, "k")`` as ``torch.k``)
            for chain in (*facts.chains, *through_getattr):
                phases = (phase, "backward") if chain.deferred and phase == "forward" else (phase,)  # (Chain.deferred)
                root = resolve_root(fn, chain, params, len(self.args))
                if root is None and chain.root_kind == "global" and chain.root not in getattr(fn, "__globals__", {}):
                    if not bounded(getattr(builtins, chain.root, len)):  # ``open``, ``eval``: a builtin, unknown
                        self.opaque.unknown(phase, f"{phase} calls {chain.root}, library code that may answer from "
                                            f'files, the system or code it runs (File "{code.co_filename}", line {chain.line})')
                    for place in builtin_places(fn.__globals__, chain.root):  # (unless rebound: by identity)
                        self._add_read(place, phases, code, chain.line)
                if root is None:
                    continue
                value = root.fetch(self.args)
                if chain in through_getattr and not (issubclass(type(value), types.ModuleType) and is_library(value)) \
                        and not issubclass(type(walk(value, chain.steps[:-1])), torch.Tensor):
                    continue  # (the user's object: keyed whole where it is read; a tensor's attributes are not)
                named = chain.steps if chain.method is None else (*chain.steps, ("attr", chain.method))
                named_end = walk(value, named) if named else value  # what the code calls or reads
                self.logs = self.logs or any(v is logging or issubclass(type(v), logging.Logger) for v in (value, named_end))
                setting = FLAG_PLACES.get(id(named_end)) or setting_place(named_end) or backends_place(root, value, chain.steps)
                calls = "singledispatch" if setting is not None and setting.description.endswith("'s registry") else \
                    "stack" if kinds.reads_stack(named_end) else "numpy" if kinds.numpy_value(named_end) else None
                if calls is not None:
                    kinds.refuse_class_reads(self.name, phase, code, self.args, calls)
                if not root.uses_args:  # (arguments: pipeline asked before the trace)
                    refuse_iterator_read(self.name, phase, chain.root, named_end)
                    if chain.method is not None and setting is None:
                        # ``LOG.write(s)``: the object it is called on (``CV.get()`` is a setting's read)
                        refuse_iterator_read(self.name, phase, chain.root, walk(value, chain.steps))
                self.opaque.note_chain(phase, code, chain, value, named_end, root.uses_args)
                self._find_hidden_read(root, value, named, named_end, f'File "{code.co_filename}", line {chain.line}')
                if hidden.setter(named_end) and not any(k[0] == id(named_end) for k in self.hidden_sites):
                    self.opaque.unknown(phase, f"{phase} calls a library's setter reached where it cannot be held back "
                                        f'(an item, an argument, a partial: File "{code.co_filename}", line {chain.line})')
                environment = reads_environment(value, named)  # (``os.environ.get``: guarded whole)
                if setting is None and not environment and callable(named_end) \
                        and is_library(named_end) and hidden.watched(named_end) is None:
                    kinds.refuse_torch_io(self.name, phase, code, chain.line, named_end)  # (and the trace's modes)
                    if not bounded(named_end):  # unknown: right for the call it is traced for
                        self.opaque.unknown(phase, f"{phase} calls {getattr(named_end, '__qualname__', repr(named_end))}, "
                                            f"library code that may answer from files, the system or settings no key holds "
                                            f'(File "{code.co_filename}", line {chain.line})')
                if environment:
                    self._add_read(ENVIRONMENT, phases, code, chain.line)
                if issubclass(type(named_end), type) and issubclass(named_end, torch.nn.Module):
                    self._add_read(MODULE_HOOKS, phases, code, chain.line)  # a module it builds runs them
                if setting is not None:
                    self._add_read(setting, phases, code, chain.line)
                for place in places_named(root, value, chain.steps, chain.method, code):  # MATHLIB.cos, MyFn.scale(t)
                    self._add_read(place, phases, code, chain.line)
                if issubclass(type(value), types.ModuleType) and is_library(value):
                    # torch.sin, math.pi: the module's attributes are not the user's state; the
                    # user's own module reached through one is (``sys.modules["cfg"].n += 1``).
                    note_through_library(self, root, value, chain, phases, seen_roots, code)
                    continue
                if root.description not in seen_roots:
                    seen_roots.add(root.description)
                    self.roots.append((root, value))
                if root.uses_args:  # argument objects are in the call key, whole (a function forward
                    if "backward" in phases[1:] and chain.use == "value" and chain.steps and guarded_value(
                            walk(value, chain.steps)):  # defines reads one when backward calls it)
                        self._add_read(place_at(root, chain.steps), "backward", code, chain.line)
                    continue
                if chain.use == "receiver" and chain.method in STATE_DEPENDENT_CALLS:  # ``D.pop("k", None)``
                    self._add_read(place_at(root, chain.steps), phases, code, chain.line)
                if chain.use in ("receiver", "increment"):
                    continue
                end = walk(value, chain.steps)
                if not guarded_value(end) or (not chain.steps and not guarded_value(value)):
                    continue
                # Through a user getter: a place that stops there (never runs it), so a backward
                # read of it never matches and backward is traced again when it runs, running
                # the getter then, as eager's backward does (the capture is single-use).
                self._add_read(place_at(root, chain.steps, issubclass(type(end), UserAttribute)), phases, code, chain.line)
                if issubclass(type(end), functools.partial):
                    # What the partial passes is read too (its keywords may change in place).
                    for part in ("args", "keywords"):
                        self._add_read(place_at(root, (*chain.steps, ("attr", part))), phases, code, chain.line)
        for place in collectives.world_places():  # rank, world size, groups: constants in the graphs
            self._add_read(place, "forward", None, None)
        for phase, found in method_objects(self.parts):  # a method that is a partial, or no function at all
            self._add_read(found, phase, None, None, found.description) if issubclass(type(found), Place) \
                else self.opaque.unknown(phase, found)
        # The Function class is watched when its code names it (``MyFn.calls += 1``): a root above.

    def _find_hidden_read(self, root: Root, value: Any, steps: tuple[tuple[str, Any], ...], end: Any, where: str) -> None:
        """A clock read, a process-wide generator's function or an lru_cache helper that the code names
        (``time.time``, ``np.random.rand``; ``end``, at ``steps`` from ``value``): where to watch it (hidden.ReadWatch)."""
        self.hidden_sites.update(lru_sites(self.name, root, value, steps, end, where))  # (a dict's item, a wrapper's cell)
        found = hidden.watched(end)
        if found is None:
            # A library function outside torch and math may draw from Python's generator
            # where the code cannot see it: then the generator's state is compared too.
            if callable(end) and not issubclass(type(end), type) and is_library(end) and \
                    (getattr(end, "__module__", None) or "").split(".")[0] not in NEVER_DRAW:
                self.may_draw = True
            return
        if steps and steps[-1][0] == "attr":
            self.hidden_sites[(id(end), steps[-1][1])] = (walk(value, steps[:-1]), steps[-1][1], end, *found)
        elif not steps and root.home is not None and root.kind == "global":
            self.hidden_sites[(id(end), root.key)] = (root.home, root.key, end, *found)
        elif not steps and root.home is not None and root.kind == "cell":
            self.hidden_sites[(id(end), "cell")] = (root.home, "cell_contents", end, *found)
        elif found[0] == "random":
            self.may_draw = True  # reached where it cannot be swapped (a table): compare the state

    def _add_read(self, place: Place, phases: str | tuple[str, ...], code: types.CodeType | None, line: int | None,
                  where: str | None = None) -> None:
        for phase in (phases,) if issubclass(type(phases), str) else phases:
            if (place.description, phase) not in self._read_keys:
                self._read_keys.add((place.description, phase))
                self.reads.append(StateRead(place, phase, f'File "{code.co_filename}", line {line}' if code else where))

    def read_ctx_chains(self, ctx: Any) -> None:
        """Backward's reads through ctx (``ctx.cfg.scale``): after forward ran, ``ctx.cfg`` is
        an object; if it is one reachable from the arguments or globals, the read is of that
        place (and checked again when backward runs). Objects forward created are its own."""
        index = {id(seen.obj): seen for seen in (self.after_forward or self.before).values() if seen.kind != "tensor"}
        roots = {id(value): Seen(value, root, (), "attrs", None) for root, value in self.roots}
        for phase, fn, facts, params in self.analysed:
            code = code_of(fn)
            for chain in facts.chains:
                if chain.root_kind != "fast" or params.get(chain.root) != "ctx" or chain.use != "value":
                    continue
                if not chain.steps and chain.method is not None:  # ``ctx.fn(g)``: a callable kept on ctx
                    chain = dataclasses.replace(chain, steps=(("attr", chain.method),), method=None)
                if not chain.steps:
                    continue
                # What the user set on ctx (never a property such as saved_tensors: reading it
                # unpacks, and its fresh tuple's id could be any snapshotted object's).
                first = vars(ctx).get(str(chain.steps[0][1]), MISSING) if chain.steps[0][0] == "attr" else MISSING
                if issubclass(type(first), (*ATOMS, torch.SymInt, torch.SymFloat, torch.SymBool, torch.Tensor)) and subclass_attributes(first) is None:
                    continue  # a value, not a holder (a symbolic size is each call's own; a ``Knob(int)`` holds some)
                # The deepest object along the chain that is the caller's (snapshotted, an
                # argument, a global's value): a container forward made may hold one
                # (``ctx.fns = {"sg": fn}``, then ``ctx.fns["sg"](g)``).
                seen, rest = None, chain.steps[1:]
                for k in range(len(chain.steps), 0, -1):
                    obj = walk(first, chain.steps[1:k])
                    if obj is MISSING or issubclass(type(obj), ATOMS) and subclass_attributes(obj) is None:
                        continue  # a value (a small int is one object wherever it is held)
                    seen = index.get(id(obj)) or argument_seen(obj, self.args, self.parts.argnames) \
                        or roots.get(id(obj))
                    if seen is not None:
                        first, rest = obj, chain.steps[k:]
                        break
                if seen is None:
                    continue
                steps, end = tensor_holder((*seen.steps, *rest), walk(first, rest), lambda: walk(first, rest[:-1]))
                if guarded_value(end):
                    self._add_read(place_at(seen.root, steps, issubclass(type(end), UserAttribute)), phase, code, chain.line)
        for place, code in tensor_attribute_reads(self.analysed, self.args, self.parts.argnames, ctx):
            self._add_read(place, "backward", code, code.co_firstlineno)

    # writes: snapshots of everything reachable from the roots
    def start(self) -> None:
        """Before the user's code runs: watch ``print`` and the clock."""
        sites = {**lru_sites_of(self.name, [fn for _, fn, _, _ in self.analysed]), **self.hidden_sites}  # (globals, defaults)
        self.watch = builtins.print = messages.PrintWatch()  # (after what may refuse: ``abort`` puts nothing back then)
        codes = {fn.__code__ for _, fn, _, _ in self.analysed if hasattr(fn, "__code__")}
        spaces = {fn.__code__: fn.__globals__ for _, fn, _, _ in self.analysed if hasattr(fn, "__code__") and hasattr(fn, "__globals__")}
        self.opaque.start(codes, self.args, spaces, self.library,
                          {fn.__code__ for phase, fn, _, _ in self.analysed if phase == "backward" and hasattr(fn, "__code__")})
        self.hidden_reads = hidden.ReadWatch(list(sites.values()), self.may_draw, lambda frame: frame.f_code in codes
                                             or not library_module(frame.f_globals.get("__name__") or ""), self.name)
        self.hidden_reads.existed, self.hidden_reads.unknown = self.existed_before, self.opaque.unknown  # (the heap watch's)
        self.hidden_reads.read = lambda place, phase, where: self._add_read(place, phase, None, None, where)
        self.messages = messages.MessageWatch(self.hidden_reads.is_user, passing=self.standing, modules=spaces.values())

    def stop(self, names_only: bool = False) -> None:
        """The names the watches swapped (``print``...) the user's again; then the code watches."""
        if self.watch is not None:
            builtins.print = self.watch.real
        for watch in (w for w in (self.messages, self.hidden_reads) if w is not None):  # (messages first)
            watch.stop()
        if not names_only:
            self.opaque.stop()

    def abort(self) -> None:
        """After tracing, however it ended: state put back, first with the code watches on (a ``__del__`` run there is seen)."""
        if not self.finished:
            self.after_forward, self.forward_diff, self.forward_writes = None, [], None  # (forward's objects)
            self.stop(names_only=True)  # (what the put-back sees: the user's bindings, not stand-ins)
            heap.restore(self.before)
        self.stop()
        if not self.finished:
            self.finished, wrote = True, bool(self.opaque.undo)  # (unanalysed code ran, a ``__del__`` too)
            self.opaque.put_back()
            if wrote:
                heap.restore(self.before)
            store_marks.unmark(self.marked)
            self.marked = []
        self.before, self.after_forward, self.forward_diff = {}, None, []  # (see ``release``)

    def release(self) -> None:
        """What it holds of the caller's objects, let go once the trace is done: the tracker lives
        on in a cycle with its watches, and an object eager frees when the caller lets go must die
        then (its ``__del__``, a weak reference's entry), not at the collector's next run."""
        self.args, self.roots, self.before, self.after_forward, self.forward_diff = (), [], {}, None, []
        self.opaque.reachable, self.opaque.calls, self.opaque.getattrs = [], None, None

    def is_user(self, frame: types.FrameType) -> bool:
        """Whether ``frame`` runs the user's code (not torch's, minihop's or a library's)."""
        return self.hidden_reads is not None and self.hidden_reads.is_user(frame)

    def keep_partial(self) -> None:
        """The user's backward raised while traced again for a real call (after forward ran):
        eager's backward would have raised there too, its Python writes before the error made.
        The trace's writes stay, where each is one minihop would replay (plain values: no
        fake tensor, no symbolic number in them); otherwise ``abort`` puts all back."""
        self.stop()
        try:
            self._writes(self.after_forward or self.before, self._snapshot(), "backward")
        except Exception:
            return
        self.finished = True
        self.opaque.undo.clear()  # what unanalysed code wrote stays too, as in finish
        store_marks.unmark(self.marked)
        self.marked = []

    def _snapshot(self, tensors: dict[int, list[Any]] | None = None) -> dict[int, Seen]:
        real_of = None if self.hidden_reads is None else self.hidden_reads.real_of
        try:
            return heap.snapshot([root for root, _ in self.roots], self.args, self.parts.argnames, real_of, tensors, self.logs)
        except heap.TooMuchState as e:
            raise too_much_state(self.name, str(e)) from None

    def existed_before(self, value: Any) -> bool:
        """Whether ``value`` is an object of the Python state forward found (not its own)."""
        return (seen := self.before.get(id(value))) is not None and seen.kind != "tensor"

    def forward_changes(self) -> tuple[list[Difference], dict[int, Seen]]:
        """Forward's differences, diffed once, and the snapshot after it (``outside.claim``)."""
        self.after_forward = self._snapshot()
        self.forward_diff = list(heap.changes(self.before, self.after_forward))
        return self.forward_diff, self.after_forward

    def forward_done(self, rest: list[Difference] | None = None) -> None:
        """Forward's differences ``outside.claim`` left, classified now (a value forward set is copied as it left it)."""
        if self.after_forward is None:
            self.forward_changes()
        self.forward_writes = self._classify(self.forward_diff if rest is None else rest, "forward")
        self.opaque.forward_done()
        if self.hidden_reads is not None:
            self.hidden_reads.check_generator()
            self.hidden_reads.phase = "backward"
        if self.messages is not None:
            self.messages.refuse(f"{self.name}.forward", self.hidden_reads)
            self.messages.phase = "backward"

    def finish(self, ctx: Any) -> PythonState:
        """Undo what tracing did to Python state; return what it read and the writes each
        call must replay. Raises ``SideEffectError`` for a write that cannot be replayed."""
        self.stop()
        for place, phase, where in self.library.reads():
            self._add_read(place, phase, None, None, where)  # the names library code resolved
        after_forward = self.after_forward if self.after_forward is not None else self._snapshot()
        after = self._snapshot()
        try:
            self.opaque.refuse()  # (an identity read the user's code caught)
            writes = [*(self.forward_writes if self.forward_writes is not None
                        else self._writes(self.before, after_forward, "forward")),
                      *self._writes(after_forward, after, "backward"),
                      *(self.hidden_reads.call_writes() if self.hidden_reads is not None else ()),
                      *(self.messages.replay_writes() if self.messages is not None else ())]
            if self.watch is not None:
                self.watch.refuse(self.name)
            if self.messages is not None:
                self.messages.refuse(f"{self.name}.backward", self.hidden_reads)
                # standing: sent for this call, as eager's; no later call may reuse the trace
                self.unreplayable += [f"backward gives a message ({what}), sent by the trace for its call"
                                      for what in self.messages.sent[:1]]
            for phase, reason in self.hidden_reads.single_use() if self.hidden_reads is not None else ():
                self.opaque.unknown(phase, reason)
            refuse_hidden_reads(self.name, self.hidden_reads.reads if self.hidden_reads is not None else [])
            with self.ctx_view():  # ctx's objects as forward left them (its writes replayed)
                self.read_ctx_chains(ctx)
            if self.opaque.backward_unknown:
                # What backward's unknown reads see may change before ``.backward()``: it is traced
                # again when it runs (a read no value matches), as eager's backward reads them then.
                self.reads.append(StateRead(UNANALYSED, "backward", None, seen=UNMATCHED))
            self.opaque.undo.clear()  # the trace stands for this call: unanalysed code's writes stay
            if self.unreplayable:  # standing: every write of this trace stays made (abort leaves them)
                self.finished = True
                store_marks.unmark(self.marked)
                self.marked = []
        except BaseException as e:  # (the trace's objects the diff holds go first: one dying as
            release_frames(e, drop=False)  # abort puts its holder back runs its ``__del__`` there)
            after = after_forward = None
            raise
        finally:
            self.abort()
        if self.unreplayable:  # ... and none is replayed: this trace serves its own call only
            return PythonState(tuple(self.reads), (), (*self.opaque.single_use(), *self.unreplayable),
                               outside_tensors=self.outside_tensors)
        return PythonState(tuple(self.reads), tuple(writes), self.opaque.single_use(),
                           outside_tensors=self.outside_tensors)

    def _writes(self, old: dict[int, Seen], new: dict[int, Seen], phase: str) -> list[StateWrite]:
        return self._classify(heap.changes(old, new), phase)

    def _classify(self, differences: Iterable[Difference], phase: str) -> list[StateWrite]:
        read_places = {r.place.description for r in self.reads}
        return [write_of(self, was, step, before, after, phase, read_places)
                for was, step, before, after in differences]

    def _refuse(self, place: Place, phase: str, where: str | None, what: str, *, tensor: bool = False) -> StateWrite:
        if self.standing and not tensor and phase == "backward":
            self.unreplayable.append(f"backward {what} {place.description} (made by the trace, for its call)")
            return StateWrite(place, "made", None, phase, where)  # dropped by finish: nothing to replay
        raise refused(self.name, phase, what, place.description, where, tensor)  # (``abort`` puts back)

    def _refuse_hidden(self, was: Seen, phase: str) -> None:  # (generators put back by ``abort``)
        place = was.root.description if not was.steps else place_at(was.root, was.steps).description
        raise drawn(self.name, f"{phase} {hidden.taking(was.obj)} {place}", None)
