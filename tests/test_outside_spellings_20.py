"""Hostile spellings, round 20 (issue #28, round 25), tried from outside against eager in
strict, apply and fallback mode (``eager_modes.matches_eager``): what eager's autograd loads
from the user's Function class, and when it loads it.

Differences from eager before this round:

- The class's ``backward`` (or ``vjp``, or its ``boxed_grads_call`` flag, which autograd reads
  at forward too) rebound between forward and ``.backward()``: eager's autograd loads it when
  backward runs (``BackwardCFunction.apply``), so the call runs the new one; a capture ran the
  bwd traced from the old one, in every mode, fallback too. A test's
  ``mock.patch.object(F, "backward", spy)`` around the loss's backward only is the usual
  spelling. The runtime's backward now compares what autograd would load with what it was
  traced from (``runtime/function_keys.backward_methods``) and traces backward again for the
  call where they differ (strict: a coded refusal where the new one reads a forward value
  forward did not save; fallback: the user's backward run eagerly); the flag set between calls
  is part of the methods key.
- An ``apply`` set on the class after a capture (``F.apply = classmethod(own)``, one that
  changes the arguments around ``super().apply``): a capture already made kept serving
  ``minihop.apply(F, ...)`` and ``minihop.function(F)``, and fallback's eager run called the
  ``apply`` it had bound when it was made (torch's). The methods key holds the ``apply`` now
  (``function_keys.methods_key``), so the next call is a miss, refused (MH101) where the class
  has its own; fallback loads the class's ``apply`` per call, as eager's caller does
  (``function_keys.class_apply``).
- A class that sets ``clear_saved_tensors_on_access = True`` (a class attribute of torch's: autograd clears
  the saved tensors on their first unpack): eager's second read of ``ctx.saved_tensors`` raises
  (in the same backward, which may catch it, or in a second backward under ``retain_graph``); a
  capture's runtime class did not carry the flag, so its reads never raised. The runtime class
  carries it now (``runtime/function.py``), and a backward that reads them a second time is
  refused while traced (MH104, ``tracer/ctx.py``: the runtime's unpack would raise where the
  trace's did not), so fallback runs it eagerly.
- A backward traced again for a call (a value it reads changed since forward) that keeps an
  object of the user's with a ``__del__`` on ctx: refused (MH106), but the trace's object died
  when minihop put ctx back as forward left it, mid-call, running the user's ``__del__`` where
  eager's never runs (found by round 25's ``method_rebound`` fuzz kind, whose retrace made one:
  a counter one ahead of eager's, in fallback mode). Such objects are kept alive now
  (``tracer/effects._put_back``). And a backward traced again for a call did not ask what it
  made whether its death runs the user's code (the capture's trace does: ``death_code``); it
  does now, so fallback runs that call's backward eagerly, whose user ctx (its ``Dying``) the
  capture kept until the next such call, past the call's graph (eager's dies with it): a
  served-once variant is forgotten once its code is handed out (``runtime/backwards.get``).
- The same retrace writing an object forward made and kept on ctx (``ctx.box.n += 1``), then
  refused: the write stayed on the trace's object, from which fallback's eager run of that
  call's backward was rebuilt (counted twice). Objects of plain state on ctx are put back as
  forward left them now, as its lists and dicts were (``effects.ctx_as_forward_left_it``).
  Found by the fuzzer; pinned there (``tests/fuzz/test_fuzz_effects.py::FOUND``), as no hand
  spelling of it tried here reproduced it.
- Under ``torch.func.vmap``, a class with no ``vmap`` rule: torch's own ``RuntimeError`` named
  minihop's class (``Transformable_F``) where eager's names ``F``.
"""

from __future__ import annotations

from typing import Any
from unittest import mock

import pytest
import torch
from torch.autograd import Function

import minihop
from minihop.errors import MinihopError

from eager_modes import caller, matches_eager


def _x(i: int) -> torch.Tensor:
    return torch.linspace(-1.0, 1.0, 3).add(i).requires_grad_()


# -- backward (or vjp) rebound between forward and .backward() -----------------------------


class RebindBwd(Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2.0

    @staticmethod
    def backward(ctx, g):
        return g * 2.0


_ORIGINAL = RebindBwd.__dict__["backward"]


def test_backward_rebound_before_backward_runs() -> None:
    def mid(i: int) -> None:
        RebindBwd.backward = staticmethod(lambda ctx, g: g * 5.0) if i == 2 else _ORIGINAL

    matches_eager(RebindBwd, lambda i: (_x(i),), mid=mid, reset=lambda: setattr(RebindBwd, "backward", _ORIGINAL))


class VjpSet(Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * 2.0

    @staticmethod
    def backward(ctx, g):
        x, = ctx.saved_tensors
        return g * 2.0 + x


def _no_vjp() -> None:
    if "vjp" in VjpSet.__dict__:
        del VjpSet.vjp


def test_vjp_set_before_backward_runs() -> None:
    """A ``vjp`` of the class's own beside its ``backward``: eager's backward raises (both
    implemented), in that call only."""
    def mid(i: int) -> None:
        if i == 1:
            VjpSet.vjp = staticmethod(lambda ctx, g: g * 7.0)
        else:
            _no_vjp()

    matches_eager(VjpSet, lambda i: (_x(i),), mid=mid, reset=_no_vjp)


class ClassmethodBwd(Function):
    k = 2.0

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * 2.0

    @classmethod
    def backward(cls, ctx, g):
        x, = ctx.saved_tensors
        return g * cls.k + x


def test_classmethod_backward_is_the_same_on_each_load() -> None:
    """A classmethod backward is a new bound method on each load (equal, not identical): the
    traced bwd keeps serving (one variant), and its class attribute changed before
    ``.backward()`` is still eager's."""
    minihop.reset()
    f = minihop.function(ClassmethodBwd)
    for i in range(3):
        x = _x(i)
        f(x).sum().backward()
        assert torch.equal(x.grad, torch.full((3,), 2.0) + x.detach())
    assert len(f.captures) == 1 and len(f.captures[0]._function.backwards.variants) == 1

    def mid(i: int) -> None:
        ClassmethodBwd.k = 2.0 + i

    matches_eager(ClassmethodBwd, lambda i: (_x(i),), mid=mid, reset=lambda: setattr(ClassmethodBwd, "k", 2.0))


class Patched(Function):
    @staticmethod
    def forward(ctx, x, s):
        ctx.s = s
        ctx.save_for_backward(x)
        return x * s

    @staticmethod
    def backward(ctx, g):
        x, = ctx.saved_tensors
        return g * ctx.s, None


SPIED: list[Any] = []


def _spy(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:
    SPIED.append(ctx.s)
    return g * ctx.s + 1.0, None


def _reads_saved(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:
    SPIED.append(ctx.s)
    x, = ctx.saved_tensors
    return g * ctx.s * x, None


@pytest.mark.parametrize("spy", [_spy, _reads_saved], ids=["spy", "reads_saved"])
def test_mock_patch_around_the_loss_backward(spy: Any) -> None:
    """``mock.patch.object(F, "backward", spy)`` around ``loss.backward()`` only: eager runs
    the spy for that call. A spy that reads a saved tensor the captured backward did not need
    (forward did not keep it): strict refuses that backward (coded); fallback runs it eagerly."""
    want: Any = None
    for mode in ("eager", "strict", "apply", "fallback"):
        minihop.reset()
        SPIED.clear()
        call = caller(mode, Patched)
        got: list[Any] = []
        for i in range(3):
            x = _x(i)
            y = call(x, 2.0)
            try:
                if i == 1:
                    with mock.patch.object(Patched, "backward", staticmethod(spy)):
                        y.sum().backward()
                else:
                    y.sum().backward()
            except MinihopError as e:
                assert mode in ("strict", "apply") and spy is _reads_saved and "rebound" in str(e), (mode, e)
                got.append("refused")
                continue
            got.append(x.grad.tolist())
        if mode == "eager":
            want = (got, list(SPIED))
        elif got[1] == "refused":
            assert got[::2] == want[0][::2] and SPIED == [], (mode, got)
        else:
            assert (got, SPIED) == want, (mode, got, SPIED, want)


class Boxed(Function):
    boxed_grads_call = True

    @staticmethod
    def forward(ctx, x):
        return x * 2.0

    @staticmethod
    def backward(ctx, *grads):
        if isinstance(grads[0], list):  # handed as one list
            return grads[0][0] * 2.0
        return grads[0] * 3.0


@pytest.mark.parametrize("flags", [((True, True), (True, False), (False, True), (False, False)),
                                   ((False, False), (False, True), (True, False), (True, True))],
                         ids=["boxed_first", "unboxed_first"])
def test_boxed_grads_call_set_between_calls_and_before_backward(flags: Any) -> None:
    """``boxed_grads_call``, the flag by which autograd hands backward its grads as one list:
    read when forward runs (the node is made boxed) and again when backward runs, so a call's
    grads are boxed if either read was set. ``flags``: per call, (at forward, at backward)."""
    def between(i: int) -> None:
        Boxed.boxed_grads_call = flags[i][0]

    def mid(i: int) -> None:
        Boxed.boxed_grads_call = flags[i][1]

    matches_eager(Boxed, lambda i: (_x(i),), between=between, mid=mid,
                  reset=lambda: setattr(Boxed, "boxed_grads_call", True))


# -- apply set on the class after a capture ------------------------------------------------


class RebindApply(Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2.0

    @staticmethod
    def backward(ctx, g):
        return g * 2.0


def _own_apply(cls: type, x: torch.Tensor) -> Any:
    return Function.apply.__func__(cls, x * 3.0)  # type: ignore[attr-defined]


def _torch_apply() -> None:
    if "apply" in RebindApply.__dict__:
        del RebindApply.apply


@pytest.mark.parametrize("mode", ["eager", "strict", "apply", "fallback"])
def test_apply_set_after_a_capture(mode: str) -> None:
    _torch_apply()
    minihop.reset()
    call = {"eager": lambda x: RebindApply.apply(x), "strict": minihop.function(RebindApply),
            "apply": lambda x: minihop.apply(RebindApply, x),
            "fallback": minihop.function(RebindApply, fallback="eager")}[mode]
    got: list[Any] = []
    try:
        for i in range(4):
            if i == 2:
                RebindApply.apply = classmethod(_own_apply)  # type: ignore[assignment]
            if i == 3:
                _torch_apply()
            x = torch.ones(3, requires_grad=True)
            try:
                y = call(x)
            except MinihopError as e:
                assert mode in ("strict", "apply") and i == 2 and "apply of its own" in str(e), (mode, i, e)
                got.append("refused")
                continue
            y.sum().backward()
            got.append((y.tolist(), x.grad.tolist()))
    finally:
        _torch_apply()
    want: list[Any] = [([2.0] * 3, [2.0] * 3), ([2.0] * 3, [2.0] * 3), ([6.0] * 3, [6.0] * 3), ([2.0] * 3, [2.0] * 3)]
    if mode in ("strict", "apply"):
        want[2] = "refused"
    assert got == want, (mode, got)


@minihop.captured
class Decorated(Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2.0

    @staticmethod
    def backward(ctx, g):
        return g * 2.0


def test_captured_class_still_hits() -> None:
    """@captured sets the class's apply to its cache's: that is the apply the key holds."""
    Decorated.minihop.clear()
    hits = Decorated.minihop.stats.hits
    for _ in range(3):
        x = torch.ones(3, requires_grad=True)
        Decorated.apply(x).sum().backward()
        assert x.grad.tolist() == [2.0] * 3
    assert Decorated.minihop.stats.hits == hits + 2, Decorated.minihop.stats


class ByHand(Function):
    @staticmethod
    def forward(ctx, x):
        return x * (2.0 if x.grad is None else 3.0)  # (a tensor argument's grad: refused, MH104)

    @staticmethod
    def backward(ctx, g):
        return g * 2.0


ByHand.apply = minihop.function(ByHand, fallback="eager").apply  # type: ignore[assignment]


def test_cache_apply_set_by_hand_runs_torch_apply_eagerly() -> None:
    """``F.apply = minihop.function(F, fallback="eager").apply``, as @captured does by hand: a
    call the cache runs eagerly runs torch's apply, not the class's (itself, endlessly)."""
    x = torch.ones(3, requires_grad=True)
    with pytest.warns(UserWarning, match="running ByHand eagerly"):
        y = ByHand.apply(x)
    y.sum().backward()
    assert y.tolist() == [2.0] * 3 and x.grad.tolist() == [2.0] * 3


# -- clear_saved_tensors_on_access: the saved tensors cleared on their first unpack --------


class ClearedOnce(Function):
    clear_saved_tensors_on_access = True

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.sin()

    @staticmethod
    def backward(ctx, g):
        x, = ctx.saved_tensors
        return g * x.cos()


class ClearedTwice(Function):
    clear_saved_tensors_on_access = True

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.sin()

    @staticmethod
    def backward(ctx, g):
        x, = ctx.saved_tensors
        try:
            x2, = ctx.saved_tensors  # eager: RuntimeError, caught
            extra = x2 * 0 + 1.0
        except RuntimeError:
            extra = 0.0
        return g * x.cos() + extra


@pytest.mark.parametrize("backwards", [1, 2])
def test_saved_tensors_cleared_on_access(backwards: int) -> None:
    """One read per backward: captured; a second backward of the call (``retain_graph``) raises
    eager's own error, from the runtime class's unpack."""
    matches_eager(ClearedOnce, lambda i: (_x(i),), backwards=backwards, refusable=False)


def test_saved_tensors_read_twice_when_cleared_on_access() -> None:
    matches_eager(ClearedTwice, lambda i: (_x(i),))
    with pytest.raises(minihop.errors.UnsupportedOperationError, match="a second time"):
        minihop.capture(ClearedTwice, _x(0))


# -- under torch.func.vmap: torch's own error names the user's class ------------------------


class NoVmapRule(Function):
    @staticmethod
    def forward(x):
        return x * 2.0

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass

    @staticmethod
    def backward(ctx, g):
        return g * 2.0


@pytest.mark.parametrize("mode", ["strict", "apply", "fallback"])
def test_vmap_without_a_rule_raises_eagers_error(mode: str) -> None:
    """No ``vmap`` staticmethod and no ``generate_vmap_rule``: eager's ``RuntimeError`` names
    the class; the capture's class under a transform was named ``Transformable_NoVmapRule``."""
    with pytest.raises(RuntimeError) as eager:
        torch.func.vmap(NoVmapRule.apply)(torch.ones(2, 3))
    minihop.reset()
    with pytest.raises(RuntimeError) as mine:
        torch.func.vmap(caller(mode, NoVmapRule))(torch.ones(2, 3))
    assert str(mine.value) == str(eager.value)


# -- a backward traced again for a call keeps an object whose death runs the user's code ----


DIED = [0]
FLAG = [False]


class Dying:
    def __del__(self) -> None:
        DIED[0] += 1


class KeepsDying(Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2.0

    @staticmethod
    def backward(ctx, g):
        if FLAG[0]:
            ctx.keep = Dying()  # (eager's dies with the call's graph)
        return g * float(DIED[0] % 5 + 1)


def test_retrace_keeping_an_object_with_a_del() -> None:
    def mid(i: int) -> None:
        FLAG[0] = i >= 2

    def reset() -> None:
        import gc
        gc.collect()
        DIED[0], FLAG[0] = 0, False

    matches_eager(KeepsDying, lambda i: (_x(i),), mid=mid, reset=reset, state=lambda: DIED[0])


class KeepsDyingWhenRebound(Function):
    @staticmethod
    def forward(ctx, x, opts):
        return x * (2.0 if opts.pop("method", "sum") == "sum" else 3.0)

    @staticmethod
    def backward(ctx, g):
        ctx.keep = {"a": [Dying()]}
        return g * float(DIED[0] % 5 + 1), None


_KEEPS = KeepsDyingWhenRebound.__dict__["backward"]


def test_eager_runs_user_ctx_dies_with_its_call() -> None:
    """A call whose backward is run eagerly under fallback (rebound since forward, then refused
    when traced again): its user ctx (here its ``Dying``) dies with the call's graph, as eager's
    does, not later. Before round 25 the capture kept it until the next such call (its variant),
    and the refusal, the last minihop error made in the thread, kept its frames
    (``errors.MADE``: kept only while a phase is traced now)."""
    def mid(i: int) -> None:
        KeepsDyingWhenRebound.backward = staticmethod(lambda ctx, g: (g * 5 + 1, None)) if i == 1 else _KEEPS

    def reset() -> None:
        import gc
        gc.collect()
        DIED[0] = 0
        KeepsDyingWhenRebound.backward = _KEEPS

    matches_eager(KeepsDyingWhenRebound, lambda i: (torch.linspace(-1, 1, (3, 4, 3, 3)[i]).requires_grad_(), {"method": "sum"}),
                  mid=mid, reset=reset, state=lambda: DIED[0])


class RoutesThroughMinihop(Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2.0

    @staticmethod
    def backward(ctx, g):
        return g * 2.0

    @classmethod
    def apply(cls, *args):  # (every caller through minihop, fallback on: as @captured does, by hand)
        return _ROUTED(*args)


_ROUTED = minihop.function(RoutesThroughMinihop, fallback="eager")


def test_own_apply_that_calls_the_cache_runs_torchs_apply() -> None:
    """A class whose own ``apply`` calls its ``minihop.function(F, fallback="eager")``: refused
    (an apply of its own), so run eagerly, through the class's apply, which came back into the
    cache: that run is torch's apply (before, the class's again, endlessly: ``RecursionError``)."""
    x = torch.ones(3, requires_grad=True)
    with pytest.warns(UserWarning, match="running .*RoutesThroughMinihop eagerly"):
        y = RoutesThroughMinihop.apply(x)
    y.sum().backward()
    assert y.tolist() == [2.0] * 3 and x.grad.tolist() == [2.0] * 3


class ArgsUnused(Function):
    @staticmethod
    def forward(ctx, x, log):
        return x * 2.0

    @staticmethod
    def backward(ctx, g):
        return g * 2.0, None


_UNUSED = ArgsUnused.__dict__["backward"]


def test_rebound_backward_writing_an_argument() -> None:
    """The captured backward uses no argument, so forward keeps none on ctx; the one rebound
    before ``.backward()`` appends to the list the call passed (reached through the caller's own
    alias of it, a closure): eager's makes the append, a capture ran the old backward."""
    logs: list[list[int]] = []

    def rebound(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:
        logs[-1].append(len(logs))
        return g * 3.0, None

    def mid(i: int) -> None:
        ArgsUnused.backward = staticmethod(rebound) if i == 2 else _UNUSED

    def make(i: int) -> tuple[Any, ...]:
        logs.append([])
        return (_x(i), logs[-1])

    matches_eager(ArgsUnused, make, mid=mid, reset=lambda: (logs.clear(), setattr(ArgsUnused, "backward", _UNUSED)),
                  state=lambda: [list(v) for v in logs])
