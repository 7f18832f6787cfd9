"""In-place updates of inputs that do not require grad (running statistics, step counters,
EMAs), written without ``ctx.mark_dirty`` and not returned: each capture updates the caller's
own tensor on every call exactly as eager ``F.apply`` does (values, version bumps, gradients),
through ``minihop.apply`` (with cache hits), ``minihop.capture`` and ``minihop.function``."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.autograd import Function

import minihop
from minihop.testing import assert_matches_eager

# ---------------------------------------------------------------------------------------------
# Functions, as a user writes them
# ---------------------------------------------------------------------------------------------


class BatchNormTrain(Function):
    """Training-mode batch norm over dim 0 that keeps running statistics and a batch counter."""

    @staticmethod
    def forward(ctx, x, weight, running_mean, running_var, num_batches_tracked, momentum, eps):
        mean = x.mean(0)
        var = x.var(0, unbiased=False)
        n = x.shape[0]
        running_mean.mul_(1 - momentum).add_(mean * momentum)
        running_var.mul_(1 - momentum).add_(var * (n / (n - 1)) * momentum)
        num_batches_tracked += 1
        invstd = torch.rsqrt(var + eps)
        xhat = (x - mean) * invstd
        ctx.save_for_backward(xhat, invstd, weight)
        return xhat * weight

    @staticmethod
    def backward(ctx, g):
        xhat, invstd, weight = ctx.saved_tensors
        gxhat = g * weight
        gx = invstd * (gxhat - gxhat.mean(0) - xhat * (gxhat * xhat).mean(0))
        return gx, (g * xhat).sum(0), None, None, None, None, None


class AdamLikeScale(Function):
    """Scales by a bias correction that depends on a step counter the forward advances."""

    @staticmethod
    def forward(ctx, x, step):
        step.add_(1)
        correction = 1 - torch.pow(0.9, step.to(x.dtype))
        ctx.correction = correction
        return x / correction

    @staticmethod
    def backward(ctx, g):
        return g / ctx.correction, None


class EMAIdentity(Function):
    """Returns its input scaled, keeping an exponential moving average of it in ``ema``."""

    @staticmethod
    def forward(ctx, x, ema, decay):
        ema.mul_(decay).add_(x, alpha=1 - decay)
        return x * 3

    @staticmethod
    def backward(ctx, g):
        return g * 3, None, None


class StatefulScale(Function):
    """The counter lives in a dict argument (a lifted input), the EMA in an object's attribute."""

    @staticmethod
    def forward(ctx, x, state, holder):
        state["step"].add_(1)
        holder.ema.lerp_(x.mean(0), 0.25)
        return x * holder.scale

    @staticmethod
    def backward(ctx, g):
        return g * 2, None, None


class Holder:
    def __init__(self, ema: torch.Tensor) -> None:
        self.ema = ema
        self.scale = 2.0


class Tracker(torch.nn.Module):
    def __init__(self, features: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(features))
        self.register_buffer("running_mean", torch.zeros(features))
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))


class ModuleStats(Function):
    """Updates the buffers of an ``nn.Module`` argument and uses its parameter."""

    @staticmethod
    def forward(ctx, x, module):
        module.running_mean.mul_(0.9).add_(x.mean(0) * 0.1)
        module.calls.add_(1)
        ctx.save_for_backward(module.weight)
        return x * module.weight

    @staticmethod
    def backward(ctx, g):
        (weight,) = ctx.saved_tensors
        return g * weight, None


GLOBAL_COUNT = torch.zeros(3)


class GlobalCount(Function):
    """Counts, in a module-level tensor, how many times each feature was positive."""

    @staticmethod
    def forward(ctx, x):
        GLOBAL_COUNT.add_((x > 0).sum(0))
        return x.sin()

    @staticmethod
    def backward(ctx, g):
        return g * 2


def make_closure_function(buf: torch.Tensor) -> type[Function]:
    class ClosureMax(Function):
        """Keeps the running maximum of its input in a closed-over tensor."""

        @staticmethod
        def forward(ctx, x):
            torch.maximum(buf, x.amax(0), out=buf)
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g * 2

    return ClosureMax


class ReadBeforeAndAfter(Function):
    """Reads the buffer before and after writing it: the order of ops matters."""

    @staticmethod
    def forward(ctx, x, buf):
        before = buf * 1
        buf.copy_(x.detach().sum(0))
        buf[0] = -1.0
        buf[1:].mul_(2)
        return x * before + x * buf

    @staticmethod
    def backward(ctx, g):
        return g, None


class ReadsBufferInBackward(Function):
    """Backward reads the buffer through a ctx attribute: eager sees its value at backward."""

    @staticmethod
    def forward(ctx, x, buf):
        buf.add_(1)
        ctx.buf = buf
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * ctx.buf, None


class SavesBuffer(Function):
    """Saves the buffer it wrote: a later write before backward trips eager's version check."""

    @staticmethod
    def forward(ctx, x, buf):
        buf.add_(1)
        ctx.save_for_backward(buf)
        return x * buf

    @staticmethod
    def backward(ctx, g):
        (buf,) = ctx.saved_tensors
        return g * buf, None


# ---------------------------------------------------------------------------------------------
# The comparison: N calls, eager against minihop, on clones of the same state
# ---------------------------------------------------------------------------------------------


def _tensors(value: Any) -> list[torch.Tensor]:
    """Every tensor in ``value`` (arguments, containers, objects, modules), in a fixed order."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, torch.nn.Module):
        return [*value.parameters(), *value.buffers()]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    if hasattr(value, "__dict__"):
        return [t for v in vars(value).values() for t in _tensors(v)]
    return []


def compare_calls(fn_cls: type[Function], state: tuple[Any, ...], run: Callable[..., Any],
                  calls: int = 3) -> None:
    """Call eager ``fn_cls.apply`` on a deep copy of ``state`` and ``run`` on ``state``,
    ``calls`` times each; after each call compare outputs, every tensor's value, ``.grad`` and
    version bump."""
    eager = copy.deepcopy(state)
    for call in range(calls):
        x = torch.randn(4, 3)
        e_args, m_args = (x.clone().requires_grad_(), *eager), (x.clone().requires_grad_(), *state)
        e_versions = [t._version for t in _tensors(e_args)]
        m_versions = [t._version for t in _tensors(m_args)]
        e_out, m_out = fn_cls.apply(*e_args), run(*m_args)
        torch.testing.assert_close(m_out, e_out)
        e_out.sum().backward()
        m_out.sum().backward()
        e_all, m_all = _tensors(e_args), _tensors(m_args)
        assert len(m_all) == len(e_all)
        for i, (m, e) in enumerate(zip(m_all, e_all, strict=True)):
            torch.testing.assert_close(m, e, msg=f"call {call}: tensor {i} differs from eager's")
            torch.testing.assert_close(m.grad, e.grad, msg=f"call {call}: .grad of tensor {i}")
        m_bumps = [t._version - v for t, v in zip(m_all, m_versions, strict=True)]
        e_bumps = [t._version - v for t, v in zip(e_all, e_versions, strict=True)]
        assert m_bumps == e_bumps, f"call {call}: version bumps {m_bumps}, eager's {e_bumps}"


def bn_state() -> tuple[Any, ...]:
    return (torch.randn(3).requires_grad_(), torch.zeros(3), torch.ones(3),
            torch.zeros((), dtype=torch.long), 0.1, 1e-5)


CASES: dict[str, tuple[type[Function], Callable[[], tuple[Any, ...]]]] = {
    "batchnorm": (BatchNormTrain, bn_state),
    "step_counter": (AdamLikeScale, lambda: (torch.zeros((), dtype=torch.long),)),
    "ema": (EMAIdentity, lambda: (torch.zeros(4, 3), 0.9)),
    "container_and_object": (StatefulScale,
                             lambda: ({"step": torch.zeros((), dtype=torch.long)}, Holder(torch.zeros(3)))),
    "module_buffers": (ModuleStats, lambda: (Tracker(3),)),
    "copy_setitem_view": (ReadBeforeAndAfter, lambda: (torch.ones(3),)),
    "buffer_read_in_backward": (ReadsBufferInBackward, lambda: (torch.zeros(4, 3),)),
}


class TestMatchesEager:
    @pytest.mark.parametrize("case", sorted(CASES))
    def test_apply_with_cache_hits(self, case: str) -> None:
        """Through minihop.apply, every call (the first one captures, the rest hit the cache) updates the state as eager does."""
        fn_cls, make_state = CASES[case]
        minihop.clear_cache()
        hits = minihop.counters()["cache_hits"]
        compare_calls(fn_cls, make_state(), lambda *a: minihop.apply(fn_cls, *a), calls=4)
        assert minihop.counters()["cache_hits"] - hits == 3

    @pytest.mark.parametrize("case", sorted(CASES))
    def test_capture_called_repeatedly(self, case: str) -> None:
        """One capture, called again and again, writes into the tensors of each call; its pair is consistent."""
        fn_cls, make_state = CASES[case]
        state = make_state()
        before = [t.clone() for t in _tensors(state)]
        cap = minihop.capture(fn_cls, torch.randn(4, 3, requires_grad=True), *state)
        torch.testing.assert_close(_tensors(state), before)  # capturing writes nothing
        minihop.check_consistent(cap.fwd, cap.bwd)
        compare_calls(fn_cls, state, cap)

    @pytest.mark.parametrize("fallback", ["raise", "eager"])
    @pytest.mark.parametrize("case", sorted(CASES))
    def test_function(self, case: str, fallback: str) -> None:
        """minihop.function, strict or with the eager fallback, captures (nothing falls back) and matches eager."""
        fn_cls, make_state = CASES[case]
        fallbacks = minihop.counters()["fallbacks"]
        compare_calls(fn_cls, make_state(), minihop.function(fn_cls, fallback=fallback))
        assert minihop.counters()["fallbacks"] == fallbacks

    def test_global_tensor(self) -> None:
        """A module-level tensor written by forward is the caller's: updated on every call and on cache hits."""
        GLOBAL_COUNT.zero_()
        minihop.clear_cache()
        expected = torch.zeros(3)
        for call in range(4):
            x = torch.randn(4, 3, requires_grad=True)
            out = minihop.apply(GlobalCount, x)
            expected += (x > 0).sum(0)
            torch.testing.assert_close(GLOBAL_COUNT, expected)
            torch.testing.assert_close(out, x.detach().sin())
        assert minihop.counters()["cache_hits"] >= 3
        version = GLOBAL_COUNT._version
        GlobalCount.apply(torch.randn(4, 3))
        eager_bump = GLOBAL_COUNT._version - version
        version = GLOBAL_COUNT._version
        minihop.apply(GlobalCount, torch.randn(4, 3))
        assert GLOBAL_COUNT._version - version == eager_bump == 1

    def test_closure_tensor(self) -> None:
        """A closed-over tensor written with out= is updated on every call, as eager's is."""
        e_buf, m_buf = torch.full((3,), -1e9), torch.full((3,), -1e9)
        e_fn, m_fn = make_closure_function(e_buf), make_closure_function(m_buf)
        cap = minihop.capture(m_fn, torch.randn(4, 3))
        minihop.check_consistent(cap.fwd, cap.bwd)
        for _ in range(3):
            x = torch.randn(4, 3)
            ve, vm = e_buf._version, m_buf._version
            torch.testing.assert_close(cap(x), e_fn.apply(x))
            torch.testing.assert_close(m_buf, e_buf)
            assert m_buf._version - vm == e_buf._version - ve == 1

    def test_graph_keeps_unused_writes(self) -> None:
        """The writes appear in the fwd graph, in forward's order, though nothing reads their results."""
        cap = minihop.capture(ReadBeforeAndAfter, torch.randn(4, 3, requires_grad=True), torch.ones(3))
        code = cap.fwd.code
        positions = [code.index(s) for s in ("before = l_buf_ * 1", "l_buf_.copy_(", "[0] = -1.0", ".mul_(2)", "outs = ")]
        assert positions == sorted(positions), code


class ReturnsBuffer(Function):
    """Writes the buffer and returns it too (not marked dirty)."""

    @staticmethod
    def forward(ctx, x, buf):
        buf.add_(1)
        return x * 2, buf

    @staticmethod
    def backward(ctx, g, gbuf):
        return g * 2, None


class TestMoreForms:
    def test_written_buffer_returned(self) -> None:
        """A written buffer forward also returns comes back as eager's: a view of it that requires grad, one bump."""
        results = []
        for run in (ReturnsBuffer.apply, minihop.capture(ReturnsBuffer, torch.randn(3, requires_grad=True), torch.zeros(3))):
            x, buf = torch.randn(3, requires_grad=True), torch.zeros(3)
            version = buf._version
            _, out = run(x, buf)
            results.append((out is buf, out._base is buf, out.requires_grad, buf._version - version, buf.tolist()))
        assert results[1] == results[0] == (False, True, True, 1, [1.0, 1.0, 1.0])

    def test_dynamic_shapes(self) -> None:
        """With dynamic=True one capture serves several batch sizes and still updates the buffer each call."""

        class BatchMean(Function):
            @staticmethod
            def forward(ctx, x, running_mean):
                running_mean.mul_(0.5).add_(x.mean(0), alpha=0.5)
                return x * 2

            @staticmethod
            def backward(ctx, g):
                return g * 2, None

        fn = minihop.function(BatchMean, dynamic=True)
        e_buf, m_buf = torch.zeros(3), torch.zeros(3)
        captures = minihop.counters()["captures"]
        for n in (2, 4, 6, 8):
            x = torch.randn(n, 3)
            torch.testing.assert_close(fn(x, m_buf), BatchMean.apply(x, e_buf))
            torch.testing.assert_close(m_buf, e_buf)
        assert minihop.counters()["captures"] - captures == 1


class TestBackwardSeesEagersBuffer:
    def test_ctx_attribute_reads_current_value(self) -> None:
        """Two forwards before one backward: the first backward reads the buffer's current value, as in eager."""
        results = []
        for run in (ReadsBufferInBackward.apply, minihop.capture(ReadsBufferInBackward, torch.randn(3, requires_grad=True), torch.zeros(3))):
            x, buf = torch.ones(3, requires_grad=True), torch.zeros(3)
            y1 = run(x, buf)
            run(x, buf)
            y1.sum().backward()
            results.append((x.grad, buf))
        torch.testing.assert_close(results[1], results[0])
        assert results[0][0].tolist() == [2.0, 2.0, 2.0]

    def test_saved_then_written_raises_like_eager(self) -> None:
        """A saved buffer written again by a later call before backward fails backward with eager's version error."""
        for run in (SavesBuffer.apply, minihop.capture(SavesBuffer, torch.randn(3, requires_grad=True), torch.zeros(3))):
            x, buf = torch.ones(3, requires_grad=True), torch.zeros(3)
            y = run(x, buf)
            y.sum().backward()
            torch.testing.assert_close(x.grad, torch.ones(3))  # one call: fine
            y1 = run(x, buf)
            run(x, buf)
            with pytest.raises(RuntimeError, match="modified by an inplace operation"):
                y1.sum().backward()


class ExpOut(Function):
    """PyTorch's forward-under-no-grad test: ``out=`` the input, returned without mark_dirty."""

    @staticmethod
    def forward(ctx, x):
        torch.exp(x, out=x)
        ctx.save_for_backward(x)
        return x

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return g * y


class ClampMax(Function):
    """A quantisation library's clamp: ``torch.min(x, hi, out=x)``, straight-through grad."""

    @staticmethod
    def forward(ctx, x, hi):
        torch.min(x, hi, out=x)
        return x

    @staticmethod
    def backward(ctx, g):
        return g, None


def _observe(run: Any, make: Any) -> list[Any]:
    """What a user sees: output values, requires_grad, is-view, whether it is the input
    object, each argument's value and version after, each .grad after backward, and whether a
    use of the old value made before the call then fails backward."""
    args = make()
    out = run(*args)
    seen = [out.detach().clone(), (out.requires_grad, out._is_view(), out is args[0]),
            [a.detach().clone() for a in args if isinstance(a, torch.Tensor)],
            [a._version for a in args if isinstance(a, torch.Tensor)]]
    out.sum().backward()
    seen.append([a.grad for a in args if isinstance(a, torch.Tensor)])
    args = make()
    first = next(a for a in args if isinstance(a, torch.Tensor) and a.requires_grad)
    before = (first * first).sum()  # saves the old value
    run(*args)
    try:
        before.backward()
        seen.append(torch.tensor(0))
    except RuntimeError as e:
        assert "modified by an inplace operation" in str(e)
        seen.append(torch.tensor(1))
    return seen


class SaveThenWrite(Function):
    """Saves an input, then writes it: eager packs saved tensors after forward, so backward
    reads the written value without a version error."""

    @staticmethod
    def forward(ctx, w, x):
        ctx.save_for_backward(x)
        x.mul_(2)
        return w * x

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * x, None


class TestInputsRequiringGrad:
    """In-place writes into inputs that require grad, without mark_dirty: eager allows them
    (forward runs under no_grad) and so does minihop, with eager's observable effects
    (issue 31; these were MH105)."""

    @pytest.mark.parametrize("fn_cls,make", [
        (ExpOut, lambda: (torch.tensor([0.5, -1.0, 2.0], requires_grad=True),)),
        (ClampMax, lambda: (torch.tensor([0.5, 2.0, -1.0], requires_grad=True), torch.ones(3))),
        (EMAIdentity, lambda: (torch.ones(4, 3), torch.zeros(4, 3, requires_grad=True), 0.5)),
        (SaveThenWrite, lambda: (torch.tensor([0.5, -1.0, 2.0], requires_grad=True), torch.ones(3, requires_grad=True))),
    ], ids=["exp_out", "min_out", "ema_mul_", "saved_then_written"])
    @pytest.mark.parametrize("fallback", [None, "eager"], ids=["strict", "fallback"])
    def test_matches_eager(self, fn_cls: type, make: Any, fallback: str | None) -> None:
        expected = [_observe(fn_cls.apply, make) for _ in range(2)]
        cf = minihop.function(fn_cls) if fallback is None else minihop.function(fn_cls, fallback=fallback)
        found = [_observe(cf, make) for _ in range(2)]
        torch.testing.assert_close(found, expected)
        assert cf.stats.eager_calls == 0

    def test_explain_says_written_back(self) -> None:
        text = str(minihop.explain(ExpOut, torch.randn(3, requires_grad=True), print_report=False))
        assert "forward: exp writes x in place: written back" in text, text

    def test_module_parameter(self) -> None:
        """A write into an nn.Module argument's parameter: the caller's parameter changes, as in eager."""

        class DecayWeight(Function):
            @staticmethod
            def forward(ctx, x, module):
                module.weight.mul_(0.5)
                return x * module.weight.detach()

            @staticmethod
            def backward(ctx, g):
                return g * 2, None

        torch.manual_seed(0)
        state = Tracker(3).state_dict()
        mods = [Tracker(3), Tracker(3)]
        for mod in mods:
            mod.load_state_dict(state)
        x = torch.randn(4, 3)
        outs = []
        for run, mod in ((DecayWeight.apply, mods[0]), (minihop.function(DecayWeight), mods[1])):
            outs.append([run(x, mod) for _ in range(2)])
        torch.testing.assert_close(outs[1], outs[0])
        torch.testing.assert_close(mods[1].weight, mods[0].weight)
        assert mods[1].weight._version == mods[0].weight._version

    def test_write_through_a_view_of_an_input_requiring_grad(self) -> None:
        """A write through a view is a write into the input itself, as in eager."""

        class ViewWrite(Function):
            @staticmethod
            def forward(ctx, x):
                x[:2].zero_()
                return x * 2

            @staticmethod
            def backward(ctx, g):
                return g * 2

        assert_matches_eager(ViewWrite, torch.randn(3, requires_grad=True))
