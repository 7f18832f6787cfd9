"""Python values a Function's forward or backward takes out of tensor data: constants, value
guards (before forward, and before backward), refusals."""

from __future__ import annotations

import re
from typing import Any

import pytest
import torch
from torch.autograd.function import once_differentiable

import minihop


def clones(*args: Any) -> tuple[Any, ...]:
    return tuple(a.detach().clone().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a
                 for a in args)


def check_apply(fn_cls: type, *args: Any) -> None:
    """minihop.apply on ``args`` gives eager's outputs and every .grad, exactly."""
    mine, ref = clones(*args), clones(*args)
    out = minihop.apply(fn_cls, *mine)
    expected = fn_cls.apply(*ref)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    out.sum().backward()
    expected.sum().backward()
    for a, b in zip(mine, ref, strict=True):
        if isinstance(a, torch.Tensor) and a.requires_grad:
            torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=0)


class SameOrNot(torch.autograd.Function):
    """torch-struct/entmax style: a special case when both inputs are equal."""

    @staticmethod
    def forward(ctx, x1, x2):
        if torch.equal(x1, x2):
            return x1 * 2
        return x1 + x2

    @staticmethod
    def backward(ctx, g):
        return g * 2, g


class ScaleByMax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        scale = x.abs().max().item()
        ctx.scale = scale
        return x / scale

    @staticmethod
    def backward(ctx, g):
        return g / ctx.scale


class ClampedScale(torch.autograd.Function):
    """The max read with .item() decides a Python branch: a value read, not a symbol."""

    @staticmethod
    def forward(ctx, x):
        scale = x.abs().max().item()
        if scale < 1:
            scale = 1.0
        ctx.scale = scale
        return x / scale

    @staticmethod
    def backward(ctx, g):
        return g / ctx.scale


class SavedDim(torch.autograd.Function):
    """torch.tensor(dim) saved for backward, and dim.item() read in backward."""

    @staticmethod
    def forward(ctx, x, dim):
        ctx.save_for_backward(torch.tensor(dim))
        return x.cumsum(dim)

    @staticmethod
    def backward(ctx, g):
        (dim,) = ctx.saved_tensors
        return g.flip(dim.item()).cumsum(dim.item()).flip(dim.item()), None


class LoopCount(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        n = torch.tensor(3)
        for _ in range(int(n)):
            x = x * 2
        return x

    @staticmethod
    def backward(ctx, g):
        return g * 8


class Branch(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        if x.sum() > 0:
            return x * 2
        return x * 3

    @staticmethod
    def backward(ctx, g):
        return g * 2


class GradBranch(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        if g.sum() > 0:
            return g * 2
        return g


class TestConstants:
    def test_loop_count(self) -> None:
        """int(torch.tensor(3)) as a loop count is a constant: captured, no value guard."""
        check_apply(LoopCount, torch.randn(4, requires_grad=True))
        cap = minihop.capture(LoopCount, torch.randn(4))
        assert [(r.kind, r.op, r.value) for r in cap.data_reads] == [("constant", "__int__", 3)]
        assert not any(r.guards_forward for r in cap.data_reads)

    def test_saved_dim_item_in_backward(self) -> None:
        """A constant saved for backward carries its value into backward's trace."""
        for dim in (0, 1):
            check_apply(SavedDim, torch.randn(3, 4, requires_grad=True), dim)
        cap = minihop.capture(SavedDim, torch.randn(3, 4, requires_grad=True), 1)
        assert {(r.kind, r.phase) for r in cap.data_reads} == {("constant", "backward")}


class TestValueGuards:
    def test_branch_recaptures(self) -> None:
        """`if x.sum() > 0`: each branch is captured once; a change of branch recaptures."""
        minihop.reset()
        check_apply(Branch, torch.tensor([1.0, 2.0], requires_grad=True))
        check_apply(Branch, torch.tensor([3.0, 2.0], requires_grad=True))
        assert minihop.counters()["captures"] == 1
        check_apply(Branch, torch.tensor([-1.0, -2.0], requires_grad=True))
        assert minihop.counters()["captures"] == 2
        check_apply(Branch, torch.tensor([5.0, 2.0], requires_grad=True))
        assert minihop.counters()["captures"] == 2  # the first capture serves it again

    def test_torch_equal(self) -> None:
        """torch.equal(x1, x2) special-casing: both branches equal eager."""
        minihop.reset()
        a = torch.tensor([1.0, 2.0], requires_grad=True)
        check_apply(SameOrNot, a, a.detach().clone().requires_grad_())
        check_apply(SameOrNot, a, torch.tensor([1.0, 3.0], requires_grad=True))
        assert minihop.counters()["captures"] == 2

    def test_item_branched_on_is_guarded(self) -> None:
        """x.abs().max().item() that a Python branch then reads is guarded exactly (the
        unbacked symbol falls back to a value read)."""
        minihop.reset()
        check_apply(ClampedScale, torch.tensor([1.0, -4.0], requires_grad=True))
        check_apply(ClampedScale, torch.tensor([2.0, 4.0], requires_grad=True))
        assert minihop.counters()["captures"] == 1  # same max, same capture
        check_apply(ClampedScale, torch.tensor([1.0, 2.5], requires_grad=True))
        assert minihop.counters()["captures"] == 2
        check_apply(ClampedScale, torch.tensor([0.5, 0.25], requires_grad=True))  # other branch
        assert minihop.counters()["captures"] == 3
        cap = minihop.capture(ClampedScale, torch.tensor([1.0, 2.5]))
        assert [(r.kind, r.op, r.value) for r in cap.data_reads] == [("guarded", "item", 2.5)]

    def test_capture_raises_on_changed_value(self) -> None:
        """A capture called with data that changes a guarded value raises MH301 naming it."""
        cap = minihop.capture(Branch, torch.tensor([1.0, 2.0]))
        cap(torch.tensor([4.0, 2.0]))
        with pytest.raises(minihop.GuardMismatchError,
                           match=r"^\[MH301\] Capture of Branch: a value its forward read from "
                                 r"tensor data changed: __bool__ gave True at capture .*if x\.sum\(\) > 0:"):
            cap(torch.tensor([-4.0, 2.0]))

    def test_eager_past_limit(self) -> None:
        """With fallback='eager', values past cache_limit run eagerly, still equal to eager."""
        f = minihop.function(ClampedScale, fallback="eager", cache_limit=2)
        with pytest.warns(UserWarning, match="cache_limit=2"):
            for k in range(1, 5):
                x = torch.tensor([1.0, float(k)], requires_grad=True)
                torch.testing.assert_close(f(x), ClampedScale.apply(x.detach()), rtol=0, atol=0)
        assert f.stats.captures == 2 and f.stats.eager_calls == 2


class RandomBranchBwd(torch.autograd.Function):
    """A backward branch on a random value: not a function of anything a guard can recompute."""

    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        if torch.rand(()) > 2.0:
            return g * 3
        return g * 2


class NoisyWithBranch(torch.autograd.Function):
    """An in-place write and a random op elsewhere in forward, then a branch on a value made
    from neither (issue 31: it was refused, as if every value depended on the whole graph)."""

    @staticmethod
    def forward(ctx, x):
        noise = torch.rand(x.shape)
        buf = torch.empty(3)
        y = x.clone()
        y.add_(noise)
        if (x.abs().sum() > 0) and bool((torch.tensor([1.0, 2.0]) > 0).all()):
            y = y * 2
        return y

    @staticmethod
    def backward(ctx, g):
        return g * 2


class WrittenThroughView(torch.autograd.Function):
    """A value read of a tensor written in place through a view: the write is part of it."""

    @staticmethod
    def forward(ctx, x):
        acc = torch.zeros(4)
        acc[:2].add_(x[:2])
        acc.view(2, 2)[1].mul_(0).add_(3.0)
        if acc.sum() > 2.5:
            return x * acc
        return x - acc

    @staticmethod
    def backward(ctx, g):
        return g  # (both branches' true gradients differ; eager's is what is compared)


class RandomWrittenIntoRead(torch.autograd.Function):
    """A random value written in place into the tensor read: still refused."""

    @staticmethod
    def forward(ctx, x):
        acc = torch.zeros(3)
        acc.add_(torch.rand(3))
        if acc.sum() > 10.0:
            return x * 3
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2


class TestUnrelatedOps:
    def test_unrelated_random_and_empty(self) -> None:
        """Branches on values computed from inputs and constants only capture, with eager's
        outputs (noise drawn from the same seed) and grads."""
        x = torch.randn(4, requires_grad=True)
        outs = []
        for run in (NoisyWithBranch.apply, lambda a: minihop.apply(NoisyWithBranch, a)):
            torch.manual_seed(3)
            outs.append(run(x))
        torch.testing.assert_close(outs[1], outs[0], rtol=0, atol=0)
        cap = minihop.capture(NoisyWithBranch, x)
        assert {r.kind for r in cap.data_reads} == {"guarded", "constant"}

    def test_write_through_a_view_is_part_of_the_value(self) -> None:
        """The writes into the read tensor (through views) are computed with it: eager's branch."""
        for data in ([1.0, 2.0, 0.0, 0.0], [-1.0, -2.0, 5.0, 5.0]):
            check_apply(WrittenThroughView, torch.tensor(data, requires_grad=True))

    def test_random_written_into_the_read_tensor_is_refused(self) -> None:
        with pytest.raises(minihop.DataDependentError, match=r"(?s)RandomWrittenIntoRead\.forward calls __bool__.*computed from rand"):
            minihop.capture(RandomWrittenIntoRead, torch.randn(3, requires_grad=True))


class ConstantMask(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        keep = torch.tensor([True, False, True, True])
        cols = torch.arange(4)[keep]
        ctx.n = cols.shape[0]
        ctx.save_for_backward(cols)
        out = x[:, cols] * 2
        for i in range(cols.shape[0]):
            out = out + i
        return out
    @staticmethod
    def backward(ctx, g):
        (cols,) = ctx.saved_tensors
        gx = torch.zeros(g.shape[0], 4)
        gx[:, cols] = g * 2
        return gx
class ConstantSplit(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        bounds = torch.tensor([1, 3])
        parts = torch.tensor_split(torch.arange(x.shape[0]), bounds)
        ctx.sizes = [len(p) for p in parts]
        return torch.stack([x[p].sum(0) for p in parts])
    @staticmethod
    def backward(ctx, g):
        return torch.cat([g[i].expand(n, -1) for i, n in enumerate(ctx.sizes)])


class TestConstantShapes:
    """A boolean-mask index or tensor_split of tensors made from Python values only: the
    result's size is known (computed for real), not data-dependent (issue 31: MH103)."""

    @pytest.mark.parametrize("fn_cls,shape", [(ConstantMask, (3, 4)), (ConstantSplit, (5, 2))],
                             ids=["mask", "tensor_split"])
    @pytest.mark.parametrize("fallback", [None, "eager"], ids=["strict", "fallback"])
    def test_matches_eager(self, fn_cls: type, shape: tuple[int, ...], fallback: str | None) -> None:
        a = torch.randn(*shape)
        cf = minihop.function(fn_cls) if fallback is None else minihop.function(fn_cls, fallback=fallback)
        for _ in range(3):
            mine, ref = clones(a.requires_grad_(), a)
            out, expected = cf(mine), fn_cls.apply(ref)
            torch.testing.assert_close(out, expected, rtol=0, atol=0)
            out.sum().backward()
            expected.sum().backward()
            torch.testing.assert_close(mine.grad, ref.grad, rtol=0, atol=0)
        assert cf.stats.captures == 1 and cf.stats.eager_calls == 0


class TestRefusals:
    def test_random_branch_in_backward(self) -> None:
        """A backward branch on a random value stays refused: the line, the op, the ways out."""
        with pytest.raises(minihop.DataDependentError,
                           match=r"(?s)^\[MH103\] RandomBranchBwd\.backward calls __bool__.*"
                                 r"if torch\.rand\(\(\)\) > 2\.0:.*computed from rand.*"
                                 r"torch\._check.*fallback=\"eager\""):
            minihop.capture(RandomBranchBwd, torch.randn(3, requires_grad=True))

    def test_whole_function_trace(self) -> None:
        """minihop.trace has no per-call guard to run before backward: a backward branch on a
        grad is refused there, naming the reason."""
        with pytest.raises(minihop.DataDependentError,
                           match=r"(?s)^\[MH103\] BranchGrad\.backward calls __bool__.*no real arguments"):
            minihop.trace(lambda x: BranchGrad.apply(x) * 1, torch.randn(3, requires_grad=True))


class TestExplain:
    def test_lists_each_value(self) -> None:
        """explain lists each data-dependent value with its handling and source line."""
        report = minihop.explain(Branch, torch.tensor([1.0, 2.0]), print_report=False)
        assert len(report.data_values) == 1
        assert report.data_values[0].startswith("__bool__ in forward == True  (value-guarded")
        assert "if x.sum() > 0:" in report.data_values[0]
        const = minihop.explain(LoopCount, torch.randn(2), print_report=False)
        assert "(constant" in const.data_values[0] and "data-dependent values" in str(const)
        refused = minihop.explain(RandomBranchBwd, torch.randn(3, requires_grad=True), print_report=False)
        assert refused.data_values[0].startswith("refused: RandomBranchBwd.backward calls __bool__")

    def test_lists_backward_values(self) -> None:
        """A value backward reads is listed as guarded before each backward, with its line."""
        report = minihop.explain(BranchSumBwd, torch.tensor([1.0, 2.0], requires_grad=True),
                                 print_report=False)
        assert report.captured and len(report.data_values) == 1
        line = report.data_values[0]
        assert line.startswith("__bool__ in backward == True  (value-guarded before each backward")
        assert "if x.sum() > 0:" in line




# ---------------------------------------------------------------------------------------------
# Unbacked values: data-dependent sizes and scalars that only flow into torch ops
# ---------------------------------------------------------------------------------------------

class MaskBwd(torch.autograd.Function):
    """Surrogate-gradient idiom (snntorch / spikingjelly): a mask read-modify-write in backward."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.sign()

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        grad = grad.clone()
        grad[x >= 0] = -grad[x >= 0]
        return grad


class MaskFwd(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x[x > 0] * 2

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        out = torch.zeros_like(x)
        out[x > 0] = g * 2
        return out


class MaskedSelect(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        m = x > 0
        ctx.save_for_backward(m)
        return torch.masked_select(x, m)

    @staticmethod
    def backward(ctx, g):
        (m,) = ctx.saved_tensors
        return torch.zeros(m.shape, dtype=g.dtype).masked_scatter(m, g)


class Nonzero(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        idx = torch.nonzero(x > 0).squeeze(1)
        ctx.save_for_backward(idx)
        ctx.n = x.shape[0]
        return x[idx]

    @staticmethod
    def backward(ctx, g):
        (idx,) = ctx.saved_tensors
        return torch.zeros(ctx.n, dtype=g.dtype).index_add(0, idx, g)


class DivMaxBwd(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * 2

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * 2 / x.abs().max().item()


class SplitBwd(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, sizes):
        ctx.save_for_backward(sizes)
        return x * 3

    @staticmethod
    def backward(ctx, g):
        (sizes,) = ctx.saved_tensors
        parts = g.split(sizes.tolist())
        return torch.cat([p * (i + 1) for i, p in enumerate(parts)]), None


class CheckedCount(torch.autograd.Function):
    """torch._check states what the code relies on; the capture checks it on every call."""

    @staticmethod
    def forward(ctx, x):
        y = x[x > 0]
        torch._check(y.shape[0] >= 2)
        if y.shape[0] >= 2:  # decided by the check: no guard
            return y[:2] * 2
        return y

    @staticmethod
    def backward(ctx, g):
        return None


# Inputs with 0, 1, some and all entries positive (every count a mask can have), and
# different maxima: a stale capture would give a wrong shape or value on some of them.
_DATA = (
    torch.tensor([1.0, -2.0, 3.0, -4.0, 5.0, 0.0]),
    torch.tensor([-1.0, -2.0, -3.0, -4.0, -5.0, -6.0]),
    torch.tensor([0.5, 2.0, 3.5, 4.0, 5.5, 7.0]),
    torch.tensor([-1.0, 9.0, -3.0, -4.0, -5.0, -6.0]),
    torch.tensor([0.0, -0.25, 0.0, 8.0, 0.0, 0.0]),
)

_UNBACKED = [MaskBwd, MaskFwd, MaskedSelect, Nonzero, ScaleByMax, DivMaxBwd]


def _data(k: int) -> torch.Tensor:
    return _DATA[k].clone().requires_grad_()


def check_capture(cap: Any, fn_cls: type, *args: Any) -> None:
    """``cap(*args)`` gives eager's outputs and every .grad, exactly."""
    mine, ref = clones(*args), clones(*args)
    out, expected = cap(*mine), fn_cls.apply(*ref)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    (out * torch.arange(out.numel()).reshape(out.shape)).sum().backward()
    (expected * torch.arange(expected.numel()).reshape(expected.shape)).sum().backward()
    for a, b in zip(mine, ref, strict=True):
        if isinstance(a, torch.Tensor) and a.requires_grad:
            torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=0)


class TestUnbacked:
    @pytest.mark.parametrize("fn_cls", _UNBACKED, ids=lambda f: f.__name__)
    def test_apply_one_capture_for_all_data(self, fn_cls: type) -> None:
        """Through minihop.apply: every count and maximum equals eager, from one capture."""
        minihop.reset()
        for k in (0, 1, 2, 3, 4, 0, 2):
            check_apply(fn_cls, _data(k))
        assert minihop.counters()["captures"] == 1

    @pytest.mark.parametrize("fn_cls", _UNBACKED, ids=lambda f: f.__name__)
    def test_capture_serves_other_data(self, fn_cls: type) -> None:
        """minihop.capture on one input, called with others (other counts, other maxima)."""
        cap = minihop.capture(fn_cls, _data(0))
        assert any(r.kind == "unbacked" for r in cap.data_reads)
        assert not any(r.guards_forward for r in cap.data_reads)
        for k in (1, 2, 3, 4, 0):
            check_capture(cap, fn_cls, _data(k))
        minihop.check_consistent(cap.fwd, cap.bwd)

    def test_split_sizes_in_backward(self) -> None:
        """split(sizes.tolist()) in backward: each call's sizes, through one capture."""
        minihop.reset()
        for sizes in ([1, 5], [2, 4], [3, 3], [6, 0], [2, 4]):
            check_apply(SplitBwd, torch.randn(6, requires_grad=True), torch.tensor(sizes))
        assert minihop.counters()["captures"] == 1
        cap = minihop.capture(SplitBwd, torch.randn(6, requires_grad=True), torch.tensor([1, 5]))
        check_capture(cap, SplitBwd, torch.randn(6, requires_grad=True), torch.tensor([4, 2]))

    def test_deferred_assert_checked_on_every_call(self) -> None:
        """The split's sizes must sum to the length: a runtime assert in the bwd graph; sizes
        that do not fail on a call after the capture as they fail in eager."""
        cap = minihop.capture(SplitBwd, torch.randn(6, requires_grad=True), torch.tensor([1, 5]))
        asserts = [n for n in cap.bwd.graph.nodes if n.target is torch.ops.aten._assert_scalar.default]
        assert any("Eq(u0 + u1, 6)" in n.args[1] for n in asserts)
        x = torch.randn(6, requires_grad=True)
        with pytest.raises(RuntimeError):
            SplitBwd.apply(x, torch.tensor([2, 2])).sum().backward()
        with pytest.raises(RuntimeError, match="split_with_sizes expects split_sizes to sum"):
            cap(x, torch.tensor([2, 2])).sum().backward()  # the split itself, as in eager

    def test_torch_check(self) -> None:
        """torch._check on a mask's count: captured once, the check runs on every call."""
        minihop.reset()
        for k in (0, 2):
            check_capture(minihop.function(CheckedCount), CheckedCount, _data(k))
        cap = minihop.capture(CheckedCount, _data(0))
        check_capture(cap, CheckedCount, _data(2))
        for bad in (_data(1), _data(3)):  # 0 and 1 positive entries
            with pytest.raises(RuntimeError):
                CheckedCount.apply(bad)
            with pytest.raises(RuntimeError, match="Runtime assertion failed"):
                cap(bad)

    def test_graphs_show_the_ops(self) -> None:
        """The graphs carry the user's ops and the symbols, saved for backward as SymInts are."""
        cap = minihop.capture(Nonzero, _data(0))
        fwd = cap.fwd.code
        assert "torch.nonzero(" in fwd and "torch.ops.aten.sym_size.int(nonzero, 0)" in fwd
        bwd_inputs = [n for n in cap.bwd.graph.nodes if n.op == "placeholder"]
        assert [str(n.meta["val"]) for n in bwd_inputs[1:]] == ["u0", "FakeTensor(..., size=(u0,), dtype=torch.int64)"]
        masked = minihop.capture(MaskFwd, _data(0))
        assert "l_x_[gt]" in masked.fwd.code
        item = minihop.capture(ScaleByMax, _data(0))
        assert ".item()" in item.fwd.code and "Sym(zuf0)" in str(item)

    def test_explain_lists_unbacked(self) -> None:
        """explain names each unbacked value with its op and source line."""
        report = minihop.explain(Nonzero, _data(0), print_report=False)
        (line,) = report.data_values
        assert line.startswith("nonzero in forward -> u0  (unbacked")
        assert "idx = torch.nonzero(x > 0).squeeze(1)" in line
        scalar = minihop.explain(DivMaxBwd, _data(0), print_report=False)
        assert scalar.data_values[0].startswith("item in backward -> zuf0  (unbacked")

    def test_static_capture_pays_no_shape_env(self) -> None:
        """A Function without data-dependent ops is traced without a ShapeEnv."""
        cap = minihop.capture(Branch, torch.tensor([1.0, 2.0]))
        assert any(r.guards_forward for r in cap.data_reads)  # value-guarded as before
        raw = minihop.pipeline.run_pipeline(LoopCount, (torch.randn(2),), {})[0]
        assert raw.inputs_for_retrace.fake_mode.shape_env is None

    def test_dynamic_capture_with_mask(self) -> None:
        """A mask in a capture with symbolic sizes: both kinds of symbols, one capture."""
        cap = minihop.capture(MaskFwd, _data(0), dynamic=True)
        for n in (3, 6, 9):
            for seed in range(2):
                torch.manual_seed(seed)
                check_capture(cap, MaskFwd, torch.randn(n, requires_grad=True))

    def test_agrees_with_dynamo(self) -> None:
        """torch.compile(backend="eager") (which graph-breaks on these) gives the same outputs."""
        for fn_cls in (MaskFwd, ScaleByMax, Nonzero):
            compiled = torch.compile(fn_cls.apply, backend="eager")
            for k in (0, 2):
                torch.testing.assert_close(minihop.apply(fn_cls, _data(k)), compiled(_data(k)),
                                           rtol=0, atol=0)


class _Holder:
    last: Any = None


HOLDER = _Holder()


class MaxToState(torch.autograd.Function):
    """The max leaves the graphs (written to Python state): a value read, replayed exactly."""

    @staticmethod
    def forward(ctx, x):
        m = x.abs().max().item()
        HOLDER.last = m
        return x / m

    @staticmethod
    def backward(ctx, g):
        return g


class MaxReturned(torch.autograd.Function):
    """The max returned as a Python number: a value read too."""

    @staticmethod
    def forward(ctx, x):
        m = x.abs().max().item()
        return x / m, m

    @staticmethod
    def backward(ctx, g, gm):
        return g


class TestUnbackedFallback:
    def test_written_to_python_state(self) -> None:
        """A number the trace would otherwise replay as its symbol is value-guarded."""
        minihop.reset()
        for k in (0, 2, 0):
            check_apply(MaxToState, _data(k))
            assert HOLDER.last == _DATA[k].abs().max().item() and type(HOLDER.last) is float
        assert minihop.counters()["captures"] == 2

    def test_returned_as_number(self) -> None:
        """forward returning the .item() value gives each call's value, as eager does."""
        for k in (0, 2, 3):
            out, m = minihop.apply(MaxReturned, _data(k))
            ref, m_ref = MaxReturned.apply(_data(k))
            torch.testing.assert_close(out, ref, rtol=0, atol=0)
            assert m == m_ref and type(m) is float

    def test_branch_in_backward_on_item(self) -> None:
        """A backward branch on an .item() of a saved input falls back to a value read that
        guards backward: equal to eager on both branches as the data changes."""
        for k in (0, 4, 2):  # max 5 (> 1), 8, 7; then a max <= 1 below
            check_apply(BranchOnMaxBwd, _data(k))
        check_apply(BranchOnMaxBwd, torch.tensor([0.5, -0.25], requires_grad=True))
        check_apply(BranchOnMaxBwd, _data(0))


class BranchOnMaxBwd(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * 2

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        if x.abs().max().item() > 1:
            return g * 2
        return g


class ReassociatedMax(torch.autograd.Function):
    """Python float arithmetic on an .item(): (m + 1e8) - 1e8 is not m in floats, though
    sympy's form of the symbol's expression says it is."""

    @staticmethod
    def forward(ctx, x):
        m = x.abs().max().item()
        return x * ((m + 1e8) - 1e8)

    @staticmethod
    def backward(ctx, g):
        return g


class TestUnbackedFloatArithmetic:
    def test_float_arithmetic_is_value_read(self) -> None:
        """Float arithmetic on the symbol falls back to a value read: exact, as eager."""
        minihop.reset()
        for k in (0, 5, 7):  # maxima 0.3, 0.5, 0.7
            check_apply(ReassociatedMax, torch.tensor([0.3, -0.1, k / 10], dtype=torch.float64,
                                                      requires_grad=True))
        assert minihop.counters()["captures"] == 3
        cap = minihop.capture(ReassociatedMax, torch.tensor([0.3, -0.1]))
        assert [r.kind for r in cap.data_reads] == ["guarded"]

    def test_check_on_a_float_is_value_read(self) -> None:
        """torch._check on an .item() float: read as a value, so the check runs as Python's."""
        minihop.reset()
        for v in ([1.0, 2.0], [3.0, 1.0], [1.0, 2.0]):
            check_apply(CheckedMax, torch.tensor(v, requires_grad=True))
        assert minihop.counters()["captures"] == 2
        with pytest.raises(RuntimeError, match="Expected cond to be True"):
            CheckedMax.apply(torch.tensor([0.1, 0.2]))
        with pytest.raises(RuntimeError, match="Expected cond to be True"):
            minihop.apply(CheckedMax, torch.tensor([0.1, 0.2]))


class CheckedMax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        m = x.abs().max().item()
        torch._check(m > 0.5)
        return x / m

    @staticmethod
    def backward(ctx, g):
        return g
# -- backward value guards ---------------------------------------------------------------------


class BranchSumBwd(torch.autograd.Function):
    """A backward branch on a saved input's value."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * 2

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        if x.sum() > 0:
            return g * 2
        return g * -2


class BranchGrad(torch.autograd.Function):
    """A backward branch on the grad itself (surrogate-gradient style)."""

    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        if (g > 0).all():
            return g * 2
        return g * 3


class LoopBwd(torch.autograd.Function):
    """A loop count read from a saved tensor."""

    @staticmethod
    def forward(ctx, x, n):
        ctx.save_for_backward(n)
        return x * 1

    @staticmethod
    def backward(ctx, g):
        (n,) = ctx.saved_tensors
        for _ in range(int(n)):
            g = g * 2
        return g, None


class BranchReadsOther(torch.autograd.Function):
    """One branch reads a saved value the other never touches: forward must save it anyway."""

    @staticmethod
    def forward(ctx, x, y):
        ctx.save_for_backward(x.sign(), y)
        ctx.scale = x.abs().max()  # a tensor on ctx, read by backward's second branch only
        return x * y

    @staticmethod
    def backward(ctx, g):
        s, y = ctx.saved_tensors
        if s.sum() > 0:
            return g * 2, None
        return g * y * ctx.scale, g * float(ctx.scale)


class BranchSecondOrder(torch.autograd.Function):
    """Backward depends on a saved input in each branch (its double backward differs)."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        if x.sum() > 0:
            return g * x * 2
        return g * x * x


def run_both(call: Any, fn_cls: type, args: tuple[Any, ...], grad: torch.Tensor | None = None) -> None:
    """``call(*args)`` gives ``fn_cls.apply``'s output, and backward with ``grad`` (default:
    ones) eager's .grad for every input, exactly."""
    mine, ref = clones(*args), clones(*args)
    out = call(*mine)
    expected = fn_cls.apply(*ref)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    out.backward(torch.ones_like(out) if grad is None else grad)
    expected.backward(torch.ones_like(expected) if grad is None else grad)
    for a, b in zip(mine, ref, strict=True):
        if isinstance(a, torch.Tensor) and a.requires_grad:
            torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=0)


def leaf(x: torch.Tensor) -> torch.Tensor:
    return x.detach().clone().requires_grad_()


def entries(fn_cls: type, args: tuple[Any, ...]) -> dict[str, Any]:
    """The three ways in, each a callable for ``args`` like ``fn_cls.apply``."""
    return {"apply": lambda *a: minihop.apply(fn_cls, *a),
            "function": minihop.function(fn_cls),
            "capture": minihop.capture(fn_cls, *clones(*args))}


def variants(cap: Any) -> int:
    """How many bwd variants a capture holds now."""
    return len(cap._function.backwards.variants)


class SetupBranch(torch.autograd.Function):
    """setup_context style (torch.func can transform it), branching on a saved input."""

    @staticmethod
    def forward(x):
        return x * 2

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])

    backward = staticmethod(BranchSumBwd.backward)


class OnceBranch(BranchSumBwd):
    """BranchSumBwd with a once_differentiable backward."""

    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * (2 if x.sum() > 0 else -2)


class NoneOrValue(torch.autograd.Function):
    """set_materialize_grads(False): a branch on which grad is None, then on values."""

    @staticmethod
    def forward(ctx, x):
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(x)
        return x * 2, x * 3

    @staticmethod
    def backward(ctx, g1, g2):
        (x,) = ctx.saved_tensors
        if g2 is None:
            return g1 * 2 if x.sum() > 0 else g1
        return g1 * 2 + g2 * (3 if bool(g2.sum() > 0) else 1)


class EqualBwd(torch.autograd.Function):
    """`torch.equal` on two saved inputs in backward (kernel code special-casing x1 is x2)."""

    @staticmethod
    def forward(ctx, x, y):
        ctx.save_for_backward(x, y)
        return x + y

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        if torch.equal(x, y):
            return g * 2, g * 0
        return g, g


class SavedOutput(torch.autograd.Function):
    """A branch on a saved output's value."""

    @staticmethod
    def forward(ctx, x):
        y = x.exp() - 2
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return g * (y + 2) if y.mean() > 0 else g * 0.5


class TensorsOnCtx(torch.autograd.Function):
    """A branch comparing tensors kept in a list on ctx (no save_for_backward)."""

    @staticmethod
    def forward(ctx, x, y):
        ctx.ts = [x * 1, y * 1]
        return x + y

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.ts
        if a.sum() > b.sum():
            return g * 2, g
        return g, g * 2


class SecondGrad(torch.autograd.Function):
    """A branch on the grad of the second of two outputs."""

    @staticmethod
    def forward(ctx, x):
        return x * 2, x * 3

    @staticmethod
    def backward(ctx, g1, g2):
        if g2.sum() > 0:
            return g1 + g2
        return g1 - g2


# Inputs taking each branch, alternating (the guard must fire on every change).
SIGNS = [torch.tensor([1.0, 2.0, -0.5]), torch.tensor([-1.0, -2.0, 0.5]),
         torch.tensor([3.0, 0.0, 1.0]), torch.tensor([-3.0, 1.0, -1.0])]


class TestBackwardValueGuards:
    @pytest.mark.parametrize("way", ["apply", "function", "capture"])
    def test_branch_on_saved_input(self, way: str) -> None:
        """`if x.sum() > 0` on a saved input in backward: every branch equals eager, however
        the data changes between calls."""
        minihop.reset()
        call = entries(BranchSumBwd, (leaf(SIGNS[0]),))[way]
        for x in SIGNS * 2:
            run_both(call, BranchSumBwd, (leaf(x),))

    @pytest.mark.parametrize("way", ["apply", "function", "capture"])
    def test_branch_on_grad(self, way: str) -> None:
        """`if (g > 0).all()` in backward: grads taking each branch, alternating."""
        minihop.reset()
        x = torch.randn(4, requires_grad=True)
        call = entries(BranchGrad, (x,))[way]
        grads = [torch.ones(4), -torch.ones(4), torch.tensor([1.0, 2.0, 3.0, 4.0]),
                 torch.tensor([1.0, -2.0, 3.0, 4.0])]
        for g in grads * 2:
            run_both(call, BranchGrad, (x,), g)

    @pytest.mark.parametrize("way", ["apply", "function", "capture"])
    def test_loop_count_from_saved(self, way: str) -> None:
        """`range(int(n))` on a saved tensor: each count equals eager."""
        minihop.reset()
        x = torch.randn(4, requires_grad=True)
        call = entries(LoopBwd, (x, torch.tensor(1)))[way]
        for n in (1, 3, 0, 2, 3, 1):
            run_both(call, LoopBwd, (x, torch.tensor(n)))

    def test_one_capture_many_backwards(self) -> None:
        """The data changes backward's branch, not forward's graph: one capture, and one bwd
        variant per branch (the guard picks it again when the branch comes back)."""
        minihop.reset()
        for x in SIGNS * 2:
            run_both(lambda *a: minihop.apply(BranchSumBwd, *a), BranchSumBwd, (leaf(x),))
        assert minihop.counters()["captures"] == 1
        (cap,) = BranchSumBwd._minihop_default.captures
        assert variants(cap) == 2

    def test_capture_guess_not_taken(self) -> None:
        """A capture made for one branch, whose first backward takes the other: traced then."""
        cap = minihop.capture(BranchSumBwd, torch.tensor([1.0, 2.0], requires_grad=True))
        assert variants(cap) == 1
        run_both(cap, BranchSumBwd, (torch.tensor([-1.0, -2.0], requires_grad=True),))
        assert variants(cap) == 2
        run_both(cap, BranchSumBwd, (torch.tensor([4.0, 2.0], requires_grad=True),))
        assert variants(cap) == 2

    def test_branch_reads_other_saved_values(self) -> None:
        """A branch reading saved values (and a tensor on ctx) the captured one never read."""
        minihop.reset()
        y = torch.tensor([0.5, -1.5, 2.0], requires_grad=True)
        cap = minihop.capture(BranchReadsOther, leaf(SIGNS[0]), y)
        for x in SIGNS * 2:
            args = (leaf(x), y)
            run_both(cap, BranchReadsOther, args)
            run_both(lambda *a: minihop.apply(BranchReadsOther, *a), BranchReadsOther, args)

    @pytest.mark.parametrize("sign", [1.0, -1.0])
    def test_double_backward(self, sign: float) -> None:
        """create_graph=True through a backward branch: second-order grads equal eager's."""
        cap = minihop.capture(BranchSecondOrder, torch.tensor([1.0, 2.0, 3.0], requires_grad=True))
        results = []
        for call in (cap, BranchSecondOrder.apply):
            x = (torch.tensor([0.5, -2.0, 1.0]) * sign).requires_grad_()
            (gx,) = torch.autograd.grad(call(x).sum(), x, create_graph=True)
            (ggx,) = torch.autograd.grad((gx * gx).sum(), x)
            results.append((gx.detach(), ggx))
        for mine, ref in zip(results[0], results[1], strict=True):
            torch.testing.assert_close(mine, ref, rtol=0, atol=0)

    def test_variants_bounded(self) -> None:
        """Past MAX_VALUE_VARIANTS values, the oldest variant is dropped (warned once); every
        result stays eager's."""
        from minihop.runtime.function import MAX_VALUE_VARIANTS

        x = torch.randn(3, requires_grad=True)
        cap = minihop.capture(LoopBwd, x, torch.tensor(0))
        with pytest.warns(UserWarning, match=rf"traced for {MAX_VALUE_VARIANTS} different values"):
            for n in range(MAX_VALUE_VARIANTS + 3):
                run_both(cap, LoopBwd, (x, torch.tensor(n)))
        assert variants(cap) == MAX_VALUE_VARIANTS
        run_both(cap, LoopBwd, (x, torch.tensor(0)))  # dropped, traced again

    def test_artifact_refused(self, tmp_path: Any) -> None:
        """A capture whose backward needs tracing per value cannot be saved."""
        cap = minihop.capture(BranchSumBwd, torch.tensor([1.0, 2.0], requires_grad=True))
        with pytest.raises(minihop.MinihopError,
                           match=r"Cannot save the capture of BranchSumBwd: its forward or backward "
                                 r"branches on"):
            cap.save(str(tmp_path / "cap.pt"))

    def test_forward_guards_unchanged(self) -> None:
        """A backward value guard adds no forward guard: other data hits the same capture."""
        cap = minihop.capture(BranchSumBwd, torch.tensor([1.0, 2.0], requires_grad=True))
        assert cap.fits((torch.tensor([-1.0, -2.0], requires_grad=True),))
        assert [(r.kind, r.phase) for r in cap.data_reads] == [("guarded", "backward")]

    def test_dynamic_sizes(self) -> None:
        """With dynamic=True, one capture serves other sizes and either branch."""
        cap = minihop.capture(BranchSumBwd, torch.randn(3, requires_grad=True), dynamic=True)
        for n, sign in [(3, 1.0), (5, -1.0), (7, 1.0), (2, -1.0)]:
            run_both(cap, BranchSumBwd, (((torch.rand(n) + 1) * sign).requires_grad_(),))

    def test_torch_func_grad(self) -> None:
        """Under torch.func.grad each branch equals eager's (backward traced outside it)."""
        for x in SIGNS * 2:
            mine = torch.func.grad(lambda t: minihop.apply(SetupBranch, t).sum())(x)
            ref = torch.func.grad(lambda t: SetupBranch.apply(t).sum())(x)
            torch.testing.assert_close(mine, ref, rtol=0, atol=0)

    def test_once_differentiable(self) -> None:
        """A once_differentiable backward branching on a saved input."""
        for x in SIGNS * 2:
            run_both(lambda *a: minihop.apply(OnceBranch, *a), OnceBranch, (leaf(x),))

    def test_none_grads_then_values(self) -> None:
        """Which grad is None picks the case, then the values pick the variant within it."""
        for x in SIGNS * 2:
            for scale in (None, 1.0, -1.0):
                a, b = leaf(x), leaf(x)
                for arg, call in ((a, lambda t: minihop.apply(NoneOrValue, t)), (b, NoneOrValue.apply)):
                    o1, o2 = call(arg)
                    (o1.sum() if scale is None else o1.sum() + (o2 * scale).sum()).backward()
                torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=0)

    def test_torch_equal_on_saved(self) -> None:
        """torch.equal(x, y) on saved inputs: equal and unequal calls, alternating."""
        x = torch.randn(3)
        for y in (x.clone(), torch.randn(3), x.clone(), x + 1):
            run_both(lambda *a: minihop.apply(EqualBwd, *a), EqualBwd,
                     (leaf(x), y.clone().requires_grad_()))

    def test_outer_graph_guards_its_bwd(self) -> None:
        """cap.graph (torch's own autograd_function_apply on the pair) gives eager's grads for
        the value its bwd was traced for, and MH301 for another: never a stale gradient."""
        cap = minihop.capture(BranchSumBwd, torch.tensor([1.0, 2.0], requires_grad=True))
        x, ref = torch.tensor([3.0, 1.0], requires_grad=True), torch.tensor([3.0, 1.0], requires_grad=True)
        cap.graph(x)[0].sum().backward()
        BranchSumBwd.apply(ref).sum().backward()
        torch.testing.assert_close(x.grad, ref.grad, rtol=0, atol=0)
        with pytest.raises(minihop.GuardMismatchError,
                           match=r"^\[MH301\] This bwd_body_0 was traced for __bool__ in backward "
                                 r"\(.*if x\.sum\(\) > 0:\) == True; this backward gives False\."):
            cap.graph(torch.tensor([-3.0, 1.0], requires_grad=True))[0].sum().backward()

    def test_saved_output_and_ctx_tensors(self) -> None:
        """Branches on a saved output and on tensors in a list on ctx, data alternating."""
        y = torch.tensor([0.5, -1.0, 0.25])
        for x in SIGNS * 2:
            run_both(lambda *a: minihop.apply(SavedOutput, *a), SavedOutput, (leaf(x),))
            run_both(lambda *a: minihop.apply(TensorsOnCtx, *a), TensorsOnCtx, (leaf(x), leaf(y)))

    def test_branch_on_second_output_grad(self) -> None:
        """The grad of the second output picks the branch (first output's grad fixed)."""
        x = torch.randn(3)
        for sign in (1.0, -1.0, 1.0, -1.0):
            mine, ref = leaf(x), leaf(x)
            grads = (torch.ones(3), torch.full((3,), sign))
            torch.autograd.backward(minihop.apply(SecondGrad, mine), grads)
            torch.autograd.backward(SecondGrad.apply(ref), grads)
            torch.testing.assert_close(mine.grad, ref.grad, rtol=0, atol=0)


class MaskedBranchOnGrad(torch.autograd.Function):
    """Backward branches on a grad whose size is data-dependent (forward returns x[x > 0])."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x[x > 0] * 2

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        out = torch.zeros_like(x)
        out[x > 0] = g * 2 if (g > 0).all() else g * 3
        return out


class TestBackwardValuesOfUnbackedGrads:
    def test_branch_on_grad_of_data_dependent_size(self) -> None:
        """The capture's guess (grads of ones) takes the forward output's real size, and each
        later backward picks its branch from the real grad."""
        minihop.reset()
        for k, weight in enumerate((1.0, -1.0, 1.0, 2.0, -3.0)):
            x = _data(k)
            mine, ref = clones(x)[0], clones(x)[0]
            out, expected = minihop.apply(MaskedBranchOnGrad, mine), MaskedBranchOnGrad.apply(ref)
            torch.testing.assert_close(out, expected, rtol=0, atol=0)
            (out * weight).sum().backward()
            (expected * weight).sum().backward()
            torch.testing.assert_close(mine.grad, ref.grad, rtol=0, atol=0)
        assert minihop.counters()["captures"] == 1


class SplitReshapeBwd(torch.autograd.Function):
    """Backward's gradient is rebuilt from parts split by a saved tensor's values: its size is
    data-dependent, and that it equals the input's is checked on every call."""

    @staticmethod
    def forward(ctx, x, sizes):
        ctx.save_for_backward(sizes)
        return x * 3

    @staticmethod
    def backward(ctx, g):
        (sizes,) = ctx.saved_tensors
        parts = g.reshape(-1).split(sizes.tolist())
        return torch.cat([p * (i + 2) for i, p in enumerate(parts)]).reshape(g.shape), None


class TestUnbackedGradientShape:
    def test_gradient_of_data_dependent_size(self) -> None:
        minihop.reset()
        for sizes in ([1, 3], [2, 2], [3, 1], [0, 4]):
            check_apply(SplitReshapeBwd, torch.tensor([1.0, -2.0, 3.0, 0.5], requires_grad=True),
                        torch.tensor(sizes))
        assert minihop.counters()["captures"] == 1
