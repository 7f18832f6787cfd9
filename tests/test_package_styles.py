"""Functions written the way public packages write them, run as their users run them.

Each case is our own code in the style of one package's Functions (read from timm 1.0,
snntorch 1.0, spikingjelly 2.0, torch-struct 0.5, pytorch-wavelets 1.3, entmax 1.3; none of
them is needed here): a Function made inside a factory that closes over a class, surrogate
gradients with a default argument kept on ctx, ``ctx.needs_input_grad`` branches, a
``torch.Size`` on ctx, a memory-efficient activation whose backward calls a module-level
helper, a classmethod forward with defaults, and a backward that recomputes under
``enable_grad``. Every case runs several calls (sizes and the state the package's users change
between calls change too) through eager ``F.apply``, ``minihop.function(F)``,
``minihop.apply`` and ``minihop.function(F, fallback="eager")``, and compares outputs, every
``.grad`` and the exception eager raises, if any.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.autograd import Function

import minihop
from minihop.errors import MinihopError


def _modes(fn_cls: type) -> dict[str, Callable[..., Any]]:
    return {
        "strict": minihop.function(fn_cls),
        "apply": lambda *a: minihop.apply(fn_cls, *a),
        "fallback": minihop.function(fn_cls, fallback="eager"),
    }


def _run(call: Callable[..., Any], make_args: Callable[[int], tuple[Any, ...]], steps: int,
         between: Callable[[int], None] = lambda i: None) -> list[Any]:
    """Per call: the output, then each tensor argument's grad (or the exception's type)."""
    results: list[Any] = []
    torch.manual_seed(0)
    for i in range(steps):
        between(i)
        args = make_args(i)
        phase = "forward"
        try:
            out = call(*args)
            outs = out if isinstance(out, tuple) else (out,)
            loss = sum((o * (k + 1.5)).sum() for k, o in enumerate(outs)
                       if isinstance(o, torch.Tensor) and o.requires_grad)
            phase = "backward"
            if isinstance(loss, torch.Tensor):
                loss.backward()
            results.append(([o.detach().clone() if isinstance(o, torch.Tensor) else o for o in outs],
                            [a.grad for a in args if isinstance(a, torch.Tensor)]))
        except MinihopError:
            raise
        except Exception as e:  # eager's own exception, where eager raises it, must be the capture's
            results.append((phase, type(e)))
    return results


def _same(a: Any, b: Any) -> None:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        assert isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor), (a, b)
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), (a, b)
        for x, y in zip(a, b, strict=True):
            _same(x, y)
    else:
        assert a == b, (a, b)


def _matches_eager(fn_cls: type, make_args: Callable[[int], tuple[Any, ...]], steps: int = 4,
                   between: Callable[[int], None] = lambda i: None,
                   reset: Callable[[], None] = lambda: None) -> None:
    reset()
    eager = _run(fn_cls.apply, make_args, steps, between)
    for mode, call in _modes(fn_cls).items():
        reset()
        got = _run(call, make_args, steps, between)
        try:
            _same(got, eager)
        except AssertionError as e:
            raise AssertionError(f"{mode} differs from eager: {e}") from None


def _x(*shape: int, grad: bool = True) -> torch.Tensor:
    return torch.randn(*shape).requires_grad_(grad)


# -- timm: memory-efficient activations, the math in module-level helpers ---------------------

def swish_fwd(x: torch.Tensor) -> torch.Tensor:
    return x.mul(torch.sigmoid(x))


def swish_bwd(x: torch.Tensor, grad_output: torch.Tensor) -> torch.Tensor:
    x_sigmoid = torch.sigmoid(x)
    return grad_output * (x_sigmoid * (1 + x * (1 - x_sigmoid)))


class SwishMemoryEfficient(Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return swish_fwd(x)

    @staticmethod
    def backward(ctx, grad_output):
        x = ctx.saved_tensors[0]
        return swish_bwd(x, grad_output)


class SwishModule(torch.nn.Module):
    """The nn.Module a model holds; its ``inplace`` flag is accepted and unused (as timm's)."""

    def __init__(self, inplace: bool = False) -> None:
        super().__init__()
        self.inplace = inplace

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return minihop.apply(SwishMemoryEfficient, x)


def test_memory_efficient_swish_at_changing_sizes() -> None:
    _matches_eager(SwishMemoryEfficient, lambda i: (_x(2 + i, 3),), steps=4)


def test_memory_efficient_swish_inside_a_module_trains_like_eager() -> None:
    torch.manual_seed(0)
    eager_net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Identity(), torch.nn.Linear(4, 1))
    ours = torch.nn.Sequential(torch.nn.Linear(4, 4), SwishModule(), torch.nn.Linear(4, 1))
    ours.load_state_dict(eager_net.state_dict())

    class EagerSwish(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return SwishMemoryEfficient.apply(x)

    eager_net[1] = EagerSwish()
    for net in (eager_net, ours):
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        torch.manual_seed(1)
        for step in range(3):
            opt.zero_grad()
            net(torch.randn(5 + step, 4)).pow(2).mean().backward()
            opt.step()
    for a, b in zip(eager_net.parameters(), ours.parameters(), strict=True):
        torch.testing.assert_close(a, b)


# -- snntorch / spikingjelly: surrogate gradients -------------------------------------------

class ATanSpike(Function):
    """A spike forward and an arctan surrogate backward; ``alpha`` defaults, kept on ctx."""

    @staticmethod
    def forward(ctx, input_, alpha=2.0):
        ctx.save_for_backward(input_)
        ctx.alpha = alpha
        return (input_ > 0).float()

    @staticmethod
    def backward(ctx, grad_output):
        (input_,) = ctx.saved_tensors
        grad = ctx.alpha / 2 / (1 + (torch.pi / 2 * ctx.alpha * input_).pow_(2)) * grad_output
        return grad, None


def atan(alpha: float = 2.0) -> Callable[[torch.Tensor], torch.Tensor]:
    """The package's factory: a closure over ``alpha`` that the neuron calls."""

    def inner(x: torch.Tensor) -> torch.Tensor:
        return minihop.apply(ATanSpike, x, alpha)

    return inner


def test_surrogate_with_default_and_given_alpha() -> None:
    _matches_eager(ATanSpike, lambda i: (_x(3, 4),), steps=2)
    _matches_eager(ATanSpike, lambda i: (_x(3, 4), [2.0, 3.0, 3.0, 0.5][i]), steps=4)


def test_surrogate_factories_keep_their_own_alpha() -> None:
    x = _x(6)
    soft, sharp = atan(1.0), atan(8.0)
    for spike, alpha in ((soft, 1.0), (sharp, 8.0), (soft, 1.0)):
        x.grad = None
        spike(x).sum().backward()
        mine = x.grad
        x.grad = None
        ATanSpike.apply(x, alpha).sum().backward()
        torch.testing.assert_close(mine, x.grad)


class SpikeHeaviside(Function):
    """spikingjelly's shape: save only when grad is needed; backward checks needs_input_grad."""

    @staticmethod
    def forward(ctx, x, alpha):
        if x.requires_grad:
            ctx.save_for_backward(x)
            ctx.alpha = alpha
        return (x >= 0).to(x)

    @staticmethod
    def backward(ctx, grad_output):
        grad_x = None
        if ctx.needs_input_grad[0]:
            sg = torch.sigmoid(ctx.saved_tensors[0] * ctx.alpha)
            grad_x = grad_output * (1.0 - sg) * sg * ctx.alpha
        return grad_x, None


def test_surrogate_saving_only_under_grad() -> None:
    _matches_eager(SpikeHeaviside, lambda i: (_x(4, grad=i % 2 == 0), 4.0), steps=4)


class Neuron:
    """A neuron object whose threshold and surrogate sharpness users tune between steps."""

    def __init__(self) -> None:
        self.threshold = 1.0
        self.alpha = 2.0


class LeakyFire(Function):
    @staticmethod
    def forward(ctx, mem, neuron):
        shifted = mem - neuron.threshold
        ctx.save_for_backward(shifted)
        ctx.neuron = neuron
        return (shifted > 0).float()

    @staticmethod
    def backward(ctx, grad_output):
        (shifted,) = ctx.saved_tensors
        a = ctx.neuron.alpha  # read when backward runs, as eager does
        return grad_output * a / (1 + (a * shifted) ** 2), None


def test_neuron_tuned_between_calls_and_before_backward() -> None:
    neuron = Neuron()
    changes = {1: ("threshold", 0.5), 2: ("alpha", 5.0), 3: ("threshold", 1.5)}

    def between(i: int) -> None:
        if i in changes:
            setattr(neuron, *changes[i])

    def reset() -> None:
        neuron.threshold, neuron.alpha = 1.0, 2.0

    _matches_eager(LeakyFire, lambda i: (_x(5), neuron), steps=4, between=between, reset=reset)


def test_neuron_sharpness_changed_between_forward_and_backward() -> None:
    def run(call: Callable[..., Any]) -> list[torch.Tensor]:
        neuron = Neuron()
        grads = []
        for alpha in (3.0, 7.0, 7.0):
            torch.manual_seed(0)
            mem = _x(5)
            spikes = call(mem, neuron)
            neuron.alpha = alpha  # eager's backward reads the new sharpness
            spikes.sum().backward()
            grads.append(mem.grad)
        return grads

    eager = run(LeakyFire.apply)
    for mode, call in _modes(LeakyFire).items():
        for a, b in zip(run(call), eager, strict=True):
            torch.testing.assert_close(a, b, msg=mode)


# -- pytorch-wavelets: a torch.Size and Python flags on ctx, needs_input_grad --------------

class SmoothMagnitude(Function):
    """Saves its local derivatives only when x needs grad; backward reads them only then
    (so ``dy`` is unbound when only y needs grad: eager raises, and so must a capture)."""

    @staticmethod
    def forward(ctx, x, y, b):
        r = torch.sqrt(x ** 2 + y ** 2 + b ** 2)
        if x.requires_grad:
            ctx.save_for_backward(x / r, y / r)
        return r - b

    @staticmethod
    def backward(ctx, dr):
        dx = None
        if ctx.needs_input_grad[0]:
            drdx, drdy = ctx.saved_tensors
            dx = drdx * dr
            dy = drdy * dr
        return dx, dy, None  # noqa: F821 - unbound on purpose, as in the package


def test_smooth_magnitude_both_need_grad() -> None:
    _matches_eager(SmoothMagnitude, lambda i: (_x(3 + i), _x(3 + i), 0.01), steps=3)


def test_smooth_magnitude_only_y_needs_grad_raises_as_eager() -> None:
    _matches_eager(SmoothMagnitude, lambda i: (_x(3, grad=False), _x(3), 0.01), steps=2)


class PoolMagnitude(Function):
    """The scattering layer's shape: ``ctx.in_shape`` (a torch.Size), a mode string and a
    flag on ctx, a zeros placeholder saved when x needs no grad."""

    @staticmethod
    def forward(ctx, x, mode, bias, combine):
        ctx.in_shape = x.shape
        ctx.mode = mode
        ctx.combine = combine
        low = F.avg_pool2d(x, 2)
        r = torch.sqrt(low ** 2 + bias ** 2)
        if combine:
            r = r.sum(1, keepdim=True)
        if x.requires_grad:
            ctx.save_for_backward(low / torch.sqrt(low ** 2 + bias ** 2))
        else:
            ctx.save_for_backward(x.new_zeros(1))
        return r - bias

    @staticmethod
    def backward(ctx, dr):
        (drdlow,) = ctx.saved_tensors
        if ctx.combine:
            dr = dr.expand(-1, drdlow.shape[1], -1, -1)
        dlow = drdlow * dr
        dx = F.interpolate(dlow, size=ctx.in_shape[-2:], mode="nearest") / 4
        if ctx.mode == "symmetric":
            dx = dx * 1.0
        return dx, None, None, None


@pytest.mark.parametrize("combine", [False, True])
def test_pooled_magnitude_keeps_shape_and_flags_on_ctx(combine: bool) -> None:
    _matches_eager(PoolMagnitude, lambda i: (_x(2, 3, 4 + 2 * i, 6), "symmetric", 0.01, combine), steps=4)


# -- entmax: a classmethod forward with defaults -------------------------------------------

class SparsemaxLike(Function):
    @classmethod
    def forward(cls, ctx, X, dim=-1, k=None):
        ctx.dim = dim
        max_val, _ = X.max(dim=dim, keepdim=True)
        X = X - max_val
        srt, _ = torch.sort(X, dim=dim, descending=True)
        cums = srt.cumsum(dim) - 1
        rho = torch.arange(1, X.shape[dim] + 1, dtype=X.dtype).view(
            [-1 if d == (dim % X.dim()) else 1 for d in range(X.dim())])
        support = rho * srt > cums
        supp_size = support.sum(dim=dim, keepdim=True)
        tau = cums.gather(dim, supp_size - 1) / supp_size.to(X.dtype)
        output = torch.clamp(X - tau, min=0)
        ctx.save_for_backward(supp_size, output)
        return output

    @classmethod
    def backward(cls, ctx, grad_output):
        supp_size, output = ctx.saved_tensors
        dim = ctx.dim
        grad_input = grad_output.clone()
        grad_input[output == 0] = 0
        v_hat = grad_input.sum(dim=dim) / supp_size.to(output.dtype).squeeze(dim)
        grad_input = torch.where(output != 0, grad_input - v_hat.unsqueeze(dim), grad_input)
        return grad_input, None, None


@pytest.mark.parametrize("dim", [-1, 0])
def test_sparsemax_classmethod_with_defaults(dim: int) -> None:
    _matches_eager(SparsemaxLike, lambda i: (_x(3, 4 + i), dim), steps=3)
    _matches_eager(SparsemaxLike, lambda i: (_x(3, 5),), steps=2)


# -- torch-struct: a Function made in a factory that closes over a semiring class -----------

class LogSemiring:
    zero = -1e5

    @staticmethod
    def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.logsumexp(a.unsqueeze(-1) + b.unsqueeze(-3), dim=-2)


class MaxSemiring(LogSemiring):
    @staticmethod
    def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return (a.unsqueeze(-1) + b.unsqueeze(-3)).amax(dim=-2)


def checkpoint_semiring(cls: type) -> type:
    """The package's factory: each semiring gets its own Function, which recomputes the
    product in backward instead of keeping it."""

    class Check(Function):
        @staticmethod
        def forward(ctx, a, b):
            ctx.save_for_backward(a, b)
            return cls.matmul(a, b)

        @staticmethod
        def backward(ctx, grad_output):
            a, b = ctx.saved_tensors
            with torch.enable_grad():
                q = cls.matmul(a, b)
                return torch.autograd.grad(q, (a, b), grad_output)

    return Check


@pytest.mark.parametrize("semiring", [LogSemiring, MaxSemiring])
def test_checkpointed_semiring_recomputes_in_backward(semiring: type) -> None:
    check = checkpoint_semiring(semiring)
    _matches_eager(check, lambda i: (_x(2, 3, 4 + i), _x(2, 4 + i, 3)), steps=3)


def test_semiring_class_swapped_in_the_factory_closure() -> None:
    """One factory Function whose closure cell is rebound to another semiring between calls."""
    current = LogSemiring

    class Check(Function):
        @staticmethod
        def forward(ctx, a, b):
            ctx.save_for_backward(a, b)
            return current.matmul(a, b)

        @staticmethod
        def backward(ctx, grad_output):
            a, b = ctx.saved_tensors
            with torch.enable_grad():
                q = current.matmul(a, b)
                return torch.autograd.grad(q, (a, b), grad_output)

    def between(i: int) -> None:
        nonlocal current
        current = MaxSemiring if i % 2 else LogSemiring

    _matches_eager(Check, lambda i: (_x(2, 3, 4), _x(2, 4, 3)), steps=4, between=between)


# -- spikingjelly 2.0: setup_context style, a module-level backward helper, a surrogate module
# whose parameters are read by name at run time -------------------------------------------

def piecewise_quadratic_backward(grad_output: torch.Tensor, x: torch.Tensor, alpha: float) -> tuple[Any, None]:
    x_abs = x.abs()
    mask = x_abs > (1 / alpha)
    grad_x = (grad_output * (-(alpha ** 2) * x_abs + alpha)).masked_fill_(mask, 0)
    return grad_x, None


class PiecewiseQuadraticSpike(Function):
    @staticmethod
    def forward(x, alpha):
        return (x >= 0).to(x)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, alpha = inputs
        ctx.save_for_backward(x)
        ctx.alpha = alpha

    @staticmethod
    def backward(ctx, grad_output):
        return piecewise_quadratic_backward(grad_output, ctx.saved_tensors[0], ctx.alpha)


class Surrogate(torch.nn.Module):
    """Its Function's parameters are attributes named in a tuple, read with getattr."""

    def __init__(self, call: Callable[..., Any], spiking: bool = True, **params: Any) -> None:
        super().__init__()
        self.call = call
        self.spiking = spiking
        self._names = tuple(params)
        for k, v in params.items():
            setattr(self, k, v)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        params = {k: getattr(self, k) for k in self._names}
        if self.spiking:
            return self.call(x, *params.values())
        return torch.sigmoid(x * params["alpha"])


def test_setup_context_surrogate_module_tuned_between_calls() -> None:
    def run(call: Callable[..., Any]) -> list[Any]:
        sg = Surrogate(call, alpha=1.0)
        torch.manual_seed(0)
        results = []
        for alpha, spiking in ((1.0, True), (4.0, True), (4.0, False), (0.5, True)):
            sg.alpha, sg.spiking = alpha, spiking
            x = (torch.randn(7) * 0.5).requires_grad_()
            out = sg(x)
            out.sum().backward()
            results.append((out.detach(), x.grad))
        return results

    eager = run(PiecewiseQuadraticSpike.apply)
    for mode, call in _modes(PiecewiseQuadraticSpike).items():
        for (o, g), (eo, eg) in zip(run(call), eager, strict=True):
            torch.testing.assert_close(o, eo, msg=mode)
            torch.testing.assert_close(g, eg, msg=mode)


def test_setup_context_surrogate_under_torch_func_at_two_sizes() -> None:
    for n in (5, 8, 6):
        x = torch.randn(n) * 0.5
        expected = None
        for mode, call in {"eager": PiecewiseQuadraticSpike.apply, **_modes(PiecewiseQuadraticSpike)}.items():
            got = (torch.func.grad(lambda r: call(r, 2.0).sum())(x),
                   torch.func.jacrev(lambda r: call(r, 3.0))(x))
            if expected is None:
                expected = got
            else:
                torch.testing.assert_close(got, expected, msg=mode)
