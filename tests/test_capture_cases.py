"""Differential cases: each small Function is captured and checked against eager ``F.apply``.

Every case goes through ``minihop.testing.assert_matches_eager`` (outputs, structure,
``requires_grad``, aliasing, every input's ``.grad``) and through ``assert_pair``, which checks
the graph contract of ``DESIGN.md`` directly on the captured graphs:

  (a) one bwd output per fwd placeholder;
  (b) one bwd grad placeholder per tensor output of forward (counted on eager's output);
  (c) fwd returns ``((outs...), (saved...))`` and bwd takes ``outs + saved`` placeholders.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

import pytest
import torch
import torch.fx as fx
import torch.nn.functional as TF

import minihop
from minihop.testing import EagerComparison, assert_matches_eager


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------

def _placeholders(gm: fx.GraphModule) -> list[fx.Node]:
    return [n for n in gm.graph.nodes if n.op == "placeholder"]


def _output(gm: fx.GraphModule) -> Any:
    (node,) = [n for n in gm.graph.nodes if n.op == "output"]
    return node.args[0]


def _count_tensors(value: Any) -> int:
    """Tensor leaves of a returned value: tuple/list items, dict values, object attributes."""
    if isinstance(value, torch.Tensor):
        return 1
    if isinstance(value, (tuple, list)):
        return sum(_count_tensors(v) for v in value)
    if isinstance(value, dict):
        return sum(_count_tensors(v) for v in value.values())
    if hasattr(value, "__dict__") and not isinstance(value, (type, torch.nn.Module)):
        return sum(_count_tensors(v) for v in vars(value).values())
    return 0


def assert_pair(cap: minihop.Capture, *, tensor_outputs: int, inputs: int | None = None,
                lifted: int | None = None) -> None:
    """Check the graph contract (a), (b), (c) on ``cap``'s pair, independently of minihop."""
    fwd_in = _placeholders(cap.fwd)
    bwd_in = _placeholders(cap.bwd)
    out = _output(cap.fwd)
    # (c) fwd returns ((outs...), (saved...))
    assert isinstance(out, tuple) and len(out) == 2, f"fwd returns {out!r}"
    outs, saved = out
    assert isinstance(outs, tuple) and isinstance(saved, tuple), f"fwd returns {out!r}"
    bwd_out = _output(cap.bwd)
    bwd_out = tuple(bwd_out) if isinstance(bwd_out, (tuple, list)) else (bwd_out,)
    # (a) one gradient (or None) per fwd input
    assert len(bwd_out) == len(fwd_in), (len(bwd_out), [n.name for n in fwd_in])
    # (b) one grad placeholder per tensor output
    assert len(outs) == tensor_outputs, (len(outs), tensor_outputs)
    assert len(bwd_in) - len(saved) == tensor_outputs
    # (c) bwd placeholders are grads + saved, saved metadata lines up
    assert len(bwd_in) == len(outs) + len(saved)
    for s, p in zip(saved, bwd_in[len(outs):], strict=True):
        sv, pv = s.meta.get("val"), p.meta.get("val")
        if isinstance(sv, torch.Tensor):
            assert isinstance(pv, torch.Tensor), (s, p)
            assert (sv.shape, sv.dtype) == (pv.shape, pv.dtype), (s, p)
    # Inputs: one InputSource per placeholder; no gradient for lifted or integer inputs.
    assert len(cap.inputs) == len(fwd_in)
    for source, node, g in zip(cap.inputs, fwd_in, bwd_out, strict=True):
        val = node.meta.get("val")
        integral = isinstance(val, torch.Tensor) and not (val.is_floating_point() or val.is_complex())
        if source.lifted or integral:
            assert g is None, f"bwd gives a gradient for {source.description}"
    if inputs is not None:
        assert len(fwd_in) == inputs, [n.name for n in fwd_in]
    if lifted is not None:
        assert sum(1 for s in cap.inputs if s.lifted) == lifted, cap.inputs
    shape = minihop.check_consistent(cap.fwd, cap.bwd)
    assert (shape.num_inputs, shape.num_outputs, shape.num_saved) == (
        len(fwd_in), len(outs), len(saved))


def check(fn_cls: type, *args: Any, inputs: int | None = None, lifted: int | None = None,
          **kwargs: Any) -> EagerComparison:
    """``assert_matches_eager`` plus the pair's graph invariants."""
    cmp = assert_matches_eager(fn_cls, *args, **kwargs)
    assert_pair(cmp.capture, tensor_outputs=_count_tensors(cmp.eager_output), inputs=inputs,
                lifted=lifted)
    return cmp


def _targets(gm: fx.GraphModule) -> list[Any]:
    return [n.target for n in gm.graph.nodes if n.op in ("call_function", "call_method")]


def r(*shape: int, grad: bool = True, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A random leaf tensor."""
    return torch.randn(*shape, dtype=dtype).requires_grad_(grad)


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


# ---------------------------------------------------------------------------------------------
# Functions used by several tests
# ---------------------------------------------------------------------------------------------

class Mul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, y):
        ctx.save_for_backward(x, y)
        return x * y

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        return g * y, g * x


class Sin(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.sin(x)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * torch.cos(x)


class Scale(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, scale=2.0):
        ctx.scale = scale
        return x * scale

    @staticmethod
    def backward(ctx, g):
        return g * ctx.scale, None


@dataclasses.dataclass
class Params:
    w: torch.Tensor
    b: torch.Tensor


class Box:
    def __init__(self, a: torch.Tensor, k: int) -> None:
        self.a = a
        self.k = k


Pair = collections.namedtuple("Pair", "a b")

_GLOBAL_W = torch.randn(3)
_REBOUND_W = torch.ones(3)
_REBOUND_K = 2.0


class _Config:
    scale = 2.0


_CONFIG = _Config()


# ---------------------------------------------------------------------------------------------
# capture: input kinds
# ---------------------------------------------------------------------------------------------

class TestInputs:
    def test_single_tensor(self) -> None:
        """One tensor argument, saved for backward."""
        check(Sin, r(4), inputs=1)

    def test_several_tensors(self) -> None:
        """Two tensor arguments both receive gradients."""
        check(Mul, r(3), r(3), inputs=2)

    def test_float_constant(self) -> None:
        """A Python float scale factor is baked in and gets no gradient."""
        check(Scale, r(3), 0.5, inputs=1)

    def test_int_bool_str_none_constants(self) -> None:
        """Int, bool, str and None arguments steer forward and backward like constants."""

        class Mixed(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x, power, negate, mode, nothing):
                ctx.save_for_backward(x)
                ctx.power, ctx.negate = power, negate
                y = x ** power
                if negate:
                    y = -y
                if mode == "double":
                    y = y * 2
                assert nothing is None
                return y

            @staticmethod
            def backward(ctx, g):
                (x,) = ctx.saved_tensors
                d = ctx.power * x ** (ctx.power - 1)
                if ctx.negate:
                    d = -d
                return g * d * 2, None, None, None, None

        check(Mixed, r(4), 3, True, "double", None, inputs=1)

    def test_tuple_of_tensors_arg(self) -> None:
        """Tensors inside a tuple argument are lifted: used, but given no gradient (eager)."""

        class Affine(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x, wb):
                w, b = wb
                ctx.save_for_backward(w)
                return x * w + b

            @staticmethod
            def backward(ctx, g):
                (w,) = ctx.saved_tensors
                return g * w, None

        check(Affine, r(3), (r(3), r(3)), inputs=3, lifted=2)

    def test_list_of_tensors_arg(self) -> None:
        """A list of tensors is iterated with len() and a for loop."""

        class SumAll(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x, ws):
                ctx.n = len(ws)
                out = x.clone()
                for w in ws:
                    out = out + w
                return out

            @staticmethod
            def backward(ctx, g):
                return g, None

        check(SumAll, r(2, 3), [r(2, 3), r(2, 3, grad=False), r(3)], inputs=4, lifted=3)

    def test_dict_of_tensors_arg(self) -> None:
        """Tensors in a dict argument are read by key."""

        class Lin(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x, p):
                ctx.save_for_backward(p["w"])
                return x @ p["w"] + p["b"]

            @staticmethod
            def backward(ctx, g):
                (w,) = ctx.saved_tensors
                return g @ w.t(), None

        check(Lin, r(2, 3), {"w": r(3, 4), "b": r(4)}, inputs=3, lifted=2)

    def test_dataclass_holding_tensors(self) -> None:
        """A dataclass argument's tensors are lifted and get no gradient, as in eager."""

        class Lin(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x, params):
                ctx.save_for_backward(params.w)
                return x @ params.w + params.b

            @staticmethod
            def backward(ctx, g):
                (w,) = ctx.saved_tensors
                return g @ w.t(), None

        params = Params(r(3, 4), r(4))
        cmp = check(Lin, r(2, 3), params, inputs=3, lifted=2)
        assert cmp.captured_args[1].w.grad is None and cmp.eager_args[1].w.grad is None

    def test_plain_object_holding_tensor_and_int(self) -> None:
        """A plain object's tensor attribute is lifted, its int attribute read as a constant."""

        class UseBox(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x, box):
                ctx.k = box.k
                return x * box.a * box.k

            @staticmethod
            def backward(ctx, g):
                return g * ctx.k, None

        check(UseBox, r(3), Box(r(3), 4), inputs=2, lifted=1)

    def test_closure_tensor(self) -> None:
        """A tensor reached through a closure is lifted and never receives a gradient."""
        w = r(3)

        class Closure(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x * w

            @staticmethod
            def backward(ctx, g):
                return g * w

        check(Closure, r(3), inputs=3, lifted=2)  # w for forward, and w fetched when backward runs
        assert w.grad is None

    def test_global_tensor(self) -> None:
        """A module-level global tensor is lifted into the graph."""

        class Global(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x + _GLOBAL_W

            @staticmethod
            def backward(ctx, g):
                return g

        check(Global, r(2, 3), inputs=2, lifted=1)

    def test_module_attribute_tensor(self) -> None:
        """An nn.Module's parameters reached from forward are lifted; they get no gradient."""
        lin = torch.nn.Linear(3, 2)

        class UseLinear(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return TF.linear(x, lin.weight, lin.bias)

            @staticmethod
            def backward(ctx, g):
                return g @ lin.weight

        check(UseLinear, r(4, 3), inputs=4, lifted=3)  # and lin.weight fetched when backward runs
        assert lin.weight.grad is None and lin.bias.grad is None

    def test_module_argument(self) -> None:
        """An nn.Module passed as an argument: its parameters are lifted."""

        class Apply(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x, mod):
                ctx.mod = mod
                return mod(x)

            @staticmethod
            def backward(ctx, g):
                return g @ ctx.mod.weight, None

        lin = torch.nn.Linear(3, 5)
        check(Apply, r(2, 3), lin, lifted=3)  # and ctx.mod.weight, read when backward runs
        assert lin.weight.grad is None

    def test_unused_tensor_arg(self) -> None:
        """A tensor argument forward never uses still gets its gradient at the right position."""

        class Unused(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x, unused, y):
                ctx.save_for_backward(y)
                return x * 3 + y

            @staticmethod
            def backward(ctx, g):
                (y,) = ctx.saved_tensors
                return g * 3, torch.ones_like(y) * g.sum(), g

        check(Unused, r(3), r(3), r(3), inputs=3)

    def test_unused_tensor_arg_first(self) -> None:
        """An unused first argument is placed after the used ones, and its grad still lines up."""

        class UnusedFirst(torch.autograd.Function):
            @staticmethod
            def forward(ctx, unused, x):
                return x.exp()

            @staticmethod
            def backward(ctx, g):
                return g * 2, g * 5

        cmp = check(UnusedFirst, r(3), r(3), inputs=2)
        assert [s.arg_index for s in cmp.capture.inputs] == [1, 0]

    def test_same_tensor_twice(self) -> None:
        """The same tensor passed twice gets both gradients accumulated."""
        x = r(4)
        cmp = check(Mul, x, x)
        torch.testing.assert_close(cmp.captured_args[0].grad, cmp.eager_args[0].grad)
        assert cmp.captured_args[0] is cmp.captured_args[1]

    def test_keyword_arguments(self) -> None:
        """Keyword arguments to apply bind to forward's parameters."""
        check(Scale, r(3), scale=3.0, inputs=1)

    def test_keyword_tensor_argument(self) -> None:
        """A tensor passed by keyword still gets its gradient."""
        check(Mul, r(3), y=r(3), inputs=2)

    def test_default_argument(self) -> None:
        """An omitted argument takes forward's default."""
        cmp = check(Scale, r(3), inputs=1)
        torch.testing.assert_close(cmp.captured_output, cmp.eager_args[0].detach() * 2.0)

    def test_inputs_not_requiring_grad(self) -> None:
        """No input requires grad: outputs do not either, and nothing gets a gradient."""
        cmp = check(Mul, r(3, grad=False), r(3, grad=False))
        assert not cmp.captured_output.requires_grad

    def test_one_input_not_requiring_grad(self) -> None:
        """needs_input_grad reports the real flags; only x gets a gradient."""

        class Needs(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x, y):
                ctx.save_for_backward(x, y)
                return x * y

            @staticmethod
            def backward(ctx, g):
                x, y = ctx.saved_tensors
                gx = g * y if ctx.needs_input_grad[0] else None
                gy = g * x if ctx.needs_input_grad[1] else None
                return gx, gy

        check(Needs, r(3), r(3, grad=False))

    def test_integer_tensor_input(self) -> None:
        """An integer index tensor is an input but never gets a gradient."""

        class Gather(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x, idx):
                ctx.save_for_backward(idx)
                ctx.n = x.shape[0]
                return x[idx]

            @staticmethod
            def backward(ctx, g):
                (idx,) = ctx.saved_tensors
                gx = torch.zeros(ctx.n, *g.shape[1:], dtype=g.dtype)
                return gx.index_add(0, idx, g), None

        check(Gather, r(5, 2), torch.tensor([0, 3, 3, 1]), inputs=2)

    def test_integer_tensor_multiplier(self) -> None:
        """An int64 tensor mixed into float math by type promotion."""

        class MulInt(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x, n):
                ctx.save_for_backward(n)
                return x * n

            @staticmethod
            def backward(ctx, g):
                (n,) = ctx.saved_tensors
                return g * n, None

        check(MulInt, r(4), torch.arange(4), inputs=2)

    def test_float64(self) -> None:
        """Double-precision inputs keep their dtype through forward and backward."""
        cmp = check(Mul, r(3, dtype=torch.float64), r(3, dtype=torch.float64))
        assert cmp.captured_output.dtype == torch.float64
        assert cmp.captured_args[0].grad.dtype == torch.float64

    def test_zero_dim(self) -> None:
        """0-dim tensors go through."""
        check(Mul, torch.tensor(2.0, requires_grad=True), torch.tensor(-3.0, requires_grad=True))

    def test_empty(self) -> None:
        """Tensors with a zero-size dimension go through."""
        check(Sin, r(0, 3))

    def test_non_contiguous(self) -> None:
        """A transposed (non-contiguous) input is reshaped and its gradient keeps its shape."""

        class Flat(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                ctx.shape = x.shape
                return x.reshape(-1) * 2

            @staticmethod
            def backward(ctx, g):
                return g.reshape(ctx.shape) * 2

        x = torch.randn(4, 3).t().requires_grad_()
        assert not x.is_contiguous()
        check(Flat, x, inputs=1)

    def test_non_contiguous_elementwise(self) -> None:
        """Elementwise math on a sliced (strided) input."""
        x = torch.randn(6, 4)[::2].requires_grad_()
        check(Sin, x)

    def test_shape_reads(self) -> None:
        """Forward reads shape, size(), numel(), dtype, device and isinstance like on tensors."""

        class Reads(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                assert isinstance(x, torch.Tensor) and len(x) == 2
                assert x.shape[0] == 2 and x.size(1) == 3 and x.numel() == 6
                assert x.dtype == torch.float32 and x.device.type == "cpu"
                ctx.n = x.numel()
                return x / x.numel()

            @staticmethod
            def backward(ctx, g):
                return g / ctx.n

        check(Reads, r(2, 3))

    def test_tensor_in_tuple_and_top_level(self) -> None:
        """A tensor reached first inside a tuple and then as a top-level argument gets its gradient."""

        class TupleFirst(torch.autograd.Function):
            @staticmethod
            def forward(ctx, t, x):
                return t[0] * x

            @staticmethod
            def backward(ctx, g):
                return None, g * 2

        x = r(3)
        check(TupleFirst, (x,), x)

    def test_namedtuple_arg(self) -> None:
        """A namedtuple argument's tensors are read by field name and lifted."""

        class UsePair(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x, pair):
                return x * pair.a + pair.b

            @staticmethod
            def backward(ctx, g):
                return g, None

        check(UsePair, r(3), Pair(r(3), r(3)), lifted=2)

    def test_optional_tensor_default_none(self) -> None:
        """An optional tensor argument left at its default None."""

        class Optional(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x, y=None):
                ctx.has_y = y is not None
                return x * 2 if y is None else x * y

            @staticmethod
            def backward(ctx, g):
                return g * 2, None

        check(Optional, r(3), inputs=1)

    def test_reads_requires_grad(self) -> None:
        """Forward may branch on x.requires_grad, which is the caller's flag as in eager."""

        class Branch(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x, y):
                ctx.rg = x.requires_grad
                return x * (2 if x.requires_grad else 3) + y

            @staticmethod
            def backward(ctx, g):
                return g * (2 if ctx.rg else 3), g

        check(Branch, r(3), r(3))
        check(Branch, r(3, grad=False), r(3))

    def test_complex(self) -> None:
        """Complex inputs get complex gradients."""
        check(Scale, torch.randn(3, dtype=torch.complex64, requires_grad=True), 2.0)

    def test_half(self) -> None:
        """float16 inputs keep their dtype."""
        cmp = check(Scale, r(4, dtype=torch.float16), 3.0)
        assert cmp.captured_output.dtype == torch.float16

    def test_bool_mask_input(self) -> None:
        """A bool mask input used with setitem in forward and masked_fill in backward."""

        class Zero(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x, mask):
                y = x.clone()
                y[mask] = 0
                ctx.save_for_backward(mask)
                return y

            @staticmethod
            def backward(ctx, g):
                (mask,) = ctx.saved_tensors
                return g.masked_fill(mask, 0), None

        check(Zero, r(4), torch.tensor([True, False, True, False]), inputs=2)

    def test_varargs(self) -> None:
        """forward(ctx, *xs): every tensor in the varargs gets its gradient."""

        class SumAll(torch.autograd.Function):
            @staticmethod
            def forward(ctx, *xs):
                ctx.n = len(xs)
                return sum(xs[1:], xs[0] * 1)

            @staticmethod
            def backward(ctx, g):
                return (g,) * ctx.n

        check(SumAll, r(3), r(3), r(3), inputs=3)

    def test_device_and_dtype_keywords(self) -> None:
        """Factory calls taking device= and dtype= from an input."""

        class Ones(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x * torch.ones(x.shape, device=x.device, dtype=x.dtype)

            @staticmethod
            def backward(ctx, g):
                return g

        check(Ones, r(3, dtype=torch.float64))

# ---------------------------------------------------------------------------------------------
# capture: output kinds
# ---------------------------------------------------------------------------------------------

class TestOutputs:
    def test_one_tensor(self) -> None:
        """A single returned tensor is returned as a tensor, not a tuple."""
        cmp = check(Sin, r(3))
        assert isinstance(cmp.captured_output, torch.Tensor)

    def test_tuple_of_tensors(self) -> None:
        """A returned tuple of tensors; both outputs carry gradients."""

        class Two(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                ctx.save_for_backward(x)
                return x.sin(), x.cos()

            @staticmethod
            def backward(ctx, ga, gb):
                (x,) = ctx.saved_tensors
                return ga * x.cos() - gb * x.sin()

        check(Two, r(4), inputs=1)

    def test_tuple_mixing_tensors_and_constants(self) -> None:
        """Ints, None and strings inside the returned tuple come back unchanged."""

        class Mixed(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x * 2, 3, None, "ok", x * 4

            @staticmethod
            def backward(ctx, g0, g1, g2, g3, g4):
                assert g1 is None and g2 is None and g3 is None
                return g0 * 2 + g4 * 4

        cmp = check(Mixed, r(3))
        assert cmp.captured_output[1:4] == (3, None, "ok")

    def test_single_output_in_tuple(self) -> None:
        """A one-element tuple stays a one-element tuple."""

        class One(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return (x * 2,)

            @staticmethod
            def backward(ctx, g):
                return g * 2

        cmp = check(One, r(3))
        assert isinstance(cmp.captured_output, tuple) and len(cmp.captured_output) == 1

    def test_object_output(self) -> None:
        """A returned object is rebuilt; its tensors do not require grad, as in eager."""

        class MakeBox(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x * 2, Box(x * 3, 7)

            @staticmethod
            def backward(ctx, g, _box):
                return g * 2

        cmp = check(MakeBox, r(3))
        box = cmp.captured_output[1]
        assert isinstance(box, Box) and box.k == 7
        assert not box.a.requires_grad

    def test_dataclass_output_only(self) -> None:
        """A Function returning only a dataclass: nothing requires grad."""

        class MakeParams(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return Params(x + 1, x - 1)

            @staticmethod
            def backward(ctx, g):
                return None

        cmp = check(MakeParams, r(3))
        assert isinstance(cmp.captured_output, Params)
        assert not cmp.captured_output.w.requires_grad

    def test_dict_output(self) -> None:
        """A dict inside the returned tuple is rebuilt with non-differentiable tensors."""

        class WithDict(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x.exp(), {"double": x * 2, "n": 1}

            @staticmethod
            def backward(ctx, g, _d):
                return g * 3

        cmp = check(WithDict, r(3))
        d = cmp.captured_output[1]
        assert set(d) == {"double", "n"} and not d["double"].requires_grad

    def test_list_output(self) -> None:
        """A list inside the returned tuple is rebuilt as a list."""

        class WithList(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return [x + 1, x + 2], x * 5

            @staticmethod
            def backward(ctx, _l, g):
                return g * 5

        cmp = check(WithList, r(3))
        assert isinstance(cmp.captured_output[0], list)

    def test_nested_tuple_output(self) -> None:
        """Tensors in a nested tuple are not outputs of the Function (no requires_grad)."""

        class Nested(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x * 2, (x * 3, x * 4)

            @staticmethod
            def backward(ctx, g, _t):
                return g * 2

        check(Nested, r(3))

    def test_output_is_input(self) -> None:
        """An input returned unchanged comes back as a view, not the input object."""

        class Identity(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x

            @staticmethod
            def backward(ctx, g):
                return g

        x = r(3)
        cmp = check(Identity, x)
        assert cmp.captured_output is not cmp.captured_args[0]
        fwd_targets = _targets(cmp.capture.fwd)
        assert "view_as" in fwd_targets or torch.Tensor.view_as in fwd_targets, fwd_targets

    def test_output_is_input_among_others(self) -> None:
        """One of two outputs is an input unchanged."""

        class PassThrough(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x, y):
                return x, x + y

            @staticmethod
            def backward(ctx, gx, gs):
                return gx + gs, gs

        cmp = check(PassThrough, r(3), r(3))
        assert cmp.captured_output[0] is not cmp.captured_args[0]

    def test_mark_non_differentiable(self) -> None:
        """A marked output does not require grad; its gradient arrives as zeros."""

        class SortVals(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                vals, idx = torch.sort(x)
                flag = vals * 0
                ctx.mark_non_differentiable(idx, flag)
                ctx.save_for_backward(idx)
                return vals, idx, flag

            @staticmethod
            def backward(ctx, g, _gi, gflag):
                (idx,) = ctx.saved_tensors
                assert gflag is not None
                gx = torch.zeros_like(g)
                return gx.scatter(0, idx, g) + gflag

        cmp = check(SortVals, r(5))
        assert cmp.capture.non_differentiable_idx == (1, 2)
        assert not cmp.captured_output[2].requires_grad

    def test_output_saved_for_backward(self) -> None:
        """An output saved for backward (exp's derivative is its own output)."""

        class Exp(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                y = x.exp()
                ctx.save_for_backward(y)
                return y

            @staticmethod
            def backward(ctx, g):
                (y,) = ctx.saved_tensors
                return g * y

        cmp = check(Exp, r(3), inputs=1)
        assert len(_output(cmp.capture.fwd)[1]) == 1

    def test_intermediate_saved(self) -> None:
        """An intermediate that is not an output is saved and used by backward."""

        class SinSq(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                s = torch.sin(x)
                c = torch.cos(x)
                ctx.save_for_backward(s, c)
                return s * s

            @staticmethod
            def backward(ctx, g):
                s, c = ctx.saved_tensors
                return g * 2 * s * c

        cmp = check(SinSq, r(3))
        assert len(_output(cmp.capture.fwd)[1]) == 2

    def test_ctx_attribute_tensor_saved(self) -> None:
        """A tensor stashed as a ctx attribute (not save_for_backward) reaches backward."""

        class Stash(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                ctx.t = torch.tanh(x)
                return ctx.t * 1

            @staticmethod
            def backward(ctx, g):
                return g * (1 - ctx.t * ctx.t)

        check(Stash, r(4))

    def test_backward_returns_none(self) -> None:
        """backward returning None for a tensor input leaves its .grad None."""

        class Half(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x, y):
                return x + y

            @staticmethod
            def backward(ctx, g):
                return g, None

        cmp = check(Half, r(3), r(3))
        assert cmp.captured_args[1].grad is None

    def test_unused_output_grad(self) -> None:
        """A grad backward never reads becomes an unused_N placeholder."""

        class FirstOnly(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x * 2, x * 3

            @staticmethod
            def backward(ctx, g0, g1):
                return g0 * 2

        cmp = check(FirstOnly, r(3))
        names = [n.name for n in _placeholders(cmp.capture.bwd)]
        assert any(name.startswith("unused") for name in names), names

    def test_integer_output(self) -> None:
        """An integer output (argmax) does not require grad, as eager marks it."""

        class ArgMax(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x * 2, x.argmax()

            @staticmethod
            def backward(ctx, g, _gi):
                return g * 2

        cmp = check(ArgMax, r(4))
        assert not cmp.captured_output[1].requires_grad

    def test_namedtuple_output(self) -> None:
        """A returned namedtuple has both fields differentiable."""

        class Split(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return Pair(x * 2, x * 3)

            @staticmethod
            def backward(ctx, ga, gb):
                return ga * 2 + gb * 3

        check(Split, r(3))

    def test_same_output_twice(self) -> None:
        """One tensor returned twice: both gradients reach backward."""

        class Twice(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                y = x * 2
                return y, y

            @staticmethod
            def backward(ctx, g1, g2):
                return (g1 + g2) * 2

        check(Twice, r(3))

    def test_view_outputs(self) -> None:
        """Outputs that are views of an input (indexing, view)."""

        class Views(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x[0], x.view(-1)

            @staticmethod
            def backward(ctx, g0, g1):
                out = g1.view(2, 3).clone()
                out[0] += g0
                return out

        check(Views, r(2, 3))

    def test_nested_output_is_input(self) -> None:
        """An input returned inside a dict is the input object itself, as in eager."""

        class Keep(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x * 2, {"x": x}

            @staticmethod
            def backward(ctx, g, _d):
                return g * 2

        check(Keep, r(3))

    def test_save_none(self) -> None:
        """None among saved tensors comes back as None."""

        class SaveNone(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                ctx.save_for_backward(None, x)
                return x * x

            @staticmethod
            def backward(ctx, g):
                nothing, x = ctx.saved_tensors
                assert nothing is None
                return 2 * x * g

        check(SaveNone, r(3))

    def test_gradient_dtype_cast(self) -> None:
        """A float64 gradient for a float32 input is cast back, as eager autograd does."""

        class Wide(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x * 2

            @staticmethod
            def backward(ctx, g):
                return (g * 2).double()

        cmp = check(Wide, r(4))
        assert cmp.captured_args[0].grad.dtype == torch.float32

    def test_gradient_for_input_not_requiring_grad(self) -> None:
        """A gradient returned for an input that does not require grad is dropped."""

        class Both(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x, y):
                ctx.save_for_backward(x)
                return x * y

            @staticmethod
            def backward(ctx, g):
                (x,) = ctx.saved_tensors
                return g, g * x

        cmp = check(Both, r(3), r(3, grad=False))
        assert cmp.captured_args[1].grad is None

    def test_integer_cast_output(self) -> None:
        """An output cast to int64 does not require grad; its grad is None in backward."""

        class Quantize(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x * 2, (x * 10).long()

            @staticmethod
            def backward(ctx, g, _gq):
                return g * 2

        check(Quantize, r(3))

    def test_chunk_returns_tuple(self) -> None:
        """forward returning torch.chunk's tuple directly: each chunk is an output."""

        class Halves(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x.chunk(2)

            @staticmethod
            def backward(ctx, a, b):
                return torch.cat([a, b])

        check(Halves, r(4))

    def test_list_returned(self) -> None:
        """A list returned directly: its tensors are not outputs of the Function (eager)."""

        class MakeList(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return [x * 2, x * 3]

            @staticmethod
            def backward(ctx, _g):
                return None

        cmp = check(MakeList, r(3))
        assert isinstance(cmp.captured_output, list)

    def test_ctx_list_of_tensors(self) -> None:
        """A list of tensors kept on ctx reaches backward."""

        class Keep(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x, y):
                ctx.ts = [x.sin(), y]
                return x.sin() * y

            @staticmethod
            def backward(ctx, g):
                s, y = ctx.ts
                return g * y * (1 - s * s).sqrt(), g * s

        check(Keep, r(3), r(3))

    def test_gradient_is_saved_tensor(self) -> None:
        """backward returning a saved tensor itself as a gradient."""

        class GradIsW(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x, w):
                ctx.save_for_backward(w)
                return x * 1 + w.sum()

            @staticmethod
            def backward(ctx, g):
                (w,) = ctx.saved_tensors
                return g, w

        check(GradIsW, r(3), r(3))

# ---------------------------------------------------------------------------------------------
# capture: ops inside forward and backward
# ---------------------------------------------------------------------------------------------

class TestOps:
    def test_matmul(self) -> None:
        """Matrix multiply with both gradients."""

        class MM(torch.autograd.Function):
            @staticmethod
            def forward(ctx, a, b):
                ctx.save_for_backward(a, b)
                return a @ b

            @staticmethod
            def backward(ctx, g):
                a, b = ctx.saved_tensors
                return g @ b.t(), a.t() @ g

        check(MM, r(2, 3), r(3, 4))

    def test_batched_matmul(self) -> None:
        """torch.bmm with transposes in backward."""

        class BMM(torch.autograd.Function):
            @staticmethod
            def forward(ctx, a, b):
                ctx.save_for_backward(a, b)
                return torch.bmm(a, b)

            @staticmethod
            def backward(ctx, g):
                a, b = ctx.saved_tensors
                return torch.bmm(g, b.transpose(1, 2)), torch.bmm(a.transpose(1, 2), g)

        check(BMM, r(2, 3, 4), r(2, 4, 5))

    def test_reductions(self) -> None:
        """sum over a dim and mean, expanded back in backward."""

        class SumMean(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                ctx.shape = x.shape
                return x.sum(dim=1), x.mean()

            @staticmethod
            def backward(ctx, gs, gm):
                n = ctx.shape[0] * ctx.shape[1]
                return gs.unsqueeze(1).expand(ctx.shape) + gm / n

        check(SumMean, r(3, 4))

    def test_amax_keepdim(self) -> None:
        """A max reduction with keepdim and a mask in backward."""

        class Max(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                m = x.amax(dim=-1, keepdim=True)
                ctx.save_for_backward(x, m)
                return m

            @staticmethod
            def backward(ctx, g):
                x, m = ctx.saved_tensors
                return (x == m).to(g.dtype) * g

        check(Max, r(3, 5))

    def test_views_reshape_transpose(self) -> None:
        """view, reshape, transpose and permute, undone in backward."""

        class Views(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x.view(2, 6).transpose(0, 1).reshape(3, 4).permute(1, 0)

            @staticmethod
            def backward(ctx, g):
                return g.permute(1, 0).reshape(6, 2).transpose(0, 1).reshape(2, 3, 2)

        check(Views, r(2, 3, 2))

    def test_indexing(self) -> None:
        """Basic slicing with steps; backward writes into a zero buffer with setitem."""

        class Slice(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                ctx.shape = x.shape
                return x[1:, ::2]

            @staticmethod
            def backward(ctx, g):
                gx = torch.zeros(ctx.shape)
                gx[1:, ::2] = g
                return gx

        check(Slice, r(4, 5))

    def test_broadcasting(self) -> None:
        """Broadcast operands; backward sums gradients back to each input's shape."""

        class Outer(torch.autograd.Function):
            @staticmethod
            def forward(ctx, a, b):
                ctx.save_for_backward(a, b)
                return a * b

            @staticmethod
            def backward(ctx, g):
                a, b = ctx.saved_tensors
                return (g * b).sum(1, keepdim=True), (g * a).sum(0, keepdim=True)

        check(Outer, r(3, 1), r(1, 4))

    def test_broadcast_gradient_summed_by_autograd(self) -> None:
        """A gradient returned in the broadcast shape is summed back, as eager autograd does."""

        class Add(torch.autograd.Function):
            @staticmethod
            def forward(ctx, a, b):
                return a + b

            @staticmethod
            def backward(ctx, g):
                return g, g

        check(Add, r(3, 4), r(4))

    def test_dtype_casts(self) -> None:
        """Casts to float64 and back, and a bool mask cast to float."""

        class Casts(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                pos = (x > 0).float()
                ctx.save_for_backward(pos)
                return (x.double() * 2).to(torch.float32) * pos

            @staticmethod
            def backward(ctx, g):
                (pos,) = ctx.saved_tensors
                return (g.to(torch.float64) * 2).float() * pos

        check(Casts, r(6))

    def test_functional_ops(self) -> None:
        """torch.nn.functional relu, softmax and linear in forward and backward."""

        class Net(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x, w):
                h = TF.relu(TF.linear(x, w))
                p = TF.softmax(h, dim=-1)
                ctx.save_for_backward(x, w, h, p)
                return p

            @staticmethod
            def backward(ctx, g):
                x, w, h, p = ctx.saved_tensors
                gh = p * (g - (g * p).sum(-1, keepdim=True))
                gh = gh * (h > 0).to(gh.dtype)
                return gh @ w, gh.t() @ x

        check(Net, r(2, 3), r(4, 3))

    def test_gelu_and_where(self) -> None:
        """F.gelu's derivative via torch.where and exp in backward."""

        class Gelu(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                ctx.save_for_backward(x)
                return TF.gelu(x)

            @staticmethod
            def backward(ctx, g):
                (x,) = ctx.saved_tensors
                cdf = 0.5 * (1 + torch.erf(x / 2 ** 0.5))
                pdf = torch.exp(-0.5 * x * x) / (2 * torch.pi) ** 0.5
                return torch.where(torch.isfinite(x), g * (cdf + x * pdf), torch.zeros_like(x))

        check(Gelu, r(5))

    def test_factory_calls(self) -> None:
        """torch.ones, zeros_like, full and arange inside forward and backward."""

        class Factories(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                ramp = torch.arange(x.shape[0], dtype=x.dtype)
                bias = torch.ones(x.shape[0]) + torch.zeros_like(x)
                return x * ramp + bias

            @staticmethod
            def backward(ctx, g):
                ramp = torch.arange(g.shape[0], dtype=g.dtype)
                return g * ramp + torch.full_like(g, 0.0)

        check(Factories, r(4))

    def test_cat_and_stack(self) -> None:
        """torch.cat in forward, split/unbind in backward."""

        class Cat(torch.autograd.Function):
            @staticmethod
            def forward(ctx, a, b):
                return torch.cat([a, b], dim=0), torch.stack([a, a])

            @staticmethod
            def backward(ctx, g, gs):
                ga, gb = g.split([2, 3], dim=0)
                s0, s1 = gs.unbind(0)
                return ga + s0 + s1, gb

        check(Cat, r(2, 3), r(3, 3))

    def test_inplace_on_intermediate(self) -> None:
        """In-place ops on values forward created are fine (only inputs need mark_dirty)."""

        class Inplace(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                y = x.clone()
                y.mul_(2).add_(1)
                return y

            @staticmethod
            def backward(ctx, g):
                out = g.clone()
                out.mul_(2)
                return out

        check(Inplace, r(3))

    def test_mark_dirty(self) -> None:
        """An input modified in place and marked dirty, as eager allows."""

        class AddOneInplace(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                x.add_(1)
                ctx.mark_dirty(x)
                return x

            @staticmethod
            def backward(ctx, g):
                return g

        x = torch.randn(3)
        cmp = check(AddOneInplace, x)
        assert cmp.capture.dirty_idx == (0,)
        torch.testing.assert_close(cmp.captured_args[0], x + 1)

    def test_setup_context_style(self) -> None:
        """A Function with a separate setup_context (forward without ctx)."""

        class Cube(torch.autograd.Function):
            @staticmethod
            def forward(x):
                return x ** 3

            @staticmethod
            def setup_context(ctx, inputs, output):
                (x,) = inputs
                ctx.save_for_backward(x)

            @staticmethod
            def backward(ctx, g):
                (x,) = ctx.saved_tensors
                return g * 3 * x * x

        check(Cube, r(4))

    def test_vjp_instead_of_backward(self) -> None:
        """A Function defining vjp rather than backward."""

        class Double(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x * 2

            @staticmethod
            def vjp(ctx, g):
                return g * 2

        check(Double, r(3))

    def test_detach_in_forward(self) -> None:
        """detach() inside forward is recorded like any op."""

        class Detach(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x.detach() * 2 + x

            @staticmethod
            def backward(ctx, g):
                return g * 3

        check(Detach, r(3))

    def test_grad_mode_off_in_bodies(self) -> None:
        """Forward and backward both run with grad mode off, as in eager."""

        class Check(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                assert not torch.is_grad_enabled()
                return x * 2

            @staticmethod
            def backward(ctx, g):
                assert not torch.is_grad_enabled()
                return g * 2

        check(Check, r(3))

    def test_materialize_grads_false(self) -> None:
        """set_materialize_grads(False) with every output used in the loss."""

        class NoMat(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                ctx.set_materialize_grads(False)
                return x * 2, x * 3

            @staticmethod
            def backward(ctx, g0, g1):
                return g0 * 2 + g1 * 3

        check(NoMat, r(3))

    def test_nested_function_apply(self) -> None:
        """Another Function's apply inside forward and backward runs its forward, as in eager."""

        class Inner(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x * 2

            @staticmethod
            def backward(ctx, g):
                return g * 2

        class Outer(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return Inner.apply(x) + 1

            @staticmethod
            def backward(ctx, g):
                return Inner.apply(g)

        check(Outer, r(3))

    def test_grad_mode_blocks_in_forward(self) -> None:
        """torch.enable_grad() and torch.no_grad() blocks inside forward."""

        class Blocks(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                with torch.enable_grad():
                    y = x * 2
                with torch.no_grad():
                    z = y.detach() + 1
                return z

            @staticmethod
            def backward(ctx, g):
                return g * 2

        check(Blocks, r(3))

    def test_einsum(self) -> None:
        """torch.einsum in both directions."""

        class Ein(torch.autograd.Function):
            @staticmethod
            def forward(ctx, a, b):
                ctx.save_for_backward(a, b)
                return torch.einsum("ij,jk->ik", a, b)

            @staticmethod
            def backward(ctx, g):
                a, b = ctx.saved_tensors
                return torch.einsum("ik,jk->ij", g, b), torch.einsum("ij,ik->jk", a, g)

        check(Ein, r(2, 3), r(3, 4))

    def test_conv1d_with_nn_grad(self) -> None:
        """F.conv1d forward, torch.nn.grad helpers in backward."""

        class Conv(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x, w):
                ctx.save_for_backward(x, w)
                return TF.conv1d(x, w)

            @staticmethod
            def backward(ctx, g):
                x, w = ctx.saved_tensors
                return (torch.nn.grad.conv1d_input(x.shape, w, g),
                        torch.nn.grad.conv1d_weight(x, w.shape, g))

        check(Conv, r(1, 2, 8), r(3, 2, 3))

    def test_layer_norm_by_hand(self) -> None:
        """A hand-written layer norm: mean, var, rsqrt saved and reused."""

        class LN(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                mu = x.mean(-1, keepdim=True)
                var = x.var(-1, unbiased=False, keepdim=True)
                rstd = torch.rsqrt(var + 1e-5)
                y = (x - mu) * rstd
                ctx.save_for_backward(y, rstd)
                return y

            @staticmethod
            def backward(ctx, g):
                y, rstd = ctx.saved_tensors
                return rstd * (g - g.mean(-1, keepdim=True) - y * (g * y).mean(-1, keepdim=True))

        check(LN, r(2, 5))

# ---------------------------------------------------------------------------------------------
# Capture.__call__: running one capture several times
# ---------------------------------------------------------------------------------------------

class TestCaptureCall:
    def test_rerun_with_new_values(self) -> None:
        """One capture runs on new values of the same shape and matches eager each time."""
        cap = minihop.capture(Mul, r(3), r(3))
        for _ in range(3):
            x, y = r(3), r(3)
            out = cap(x, y)
            out.sum().backward()
            torch.testing.assert_close(out, x.detach() * y.detach())
            torch.testing.assert_close(x.grad, y.detach())
            torch.testing.assert_close(y.grad, x.detach())

    def test_closure_sees_new_value(self) -> None:
        """A lifted global is fetched on each call, so later in-place updates are seen."""

        class Global(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x * _GLOBAL_W

            @staticmethod
            def backward(ctx, g):
                return g * _GLOBAL_W

        x = r(3)
        cap = minihop.capture(Global, x)
        old = _GLOBAL_W.clone()
        try:
            _GLOBAL_W.add_(1)
            torch.testing.assert_close(cap(x), Global.apply(x))
        finally:
            _GLOBAL_W.copy_(old)

    def test_saved_input_modified_in_place(self) -> None:
        """A saved tensor modified in place before backward is an error, as in eager."""
        for run in (Mul.apply, lambda a, b: minihop.capture(Mul, a, b)(a, b)):
            a = r(3)
            b = r(3) * 1
            out = run(a, b)
            b.add_(1)
            with pytest.raises(RuntimeError, match="modified by an inplace operation"):
                out.sum().backward()


# ---------------------------------------------------------------------------------------------
# minihop.apply: drop-in for F.apply, cached
# ---------------------------------------------------------------------------------------------

# The apply tests use their own classes (each class has its own cache), behaving exactly as
# the plain ones; the `traces` fixture logs each capture by the short name.


class CountedMul(Mul):
    pass


class CountedSin(Sin):
    pass


class CountedScale(Scale):
    pass


class CountedTwo(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.sin(), 3, x.cos()

    @staticmethod
    def backward(ctx, ga, _n, gb):
        (x,) = ctx.saved_tensors
        return ga * x.cos() - gb * x.sin()


_SHORT_NAMES = {"CountedMul": "Mul", "CountedSin": "Sin", "CountedScale": "Scale", "CountedTwo": "Two"}


@pytest.fixture
def traces(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Start from an empty apply cache; log the short name of each Function captured.

    (Counting forward runs from inside forward would be a Python side effect, which minihop
    refuses: it would run once per capture, not once per call.)
    """
    log: list[str] = []
    real = minihop.cache.capture

    def counting(fn_cls: type, *args: object, **kwargs: object) -> object:
        log.append(_SHORT_NAMES.get(fn_cls.__name__, fn_cls.__name__))
        return real(fn_cls, *args, **kwargs)

    monkeypatch.setattr(minihop.cache, "capture", counting)
    minihop.clear_cache()
    yield log
    minihop.clear_cache()


def _twin(x: torch.Tensor) -> torch.Tensor:
    return x.detach().clone().requires_grad_(x.requires_grad)


class TestApply:
    def test_matches_eager_and_caches(self, traces: list[str]) -> None:
        """apply gives eager's outputs and grads, and captures only once for the same key."""
        for _ in range(3):
            x, y = r(3), r(3)
            xe, ye = _twin(x), _twin(y)
            out = minihop.apply(CountedMul, x, y)
            ref = Mul.apply(xe, ye)
            torch.testing.assert_close(out, ref)
            out.sum().backward()
            ref.sum().backward()
            torch.testing.assert_close(x.grad, xe.grad)
            torch.testing.assert_close(y.grad, ye.grad)
        assert traces == ["Mul"]

    def test_new_shape_recaptures(self, traces: list[str]) -> None:
        """A new shape is a new capture; going back to the old one hits the cache."""
        minihop.apply(CountedSin, r(3))
        minihop.apply(CountedSin, r(4))
        minihop.apply(CountedSin, r(3))
        assert traces == ["Sin", "Sin"]

    def test_constant_value_is_part_of_key(self, traces: list[str]) -> None:
        """A different Python constant recaptures and gives that constant's result."""
        x = r(3)
        torch.testing.assert_close(minihop.apply(CountedScale, x, 2.0), x * 2.0)
        torch.testing.assert_close(minihop.apply(CountedScale, x, 5.0), x * 5.0)
        torch.testing.assert_close(minihop.apply(CountedScale, x, 2.0), x * 2.0)
        assert traces == ["Scale", "Scale"]

    def test_keyword_and_default(self, traces: list[str]) -> None:
        """apply binds keywords and defaults like F.apply; positional and keyword share a capture."""
        x = r(3)
        torch.testing.assert_close(minihop.apply(CountedScale, x), Scale.apply(x))
        torch.testing.assert_close(minihop.apply(CountedScale, x, scale=3.0), Scale.apply(x, scale=3.0))
        torch.testing.assert_close(minihop.apply(CountedScale, x, 3.0), Scale.apply(x, 3.0))
        assert traces == ["Scale", "Scale"]

    def test_tuple_output_and_grads(self, traces: list[str]) -> None:
        """apply returns the same structure as eager, with matching gradients."""
        for _ in range(2):
            x = r(4)
            xe = _twin(x)
            a, n, b = minihop.apply(CountedTwo, x)
            ae, ne, be = CountedTwo.apply(xe)
            assert n == ne == 3
            (a * 2 + b).sum().backward()
            (ae * 2 + be).sum().backward()
            torch.testing.assert_close(x.grad, xe.grad)
        assert traces == ["Two"]  # one capture for both calls

    def test_requires_grad_is_part_of_key(self, traces: list[str]) -> None:
        """Inputs not requiring grad give an output that does not; a separate capture."""
        out = minihop.apply(CountedSin, r(3, grad=False))
        assert not out.requires_grad
        out = minihop.apply(CountedSin, r(3))
        assert out.requires_grad
        assert traces == ["Sin", "Sin"]

    def test_function_stats(self) -> None:
        """minihop.function(F) counts one capture and then hits, through its public stats."""
        cf = minihop.function(Mul)
        for _ in range(3):
            x, y = r(3), r(3)
            torch.testing.assert_close(cf.apply(x, y), x * y)
        assert (cf.stats.captures, cf.stats.hits) == (1, 2)

    def test_global_rebound_between_calls(self, traces: list[str]) -> None:
        """A global rebound to a new tensor between calls is used, as F.apply would."""
        global _REBOUND_W

        class UseGlobal(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x * _REBOUND_W

            @staticmethod
            def backward(ctx, g):
                return g * _REBOUND_W

        x = r(3)
        old = _REBOUND_W
        try:
            torch.testing.assert_close(minihop.apply(UseGlobal, x), UseGlobal.apply(x))
            _REBOUND_W = torch.full((3,), 5.0)
            torch.testing.assert_close(minihop.apply(UseGlobal, x), UseGlobal.apply(x))
        finally:
            _REBOUND_W = old

    def test_closure_rebound_between_calls(self, traces: list[str]) -> None:
        """A closure cell rebound to a new tensor between calls is used, as F.apply would."""
        s = torch.ones(3)

        class UseCell(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x * s

            @staticmethod
            def backward(ctx, g):
                return g * s

        x = r(3)
        torch.testing.assert_close(minihop.apply(UseCell, x), UseCell.apply(x))
        s = torch.full((3,), 7.0)
        torch.testing.assert_close(minihop.apply(UseCell, x), UseCell.apply(x))

    def test_module_parameter_replaced(self, traces: list[str]) -> None:
        """A module argument whose parameter is replaced between calls uses the new one."""

        class Run(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x, mod):
                return mod(x)

            @staticmethod
            def backward(ctx, g):
                return None, None

        lin = torch.nn.Linear(3, 2)
        x = r(3)
        torch.testing.assert_close(minihop.apply(Run, x, lin), Run.apply(x, lin))
        lin.weight = torch.nn.Parameter(torch.zeros(2, 3))
        torch.testing.assert_close(minihop.apply(Run, x, lin), Run.apply(x, lin))

    def test_python_number_global_rebound(self, traces: list[str]) -> None:
        """A Python float global rebound between calls is used, as F.apply would."""
        global _REBOUND_K

        class UseK(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x * _REBOUND_K

            @staticmethod
            def backward(ctx, g):
                return g * _REBOUND_K

        x = r(3)
        old = _REBOUND_K
        try:
            torch.testing.assert_close(minihop.apply(UseK, x), UseK.apply(x))
            _REBOUND_K = 3.0
            torch.testing.assert_close(minihop.apply(UseK, x), UseK.apply(x))
        finally:
            _REBOUND_K = old

    def test_python_number_closure_rebound(self, traces: list[str]) -> None:
        """A Python float closure cell rebound between calls is used, as F.apply would."""
        k = 2.0

        class UseCell(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x * k

            @staticmethod
            def backward(ctx, g):
                return g * k

        x = r(3)
        torch.testing.assert_close(minihop.apply(UseCell, x), UseCell.apply(x))
        k = 3.0
        torch.testing.assert_close(minihop.apply(UseCell, x), UseCell.apply(x))

    def test_global_object_attribute_changed(self, traces: list[str]) -> None:
        """A setting read from a global object's attribute, changed between calls, is used."""

        class UseConfig(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x * _CONFIG.scale

            @staticmethod
            def backward(ctx, g):
                return g * _CONFIG.scale

        x = r(3)
        try:
            torch.testing.assert_close(minihop.apply(UseConfig, x), UseConfig.apply(x))
            _CONFIG.scale = 3.0
            torch.testing.assert_close(minihop.apply(UseConfig, x), UseConfig.apply(x))
        finally:
            _CONFIG.scale = 2.0
