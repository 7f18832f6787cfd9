"""Eager semantics of ``torch.autograd.Function`` features, checked on minihop captures.

Each test runs a small Function through minihop and through eager ``F.apply`` on clones of the
same inputs and compares what a user can observe: outputs, every input's ``.grad``,
``requires_grad`` and ``grad_fn``-ness of outputs, aliasing, version counters and errors. Every
capture also goes through ``minihop.check_consistent``.

Where eager and Dynamo 2.13 differ (``set_materialize_grads(False)`` with a ``None`` branch,
saved-tensor version checks, ``saved_tensors_hooks``, ``mark_dirty`` without return, wrongly
shaped gradients) the tests assert eager's behaviour. ``docs/parity.md`` maps each behaviour to
its test here or in ``tests/test_dynamic.py``.
"""

from __future__ import annotations

import collections
import operator
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn as nn
from torch.autograd import Function
from torch.autograd.function import once_differentiable

import minihop
from minihop.testing import EagerComparison, assert_matches_eager, clone_args


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------

def r(*shape: int, grad: bool = True) -> torch.Tensor:
    """A random float32 leaf."""
    return torch.randn(*shape).requires_grad_(grad)


def check(fn_cls: type, *args: Any, **kwargs: Any) -> EagerComparison:
    """``assert_matches_eager`` plus ``check_consistent`` and ``grad_fn``-ness of every output."""
    cmp = assert_matches_eager(fn_cls, *args, **kwargs)
    minihop.check_consistent(cmp.capture.fwd, cmp.capture.bwd)
    assert_same_flags(cmp.eager_output, cmp.captured_output)
    return cmp


def captured(fn_cls: type, *args: Any, **kwargs: Any) -> minihop.Capture:
    """``minihop.capture`` plus ``check_consistent`` on the pair."""
    cap = minihop.capture(fn_cls, *args, **kwargs)
    minihop.check_consistent(cap.fwd, cap.bwd)
    return cap


def tensor_leaves(value: Any) -> list[torch.Tensor]:
    """Tensors inside tuples, lists, dicts and plain objects, in structure order."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in tensor_leaves(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in tensor_leaves(v)]
    if hasattr(value, "__dict__") and not isinstance(value, type):
        return [t for v in vars(value).values() for t in tensor_leaves(v)]
    return []


def assert_same_flags(eager: Any, mine: Any) -> None:
    """Each output tensor: same ``requires_grad`` and ``grad_fn is None`` as eager's."""
    e_leaves, m_leaves = tensor_leaves(eager), tensor_leaves(mine)
    assert len(e_leaves) == len(m_leaves)
    for i, (e, m) in enumerate(zip(e_leaves, m_leaves, strict=True)):
        assert (m.requires_grad, m.grad_fn is None) == (e.requires_grad, e.grad_fn is None), (
            f"output tensor {i}: eager requires_grad={e.requires_grad} grad_fn={e.grad_fn}, "
            f"minihop requires_grad={m.requires_grad} grad_fn={m.grad_fn}")


def targets(gm: torch.fx.GraphModule) -> list[Any]:
    return [n.target for n in gm.graph.nodes if n.op in ("call_function", "call_method")]


def bwd_outputs(gm: torch.fx.GraphModule) -> tuple[Any, ...]:
    (node,) = [n for n in gm.graph.nodes if n.op == "output"]
    out = node.args[0]
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def eager_apply(fn_cls: type) -> Callable[..., Any]:
    return fn_cls.apply


def minihop_apply(fn_cls: type) -> Callable[..., Any]:
    return lambda *args, **kwargs: minihop.apply(fn_cls, *args, **kwargs)


@pytest.fixture(autouse=True)
def _fresh() -> None:
    torch.manual_seed(0)
    minihop.clear_cache()


# ---------------------------------------------------------------------------------------------
# ctx.mark_dirty and in-place changes to inputs
# ---------------------------------------------------------------------------------------------

class MulTwoInplace(Function):
    @staticmethod
    def forward(ctx, x):
        x.mul_(2)
        ctx.mark_dirty(x)
        return x

    @staticmethod
    def backward(ctx, g):
        return g * 2


class TestMarkDirty:
    def test_dirty_input_returned_rewrites_history(self) -> None:
        """A dirty returned input is the output object, its version is bumped and gradients flow through its new history."""
        cap = captured(MulTwoInplace, torch.ones(2, 2) @ r(2, 2))
        assert cap.dirty_idx == (0,)
        w = r(2, 2)
        results = []
        for run in (MulTwoInplace.apply, cap):
            w_ = w.detach().clone().requires_grad_()
            y = torch.ones(2, 2) @ w_
            v0 = y._version
            out = run(y)
            results.append((out is y, y._version - v0, out.requires_grad,
                            type(y.grad_fn).__name__ == "MmBackward0", y.detach().clone()))
            (y * torch.arange(4.0).view(2, 2)).sum().backward()
            results[-1] += (w_.grad,)
        (e_is, e_ver, e_rg, e_mm, e_val, e_grad), (m_is, m_ver, m_rg, m_mm, m_val, m_grad) = results
        assert (m_is, m_ver, m_rg, m_mm) == (e_is, e_ver, e_rg, e_mm)
        assert (e_is, e_rg, e_mm) == (True, True, False) and e_ver >= 1  # eager bumps by 2 here
        torch.testing.assert_close(m_val, e_val)
        torch.testing.assert_close(m_grad, e_grad)

    def test_dirty_input_not_returned_refused(self) -> None:
        """mark_dirty on an input forward does not return: eager raises at apply, minihop at capture."""

        class DirtyNotReturned(Function):
            @staticmethod
            def forward(ctx, x, y):
                x.add_(1)
                ctx.mark_dirty(x)
                return y * 2

            @staticmethod
            def backward(ctx, g):
                return None, g * 2

        with pytest.raises(RuntimeError, match="Some elements marked as dirty during the forward method were not returned"):
            DirtyNotReturned.apply(torch.randn(3), r(3))
        with pytest.raises(minihop.InplaceInputError, match=r"DirtyNotReturned\.forward marks an input dirty .* but does not return it"):
            minihop.capture(DirtyNotReturned, torch.randn(3), r(3))
        with pytest.raises(minihop.InplaceInputError):
            minihop.apply(DirtyNotReturned, torch.randn(3), r(3))

    def test_inplace_without_mark_dirty(self) -> None:
        """An in-place write into an input without mark_dirty: captured like eager (value, version bump, grads), whether or not the input requires grad."""

        class Sneaky(Function):
            @staticmethod
            def forward(ctx, w, x):
                x.add_(1)
                return w * x

            @staticmethod
            def backward(ctx, g):
                return g * 2, None

        cap = minihop.capture(Sneaky, r(3), torch.zeros(3))
        w = r(3)
        results = []
        for run in (Sneaky.apply, cap, cap):
            w_, x = w.detach().clone().requires_grad_(), torch.zeros(3)
            out = run(w_, x)
            out.sum().backward()
            results.append((out.detach(), x.clone(), x._version, w_.grad))
        (e_out, e_x, e_version, e_grad), *minihop_runs = results
        assert e_x.eq(1).all() and e_version == 1  # eager bumps the version once per write
        for out, x_after, version, grad in minihop_runs:
            torch.testing.assert_close(out, e_out)
            torch.testing.assert_close(x_after, e_x)
            torch.testing.assert_close(grad, e_grad)
            assert version == e_version

        # Into an input that requires grad (issue 31): eager allows it too; the same write
        # happens to the caller's tensor.
        outs = []
        for run in (Sneaky.apply, minihop.capture(Sneaky, r(3), torch.zeros(3, requires_grad=True))):
            w_, x = w.detach().clone().requires_grad_(), torch.zeros(3, requires_grad=True)
            out = run(w_, x)
            out.sum().backward()
            outs.append((out.detach(), x.detach().clone(), x._version, w_.grad, x.grad))
        assert outs[0][1].eq(1).all() and outs[0][2] == 1 and outs[0][4] is None
        torch.testing.assert_close(outs[1], outs[0])


# ---------------------------------------------------------------------------------------------
# ctx.set_materialize_grads(False)
# ---------------------------------------------------------------------------------------------

class NoneAware(Function):
    """Backward gives a different answer for a None grad than for a zero grad."""

    @staticmethod
    def forward(ctx, x):
        ctx.set_materialize_grads(False)
        return x * 2, x * 3

    @staticmethod
    def backward(ctx, ga, gb):
        if ga is None:
            return gb * 3
        if gb is None:
            return ga * 2
        return ga * 2 + gb * 3 + 1  # the +1 shows whether a None became a zero tensor


class TestMaterializeGrads:
    def test_none_branch_matches_eager(self) -> None:
        """Backward sees None for an output without gradient, as in eager (Dynamo 2.13 passes zeros)."""
        x = r(3)
        cap = captured(NoneAware, x)
        for use in ((0,), (1,), (0, 1)):  # each None pattern, through one capture
            ex, mx = x.detach().clone().requires_grad_(), x.detach().clone().requires_grad_()
            e_out, m_out = NoneAware.apply(ex), cap(mx)
            sum(e_out[i].sum() for i in use).backward()
            sum(m_out[i].sum() for i in use).backward()
            torch.testing.assert_close(mx.grad, ex.grad, msg=f"outputs used: {use}")
        # Eager's answer when only output 0 is used: 2, not the zero-grad branch's 3.
        ex = x.detach().clone().requires_grad_()
        NoneAware.apply(ex)[0].sum().backward()
        torch.testing.assert_close(ex.grad, torch.full((3,), 2.0))

    def test_non_differentiable_grad_is_none(self) -> None:
        """A mark_non_differentiable output's grad arrives as None (not zeros) with materialize off."""

        class SeesNone(Function):
            @staticmethod
            def forward(ctx, x):
                ctx.set_materialize_grads(False)
                idx = x.argmax()
                ctx.mark_non_differentiable(idx)
                return x * 2, idx

            @staticmethod
            def backward(ctx, g, g_idx):
                return g * 2 if g_idx is None else g * 2 + 100

        check(SeesNone, r(4))


# ---------------------------------------------------------------------------------------------
# ctx.needs_input_grad
# ---------------------------------------------------------------------------------------------

class SinCos(Function):
    @staticmethod
    def forward(ctx, x, y):
        ctx.save_for_backward(x, y)
        return torch.sin(x) + torch.cos(y)

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        gx = g * torch.cos(x) if ctx.needs_input_grad[0] else None
        gy = -g * torch.sin(y) if ctx.needs_input_grad[1] else None
        return gx, gy


class TestNeedsInputGrad:
    @pytest.mark.parametrize("grads", [(True, True), (True, False), (False, True)])
    def test_branches_match_eager(self, grads: tuple[bool, bool]) -> None:
        """Backward branching on needs_input_grad gives eager's grads (None where eager's is None)."""
        check(SinCos, r(3, grad=grads[0]), r(3, grad=grads[1]))

    def test_pruned_backward_work(self) -> None:
        """With y not requiring grad, the bwd graph has no work for y's gradient and returns None for it."""
        full = captured(SinCos, r(3), r(3))
        pruned = captured(SinCos, r(3), r(3, grad=False))
        assert torch.sin in targets(full.bwd) and torch.cos in targets(full.bwd)
        assert torch.sin not in targets(pruned.bwd) and torch.cos in targets(pruned.bwd)
        assert bwd_outputs(pruned.bwd)[1] is None and bwd_outputs(full.bwd)[1] is not None

    def test_requires_grad_is_part_of_key(self) -> None:
        """minihop.apply captures again when requires_grad differs, and each capture matches eager."""
        x, y = r(3), r(3)
        counted = minihop.function(SinCos)  # apply's cache, with stats to read
        for y_grad in (True, False, True):
            ex, ey, mx, my = (t.detach().clone() for t in (x, y, x, y))
            ex.requires_grad_(); mx.requires_grad_()
            ey.requires_grad_(y_grad); my.requires_grad_(y_grad)
            SinCos.apply(ex, ey).sum().backward()
            minihop.apply(SinCos, mx, my).sum().backward()
            counted.apply(mx.detach(), my.detach().requires_grad_(y_grad))
            torch.testing.assert_close(mx.grad, ex.grad)
            assert (my.grad is None) == (ey.grad is None) == (not y_grad)
            if y_grad:
                torch.testing.assert_close(my.grad, ey.grad)
        assert (counted.stats.captures, counted.stats.hits) == (2, 1)


# ---------------------------------------------------------------------------------------------
# once_differentiable and double backward
# ---------------------------------------------------------------------------------------------

class CubeOnce(Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x ** 3

    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 3 * x * x * g


class Cube(Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x ** 3

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 3 * x * x * g


class TestHigherOrder:
    def test_once_differentiable_first_order(self) -> None:
        """A once_differentiable backward gives eager's first-order gradients."""
        check(CubeOnce, r(4))

    def test_once_differentiable_double_backward_raises(self) -> None:
        """Differentiating a once_differentiable backward raises eager's error."""
        cap = captured(CubeOnce, r(4))
        for run in (CubeOnce.apply, cap):
            x = r(4)
            # A grad that requires grad reaches the backward: its result is an error node.
            (gx,) = torch.autograd.grad(run(x), x, grad_outputs=r(4), create_graph=True)
            assert gx.requires_grad and type(gx.grad_fn).__name__ == "Error"
            with pytest.raises(RuntimeError, match="trying to differentiate twice a function that was marked with @once_differentiable"):
                gx.sum().backward()
            # A constant grad (from .sum()): eager's result simply has no history.
            x = r(4)
            (gx,) = torch.autograd.grad(run(x).sum(), x, create_graph=True)
            assert not gx.requires_grad and gx.grad_fn is None

    def test_double_backward(self) -> None:
        """grad of grad through a differentiable backward equals eager's (6x for x**3)."""
        x = r(4)
        cap = captured(Cube, x)
        results = []
        for run in (Cube.apply, cap):
            x_ = x.detach().clone().requires_grad_()
            (gx,) = torch.autograd.grad(run(x_).sum(), x_, create_graph=True)
            (ggx,) = torch.autograd.grad((gx * torch.arange(4.0)).sum(), x_)
            results.append((gx.detach(), gx.requires_grad, ggx))
        (e_gx, e_rg, e_ggx), (m_gx, m_rg, m_ggx) = results
        assert m_rg == e_rg is True
        torch.testing.assert_close(m_gx, e_gx)
        torch.testing.assert_close(m_ggx, e_ggx)
        torch.testing.assert_close(e_ggx, 6 * x.detach() * torch.arange(4.0))


# ---------------------------------------------------------------------------------------------
# Other ways to write a Function: vjp, jvp, setup_context, keyword arguments
# ---------------------------------------------------------------------------------------------

class TestFunctionForms:
    def test_vjp_alias(self) -> None:
        """A Function defining vjp instead of backward."""

        class ExpVjp(Function):
            @staticmethod
            def forward(ctx, x):
                y = torch.exp(x)
                ctx.save_for_backward(y)
                return y

            @staticmethod
            def vjp(ctx, g):
                (y,) = ctx.saved_tensors
                return g * y

        check(ExpVjp, r(3))

    def test_jvp_present(self) -> None:
        """A Function that also defines jvp: reverse mode is unaffected."""

        class WithJvp(Function):
            @staticmethod
            def forward(ctx, x):
                ctx.save_for_backward(x)
                ctx.x = x
                return torch.sin(x)

            @staticmethod
            def backward(ctx, g):
                (x,) = ctx.saved_tensors
                return g * torch.cos(x)

            @staticmethod
            def jvp(ctx, t):
                return t * torch.cos(ctx.x)

        check(WithJvp, r(3))

    def test_setup_context_style(self) -> None:
        """forward without ctx plus setup_context, saving an input and the output."""

        class TanhSC(Function):
            @staticmethod
            def forward(x, scale):
                return torch.tanh(x) * scale

            @staticmethod
            def setup_context(ctx, inputs, output):
                x, scale = inputs
                ctx.scale = scale
                ctx.save_for_backward(x)

            @staticmethod
            def backward(ctx, g):
                (x,) = ctx.saved_tensors
                return g * ctx.scale * (1 - torch.tanh(x) ** 2), None

        check(TanhSC, r(3), 1.5)

    def test_keyword_arguments(self) -> None:
        """apply with keyword arguments (tensor and constant) matches eager, via capture and apply."""

        class Affine(Function):
            @staticmethod
            def forward(ctx, x, w, scale=2.0, shift=0.0):
                ctx.save_for_backward(w)
                ctx.scale = scale
                return x * w * scale + shift

            @staticmethod
            def backward(ctx, g):
                (w,) = ctx.saved_tensors
                return g * w * ctx.scale, None, None, None

        check(Affine, r(3), w=r(3, grad=False), scale=3.0)
        check(Affine, x=r(3), w=r(3), scale=3.0, shift=1.0)
        x, w = r(3), r(3)
        ex, ew, mx, mw = clone_args((x, w, x, w))
        torch.testing.assert_close(minihop.apply(Affine, mx, w=mw, scale=0.5),
                                   Affine.apply(ex, w=ew, scale=0.5))

    def test_setup_context_defaults(self) -> None:
        """setup_context style: eager binds defaults, so a later keyword alone is fine."""

        class ShiftSC(Function):
            @staticmethod
            def forward(x, scale=2.0, shift=0.0):
                return x * scale + shift

            @staticmethod
            def setup_context(ctx, inputs, output):
                ctx.scale = inputs[1]

            @staticmethod
            def backward(ctx, g):
                return g * ctx.scale, None, None

        check(ShiftSC, r(3), shift=1.0)

    def test_setup_context_defaults_positional_call(self) -> None:
        """setup_context style called without the defaulted arguments: eager passes the defaults in ``inputs``."""

        class ScaleSC(Function):
            @staticmethod
            def forward(x, scale=2.0):
                return x * scale

            @staticmethod
            def setup_context(ctx, inputs, output):
                assert len(inputs) == 2, f"setup_context got inputs={inputs!r}"
                ctx.scale = inputs[1]

            @staticmethod
            def backward(ctx, g):
                return g * ctx.scale, None

        check(ScaleSC, r(3))

    def test_ctx_style_skipped_default_is_an_error(self) -> None:
        """ctx style: eager does not fill a skipped default before a given keyword (TypeError); minihop must not run it either."""

        class ShiftCtx(Function):
            @staticmethod
            def forward(ctx, x, scale=2.0, shift=0.0):
                return x * scale + shift

            @staticmethod
            def backward(ctx, g):
                return g * 2, None, None

        with pytest.raises(TypeError, match="missing required argument: 'scale'"):
            ShiftCtx.apply(r(3), shift=1.0)
        with pytest.raises(TypeError):
            minihop.apply(ShiftCtx, r(3), shift=1.0)


# ---------------------------------------------------------------------------------------------
# Values kept on ctx
# ---------------------------------------------------------------------------------------------

class TestCtxAttributes:
    def test_tensor_attributes(self) -> None:
        """Tensors stored as ctx attributes (an input and an intermediate), not save_for_backward."""

        class Attr(Function):
            @staticmethod
            def forward(ctx, x, y):
                ctx.y = y
                ctx.h = torch.sigmoid(x)
                return ctx.h * y

            @staticmethod
            def backward(ctx, g):
                return g * ctx.y * ctx.h * (1 - ctx.h), g * ctx.h

        cmp = check(Attr, r(3), r(3))
        assert cmp.capture.saved_for_backward_idx == ()

    def test_containers_of_tensors(self) -> None:
        """Lists, tuples and dicts of tensors on ctx."""

        class Containers(Function):
            @staticmethod
            def forward(ctx, x, y):
                ctx.as_list = [x, torch.sin(x)]
                ctx.as_tuple = (y, torch.cos(y))
                ctx.as_dict = {"xy": x * y, "n": 2}
                return x * y + torch.sin(x)

            @staticmethod
            def backward(ctx, g):
                x, sx = ctx.as_list
                y, cy = ctx.as_tuple
                n = ctx.as_dict["n"]
                return g * (y + torch.cos(x)) * (n - 1), g * x * (cy * 0 + 1)

        check(Containers, r(3), r(3))

    def test_non_tensor_attributes(self) -> None:
        """Python numbers and flags on ctx are constants in the graphs."""

        class Consts(Function):
            @staticmethod
            def forward(ctx, x, k):
                ctx.k = k
                ctx.flag = True
                return x * k

            @staticmethod
            def backward(ctx, g):
                return (g * ctx.k if ctx.flag else g), None

        check(Consts, r(3), 4)


# ---------------------------------------------------------------------------------------------
# Saved tensors: version counters and saved_tensors_hooks
# ---------------------------------------------------------------------------------------------

class SaveBoth(Function):
    @staticmethod
    def forward(ctx, x, y):
        h = torch.sin(x)
        ctx.save_for_backward(x, y, h)
        return h * y

    @staticmethod
    def backward(ctx, g):
        x, y, h = ctx.saved_tensors
        return g * y * torch.cos(x), g * h


class StashX(Function):
    @staticmethod
    def forward(ctx, x):
        ctx.x = x
        return x * x

    @staticmethod
    def backward(ctx, g):
        return 2 * ctx.x * g


class SavePartlyUsed(Function):
    """Saves x and y; backward unpacks both but computes with x only."""

    @staticmethod
    def forward(ctx, x, y):
        ctx.save_for_backward(x, y)
        return x * x + y

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        return 2 * x * g, g


class SaveTwice(Function):
    """Saves the same tensor twice."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x, x)
        return x * x

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        return g * a + g * b


def count_hooks(run: Callable[..., Any], *args: Any) -> tuple[dict[str, int], list[Any]]:
    """Pack/unpack calls of saved_tensors_hooks around ``run(*args)``; unpack doubles each value."""
    calls = {"pack": 0, "unpack": 0}

    def pack(t: torch.Tensor) -> torch.Tensor:
        calls["pack"] += 1
        return t

    def unpack(t: torch.Tensor) -> torch.Tensor:
        calls["unpack"] += 1
        return t * 2

    args = clone_args(args)
    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        out = run(*args)
    out.sum().backward()
    return calls, [a.grad for a in args]


class TestSavedTensors:
    def test_saved_input_modified_raises(self) -> None:
        """A save_for_backward input modified in place before backward raises eager's version error."""
        cap = captured(SaveBoth, r(3), r(3))
        for run in (SaveBoth.apply, cap):
            x, y = r(3), r(3)
            out = run(x, y)
            with torch.no_grad():
                y.mul_(2)
            with pytest.raises(RuntimeError, match="modified by an inplace operation"):
                out.sum().backward()

    def test_saved_output_modified_raises(self) -> None:
        """A saved output modified in place before backward raises eager's version error."""

        class ExpOut(Function):
            @staticmethod
            def forward(ctx, x):
                y = torch.exp(x)
                ctx.save_for_backward(y)
                return y

            @staticmethod
            def backward(ctx, g):
                (y,) = ctx.saved_tensors
                return g * y

        cap = captured(ExpOut, r(3))
        for run in (ExpOut.apply, cap):
            out = run(r(3))
            out.add_(1)
            with pytest.raises(RuntimeError, match="modified by an inplace operation"):
                out.sum().backward()

    def test_ctx_attribute_modified_no_check(self) -> None:
        """A tensor kept as a ctx attribute has no version check: backward sees the new value, as in eager."""
        x = r(3)
        cap = captured(StashX, x)
        grads = []
        for run in (StashX.apply, cap):
            x_ = x.detach().clone().requires_grad_()
            out = run(x_)
            with torch.no_grad():
                x_.mul_(10)
            out.sum().backward()
            grads.append(x_.grad)
        torch.testing.assert_close(grads[1], grads[0])
        torch.testing.assert_close(grads[0], 2 * (x.detach() * 10))

    def test_saved_tensors_hooks_see_saved(self) -> None:
        """saved_tensors_hooks are called for each saved tensor, and unpack's result reaches backward."""
        x, y = r(3), r(3)
        cap = captured(SaveBoth, x, y)
        e_calls, e_grads = count_hooks(SaveBoth.apply, x, y)
        m_calls, m_grads = count_hooks(cap, x, y)
        assert e_calls == {"pack": 3, "unpack": 3}
        assert m_calls == e_calls
        for m, e in zip(m_grads, e_grads, strict=True):
            torch.testing.assert_close(m, e)

    @pytest.mark.parametrize("fn_cls", [SavePartlyUsed, SaveTwice], ids=["partly_used", "saved_twice"])
    def test_saved_tensors_hooks_count_every_saved(self, fn_cls: type) -> None:
        """Eager packs every tensor given to save_for_backward (even one backward ignores, or one given twice)."""
        args = (r(3), r(3))[: 2 if fn_cls is SavePartlyUsed else 1]
        cap = captured(fn_cls, *args)
        e_calls, e_grads = count_hooks(fn_cls.apply, *args)
        m_calls, m_grads = count_hooks(cap, *args)
        assert e_calls == {"pack": 2, "unpack": 2}
        assert m_calls == e_calls, f"eager {e_calls}, minihop {m_calls}"
        for m, e in zip(m_grads, e_grads, strict=True):
            torch.testing.assert_close(m, e)

    def test_saved_but_unused_modified_raises(self) -> None:
        """A saved tensor that backward unpacks but does not compute with still gets eager's version check."""
        cap = captured(SavePartlyUsed, r(3), r(3))
        for run in (SavePartlyUsed.apply, cap):
            x, y = r(3), r(3)
            out = run(x, y)
            with torch.no_grad():
                y.mul_(2)
            with pytest.raises(RuntimeError, match="modified by an inplace operation"):
                out.sum().backward()


# ---------------------------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------------------------

class TestInputs:
    def test_same_tensor_twice(self) -> None:
        """F.apply(x, x): the two gradients accumulate into x.grad."""

        class MulSin(Function):
            @staticmethod
            def forward(ctx, a, b):
                ctx.save_for_backward(a, b)
                return a * torch.sin(b)

            @staticmethod
            def backward(ctx, g):
                a, b = ctx.saved_tensors
                return g * torch.sin(b), g * a * torch.cos(b)

        x = r(4)
        check(MulSin, x, x)
        cap = captured(MulSin, x, x)
        grads = []
        for run in (MulSin.apply, cap):
            x_ = x.detach().clone().requires_grad_()
            run(x_, x_).sum().backward()
            grads.append(x_.grad)
        torch.testing.assert_close(grads[1], grads[0])
        xd = x.detach()
        torch.testing.assert_close(grads[0], torch.sin(xd) + xd * torch.cos(xd))

    def test_sequential_argument(self) -> None:
        """An nn.Sequential argument: its parameters are read at paths such as ``m.0.weight``,
        which is no Python attribute syntax (the capture failed with a SyntaxError)."""

        class Apply(Function):
            @staticmethod
            def forward(ctx, m, x):
                return m(x)

            @staticmethod
            def backward(ctx, g):
                return None, g

        m = nn.Sequential(nn.Linear(3, 3), nn.Tanh())
        check(Apply, m, r(2, 3))


# ---------------------------------------------------------------------------------------------
# Outputs of every structure
# ---------------------------------------------------------------------------------------------

class Obj:
    def __init__(self, t: torch.Tensor, n: int) -> None:
        self.t = t
        self.n = n

    def __eq__(self, other: object) -> bool:  # for assert_matches_eager's non-tensor compare
        return isinstance(other, Obj) and self.n == other.n and torch.equal(self.t, other.t)


NT = collections.namedtuple("NT", "a b")


class TestOutputs:
    def test_dict_output(self) -> None:
        """A dict beside a tensor: its tensors do not require grad, as in eager."""

        class DictOut(Function):
            @staticmethod
            def forward(ctx, x):
                return x * 2, {"a": x * 3, "k": 1}

            @staticmethod
            def backward(ctx, g, g_dict):
                return g * 2

        cmp = check(DictOut, r(3))
        assert not cmp.captured_output[1]["a"].requires_grad

    def test_nested_tuple_and_list(self) -> None:
        """Nested tuples and lists: only top-level tensors require grad."""

        class Nested(Function):
            @staticmethod
            def forward(ctx, x):
                return x * 2, (x * 3, [x * 4, 5])

            @staticmethod
            def backward(ctx, g, g_nested):
                return g * 2

        check(Nested, r(3))

    def test_ints_and_none(self) -> None:
        """Ints and None among the outputs come back unchanged."""

        class WithInts(Function):
            @staticmethod
            def forward(ctx, x):
                return x * 2, 3, None

            @staticmethod
            def backward(ctx, g, g_int, g_none):
                return g * 2

        cmp = check(WithInts, r(3))
        assert cmp.captured_output[1:] == (3, None)

    def test_user_object(self) -> None:
        """A user object holding a tensor and an int, beside a tensor."""

        class ObjOut(Function):
            @staticmethod
            def forward(ctx, x):
                return Obj(x * 3, 1), x * 2

            @staticmethod
            def backward(ctx, g_obj, g):
                return g * 2

        cmp = check(ObjOut, r(3))
        assert isinstance(cmp.captured_output[0], Obj)
        assert not cmp.captured_output[0].t.requires_grad

    def test_namedtuple_becomes_tuple(self) -> None:
        """A namedtuple returned at top level comes back as a plain tuple, as in eager."""

        class NTOut(Function):
            @staticmethod
            def forward(ctx, x):
                return NT(x * 2, x * 3)

            @staticmethod
            def backward(ctx, ga, gb):
                return ga * 2 + gb * 3

        cmp = check(NTOut, r(3))
        assert type(cmp.eager_output) is tuple and type(cmp.captured_output) is tuple

    def test_non_differentiable_marked(self) -> None:
        """mark_non_differentiable outputs do not require grad; their grads arrive as zeros."""

        class NonDiff(Function):
            @staticmethod
            def forward(ctx, x):
                y = x * 3
                ctx.mark_non_differentiable(y)
                return x * 2, y

            @staticmethod
            def backward(ctx, g, g_y):
                assert g_y is not None
                return g * 2 + g_y

        cmp = check(NonDiff, r(3))
        assert cmp.capture.non_differentiable_idx == (1,)
        assert not cmp.captured_output[1].requires_grad

    def test_integer_dtype_output(self) -> None:
        """An integer tensor output does not require grad, as in eager."""

        class IntOut(Function):
            @staticmethod
            def forward(ctx, x):
                return x * 2, (x > 0).long(), x.argmax()

            @staticmethod
            def backward(ctx, g, g_mask, g_arg):
                return g * 2

        cmp = check(IntOut, r(4))
        assert [t.requires_grad for t in cmp.captured_output] == [True, False, False]

    def test_output_is_input(self) -> None:
        """An input returned unchanged comes back as a new tensor object (a view), as in eager."""

        class Ident(Function):
            @staticmethod
            def forward(ctx, x, y):
                return x, y * 2

            @staticmethod
            def backward(ctx, gx, gy):
                return gx, gy * 2

        cmp = check(Ident, r(3), r(3))
        assert cmp.captured_output[0] is not cmp.captured_args[0]


# ---------------------------------------------------------------------------------------------
# Backward's return value checked at capture time
# ---------------------------------------------------------------------------------------------

class TestBackwardOutputChecks:
    def test_wrong_count(self) -> None:
        """Backward returning two gradients for one input: eager raises at backward, minihop at capture."""

        class TwoForOne(Function):
            @staticmethod
            def forward(ctx, x):
                return x * 2

            @staticmethod
            def backward(ctx, g):
                return g, g

        with pytest.raises(RuntimeError, match="returned an incorrect number of gradients"):
            TwoForOne.apply(r(3)).sum().backward()
        with pytest.raises(minihop.BackwardOutputError, match=r"TwoForOne\.backward returned 2 gradient\(s\), but forward takes 1 argument"):
            minihop.capture(TwoForOne, r(3))

    def test_grad_for_non_tensor_input(self) -> None:
        """A tensor gradient for an int argument: an error in eager and in minihop."""

        class GradForInt(Function):
            @staticmethod
            def forward(ctx, x, k):
                return x * k

            @staticmethod
            def backward(ctx, g):
                return g * 2, g

        with pytest.raises(RuntimeError, match="returned a gradient different than None at position 2, but the corresponding forward input was not a Variable"):
            GradForInt.apply(r(3), 2).sum().backward()
        with pytest.raises(minihop.BackwardOutputError, match=r"GradForInt\.backward returned a tensor as the gradient for argument 1 \(k\), which is a int"):
            minihop.capture(GradForInt, r(3), 2)

    def test_wrong_shape(self) -> None:
        """A wrongly shaped gradient: eager raises; minihop names Function, position, expected and found shapes."""

        class Transposed(Function):
            @staticmethod
            def forward(ctx, x):
                return x * 2

            @staticmethod
            def backward(ctx, g):
                return g.t()

        with pytest.raises(RuntimeError, match=r"returned an invalid gradient at index 0 - got \[3, 2\] but expected shape compatible with \[2, 3\]"):
            Transposed.apply(r(2, 3)).sum().backward()
        with pytest.raises(minihop.BackwardOutputError) as info:
            minihop.capture(Transposed, r(2, 3))
        message = str(info.value)
        assert "Transposed.backward returned a gradient of shape [3, 2] for argument 0 (x)" in message
        assert "expected: [2, 3]" in message and "found:    [3, 2]" in message
        assert isinstance(info.value, RuntimeError)  # code catching eager's error still catches it

    def test_non_tensor_gradient(self) -> None:
        """Backward returning an int as a gradient: eager raises, minihop raises BackwardOutputError."""

        class IntGrad(Function):
            @staticmethod
            def forward(ctx, x):
                return x * 2

            @staticmethod
            def backward(ctx, g):
                return 1

        with pytest.raises(RuntimeError, match=r"expected Variable or None \(got int\)"):
            IntGrad.apply(r(3)).sum().backward()
        with pytest.raises(minihop.BackwardOutputError, match=r"IntGrad\.backward returned a int as the gradient for argument 0 \(x\)"):
            minihop.capture(IntGrad, r(3))

    def test_broadcastable_shape_accepted(self) -> None:
        """A gradient that sums back to the input's shape is accepted and reduced, as in eager."""

        class Broad(Function):
            @staticmethod
            def forward(ctx, x):
                return x * 2

            @staticmethod
            def backward(ctx, g):
                return g.expand(4, 3) * 2

        check(Broad, r(3))


# ---------------------------------------------------------------------------------------------
# Backward reading grad metadata
# ---------------------------------------------------------------------------------------------

class StrideReader(Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2 + g.stride()[1]


class ContigReader(Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2 if g.is_contiguous() else g * 3


def _grad_cases(out: torch.Tensor) -> list[Callable[[torch.Tensor], None]]:
    return [
        lambda o: o.backward(gradient=torch.arange(6.0).view(2, 3)),      # contiguous
        lambda o: o.backward(gradient=torch.arange(6.0).view(3, 2).t()),  # transposed
        lambda o: o.sum().backward(),                                      # expanded, stride 0
    ]


class TestGradMetadata:
    @pytest.mark.parametrize("fn_cls", [StrideReader, ContigReader], ids=["stride", "is_contiguous"])
    def test_reads_real_grad_layout(self, fn_cls: type) -> None:
        """Backward reading grad strides/contiguity sees the real grads' layout, as in eager."""
        x = r(2, 3)
        cap = captured(fn_cls, x)
        eager_grads, mine_grads = [], []
        for case in range(3):
            for run, grads in ((fn_cls.apply, eager_grads), (cap, mine_grads)):
                x_ = x.detach().clone().requires_grad_()
                out = run(x_)
                _grad_cases(out)[case](out)
                grads.append(x_.grad)
        for case, (m, e) in enumerate(zip(mine_grads, eager_grads, strict=True)):
            torch.testing.assert_close(m, e, msg=f"grad case {case}")
        assert not torch.equal(eager_grads[0] - 2 * torch.arange(6.0).view(2, 3),
                               eager_grads[1] - 2 * torch.arange(6.0).view(3, 2).t())


# ---------------------------------------------------------------------------------------------
# Nested and composed Functions
# ---------------------------------------------------------------------------------------------

class Double(Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2


class Sin(Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.sin(x)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * torch.cos(x)


class LinearFn(Function):
    @staticmethod
    def forward(ctx, x, w, b):
        ctx.save_for_backward(x, w)
        return x @ w.t() + b

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return g @ w, g.t() @ x, g.sum(0)


class TestUnusedValues:
    def test_unused_random_draw_advances_the_generator(self) -> None:
        """A random draw forward and backward never use still runs, as in eager: the global
        generator is where eager leaves it after the call and after backward."""

        class Noisy(Function):
            @staticmethod
            def forward(ctx, x):
                noise = torch.rand(3)  # drawn, then not used
                return x * 2

            @staticmethod
            def backward(ctx, g):
                jitter = torch.randn(2)  # drawn, then not used
                return g * 2

        cap = captured(Noisy, r(3))
        after: list[tuple[torch.Tensor, torch.Tensor]] = []
        for run in (Noisy.apply, cap):
            torch.manual_seed(0)
            out = run(r(3))
            after_forward = torch.rand(2)
            out.sum().backward()
            after.append((after_forward, torch.rand(2)))
        torch.testing.assert_close(after[1], after[0])

    def test_unused_values_stay_in_the_bodies(self) -> None:
        """Values computed and never used stay in both bodies, as eager runs them."""

        class Unused(Function):
            @staticmethod
            def forward(ctx, x, y):
                ctx.save_for_backward(x)
                total = x * y  # not used
                return torch.sin(x)

            @staticmethod
            def backward(ctx, g):
                (x,) = ctx.saved_tensors
                c = torch.cos(x)
                twice = c * 2  # not used
                return g * c, None

        cmp = check(Unused, r(3), r(3))
        assert operator.mul in targets(cmp.capture.fwd)
        assert [t for t in targets(cmp.capture.bwd) if t is operator.mul] == [operator.mul, operator.mul]


class TestComposition:
    def test_function_inside_forward(self) -> None:
        """Another Function's apply inside forward (runs as plain ops: forward has no grad)."""

        class Outer(Function):
            @staticmethod
            def forward(ctx, x):
                ctx.save_for_backward(x)
                return Sin.apply(Double.apply(x)) * 3

            @staticmethod
            def backward(ctx, g):
                (x,) = ctx.saved_tensors
                return g * 6 * torch.cos(2 * x)

        cmp = check(Outer, r(3))
        assert torch.sin in targets(cmp.capture.fwd)

    def test_function_inside_backward(self) -> None:
        """Another Function's apply inside backward."""

        class Outer(Function):
            @staticmethod
            def forward(ctx, x):
                ctx.save_for_backward(x)
                return torch.sin(x) * 2

            @staticmethod
            def backward(ctx, g):
                (x,) = ctx.saved_tensors
                return Double.apply(g * torch.cos(x))

        check(Outer, r(3))

    def test_module_training(self) -> None:
        """An nn.Module whose forward uses minihop.apply trains to the same parameters as eager."""

        class Net(nn.Module):
            def __init__(self, apply: Callable[..., Any]) -> None:
                super().__init__()
                self.apply_fn = apply
                self.lin = nn.Linear(4, 3)
                self.w = nn.Parameter(torch.randn(2, 3))
                self.b = nn.Parameter(torch.zeros(2))

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                h = torch.tanh(self.lin(x))
                return self.apply_fn(LinearFn)(h, self.w, self.b)

        eager, mine = Net(eager_apply), Net(minihop_apply)
        mine.load_state_dict(eager.state_dict())
        opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (eager, mine)]
        for step in range(4):
            x, target = torch.randn(5, 4), torch.randn(5, 2)
            for model, opt in zip((eager, mine), opts, strict=True):
                opt.zero_grad()
                ((model(x) - target) ** 2).mean().backward()
                opt.step()
        for (name, pe), (_, pm) in zip(eager.named_parameters(), mine.named_parameters(), strict=True):
            torch.testing.assert_close(pm, pe, msg=f"parameter {name}")

    def test_applied_in_loop(self) -> None:
        """A Function applied repeatedly in a loop: one capture, eager's gradients."""
        x = r(3)
        ex, mx = clone_args((x, x))[0], x.detach().clone().requires_grad_()
        e, m = ex, mx
        counted = minihop.function(Sin)
        c = mx.detach().clone().requires_grad_()
        for _ in range(5):
            e, m, c = Sin.apply(e), minihop.apply(Sin, m), counted.apply(c)
        torch.testing.assert_close(m, e)
        e.sum().backward()
        m.sum().backward()
        torch.testing.assert_close(mx.grad, ex.grad)
        torch.testing.assert_close(c, e)
        assert (counted.stats.captures, counted.stats.hits) == (1, 4)  # leaf and non-leaf share a key

    def test_closure_over_module_parameters_and_buffers(self) -> None:
        """Forward and backward reading a closed-over module's parameter and buffer; a replaced parameter is picked up."""
        lin = nn.Linear(3, 3)
        lin.register_buffer("scale", torch.tensor([1.0, 2.0, 3.0]))

        class UsesLin(Function):
            @staticmethod
            def forward(ctx, x):
                ctx.save_for_backward(x)
                return (x @ lin.weight.t()) * lin.scale

            @staticmethod
            def backward(ctx, g):
                return (g * lin.scale) @ lin.weight

        def both() -> None:
            x = r(2, 3)
            ex, mx = clone_args((x, x))[0], x.detach().clone().requires_grad_()
            e, m = UsesLin.apply(ex), minihop.apply(UsesLin, mx)
            torch.testing.assert_close(m, e)
            e.sum().backward()
            m.sum().backward()
            torch.testing.assert_close(mx.grad, ex.grad)

        both()
        assert lin.weight.grad is None  # eager's forward runs without grad: closed-over params get none
        with torch.no_grad():
            lin.scale.mul_(-1)  # a buffer changed in place
        both()
        lin.weight = nn.Parameter(torch.randn(3, 3))  # a parameter replaced
        both()
        lin.scale = torch.tensor([5.0, 6.0, 7.0])  # a buffer rebound
        both()
        assert lin.weight.grad is None
