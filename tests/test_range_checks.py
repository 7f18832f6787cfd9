"""Value-range checks on data-dependent sizes, written as Dynamo writes them.

A boolean mask index (``grad[x >= 0]``) or ``masked_select`` gives a tensor whose size comes
from the data: an unbacked symbol ``u0`` with the range ``[0, numel]``. Dynamo's bodies read
that size right where it is made and assert both bounds (torch.fx's
``insert_deferred_runtime_asserts``, run on every body once traced); minihop's bodies must
do the same for a strict comparison to hold. The Functions are written the way surrogate-
gradient spiking packages write theirs (snntorch, spikingjelly): a mask in backward, a ctx
attribute for the slope, ``setup_context`` and a backward helper.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.autograd import Function

import minihop
from minihop.testing import assert_matches_eager, assert_same_graph, dynamo_graphs


class TriangularSpike(Function):
    """snntorch-style: a Heaviside spike whose surrogate grad flips sign where ``x >= 0``."""

    @staticmethod
    def forward(ctx: Any, input_: torch.Tensor, threshold: float) -> torch.Tensor:
        ctx.save_for_backward(input_)
        ctx.threshold = threshold
        return (input_ > 0).float()

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> Any:
        (input_,) = ctx.saved_tensors
        grad_input = grad_output.clone()
        grad = grad_input * ctx.threshold
        grad[input_ >= 0] = -grad[input_ >= 0]
        return grad, None


def log_tailed_backward(grad_output: torch.Tensor, x: torch.Tensor, alpha: float) -> Any:
    mask_gt1 = x > 1.0
    mask_le0 = x <= 0.0
    grad_x = torch.ones_like(grad_output)
    grad_x[mask_gt1] = 1.0 / x[mask_gt1]
    grad_x[mask_le0] = alpha
    return grad_output * grad_x, None


class LogTailedSpike(Function):
    """spikingjelly-style: forward without ctx, ``setup_context``, backward through a helper."""

    @staticmethod
    def forward(x: torch.Tensor, alpha: float) -> torch.Tensor:
        return (x >= 0).to(x)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        x, alpha = inputs
        ctx.save_for_backward(x)
        ctx.alpha = alpha

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> Any:
        return log_tailed_backward(grad_output, ctx.saved_tensors[0], ctx.alpha)


class SavesInput(Function):
    """Forward saves its input and returns a copy; the subclasses' backwards use masks."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return x.clone()


class TwoMasks(SavesInput):
    """Both masks written inline: the user's own ``x <= 0`` takes the name ``le`` first."""

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        out = torch.ones_like(g)
        out[x > 1] = 1.0 / x[x > 1]
        out[x <= 0] = 0.01
        return g * out


class SelectedScale(Function):
    """``masked_select`` in backward: the selected grads' sum scales the whole grad."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return x * 2

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        picked = torch.masked_select(g, x > 0)
        return g * picked.sum()


class MaskInForward(Function):
    """A mask in forward (Dynamo cannot capture this one as a HOP; eager is the reference)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        positive = x[x > 0]
        return x * positive.sum()

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g


def args_for(fn_cls: type, x: torch.Tensor) -> tuple[Any, ...]:
    extra = {TriangularSpike: (1.0,), LogTailedSpike: (0.01,)}.get(fn_cls, ())
    return (x, *extra)


def inputs() -> list[torch.Tensor]:
    """Random, and the two ends of the range: no element masked (u0 = 0), every one (20)."""
    torch.manual_seed(0)
    return [torch.randn(4, 5) * 2, -torch.rand(4, 5) - 1.5, torch.rand(4, 5) + 1.5]


BACKWARD_MASKS = [TriangularSpike, LogTailedSpike, TwoMasks, SelectedScale]


@pytest.mark.parametrize("fn_cls", BACKWARD_MASKS, ids=lambda c: c.__name__)
def test_matches_eager_and_dynamo_strictly(fn_cls: type) -> None:
    """Outputs and grads are eager's, and both bodies equal Dynamo's strictly (with meta)."""
    for x in inputs():
        assert_matches_eager(fn_cls, *args_for(fn_cls, x.requires_grad_()))
    args = args_for(fn_cls, torch.randn(4, 5, requires_grad=True))
    cap = minihop.capture(fn_cls, *args)
    dynamo = dynamo_graphs(fn_cls, *args)
    assert_same_graph(cap.fwd, dynamo.fwd, check_meta=True)
    assert_same_graph(cap.bwd, dynamo.bwd, check_meta=True)


def test_checks_sit_where_the_size_is_made() -> None:
    """The size read and both bounds' asserts follow the mask index, before its first use."""
    cap = minihop.capture(TriangularSpike, torch.randn(4, 5, requires_grad=True), 1.0)
    code = [line.strip() for line in cap.bwd.code.splitlines()]
    start = next(i for i, line in enumerate(code) if line.startswith("getitem = grad[ge]"))
    assert code[start + 1:start + 6] == [
        "sym_size_int = torch.ops.aten.sym_size.int(getitem, 0)",
        "ge_2 = sym_size_int >= 0",
        "_assert_scalar_default = torch.ops.aten._assert_scalar.default(ge_2, \"Runtime "
        "assertion failed for expression u0 >= 0 on node 'ge_2'\");  ge_2 = _assert_scalar_default = None",
        "le = sym_size_int <= 20;  sym_size_int = None",
        "_assert_scalar_default_1 = torch.ops.aten._assert_scalar.default(le, \"Runtime "
        "assertion failed for expression u0 <= 20 on node 'le'\");  le = _assert_scalar_default_1 = None",
    ]
    assert code[start + 6].startswith("neg = -getitem")


def test_check_names_come_after_the_users() -> None:
    """A check's comparison takes a name the body left free: ``le`` where the user stored the
    mask under a name of their own, ``le_1`` where the user's own ``x <= 0`` is ``le``."""
    named = minihop.capture(LogTailedSpike, torch.randn(4, 5, requires_grad=True), 0.01).bwd.code
    assert "le = sym_size_int <= 20" in named
    assert "on node 'le'" in named and "mask_le0 = l_x_ <= 0.0" in named
    inline = minihop.capture(TwoMasks, torch.randn(4, 5, requires_grad=True)).bwd.code
    assert "le_1 = sym_size_int <= 20" in inline and "on node 'le_1'" in inline
    assert "le = l_x_ <= 0" in inline


def test_forward_mask_is_checked_in_forward() -> None:
    """In forward too: the range is asserted after the index, and eager's results hold."""
    for x in inputs():
        assert_matches_eager(MaskInForward, x.requires_grad_())
    fwd = minihop.capture(MaskInForward, torch.randn(4, 5, requires_grad=True)).fwd.code
    assert "Runtime assertion failed for expression u0 >= 0" in fwd
    assert "Runtime assertion failed for expression u0 <= 20" in fwd


def test_one_capture_serves_every_mask() -> None:
    """The checks hold for every mask, from none to all: one capture, eager's grads each time."""
    fn = minihop.function(TriangularSpike)
    for x in inputs():
        mine, theirs = x.clone().requires_grad_(), x.clone().requires_grad_()
        fn.apply(mine, 1.0).sum().backward()
        TriangularSpike.apply(theirs, 1.0).sum().backward()
        torch.testing.assert_close(mine.grad, theirs.grad)
    assert fn.stats.captures == 1


class SizeOfSelected(SavesInput):
    """Backward reads ``.shape`` of a masked tensor: a size that comes from the data."""

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        picked = g[x > 0]
        z = torch.zeros(picked.shape[0])
        return g + z.sum() + picked.sum()


def test_shape_of_a_data_size_is_a_listed_difference() -> None:
    """docs/oracle.md's known difference: Dynamo keeps an unused ``picked.size()`` call, minihop does
    not; the bodies are otherwise the same, and the results eager's."""
    x = torch.randn(4, 5, requires_grad=True)
    assert_matches_eager(SizeOfSelected, x)
    cap, dynamo = minihop.capture(SizeOfSelected, x), dynamo_graphs(SizeOfSelected, x)
    mine = [n for n in cap.bwd.graph.nodes if n.op != "placeholder" and n.target != "size"]
    theirs = [n for n in dynamo.bwd.graph.nodes if n.op != "placeholder" and n.target != "size"]
    assert [n.target for n in mine] == [n.target for n in theirs]
    assert [n.target for n in dynamo.bwd.graph.nodes].count("size") == 1
    assert not any(n.target == "size" for n in cap.bwd.graph.nodes)
