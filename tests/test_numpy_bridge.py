"""NumPy round trips on tensor data (``x.detach().numpy()`` -> NumPy -> ``torch.from_numpy``),
traced as torch ops through ``torch._numpy`` (as Dynamo's numpy support does), against eager:
outputs and every ``.grad`` over calls whose data changes (so a value baked in at capture would
show), strict and ``fallback="eager"``. A NumPy function ``torch._numpy`` lacks is refused
(MH103) naming the call."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from torch.autograd import Function

import minihop


class NumpySurrogate(Function):
    """A spiking library's surrogate written in NumPy: forward and backward leave torch."""

    @staticmethod
    def forward(ctx, x):
        a = x.detach().numpy()
        ctx.save_for_backward(x)
        return torch.from_numpy(np.tanh(a) * 2 + np.exp(-np.abs(a)))

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        a = x.detach().numpy()
        t = np.tanh(a)
        d = (1 - t ** 2) * 2 - np.sign(a) * np.exp(-np.abs(a))
        return g * torch.from_numpy(d)


class NumpyClipNorm(Function):
    """Clip by a NumPy norm, with np.where, np.clip and a reduction."""

    @staticmethod
    def forward(ctx, x, limit):
        a = x.detach().numpy()
        n = np.linalg.norm(a, axis=-1, keepdims=True)
        scale = np.where(n > limit, limit / np.maximum(n, 1e-12), np.ones_like(n))
        ctx.save_for_backward(torch.from_numpy(scale))
        return torch.from_numpy(np.clip(a * scale, -10.0, 10.0))

    @staticmethod
    def backward(ctx, g):
        (scale,) = ctx.saved_tensors
        return g * scale, None


class NumpyUnwrap(Function):
    @staticmethod
    def forward(ctx, x):
        return torch.from_numpy(np.unwrap(x.detach().numpy()))

    @staticmethod
    def backward(ctx, g):
        return g


def _calls(run: Any, datas: list[torch.Tensor], *extra: Any) -> list[Any]:
    seen = []
    for data in datas:
        x = data.clone().requires_grad_()
        out = run(x, *extra)
        (out * torch.linspace(-1, 1, out.numel()).reshape(out.shape)).sum().backward()
        seen.append((out.detach(), x.grad))
    return seen


@pytest.mark.parametrize("fallback", [None, "eager"], ids=["strict", "fallback"])
@pytest.mark.parametrize("fn_cls,shape,extra", [(NumpySurrogate, (5,), ()), (NumpyClipNorm, (3, 4), (1.5,))],
                         ids=["surrogate", "clip_norm"])
def test_matches_eager(fn_cls: type, shape: tuple[int, ...], extra: tuple[Any, ...], fallback: str | None) -> None:
    torch.manual_seed(0)
    datas = [torch.randn(*shape) * (k + 1) for k in range(3)]
    expected = _calls(fn_cls.apply, datas, *extra)
    cf = minihop.function(fn_cls) if fallback is None else minihop.function(fn_cls, fallback=fallback)
    found = _calls(cf, datas, *extra)
    torch.testing.assert_close(found, expected, rtol=1e-5, atol=1e-6)
    assert cf.stats.captures == 1 and cf.stats.eager_calls == 0, cf.stats


def test_the_graph_holds_torch_ops() -> None:
    """The NumPy calls are torch ops in the fwd graph (not a constant from the traced data)."""
    cap = minihop.capture(NumpySurrogate, torch.randn(5, requires_grad=True))
    targets = {getattr(n.target, "__name__", str(n.target)) for n in cap.fwd.graph.nodes}
    assert {"tanh", "exp"} <= targets, targets


def test_missing_numpy_function_is_refused_by_name() -> None:
    with pytest.raises(minihop.DataDependentError, match=r"\[MH103\] The traced code calls numpy\.unwrap"):
        minihop.capture(NumpyUnwrap, torch.randn(4, requires_grad=True))
    cf = minihop.function(NumpyUnwrap, fallback="eager")
    x = torch.randn(4, requires_grad=True)
    with pytest.warns(UserWarning, match="MH103"):
        torch.testing.assert_close(cf(x), NumpyUnwrap.apply(x))


def test_numpy_of_a_tensor_requiring_grad_as_eager() -> None:
    """x.numpy() on an input requiring grad: allowed in forward (grad mode is off), eager's
    RuntimeError under enable_grad."""

    class Direct(Function):
        @staticmethod
        def forward(ctx, x):
            return torch.from_numpy(np.tanh(x.numpy()))

        @staticmethod
        def backward(ctx, g):
            return g

    class UnderGrad(Function):
        @staticmethod
        def forward(ctx, x):
            with torch.enable_grad():
                return torch.from_numpy(np.tanh(x.numpy()))

        @staticmethod
        def backward(ctx, g):
            return g

    x = torch.randn(3, requires_grad=True)
    torch.testing.assert_close(minihop.apply(Direct, x), Direct.apply(x))
    for run in (UnderGrad.apply, lambda a: minihop.apply(UnderGrad, a)):
        with pytest.raises(RuntimeError, match=r"Can't call numpy\(\) on Tensor that requires grad"):
            run(x)
