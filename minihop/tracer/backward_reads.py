"""Tensors backward reads from a global, a closure cell, a class/module attribute, or a module
argument's parameters and buffers (``ctx.mod.scale``).

Place in the pipeline: tracer (used by ``trace.py`` while backward runs). Eager's backward reads
such a tensor when backward runs, not when forward did: rebinding the global, replacing
``F.W``, or writing into the tensor between forward and ``.backward()`` changes what backward
computes. So a tensor backward reaches this way is not the forward value of the same tensor: it
gets its own fake and its own fwd input (``InputSource.read_in_backward``), passed through fwd
as a saved value, which the runtime fetches again (its ``place``, or the argument's ``path`` in the
call's arguments, which forward then keeps on ctx) when backward runs.

Invariant: one ``InputSource`` and one fwd placeholder per route, for the first trace and for
every backward traced again (a tensor rebound to another shape then gets a fake of its own
shape, bound to the same placeholder), so a variant's saved values are the capture's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, cast

import torch
from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily

from ..errors import SideEffectError, UnsupportedOperationError
from ..spec import InputSource, Place, arg_place
from ..structure import Path, held_values, iter_leaves, make_getter
from .names import input_name
from .refusals import unrouted_read
from .routes import RouteMap, closure_routes, module_tensors

__all__ = ["BackwardReads", "argument_tensors_on_ctx", "forward_values_on_ctx"]

Routes = dict[int, tuple[str, Callable[[], Any]]]


class BackwardReads:
    """The tensors one capture's backward read from their live places (see module docstring).

    ``tracing`` is the trace's state: its ``closure_routes``, ``module_paths``, ``_fake``, ``sources``,
    ``_add_source`` and ``fwd`` recorder are used as ``_lift_real`` uses them.
    """

    def __init__(self, tracing: Any, routes: Callable[[], Routes]) -> None:
        self.t = tracing
        self.routes = routes  # the routes as they are now (a rebound name leads to its new tensor)
        self.fakes: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # id(real) -> (real, fake)
        # route's place -> (its source, the first fake: the one whose placeholder the others share)
        self.by_route: dict[Any, tuple[InputSource, torch.Tensor]] = {}
        self.again = False  # backward is traced again, after forward ran (for one call)
        self.paths: dict[int, tuple[torch.Tensor, Path]] = {}  # id -> (argument tensor, its path): ``register``
        # id(stand-in) -> (stand-in, forward's fake): what forward wrote into a global's container
        self.stand_ins: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        # id -> (tensor, route): where each tensor a route reaches lived as backward started
        # (``begin``): backward may read it and then delete its entry (``del MEMO[k]``) before
        # using it; the place it read is the one it was read from.
        self.at_start: dict[int, tuple[torch.Tensor, tuple[str, Any]]] = {}
        # Forward's tensors of a size read from data (no hint: no stand-in can be made) in a
        # global's container: backward using one is refused (``check_unbacked_memos``).
        self.unbacked_memos: list[torch.Tensor] = []
        self.outside: tuple[Any, ...] = ()  # weak references: ``pystate.StateTracker.outside_tensors``
        # The tensors of lru_cache entries the code got (``cached``), held: an id there is never another's.
        self.entries, self.entry_tensors = RouteMap(), cast(list[torch.Tensor], [])

    def cached(self, tensor: torch.Tensor, name: str, place: Place) -> None:
        """A tensor of an lru_cache entry the code got (``hidden.ReadWatch``): read through its place on every call."""
        taken = {n for n, p in self.entries.values() if p.description != place.description}  # (``t("a b")``, ``t("a_b")``)
        name = next(n for k in range(len(taken) + 1) if (n := name + "_" * k) not in taken)
        self.t.closure_routes[id(tensor)] = self.entries[id(tensor)] = (name, place)
        self.entry_tensors.append(tensor)

    def arguments(self, call_args: tuple[Any, ...]) -> None:
        """Backward is traced again for a call: its module arguments' parameters and buffers
        (one replaced since forward, say) are found at their paths as they are now."""
        self.again = True
        self.paths.clear()
        self.fakes.clear()  # (the capture's, made where it passed every route on: ``pass_all``)
        for i, a in enumerate(call_args):
            if issubclass(type(a), torch.nn.Module):
                for parts, tensor in module_tensors(a):
                    self.register(tensor, (("arg", i), *(("attr", p) for p in parts)))
            elif not issubclass(type(a), torch.Tensor):
                # A container or object argument the rerun's ctx holds (``ctx.s = s``): the
                # tensors backward reaches in it are read from there (argument_tensors_on_ctx).
                for path, leaf in iter_leaves(a, (("arg", i),)):
                    if issubclass(type(leaf), torch.Tensor):
                        self.register(leaf, path)

    def register(self, tensor: torch.Tensor, path: Path) -> None:
        """``tensor`` is the call's argument at ``path`` (for this run of backward only)."""
        self.paths.setdefault(id(tensor), (tensor, path))

    def path_of(self, real: torch.Tensor) -> Path | None:
        """The argument path of ``real`` in this run of backward. Held with the tensor: an id
        from an earlier call's tensor, freed since, may be another tensor's now. A backward
        traced again uses only its own call's (the first trace's ``module_paths`` are older)."""
        entry = self.paths.get(id(real))
        if entry is not None and entry[0] is real:
            return entry[1]
        return None if self.again else self.t.module_paths.get(id(real))

    def forget_call(self) -> None:
        """Hold none of the call's tensors once backward's run is traced."""
        self.paths.clear()
        self.fakes.clear()
        self.stand_ins.clear()
        self.at_start.clear()

    def begin(self) -> None:
        """Backward starts: note the route to each tensor the routes reach now (``at_start``)."""
        self.at_start.clear()
        for key, route in self.routes().items():
            if key in self.entries:
                continue  # (a cache's entry: read only where the code calls the helper)
            try:
                value = route[1].get(())
            except Exception:
                continue
            if issubclass(type(value), torch.Tensor) and id(value) == key:
                self.at_start[key] = (value, route)

    def stand_in(self, value: Any) -> Any:
        """What backward finds where forward wrote ``value`` into a container below a global or
        a cell (``outside.OutsideWrites.replayed``): for a tensor forward computed, a real
        stand-in of its properties, so that backward's read of it is a read of that place
        when backward runs (``lift``: a route leads to it now), as eager's is: the caller may
        have cleared the memo (eager's ``KeyError``) or put another tensor there since. Where
        no route leads to it, ``lift`` gives forward's fake back (its value, saved). One of
        symbolic sizes (dynamic shapes) stands in with its sizes' hints, and a route to it is
        refused (``lift``): its read would need sizes of its own, which the graphs cannot take."""
        if not (issubclass(type(value), FakeTensor) and type(value) is FakeTensor and self.t.is_traced(value)):
            return value
        try:
            shape, stride = (tuple(_hint(d) for d in sizes) for sizes in (value.shape, value.stride()))
            with unset_fake_temporarily(), torch._C.DisableTorchFunction():
                real = torch.empty_strided(shape, stride, dtype=value.dtype, device=value.device)
        except Exception:  # no hint (an unbacked size), or a device this process cannot allocate on
            self.unbacked_memos.append(value)
            return value
        if value.requires_grad:
            real.requires_grad_(True)
        self.stand_ins[id(real)] = (real, value)
        return real

    def check_unbacked_memos(self) -> None:
        """Backward used a tensor of a size read from data that forward stored in a global's
        container: forward's value would stand for what that place holds when backward runs."""
        found, self.unbacked_memos = self.unbacked_memos, []
        for fake in found:
            if self.t.bwd.node_of.get(id(fake)) is not None:
                raise SideEffectError(
                    f"{self.t.parts.name}.backward reads a tensor of a size read from data "
                    f"(shape {list(fake.shape)}) that forward stored outside its return value (a "
                    "global's container or object).",
                    "Eager's backward reads what that place holds when backward runs (the caller may "
                    "have replaced or removed it since forward); its size is known only when forward "
                    "runs, so no capture can read that place again, and forward's value would stand for it.",
                    "Save it for backward (ctx.save_for_backward), or run the Function eagerly with "
                    "minihop.function(F, fallback='eager').")

    def symbolic_memo(self, name: str) -> SideEffectError:
        """Backward reads, at route ``name``, a tensor of symbolic sizes forward stored there."""
        return SideEffectError(
            f"{self.t.parts.name}.backward reads {name}, a tensor of dynamic sizes that forward "
            "stored outside its return value (a global's container or object).",
            "Eager's backward reads what that place holds when backward runs (the caller may have "
            "replaced or removed it since forward); a capture with dynamic sizes cannot read a "
            "tensor of sizes of its own there.",
            "Save it for backward (ctx.save_for_backward), capture without dynamic=..., or run "
            "the Function eagerly with minihop.function(F, fallback='eager').")

    def unreachable_memo(self) -> SideEffectError:
        """Backward reads a tensor forward stored below a global or a cell where no route
        reaches (deeper than ``routes.py`` follows): its place cannot be read again when
        backward runs, and forward's value would stand for what the caller left there."""
        return SideEffectError(
            f"{self.t.parts.name}.backward reads a tensor that forward stored in a container "
            "below a global or a closure cell, deeper than minihop fetches tensors from.",
            "Eager's backward reads what that place holds when backward runs (the caller may "
            "have replaced or removed it since forward); minihop cannot read that place again, "
            "and forward's tensor would stand for it.",
            "Save it for backward (ctx.save_for_backward), keep the memo at most three steps "
            "below its global, or run the Function eagerly with "
            "minihop.function(F, fallback='eager').")

    def lift(self, real: torch.Tensor) -> torch.Tensor | None:
        """Backward's fake for ``real``, or None when no live route reaches it."""
        entry = self.fakes.get(id(real))
        if entry is not None and entry[0] is real:
            return entry[1]
        path = self.path_of(real)
        if path is not None:
            # A parameter or buffer of a module argument: read from the call's argument when
            # backward runs (the runtime keeps the call's arguments on ctx for it).
            name, place = input_name(path, self.t.parts.argnames), None
        else:
            stood = self.stand_ins.get(id(real))
            stood = stood if stood is not None and stood[0] is real else None
            # A stand-in is new: the routes are found again (an older id may be its now).
            route = None if stood is not None else self.t.closure_routes.get(id(real))
            if route is not None and self.entries.get(id(real)) is not route and not _leads_to(route[1], real):
                route = None  # (found before: a list's position that moved since; found again now)
            if route is None:
                self.t.closure_routes = self.routes()
                route = self.t.closure_routes.get(id(real))
            if route is None:
                start = self.at_start.get(id(real))
                route = start[1] if start is not None and start[0] is real else None
                if route is None and stood is not None:
                    raise self.unreachable_memo()
                if route is None and any(held() is real for held in self.outside):
                    # The heap walk reached it outside the arguments before the trace (a
                    # global's, deeper than a route goes, or where no route is walked): eager's
                    # backward reads it there when it runs, and nothing here can read it again.
                    raise unrouted_read(self.t.parts.name, getattr(self.t.closure_routes, "cut", False))
                if route is None:
                    return None  # (made while traced: a constant of backward's own code)
            name, place = route
            if stood is not None and _symbolic(stood[1]):
                raise self.symbolic_memo(place.description)
        # Its own fake, never forward's for the same tensor: forward's value and what the same
        # place holds when backward runs may differ.
        with unset_fake_temporarily(), torch._C.DisableTorchFunction():
            alias = real.detach()  # a new tensor object: a new fake (fakes are memoised per tensor)
        fake = self.t._fake(alias)
        if real.requires_grad:
            fake.requires_grad_(True)
        self.fakes[id(real)] = (real, fake)
        # One source per place (two places' names may coincide: ``D["a b"]``, ``D["a_b"]``).
        where = ("arg", path) if path is not None else (place.root.kind, place.root.key, place.steps)
        known = self.by_route.get(where)
        while self.again and known is not None and place is not None and known[0].place is not None \
                and not _leads_to(known[0].place, real):
            # The same steps, read otherwise now (a list's position whose length changed since:
            # the captured route reads nothing there): this variant's own place, fetched anew.
            where = (*where, "moved")
            known = self.by_route.get(where)
        if self.again and known is not None and self.t.fwd.node_of.get(id(known[1])) is None:
            raise self.unknown(name)  # forward passed on only the places the first backward read
        if known is None:
            # (Traced again: a place the captured backward did not read. Its fwd input is the
            # variant's own; the runtime fetches it when backward runs, as it does the others.)
            taken = {s.name for s in self.t.sources.values()}
            unique = name
            while unique in taken:
                unique += "bwd"
            source = InputSource(unique, f"tensor {name} backward reads when it runs",
                                 arg_place(path) if path is not None else place, None,
                                 None if path is not None else real, read_in_backward=True)
            self.by_route[where] = (source, fake)
            self.t._add_source(fake, source)
            return fake
        source, first = known
        self.t._add_source(fake, source)
        node = self.t.fwd.node_of.get(id(first))
        if node is not None:  # traced again: the placeholder forward already has
            self.t.fwd.node_of[id(fake)] = node
            self.t.fwd.alive.append(fake)
        return fake

    def unknown(self, name: str) -> UnsupportedOperationError:
        """Backward traced again reads a tensor (``name``) the backward traced at capture did not."""
        return UnsupportedOperationError(
            f"{self.t.parts.name}.backward, traced again for this call, reads the tensor "
            f"{name}, which the backward traced at capture did not read.",
            "Eager's backward reads it when it runs; forward has already run and passed on only "
            "the tensors the captured backward read.",
            "Read the same tensors in backward whatever Python values it sees, or call the "
            "Function eagerly.")

    def pass_all(self, every_route: bool = False) -> None:
        """Backward's reads are guarded: a later backward may take a path the first did not
        and read another of these places. Forward has run by then, so it passes every place
        a backward could read through now (as ``save_everything`` saves every forward value):
        those lifted (an argument's container on ctx), and with ``every_route`` each tensor
        backward's globals, cells and helpers reach."""
        if every_route:
            for _name, place in list(closure_routes(self.t.parts.backward).values()):
                try:
                    real = place.get(())
                except Exception:
                    continue
                if issubclass(type(real), torch.Tensor) and not issubclass(type(real), FakeTensor):
                    self.lift(real)
        for _source, fake in list(self.by_route.values()):
            self.t.bwd.node_for(fake)


@contextlib.contextmanager
def forward_values_on_ctx(t: Any, ctx: Any) -> Iterator[None]:
    """While backward runs, the real tensors forward put on ctx (``save_for_backward(W)``,
    ``ctx.w = W`` with W a global) are forward's values of them, not reads of their places:
    eager's backward gets forward's object there whatever the global holds by then. So each is
    replaced by forward's fake of it (``save_for_backward``'s for good: it is then saved as the
    fwd input it is; an attribute until backward ends, unless backward rebinds it)."""
    def forward_fake(value: Any) -> Any:
        if not issubclass(type(value), torch.Tensor) or issubclass(type(value), FakeTensor):
            return value
        phase, t.phase = t.phase, "forward"
        try:
            return t._lift_real(value)
        finally:
            t.phase = phase

    record = ctx._minihop_record
    if record.saved:
        record.saved = tuple(forward_fake(v) for v in record.saved)
    swapped: dict[str, tuple[Any, Any]] = {}
    for name, value in list(vars(ctx).items()):
        if name.startswith("_minihop"):
            continue
        if issubclass(type(value), tuple) and any(issubclass(type(v), torch.Tensor) for v in value):
            new = type(value)(forward_fake(v) for v in value) if type(value) is tuple else value
        else:
            new = forward_fake(value)
        if new is not value:
            swapped[name] = (value, new)
            object.__setattr__(ctx, name, new)
    try:
        yield
    finally:
        for name, (value, new) in swapped.items():
            if vars(ctx).get(name) is new:  # backward did not rebind it
                object.__setattr__(ctx, name, value)


@contextlib.contextmanager
def argument_tensors_on_ctx(t: Any, ctx: Any, fake_args: tuple[Any, ...],
                            real_args: tuple[Any, ...] | None) -> Iterator[None]:
    """While backward runs, a tensor it reaches inside an argument's container or object that
    forward kept on ctx (``ctx.s = s``, then ``ctx.s["w"]``) is read from the caller's
    container when backward runs, as eager's backward reads it: the caller may have put another
    tensor there since forward. The trace's ctx holds forward's copy of the argument (its
    tensors are forward's fakes), so each such tensor is swapped, in that copy, for a fake
    of its own read from the argument's path (``BackwardReads.lift``), and put back after.

    A tuple's items are never swapped: nobody can replace them, so backward reads forward's
    objects, as eager does. Where backward rebinds a swapped item, its write stays (the heap
    watch sees it)."""
    if real_args is None:
        try:
            yield
        finally:
            t.backward_reads.forget_call()  # stand-ins and the routes' tensors are not kept
        return
    copies: dict[int, tuple[Any, Any, Path]] = {}  # id(forward's copy) -> (copy, caller's, path)
    for i, (fake, real) in enumerate(zip(fake_args, real_args)):
        if not issubclass(type(fake), (torch.Tensor, torch.nn.Module)):
            _index(fake, real, (("arg", i),), copies)
    undo: list[tuple[Any, tuple[str, Any], Any, Any]] = []
    done: set[int] = set()
    for name, value in vars(ctx).items():
        if name.startswith("_minihop"):
            continue
        for held in (value, *(value if type(value) in (tuple, list) else ())):
            entry = copies.get(id(held))
            if entry is not None:
                _swap(t, *entry, real_args, copies, undo, done)
    try:
        yield
    finally:
        t.backward_reads.forget_call()
        for owner, step, old, new in reversed(undo):
            if _child(owner, step) is new:  # backward did not rebind it
                _put(owner, step, old)


def _children(value: Any) -> list[tuple[tuple[str, Any], Any]]:
    return held_values(value) or []


def _child(owner: Any, step: tuple[str, Any]) -> Any:
    kind, key = step
    try:
        return getattr(owner, key) if kind == "attr" else owner[key]
    except (LookupError, AttributeError, TypeError):
        return None


def _put(owner: Any, step: tuple[str, Any], value: Any) -> None:
    kind, key = step
    if kind == "attr":
        object.__setattr__(owner, key, value)  # as replace_tensors set it (frozen dataclasses too)
    else:
        owner[key] = value


def _index(fake: Any, real: Any, path: Path, copies: dict[int, tuple[Any, Any, Path]]) -> None:
    """Record forward's copies of the caller's containers and objects (``replace_tensors``
    copied exactly those that hold a tensor) with their paths."""
    # (as deep as ``replace_tensors`` made copies, which is as deep as tensors lie: cycles stop)
    if fake is real or id(fake) in copies or issubclass(type(fake), torch.Tensor):
        return
    copies[id(fake)] = (fake, real, path)
    for step, child in _children(fake):
        if not issubclass(type(child), torch.Tensor):
            _index(child, _child(real, step), path + (step,), copies)


def _swap(t: Any, fake: Any, real: Any, path: Path, real_args: tuple[Any, ...], copies: dict[int, tuple[Any, Any, Path]],
          undo: list[tuple[Any, tuple[str, Any], Any, Any]], done: set[int]) -> None:
    if id(fake) in done:
        return
    done.add(id(fake))
    for step, child in _children(fake):
        if issubclass(type(child), FakeTensor) and not issubclass(type(fake), tuple):
            original = _child(real, step)
            source = t.sources.get(id(child))
            if issubclass(type(original), torch.Tensor) and not issubclass(type(original), FakeTensor) and source is not None \
                    and source.path is not None and make_getter(source.path)(real_args, {}) is original:
                pass  # the caller's tensor (also when it is another argument too: ``{"w": x}``)
            elif not issubclass(type(original), torch.Tensor) and t.is_traced(child) and not _symbolic(child):
                # Forward put it there (replayed into the caller's container on every call):
                # backward reads what is there when it runs, forward's or the caller's since.
                with unset_fake_temporarily(), torch._C.DisableTorchFunction():
                    original = torch.empty_strided(child.shape, child.stride(), dtype=child.dtype,
                                                   device=child.device)
            else:
                continue
            t.backward_reads.register(original, path + (step,))  # held there (a stand-in too)
            new = t.backward_reads.lift(original)
            if new is not None:
                _put(fake, step, new)
                undo.append((fake, step, child, new))
        elif id(child) in copies:
            _swap(t, *copies[id(child)], real_args, copies, undo, done)


def _hint(size: Any) -> int:
    """A size's concrete value (a symbolic one's hint; none for an unbacked one: ValueError)."""
    if issubclass(type(size), torch.SymInt):
        hint = size.node.hint
        if hint is None:
            raise ValueError("an unbacked size")
        return int(hint)
    return int(size)


def _symbolic(value: torch.Tensor) -> bool:
    return any(issubclass(type(d), torch.SymInt) for d in (*value.shape, *value.stride()))


def _leads_to(place: Any, real: torch.Tensor) -> bool:
    """Whether ``place`` (a route of a global's, a cell's) holds ``real`` now."""
    try:
        return place.get(()) is real
    except Exception:
        return False
