"""Hostile spellings, round 19 (issue #28, round 24), tried from outside against eager in
strict, apply and fallback mode (``eager_modes.matches_eager``).

Differences from eager before this round:

- NaNs of different sign or payload (``struct.unpack`` of a chosen pattern, ``-math.nan``) were
  one value to every key and to the heap watch: ``float.hex`` writes each as "nan". Code that
  reads the bits back (``struct.pack``, ``math.copysign``) got the first call's answer on every
  later call, as an argument, inside a tuple, as a global, an attribute, a list's item or a
  helper's default. Floats are compared by ``library_state.float_bits`` now, everywhere.
- A tensor's own state set by assignment (``y.grad = g``, ``del y.grad``, ``y.data = v``) in
  forward or backward, on an input, a global, a module's parameter, a saved tensor or a tensor
  the phase made: the setter makes no op, so the graph had no node for it. The caller's tensor
  was never changed, and the phase's own tensor kept its old value's node (``y.data =
  y.data.clamp(min=0)``, then ``y``): every mode, fallback too, silently. Refused now (MH104,
  ``tracer/tensor_state.py``), so fallback runs eagerly.
- A backward that asks its grad what only a real grad answers, no plain value (``g._base``,
  which is a tensor where autograd hands backward a view, as a loss through ``y.t()`` does;
  ``g.grad_fn`` under ``create_graph=True``): the fake grad answered None, the check of a later
  grad traced a variant with the same fake answer and ran it. Refused now where the call's grad
  answers otherwise (``runtime/assumptions.refuse_unlike_grads``).
- torch's thread-local dispatch state read by a private getter
  (``torch._C._dispatch_tls_local_include_set()``, ``_dispatch_tls_is_dispatch_key_included``):
  the Python key is on while minihop traces, off in eager; the trace's answer was kept. Such
  getters are trace-mode probes now (``tracer/library.reads_trace_modes``: MH104).
- autograd engine state set up by the phase outside any op: forward-mode AD (a dual level
  entered, dual tensors made: the graph's run named a level that no longer existed and raised,
  in every mode, fallback too: backward's tangents), saved-tensor hooks pushed around a recompute in backward (the
  pack hook's change to what is saved was lost), a version counter bumped by hand
  (``increment_version``). Refused now (MH104: ``library.autograd_state``, and the dual ops
  however reached, ``tracer/tensor_state.py``).
- a ``TorchDispatchMode`` the phase enters itself (counting aten ops): it ran on the trace's fake
  tensors with the heap watch paused, and the graphs run without it: its record was the trace's,
  once. And a profiler range the phase opens (``record_function``): in eager's profile once per
  call, in a capture's never. Both refused now (MH104: ``run_context.refuse_entered_dispatch_modes``;
  ``torch.autograd.profiler`` among torch's process readers and writers).
- a write to a library module of its library's own module class, whose attributes its code keeps
  (torch's config modules: a dict of their own; ``torch.utils.deterministic``: C): the namespace
  the heap watch compares did not change, so the write was made once, while tracing. Refused now
  (MH106, ``module_reads._attributes_run_code``).
- the backward autograd calls, resolved as eager's autograd does: a class with both
  ``backward`` and ``vjp`` of its own (``vjp = backward`` too) ran its backward where eager's
  raises; a ``boxed_grads_call`` backward was handed its grads one by one where autograd hands
  it one list.
- a class with an ``apply`` of its own (filling in defaults, changing arguments, counting calls
  around ``super().apply``, as some packages write one): a capture called forward as torch's
  ``Function.apply`` does, skipping it, in every mode. Refused now (MH101,
  ``function_parts.refuse_own_apply``); fallback calls the class's own apply.
"""

from __future__ import annotations

import functools
import math
import pathlib
import random
import struct
import sys
import tempfile
from typing import Any

import pytest
import torch
import torch.autograd.forward_ad as fwAD
import torch.fx.experimental._config as fx_config
import torch.utils.deterministic
from torch.autograd import Function
from torch.utils._python_dispatch import TorchDispatchMode

import minihop
from minihop.errors import UnsupportedOperationError

from eager_modes import caller, matches_eager, normalized, same_normalized


def _x(i: int) -> torch.Tensor:
    return torch.linspace(-1.0, 1.0, 3).add(i).requires_grad_()


# -- NaNs told apart by their bits ----------------------------------------------------------

def _nan(payload: int, negative: bool = False) -> float:
    return struct.unpack("<d", bytes([payload, 0, 0, 0, 0, 0, 0xF8, 0xFF if negative else 0x7F]))[0]


NANS = [_nan(1), _nan(2), _nan(1, negative=True), _nan(1)]


def _bits(f: float) -> float:
    """What code reads back of a NaN: its payload byte, and its sign."""
    return float(struct.pack("<d", f)[0] + (10 if math.copysign(1.0, f) < 0 else 0))


class ScaledByBits(Function):
    @staticmethod
    def forward(ctx, x, f):
        return x * _bits(f)

    @staticmethod
    def backward(ctx, g):
        return g * 2, None


class ScaledByFirstBits(Function):
    @staticmethod
    def forward(ctx, x, t):
        return x * _bits(t[0])

    @staticmethod
    def backward(ctx, g):
        return g * 2, None


def test_nan_argument_payloads_and_signs() -> None:
    matches_eager(ScaledByBits, lambda i: (_x(i), NANS[i]))


def test_nan_inside_a_tuple_argument() -> None:
    matches_eager(ScaledByFirstBits, lambda i: (_x(i), (NANS[i], 1.0)))


def test_minus_nan_is_not_nan() -> None:
    values = [math.nan, -math.nan, math.nan, -math.nan]
    matches_eager(ScaledByBits, lambda i: (_x(i), values[i]))


GLOBAL_NAN = [NANS[0]]
HOLDER = type("Holder", (), {})()
HOLDER.f = NANS[0]


def _global_reads(i: int) -> None:
    GLOBAL_NAN[0] = NANS[i]


class ReadsGlobalNan(Function):
    @staticmethod
    def forward(ctx, x):
        return x * _bits(GLOBAL_NAN[0])

    @staticmethod
    def backward(ctx, g):
        return g * _bits(GLOBAL_NAN[0])


def test_nan_global_changed_between_calls_and_before_backward() -> None:
    matches_eager(ReadsGlobalNan, lambda i: (_x(i),), between=_global_reads,
                  mid=lambda i: _global_reads((i + 1) % 4), reset=lambda: _global_reads(0))


class ReadsAttributeNan(Function):
    @staticmethod
    def forward(ctx, x, holder):
        return x * _bits(holder.f)

    @staticmethod
    def backward(ctx, g):
        return g * 2, None


def test_nan_attribute_changed_between_calls() -> None:
    matches_eager(ReadsAttributeNan, lambda i: (_x(i), HOLDER),
                  between=lambda i: setattr(HOLDER, "f", NANS[i]), reset=lambda: setattr(HOLDER, "f", NANS[0]))


def _scaled(x: torch.Tensor, f: float = NANS[0]) -> torch.Tensor:
    return x * _bits(f)


class HelperDefault(Function):
    @staticmethod
    def forward(ctx, x):
        return _scaled(x)

    @staticmethod
    def backward(ctx, g):
        return g * 2


def test_nan_default_of_a_helper_changed_between_calls() -> None:
    matches_eager(HelperDefault, lambda i: (_x(i),),
                  between=lambda i: setattr(_scaled, "__defaults__", (NANS[i],)),
                  reset=lambda: setattr(_scaled, "__defaults__", (NANS[0],)))


class FlipsNan(Function):
    """forward swaps the global NaN for the other payload: a write the heap watch must see."""

    @staticmethod
    def forward(ctx, x):
        GLOBAL_NAN[0] = NANS[1] if _bits(GLOBAL_NAN[0]) == 1.0 else NANS[0]
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2


def test_nan_written_to_another_payload() -> None:
    matches_eager(FlipsNan, lambda i: (_x(i),), state=lambda: struct.pack("<d", GLOBAL_NAN[0]).hex(),
                  reset=lambda: _global_reads(0))


# -- a tensor's own state set by assignment ------------------------------------------------

OTHERS = [torch.ones(3, requires_grad=True), torch.ones(3, requires_grad=True)]
W = torch.ones(3, requires_grad=True)


def _others_reset() -> None:
    for t in (*OTHERS, W):
        t.grad = None
    W.data = torch.ones(3)
    for t in OTHERS:
        t.data = torch.ones(3)


def _grads() -> list[Any]:
    return [t.grad for t in (*OTHERS, W)] + [t.detach().clone() for t in (*OTHERS, W)]


class SetsArgumentGrad(Function):
    @staticmethod
    def forward(ctx, x, y):
        y.grad = torch.full_like(y, 7.0)
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2, None


class ClearsArgumentGrad(Function):
    @staticmethod
    def forward(ctx, x, y):
        y.grad = None
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2, None


class DeletesArgumentGrad(Function):
    @staticmethod
    def forward(ctx, x, y):
        del y.grad
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2, None


class AssignsArgumentData(Function):
    @staticmethod
    def forward(ctx, x, y):
        y.data = y.data * 2
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2, None


class SetsCtxTensorGradInBackward(Function):
    @staticmethod
    def forward(ctx, x, y):
        ctx.y = y
        return x * 2

    @staticmethod
    def backward(ctx, g):
        ctx.y.grad = g.clone()
        return g * 2, None


@pytest.mark.parametrize("fn", [SetsArgumentGrad, ClearsArgumentGrad, DeletesArgumentGrad, AssignsArgumentData,
                                SetsCtxTensorGradInBackward])
def test_tensor_state_of_an_argument_set(fn: type) -> None:
    def between(i: int) -> None:
        OTHERS[i % 2].grad = torch.full((3,), float(i))

    matches_eager(fn, lambda i: (_x(i), OTHERS[i % 2]), between=between, state=_grads, reset=_others_reset)


class SetsGlobalGradFromInput(Function):
    @staticmethod
    def forward(ctx, x):
        W.grad = x.detach() * 2
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2


class AssignsGlobalData(Function):
    @staticmethod
    def forward(ctx, x):
        W.data = W.data + 1
        return x * W.detach()

    @staticmethod
    def backward(ctx, g):
        return g


class ClearsSavedGradInBackward(Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * 2

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        x.grad = None
        return g * 2


class ClampsThroughData(Function):
    """The old idiom: ``y.data = y.data.clamp(...)`` on a tensor forward made itself."""

    @staticmethod
    def forward(ctx, x):
        y = x * 2
        y.data = y.data.clamp(min=0)
        return y + 1

    @staticmethod
    def backward(ctx, g):
        return g * 2


class ScalesGradThroughData(Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        r = g * 2
        r.data = r.data * 3
        return r


class KeepsLocalGrad(Function):
    @staticmethod
    def forward(ctx, x):
        y = torch.zeros_like(x)
        y.grad = x * 3
        return x * 2 + y.grad

    @staticmethod
    def backward(ctx, g):
        return g * 5


@pytest.mark.parametrize("fn", [SetsGlobalGradFromInput, AssignsGlobalData, ClampsThroughData,
                                ScalesGradThroughData, KeepsLocalGrad])
def test_tensor_state_of_a_global_or_a_local_set(fn: type) -> None:
    matches_eager(fn, lambda i: (_x(i),), state=_grads, reset=_others_reset)


def test_saved_input_grad_cleared_in_backward() -> None:
    inputs = [_x(0), _x(1)]

    def between(i: int) -> None:
        inputs[i % 2].grad = torch.ones(3)

    def reset() -> None:
        for t in inputs:
            t.grad = None

    matches_eager(ClearsSavedGradInBackward, lambda i: (inputs[i % 2],), between=between,
                  state=lambda: [t.grad for t in inputs], reset=reset)


@pytest.mark.parametrize(("fn", "spelled"), [(SetsArgumentGrad, r"\.grad = "), (DeletesArgumentGrad, "del t.grad"),
                                             (ClampsThroughData, r"\.data = ")])
def test_strict_names_the_setter(fn: type, spelled: str) -> None:
    args = (_x(0), OTHERS[0]) if fn is not ClampsThroughData else (_x(0),)
    try:
        with pytest.raises(UnsupportedOperationError, match=rf"MH104.*{fn.__name__}.forward sets a tensor's own .*{spelled}"):
            minihop.function(fn)(*args)
    finally:
        _others_reset()


def test_setter_of_requires_grad_is_still_captured() -> None:
    """``t.requires_grad = True`` is the one setter a graph holds (as ``requires_grad_``)."""

    class Recomputes(Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x.sin()

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            with torch.enable_grad():
                xd = x.detach()
                xd.requires_grad = True
                (gx,) = torch.autograd.grad(xd.sin(), xd, g)
            return gx

    matches_eager(Recomputes, lambda i: (_x(i),), refusable=False)


# -- a grad asked what only a real grad answers -----------------------------------------------

class AsksGradBase(Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * (2.0 if g._base is None else 3.0)


class AsksGradHistory(Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * (2.0 if g.grad_fn is None else 3.0)


LOSSES = [lambda y: y.sum(), lambda y: (y.t() * torch.arange(6.0).reshape(3, 2)).sum(), lambda y: (y * 2).sum(),
          lambda y: y.t().sum(0).sum()]


def _grads_through_losses(mode: str, fn: type, create_graph: bool) -> list[Any]:
    call, found = caller(mode, fn), []
    for i, loss in enumerate(LOSSES * 2):
        x = torch.linspace(-1.0, 1.0, 6).add(i).reshape(2, 3).requires_grad_()
        y = call(x)
        w = torch.ones(2, 3, requires_grad=True)
        (gx,) = torch.autograd.grad(loss(y * w if create_graph and i % 2 else y), x, create_graph=create_graph)
        found.append((y, gx))
    return found


@pytest.mark.parametrize(("fn", "create_graph"), [(AsksGradBase, False), (AsksGradHistory, True)])
def test_grad_asked_what_only_a_real_grad_answers(fn: type, create_graph: bool) -> None:
    eager = _grads_through_losses("eager", fn, create_graph)
    for mode in ("strict", "apply", "fallback"):
        minihop.reset()
        try:
            got = _grads_through_losses(mode, fn, create_graph)
        except UnsupportedOperationError as e:
            assert mode != "fallback" and "the fake grad minihop traces with" in str(e), e
            continue
        assert same_normalized(normalized(got), normalized(eager)), mode


# -- torch's dispatch state read by the code (what only minihop's trace sets) ----------------

_TLS_PROBES = {
    "include_set": lambda: torch._C._dispatch_tls_local_include_set().has(torch._C.DispatchKey.Python),
    "key_included": lambda: torch._C._dispatch_tls_is_dispatch_key_included(torch._C.DispatchKey.Python),
    "exclude_set": lambda: torch._C._dispatch_tls_local_exclude_set().has(torch._C.DispatchKey.Python),
}


def _tls_probe(probe: Any, phase: str) -> type:
    class ProbesDispatch(Function):
        @staticmethod
        def forward(ctx, x):
            return x * (5.0 if phase == "forward" and probe() else 2.0)

        @staticmethod
        def backward(ctx, g):
            return g * (5.0 if phase == "backward" and probe() else 2.0)

    return ProbesDispatch


@pytest.mark.parametrize("phase", ["forward", "backward"])
@pytest.mark.parametrize("probe", sorted(_TLS_PROBES))
def test_dispatch_state_probe(probe: str, phase: str) -> None:
    """A private getter of torch's thread-local dispatch state: the Python key is on while minihop
    traces (its fake mode), off in eager. Before round 24 the trace's answer was kept."""
    fn_cls = _tls_probe(_TLS_PROBES[probe], phase)
    matches_eager(fn_cls, lambda i: (_x(i),))
    with pytest.raises(UnsupportedOperationError, match="MH104"):
        minihop.function(fn_cls)(_x(0)).sum().backward()


# -- autograd engine state set up by the phase (forward AD, saved-tensor hooks, versions) -----

class TangentByDualNumbers(Function):
    """backward takes a derivative by forward-mode AD (a dual number's tangent; forward AD is
    off inside forward, on in backward)."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * 2

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        with fwAD.dual_level():
            dual = fwAD.make_dual(x.detach(), torch.ones_like(x))
            tangent = fwAD.unpack_dual(dual.sin()).tangent
        return g * tangent


class TangentByTorchLevel(Function):
    """The same through torch's own level and dual ops (as library code reaches them)."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * 2

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        level = torch._C._enter_dual_level()
        try:
            dual = torch._make_dual(x.detach(), torch.ones_like(x), level=level)
            tangent = torch._unpack_dual(dual.sin(), level=level).tangent
        finally:
            torch._C._exit_dual_level(level=level)
        return g * tangent


class RecomputesUnderPackHooks(Function):
    """backward recomputes under saved-tensor hooks whose pack changes what is saved."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        with torch.enable_grad():
            xd = x.detach().requires_grad_()
            with torch.autograd.graph.saved_tensors_hooks(lambda t: t * 2, lambda t: t):
                y = xd * xd
        (gx,) = torch.autograd.grad(y, xd, g)
        return gx


class BumpsVersion(Function):
    @staticmethod
    def forward(ctx, x, y):
        torch.autograd.graph.increment_version(y)
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2, None


@pytest.mark.parametrize("fn", [TangentByDualNumbers, TangentByTorchLevel, RecomputesUnderPackHooks])
def test_autograd_engine_state_set_up_by_the_phase(fn: type) -> None:
    fn.apply(_x(0)).sum().backward()  # (torch's own warn-once notices, given before the comparison)
    matches_eager(fn, lambda i: (_x(i),))
    with pytest.raises(UnsupportedOperationError, match="MH104"):
        minihop.function(fn)(_x(0)).sum().backward()


def test_version_counter_bumped_by_hand() -> None:
    held = [torch.ones(3), torch.ones(3)]

    def reset() -> None:
        held[:] = [torch.ones(3), torch.ones(3)]

    matches_eager(BumpsVersion, lambda i: (_x(i), held[i % 2]), state=lambda: [t._version for t in held], reset=reset)
    with pytest.raises(UnsupportedOperationError, match=r"MH104.*increment_version"):
        minihop.function(BumpsVersion)(_x(0), torch.ones(3))


# -- a dispatch mode the phase enters; a profiler range it opens ------------------------------

SEEN_OPS: list[str] = []


class CountsAtenOps(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        SEEN_OPS.append(str(func))
        return func(*args, **(kwargs or {}))


class CountsOwnOps(Function):
    @staticmethod
    def forward(ctx, x):
        with CountsAtenOps():
            y = x.sin() * 2
        return y

    @staticmethod
    def backward(ctx, g):
        with CountsAtenOps():
            return g * 2


def test_dispatch_mode_entered_by_the_phase() -> None:
    matches_eager(CountsOwnOps, lambda i: (_x(i),), state=lambda: list(SEEN_OPS), reset=SEEN_OPS.clear)
    with pytest.raises(UnsupportedOperationError, match=r"MH104.*under CountsAtenOps, a dispatch mode it entered"):
        minihop.function(CountsOwnOps)(_x(0))


class ProfiledRange(Function):
    @staticmethod
    def forward(ctx, x):
        with torch.profiler.record_function("minihop_test_range"):
            return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2


def _ranges(call: Any) -> int:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for i in range(2):
            call(_x(i)).sum().backward()
    return sum(1 for e in prof.events() if e.name == "minihop_test_range")


def test_profiler_range_opened_on_every_call() -> None:
    """A profiler range the Function opens is in eager's profile once per call; a capture's graphs
    opened none (the trace's one only). Refused now; fallback's profile is eager's."""
    assert _ranges(ProfiledRange.apply) == 2
    minihop.reset()
    assert _ranges(minihop.function(ProfiledRange, fallback="eager")) == 2
    with pytest.raises(UnsupportedOperationError, match=r"MH104.*record_function.*profiler"):
        minihop.function(ProfiledRange)(_x(0))


# -- a library module whose attributes its own code keeps -------------------------------------

class TogglesConfig(Function):
    """forward flips a flag of one of torch's config modules (values kept in its own dict)."""

    @staticmethod
    def forward(ctx, x):
        fx_config.no_data_dependent_graph_break = not fx_config.no_data_dependent_graph_break
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2


class SetsDeterministicFill(Function):
    """backward sets torch.utils.deterministic's flag (a property kept in C)."""

    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        torch.utils.deterministic.fill_uninitialized_memory = False
        return g * 2


def _library_flags() -> tuple[bool, bool]:
    return fx_config.no_data_dependent_graph_break, torch.utils.deterministic.fill_uninitialized_memory


def _library_flags_reset() -> None:
    fx_config.no_data_dependent_graph_break = False
    torch.utils.deterministic.fill_uninitialized_memory = True


@pytest.mark.parametrize("fn", [TogglesConfig, SetsDeterministicFill])
def test_write_to_a_library_module_that_keeps_its_own_attributes(fn: type) -> None:
    try:
        matches_eager(fn, lambda i: (_x(i),), state=_library_flags, reset=_library_flags_reset)
        with pytest.raises(minihop.SideEffectError, match=r"MH106.*a library module whose attributes are kept by its own code"):
            minihop.function(fn)(_x(0)).sum().backward()
    finally:
        _library_flags_reset()


# -- the backward autograd calls -------------------------------------------------------------

class AliasedVjp(Function):
    """``vjp = backward`` in the class body: both are the class's own, so eager's autograd raises
    when backward runs (``BackwardCFunction._get_user_fn``)."""

    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2

    vjp = backward


def test_backward_and_vjp_both_the_classes_own() -> None:
    matches_eager(AliasedVjp, lambda i: (_x(i),))


class BoxedGrads(Function):
    boxed_grads_call = True

    @staticmethod
    def forward(ctx, x):
        return x * 2, x * 3

    @staticmethod
    def backward(ctx, grads):
        first, second = grads
        grads.clear()  # (what the flag is for: the caller lets go of the grads early)
        return first * 2 + second * 3


def test_boxed_grads_call() -> None:
    matches_eager(BoxedGrads, lambda i: (_x(i),))


# -- a class with an apply of its own ----------------------------------------------------------

APPLIED: list[int] = []


class TriplesItsScale(Function):
    """An apply of the class's own that fills in a default and changes an argument (as some
    packages write one, for keyword arguments or defaults), counting its calls."""

    @staticmethod
    def forward(ctx, x, scale):
        ctx.scale = scale
        return x * scale

    @staticmethod
    def backward(ctx, g):
        return g * ctx.scale, None

    @classmethod
    def apply(cls, x, scale=2.0):
        APPLIED.append(1)
        return super().apply(x, scale * 3)


def test_own_apply_runs_as_eager_runs_it() -> None:
    matches_eager(TriplesItsScale, lambda i: (_x(i), float(i + 1)), state=lambda: len(APPLIED), reset=APPLIED.clear)
    matches_eager(TriplesItsScale, lambda i: (_x(i),), state=lambda: len(APPLIED), reset=APPLIED.clear)
    with pytest.raises(minihop.UnsupportedArgumentError, match=r"MH101.*has an apply of its own \(TriplesItsScale.apply\)"):
        minihop.function(TriplesItsScale)(_x(0), 1.0)


def _decorated(fallback: str) -> type:
    @minihop.captured(fallback=fallback)
    class TriplesDecorated(Function):
        @staticmethod
        def forward(ctx, x, scale):
            ctx.scale = scale
            return x * scale

        @staticmethod
        def backward(ctx, g):
            return g * ctx.scale, None

        @classmethod
        def apply(cls, x, scale=2.0):
            return super().apply(x, scale * 3)

    return TriplesDecorated


def test_own_apply_under_the_decorator() -> None:
    """``@minihop.captured`` replaces the class's apply: the one it replaced is still its own."""
    x = _x(0)
    y = _decorated("eager").apply(x, 1.0)
    y.sum().backward()
    torch.testing.assert_close(y, _x(0) * 3.0, rtol=0, atol=0)
    torch.testing.assert_close(x.grad, torch.full((3,), 3.0), rtol=0, atol=0)
    with pytest.raises(minihop.UnsupportedArgumentError, match="has an apply of its own"):
        _decorated("raise").apply(_x(0), 1.0)


@functools.lru_cache(maxsize=None)
def _ramp(n: int) -> torch.Tensor:
    return torch.arange(n, dtype=torch.float32) + 1


class ScalesByCachedRamp(Function):
    """An lru_cache helper: minihop watches its ops under a dispatch mode of its own, which is
    not one the phase entered (found by the effects fuzz: refused after the round's first fix)."""

    @staticmethod
    def forward(ctx, x):
        return x * _ramp(x.shape[0])

    @staticmethod
    def backward(ctx, g):
        return g * _ramp(g.shape[0])


def test_minihops_own_dispatch_mode_is_not_the_phases() -> None:
    matches_eager(ScalesByCachedRamp, lambda i: (_x(i),), refusable=False, reset=_ramp.cache_clear)


# -- a backward traced again that writes in place, then raises (effects fuzz seed 1282283) ----

def test_backward_traced_again_writes_in_place_then_raises() -> None:
    """Effects fuzz seed 1282283 (silent also at 0448779): backward bumps, in place, a table an
    lru_cache helper hands out, then reads forward's stash, which the caller empties before one
    call's ``.backward()``. Eager's backward bumps the table, then raises ``KeyError``; traced again
    for that call (the stash changed), the bump was a node of a graph that never ran, and the
    trace's ``KeyError`` propagated as eager's: the table stayed one behind in fallback mode. Such
    a trace is refused now (MH104), so fallback runs that backward eagerly. (The case is the
    generator's, by seed: reduced by hand to its Function, it no longer reached that path.)"""
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent / "fuzz"))
    import generate_effects
    source = generate_effects.generate_source(random.Random(1282283))
    with tempfile.TemporaryDirectory() as directory:
        outcome, detail = generate_effects.run_case(source, pathlib.Path(directory), 1282283)
    assert outcome in ("captured", "refused"), detail
