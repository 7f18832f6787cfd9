"""Functions written the way public packages write theirs, with the state they read changed
between calls and before ``.backward()`` (issue 28: tried from outside): a mode table looked up
by name (pytorch-wavelets), a semiring class passed in whose class attribute changes
(torch-struct), a surrogate made by a factory closing over a config value (snntorch), a branch
on ``x.requires_grad`` (spikingjelly), a module flag read through a function (timm's
``is_exportable``), ids from a class counter, a stats dict shared through ctx, and sparsemax
with a ``dim`` argument (entmax). No package is imported: each Function is written here.

Each runs eagerly and in strict, apply and fallback mode (``eager_modes.matches_eager``):
equal records, or a coded refusal in strict and apply.
"""

from __future__ import annotations

import math

import torch

import eager_modes

x3 = lambda i: (torch.arange(1.0, 4.0).requires_grad_(),)  # noqa: E731


def test_wavelet_mode_table() -> None:
    MODES = {"zero": 0, "symmetric": 1}
    class Conv(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, mode):
            ctx.mode = MODES[mode]
            return x * (2 + ctx.mode)
        @staticmethod
        def backward(ctx, g):
            return g * (2 + ctx.mode), None
    eager_modes.matches_eager(Conv, lambda i: (torch.arange(1.0, 4.0).requires_grad_(), "symmetric"),
        between=lambda i: MODES.__setitem__("symmetric", i), mid=lambda i: MODES.__setitem__("symmetric", 10 + i),
        reset=lambda: MODES.__setitem__("symmetric", 1))

def test_semiring_class_arg() -> None:
    class LogSemiring:
        zero = -1e5
        @classmethod
        def plus(cls, a, b): return torch.logaddexp(a, b)
    class Max(LogSemiring):
        zero = -1e4
        @classmethod
        def plus(cls, a, b): return torch.maximum(a, b)
    class Chart(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, semiring):
            ctx.semiring = semiring
            return semiring.plus(x, torch.full_like(x, semiring.zero))
        @staticmethod
        def backward(ctx, g):
            return g * (1.0 if ctx.semiring.zero < -5e4 else 2.0), None
    def between(i):
        LogSemiring.zero = -1e5 if i % 2 == 0 else -1e3
    eager_modes.matches_eager(Chart, lambda i: (torch.arange(1.0, 4.0).requires_grad_(), Max if i == 3 else LogSemiring),
        between=between, mid=lambda i: setattr(LogSemiring, "zero", -1e6) if i == 1 else None, reset=lambda: setattr(LogSemiring, "zero", -1e5))

def test_snn_surrogate_factory() -> None:
    class ATan(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, alpha):
            ctx.save_for_backward(x)
            ctx.alpha = alpha
            return (x > 0).float()
        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return g * ctx.alpha / 2 / (1 + (math.pi / 2 * ctx.alpha * x) ** 2), None
    CONF = {"alpha": 2.0}
    def atan():
        alpha = CONF["alpha"]
        def inner(x):
            return ATan.apply(x, alpha)
        return inner
    class Wrap(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * 2
        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            with torch.enable_grad():
                xx = x.detach().requires_grad_()
                (d,) = torch.autograd.grad(SPIKE[0](xx).sum(), xx)
            return g * d
    SPIKE = [atan()]
    def between(i):
        CONF["alpha"] = 2.0 + i
        SPIKE[0] = atan()
    eager_modes.matches_eager(Wrap, lambda i: (torch.linspace(-1, 1, 3).requires_grad_(),), between=between,
                              reset=lambda: between(0))

def test_spikingjelly_requires_grad_branch() -> None:
    class Heaviside(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, alpha):
            if x.requires_grad:
                ctx.save_for_backward(x)
                ctx.alpha = alpha
            return (x >= 0).to(x)
        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            sg = torch.sigmoid(ctx.alpha * x)
            return g * ctx.alpha * sg * (1 - sg), None
    eager_modes.matches_eager(Heaviside, lambda i: (torch.linspace(-1, 1, 3 + i % 2).requires_grad_(), 4.0 - i))

def test_timm_exportable_flag() -> None:
    FLAGS = {"exportable": False}
    def is_exportable():
        return FLAGS["exportable"]
    class Swish(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * torch.sigmoid(x) if not is_exportable() else x * 0.5
        @staticmethod
        def backward(ctx, g):
            x = ctx.saved_tensors[0]
            s = torch.sigmoid(x)
            return g * (s * (1 + x * (1 - s))) if not is_exportable() else g * 0.5
    eager_modes.matches_eager(Swish, x3, between=lambda i: FLAGS.__setitem__("exportable", i == 2),
                              mid=lambda i: FLAGS.__setitem__("exportable", i == 1), reset=lambda: FLAGS.__setitem__("exportable", False))

def test_unique_ids() -> None:
    LOG = []
    class Tagged(torch.autograd.Function):
        _next = 0
        @staticmethod
        def forward(ctx, x):
            Tagged._next += 1
            ctx.id = Tagged._next
            return x * 2
        @staticmethod
        def backward(ctx, g):
            LOG.append(ctx.id)
            return g * 2
    eager_modes.matches_eager(Tagged, x3, state=lambda: (Tagged._next, list(LOG)),
                              reset=lambda: (LOG.clear(), setattr(Tagged, "_next", 0)))

def test_shared_stats_on_ctx() -> None:
    STATS = {"calls": 0}
    class Counted(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.stats = STATS
            return x * 2
        @staticmethod
        def backward(ctx, g):
            ctx.stats["calls"] += 1
            return g * ctx.stats["calls"]
    eager_modes.matches_eager(Counted, x3, state=lambda: dict(STATS), reset=lambda: STATS.__setitem__("calls", 0),
                              mid=lambda i: STATS.__setitem__("calls", 10) if i == 2 else None)

def test_entmax_dim_arg() -> None:
    class Sparsemax(torch.autograd.Function):
        @staticmethod
        def forward(ctx, X, dim=-1):
            ctx.dim = dim
            max_val, _ = X.max(dim=dim, keepdim=True)
            X = X - max_val
            Xs, _ = torch.sort(X, dim=dim, descending=True)
            rho = torch.arange(1, X.size(dim) + 1, device=X.device, dtype=X.dtype)
            view = [1] * X.dim(); view[0] = -1
            rho = rho.view(view).transpose(0, dim)
            cumsum = Xs.cumsum(dim) - 1
            support = rho * Xs > cumsum
            k = support.sum(dim=dim).unsqueeze(dim)
            tau = cumsum.gather(dim, k - 1) / k.to(X.dtype)
            out = torch.clamp(X - tau, min=0)
            ctx.save_for_backward(out)
            return out
        @staticmethod
        def backward(ctx, g):
            (out,) = ctx.saved_tensors
            dim = ctx.dim
            gi = g.clone()
            gi[out == 0] = 0
            v_hat = gi.sum(dim=dim) / (out != 0).to(g.dtype).sum(dim=dim)
            gi = torch.where(out != 0, gi - v_hat.unsqueeze(dim), gi)
            return gi, None
    eager_modes.matches_eager(Sparsemax, lambda i: (torch.tensor([[1.0, 2.0, 0.5 + i], [0.1, 0.2, 3.0]]).requires_grad_(), -1 if i % 2 else 1))
