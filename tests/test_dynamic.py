"""Dynamic shapes: one capture with symbolic sizes serves many sizes, as eager would.

``minihop.capture(F, *args, dynamic=True)`` (every dimension) or ``dynamic={"x": [0]}`` (named
dimensions) traces with ``ShapeEnv`` sizes. Each test compares the capture, called at several
sizes, with eager ``F.apply`` (outputs and every ``.grad``), checks the pair with
``minihop.check_consistent``, and checks the graph layout the seed's dynamic-shape test shows:
size symbols as ``Sym(...)`` placeholders just before their tensors, saved when backward needs
them, with ``None`` gradients. Symbol names (``s17``, ``s93``, ...) vary and are never pinned.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.fx as fx
from torch.autograd import Function

import minihop
from minihop.testing import clone_args
from shared_functions import Add, MatMul, MeanRows


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------

def placeholders(gm: fx.GraphModule) -> list[fx.Node]:
    return [n for n in gm.graph.nodes if n.op == "placeholder"]


def is_sym(node: fx.Node) -> bool:
    return isinstance(node.meta.get("val"), torch.SymInt)


def fwd_saved(gm: fx.GraphModule) -> tuple[fx.Node, ...]:
    (out,) = [n for n in gm.graph.nodes if n.op == "output"]
    return tuple(out.args[0][1])


def bwd_outputs(gm: fx.GraphModule) -> tuple[Any, ...]:
    (out,) = [n for n in gm.graph.nodes if n.op == "output"]
    return tuple(out.args[0])


def captured(fn_cls: type, *args: Any, **kwargs: Any) -> minihop.Capture:
    cap = minihop.capture(fn_cls, *args, **kwargs)
    minihop.check_consistent(cap.fwd, cap.bwd)
    return cap


def assert_capture_matches_eager(cap: minihop.Capture, fn_cls: type, *args: Any) -> None:
    """Run ``cap`` and eager on clones of ``args``; compare outputs and every ``.grad``."""
    eager_args, mine_args = clone_args(args), clone_args(args)
    eager_out, mine_out = fn_cls.apply(*eager_args), cap(*mine_args)
    eager_out = eager_out if isinstance(eager_out, tuple) else (eager_out,)
    mine_out = mine_out if isinstance(mine_out, tuple) else (mine_out,)
    for e, m in zip(eager_out, mine_out, strict=True):
        torch.testing.assert_close(m, e)
        assert m.requires_grad == e.requires_grad
    gen = torch.Generator().manual_seed(0)
    weights = [torch.randn(e.shape, generator=gen) for e in eager_out]
    sum((e * w).sum() for e, w in zip(eager_out, weights, strict=True)).backward()
    sum((m * w).sum() for m, w in zip(mine_out, weights, strict=True)).backward()
    for i, (e, m) in enumerate(zip(eager_args, mine_args, strict=True)):
        if isinstance(e, torch.Tensor):
            assert (e.grad is None) == (m.grad is None), f"grad of argument {i}"
            if e.grad is not None:
                torch.testing.assert_close(m.grad, e.grad, msg=lambda s: f"grad of argument {i}: {s}")


def r(*shape: int, grad: bool = True) -> torch.Tensor:
    return torch.randn(*shape).requires_grad_(grad)


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


# ---------------------------------------------------------------------------------------------
# Functions
# ---------------------------------------------------------------------------------------------

# Add (the seed's test_rewired_bwd_output Function), MatMul and MeanRows: shared_functions.


# ---------------------------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------------------------

class TestOneCaptureManySizes:
    def test_dynamic_true(self) -> None:
        """dynamic=True: one capture runs at several sizes of every dimension with eager's outputs and grads."""
        cap = captured(MatMul, r(4, 3), r(3, 5), dynamic=True)
        for n, k, m in ((2, 3, 5), (7, 3, 5), (3, 6, 2), (16, 4, 9)):
            assert_capture_matches_eager(cap, MatMul, r(n, k), r(k, m))

    def test_dynamic_per_dimension(self) -> None:
        """dynamic={"x": [0]}: one capture serves several batch sizes of x."""
        cap = captured(MatMul, r(4, 3), r(3, 5), dynamic={"x": [0]})
        w = r(3, 5)
        for n in (2, 5, 11, 64):
            assert_capture_matches_eager(cap, MatMul, r(n, 3), w)

    def test_per_dimension_keeps_other_sizes_static(self) -> None:
        """dynamic={"x": [0]}: only x's dimension 0 gets a size symbol; w keeps its static shape."""
        cap = captured(MatMul, r(4, 3), r(3, 5), dynamic={"x": [0]})
        syms = [n for n in placeholders(cap.fwd) if is_sym(n)]
        tensors = [n for n in placeholders(cap.fwd) if not is_sym(n)]
        assert len(syms) == 1, f"Sym placeholders: {[(n.name, n.meta['val']) for n in syms]}"
        x_val, w_val = (n.meta["val"] for n in tensors)
        assert isinstance(x_val.shape[0], torch.SymInt) and x_val.shape[1] == 3
        assert all(type(s) is int for s in w_val.shape), f"w traced as {tuple(w_val.shape)}"

    def test_dynamic_keyword_and_position(self) -> None:
        """dynamic names an argument by name or by position, with the same result."""
        by_name = captured(MatMul, r(4, 3), r(3, 5), dynamic={"x": [0]})
        by_pos = captured(MatMul, r(4, 3), r(3, 5), dynamic={0: [0]})
        for cap in (by_name, by_pos):
            assert_capture_matches_eager(cap, MatMul, r(9, 3), r(3, 5))


class TestSeedLayout:
    def test_rewired_bwd_output_dynamic(self) -> None:
        """The seed's dynamic test_rewired_bwd_output: fwd inputs (sA, x, sB, y), saved (sB, a, x, result), bwd outputs (None, gx, None, gy)."""
        x, y = torch.cos(r(8, 8)), torch.cos(r(8, 8))
        cap = captured(Add, x, y, dynamic={"x": [0], "y": [0]})
        fwd = cap.fwd  # one copy: the nodes below are compared by identity
        fwd_in = placeholders(fwd)
        assert [is_sym(n) for n in fwd_in] == [True, False, True, False]
        s_a, l_x, s_b, l_y = fwd_in
        # Both symbols stand for one size (the seed prints s77: "Sym(s17)" and s17: "Sym(s17)").
        assert str(s_a.meta["val"]) == str(s_b.meta["val"]) == s_b.name
        saved = fwd_saved(fwd)
        assert len(saved) == 4
        assert saved[0] is s_b and saved[2] is l_x
        assert [n.name for n in saved[1::2]] == ["a", "result"]
        out = bwd_outputs(cap.bwd)
        assert out[0] is None and out[2] is None and out[1] is not None and out[3] is not None
        bwd_in = placeholders(cap.bwd)
        assert [n.name for n in bwd_in][:2] == ["grad_a", "grad_b"] and is_sym(bwd_in[2])
        text = str(cap)
        assert f'{s_a.name}: "Sym({s_b.name})"' in text and f'{s_b.name}: "Sym({s_b.name})"' in text
        assert f'"f32[{s_b.name}, 8]"' in text
        for n in (2, 5, 13):
            assert_capture_matches_eager(cap, Add, torch.cos(r(n, 8)), torch.cos(r(n, 8)))


class TestSymIntsOnCtx:
    def test_size_on_ctx(self) -> None:
        """ctx.n = x.shape[0] under dynamic shapes: the size is saved as a SymInt and backward gets the real n."""
        cap = captured(MeanRows, r(4, 3), dynamic={"x": [0]})
        fwd = cap.fwd  # one copy: the nodes below are compared by identity
        saved = fwd_saved(fwd)
        assert [is_sym(n) for n in saved] == [True]
        assert saved[0] is placeholders(fwd)[0]
        for n in (2, 3, 10):
            assert_capture_matches_eager(cap, MeanRows, r(n, 3))


class StrideReader(Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2 + g.stride()[0]


class TestGradLayoutWithDynamicShapes:
    def test_backward_reading_grad_stride(self) -> None:
        """dynamic=True and a backward reading g.stride(): each size and grad layout gets eager's gradient."""
        cap = captured(StrideReader, r(2, 3), dynamic=True)
        for n in (2, 5):
            for layout in ("contiguous", "transposed", "expanded"):
                grads = []
                for run in (StrideReader.apply, cap):
                    x = r(n, 3)
                    out = run(x)
                    if layout == "contiguous":
                        out.backward(gradient=torch.ones(n, 3))
                    elif layout == "transposed":
                        out.backward(gradient=torch.ones(3, n).t())
                    else:
                        out.sum().backward()
                    grads.append(x.grad)
                torch.testing.assert_close(grads[1], grads[0], msg=lambda s: f"n={n} {layout}: {s}")


class TestGuards:
    def test_size_one_is_refused(self) -> None:
        """Size 1 is specialised by the ShapeEnv: calling with it raises GuardMismatchError."""
        cap = captured(Add, r(8, 8), r(8, 8), dynamic={"x": [0], "y": [0]})
        with pytest.raises(minihop.GuardMismatchError, match="dynamic sizes outside what it was traced for"):
            cap(r(1, 8), r(1, 8))

    def test_related_sizes_are_guarded(self) -> None:
        """Sizes the trace found equal must stay equal: x and y of different lengths raise GuardMismatchError."""
        cap = captured(Add, r(8, 8), r(8, 8), dynamic=True)
        with pytest.raises(minihop.GuardMismatchError):
            cap(r(4, 8), r(5, 8))
        with pytest.raises(RuntimeError):  # eager: the shapes do not broadcast
            Add.apply(r(4, 8), r(5, 8))

    def test_static_dimension_is_keyed(self) -> None:
        """A dimension not named in dynamic stays fixed: another size there raises GuardMismatchError."""
        cap = captured(MatMul, r(4, 3), r(3, 5), dynamic={"x": [0]})
        with pytest.raises(minihop.GuardMismatchError):
            cap(r(4, 3), r(3, 6))


class TestSizeFloats:
    def test_float_from_sizes_is_refused(self) -> None:
        """A float made from dynamic sizes (n / (n - 1)) reaching an op is refused, not baked in as a stale symbol."""

        class Unbiased(Function):
            @staticmethod
            def forward(ctx, x):
                n = x.shape[0]
                return x * (n / (n - 1))

            @staticmethod
            def backward(ctx, g):
                return g

        x = torch.randn(4, 3)
        with pytest.raises(minihop.UnsupportedOperationError,
                           match=r"A SymFloat \(.*\) computed from dynamic sizes reaches a graph op\."):
            minihop.capture(Unbiased, x, dynamic=True)
        torch.testing.assert_close(minihop.capture(Unbiased, x)(x), Unbiased.apply(x))  # static: fine


class SizeAsTensorInBackward(Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g / torch.tensor(g.shape[0])


class HalfSize(Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x * int(x.shape[0] * 0.5)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g * int(g.shape[0] * 0.5)


class SliceBySize(Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x * torch.arange(x.shape[0] ** 2)[: x.shape[0]]

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g * torch.arange(g.shape[0] ** 2)[: g.shape[0]]


class SizeAsKey(Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x * {x.shape[0]: 2}.get(x.shape[0], 3)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g


class TestSizesFixedWhileTracing:
    def test_size_made_a_tensor_is_guarded(self) -> None:
        """torch.tensor(g.shape[0]) fixes the size to its traced value: another size recaptures instead of dividing by the old one."""
        f = minihop.function(SizeAsTensorInBackward, dynamic=True)
        for n in (4, 6):
            x, y = r(n), r(n)
            f.apply(x).sum().backward()
            SizeAsTensorInBackward.apply(y).sum().backward()
            torch.testing.assert_close(x.grad, y.grad)
        assert f.stats.captures == 2
        cap = captured(SizeAsTensorInBackward, r(4), dynamic=True)
        assert "T[0].size()[0] == 4" in cap.shape_guards.expression
        with pytest.raises(minihop.GuardMismatchError):
            cap(r(6))

    def test_float_size_arithmetic_guard_runs(self) -> None:
        """A guard written with torch.sym_float (int(n * 0.5)) is evaluated, not a NameError."""
        cap = captured(HalfSize, r(4), dynamic=True)
        assert_capture_matches_eager(cap, HalfSize, r(5))
        with pytest.raises(minihop.GuardMismatchError):
            cap(r(6))

    def test_symbolic_slice_bound_follows_the_size(self) -> None:
        """x[:n] with n a dynamic size slices at the call's size, not the traced one."""
        cap = captured(SliceBySize, r(4), dynamic=True)
        for n in (4, 6, 7):
            assert_capture_matches_eager(cap, SliceBySize, r(n))

    def test_size_as_dict_key_is_mh104(self) -> None:
        """Hashing a dynamic size (a dict key) is MH104, not the SymInt's TypeError."""
        SizeAsKey.apply(r(4))
        with pytest.raises(minihop.UnsupportedOperationError,
                           match=r"\[MH104\] SizeAsKey\.forward fails on minihop's fake tensors with a "
                                 r"TypeError that only fake tensors raise\.\n  found: unhashable type"):
            minihop.capture(SizeAsKey, r(4), dynamic=True)
