"""``fallback="eager"`` backward after a captured forward, with features crossed.

Each case builds a Function from three choices and runs one script eagerly and through
``minihop.function(F, fallback="eager")``, comparing every output, every ``.grad`` and what
backward recorded:

- what forward leaves on ctx (a saved input, a saved intermediate, a tensor attribute, a list
  of tensors, the caller's object, a size, a ``torch.Size``);
- what it returns (one tensor, a tuple with an int, two tensors);
- what makes the captured backward unable to stand for eager's in the last call (a flag read
  by backward flipped before ``.backward()`` with a Python int from a dynamic size, an expanded
  grad, the caller setting ``y.grad_fn.scale``), with and without ``create_graph=True``.

Strict mode is run too: it must equal eager or raise a ``MinihopError``. Then each of
autograd's ctx features (``mark_dirty``, ``mark_non_differentiable``, a nested output, a
``once_differentiable`` backward, an inner Function, a saved output) on the eager path.
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.autograd.function import once_differentiable

import minihop
from minihop.errors import MinihopError
from tests.eager_modes import normalized, same_normalized

FLAGS = {"audit": False}
SEEN: list[Any] = []


class Holder:
    def __init__(self, t: torch.Tensor) -> None:
        self.t = t


# What forward keeps, and how backward gets a tensor "k" and a number "n" from it.
KEEPS: dict[str, tuple[Callable[..., tuple[torch.Tensor, Any]], Callable[..., tuple[torch.Tensor, Any]]]] = {
    "saved input": (lambda ctx, x, h: (ctx.save_for_backward(x), None)[1],
                    lambda ctx: (ctx.saved_tensors[0], 1)),
    "saved intermediate": (lambda ctx, x, h: (ctx.save_for_backward(x.cos()), None)[1],
                           lambda ctx: (ctx.saved_tensors[0], 1)),
    "tensor attribute": (lambda ctx, x, h: setattr(ctx, "k", x * 3),
                         lambda ctx: (ctx.k, 1)),
    "list of tensors": (lambda ctx, x, h: setattr(ctx, "ks", [x.sin(), x * 2]),
                        lambda ctx: (ctx.ks[0] + ctx.ks[1], len(ctx.ks))),
    "caller's object": (lambda ctx, x, h: setattr(ctx, "h", h),
                        lambda ctx: (ctx.h.t, 1)),
    "size": (lambda ctx, x, h: (setattr(ctx, "n", x.shape[0]), ctx.save_for_backward(x))[0],
             lambda ctx: (ctx.saved_tensors[0], ctx.n)),
    "torch.Size": (lambda ctx, x, h: (setattr(ctx, "shape", x.shape), setattr(ctx, "k", x + 1))[0],
                   lambda ctx: (ctx.k, ctx.shape[0])),
}

RETURNS = {
    "tensor": lambda x: x * 2,
    "tuple with int": lambda x: (x * 2, 5),
    "two tensors": lambda x: (x * 2, x.sin()),
}


def make_function(keep: str, returns: str) -> type:
    put, get = KEEPS[keep]
    make = RETURNS[returns]

    def forward(ctx: Any, x: torch.Tensor, h: Holder) -> Any:
        put(ctx, x, h)
        ctx.scale = 2.0
        return make(x)

    def backward(ctx: Any, g: torch.Tensor, *rest: Any) -> tuple[torch.Tensor, None]:
        k, n = get(ctx)
        if FLAGS["audit"]:
            SEEN.append((int(g.shape[0]), int(n)))
        if not g.is_contiguous():
            k = k * 1.5
        grad = g * k * ctx.scale * n
        if rest and isinstance(rest[0], torch.Tensor):
            grad = grad + rest[0] * x_cos(k)
        return grad, None

    return type(f"F_{keep}_{returns}".replace(" ", "_").replace("'", "").replace(".", "_"),
                (torch.autograd.Function,), {"forward": staticmethod(forward), "backward": staticmethod(backward)})


def x_cos(k: torch.Tensor) -> torch.Tensor:
    return k.cos()


def _script(trigger: str, create_graph: bool) -> Callable[[Callable[..., Any]], list[Any]]:
    def script(call: Callable[..., Any]) -> list[Any]:
        out: list[Any] = []
        for i in range(4):
            x = torch.randn(3 + i % 2, requires_grad=True)
            h = Holder(torch.full((3 + i % 2,), float(i + 1)))
            y = call(x, h)
            first = y[0] if isinstance(y, tuple) else y
            last = i == 3
            if last and trigger == "flag and size":
                FLAGS["audit"] = True
            if last and trigger == "caller sets grad_fn":
                first.grad_fn.scale = 5.0
            loss = first.sum() if last and trigger == "expanded grad" else (first * 1.5).sum()
            if isinstance(y, tuple) and isinstance(y[1], torch.Tensor):
                loss = loss + (y[1] * 0.5).sum()
            (gx,) = torch.autograd.grad(loss, x, create_graph=create_graph)
            FLAGS["audit"] = False
            out += [y, gx]
            if create_graph and gx.requires_grad:
                out.append(torch.autograd.grad(gx.sum(), x)[0])
        return out + [list(SEEN)]

    return script


def _records(call: Callable[..., Any], script: Callable[[Callable[..., Any]], list[Any]]) -> Any:
    minihop.reset()
    SEEN.clear()
    FLAGS["audit"] = False
    torch.manual_seed(0)
    return normalized(script(call))


CASES = list(itertools.product(KEEPS, RETURNS, ("flag and size", "expanded grad", "caller sets grad_fn")))


@pytest.mark.parametrize("create_graph", [False, True], ids=["grad", "create_graph"])
@pytest.mark.parametrize("keep,returns,trigger", CASES, ids=["-".join(c) for c in CASES])
def test_fallback_equals_eager(keep: str, returns: str, trigger: str, create_graph: bool) -> None:
    fn_cls = make_function(keep, returns)
    script = _script(trigger, create_graph)
    eager = _records(fn_cls.apply, script)
    fallback = _records(minihop.function(fn_cls, fallback="eager"), script)
    assert same_normalized(fallback, eager), f"fallback differs from eager:\n{fallback}\n{eager}"
    try:
        strict = _records(minihop.function(fn_cls), script)
    except MinihopError:
        return
    assert same_normalized(strict, eager), f"strict differs from eager:\n{strict}\n{eager}"


# --- ctx features on the eager path ------------------------------------------------------------
# Each backward, when the caller turns auditing on before the last call's ``.backward()``,
# records a Python int from its grad's (dynamic) size: strict refuses that call (MH104), and
# fallback runs the user's backward eagerly for it, with the ctx feature as eager has it.

def _audit(g: torch.Tensor) -> None:
    if FLAGS["audit"]:
        SEEN.append(int(g.shape[0]))


class Inner(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return x.exp()

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return g * x.exp()


class MarksDirty(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        x.mul_(2)
        ctx.mark_dirty(x)
        ctx.save_for_backward(x)
        return x

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        _audit(g)
        (x,) = ctx.saved_tensors
        return g * 2 + x * 0


class MarksNonDifferentiable(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        idx = x.argmax().reshape(1)
        ctx.mark_non_differentiable(idx)
        return x * 3, idx

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor, gi: Any) -> torch.Tensor:
        _audit(g)
        return g * 3


class ReturnsNested(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        ctx.k = x.cos()
        return x * 2, {"aux": x.sin()}

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor, gd: Any) -> torch.Tensor:
        _audit(g)
        return g * 2 + ctx.k


class OnceDifferentiable(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return x ** 2

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        _audit(g)
        (x,) = ctx.saved_tensors
        return g * 2 * x


class CallsInner(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        y = Inner.apply(x)
        ctx.save_for_backward(y)
        return y * 2

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        _audit(g)
        (y,) = ctx.saved_tensors
        return g * 2 * y


class SavesOutput(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        y = x.tanh()
        ctx.save_for_backward(y)
        ctx.out = y
        return y

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        _audit(g)
        (y,) = ctx.saved_tensors
        return g * (1 - ctx.out ** 2) + y * 0


def _feature_script(dirty: bool) -> Callable[[Callable[..., Any]], list[Any]]:
    def script(call: Callable[..., Any]) -> list[Any]:
        out: list[Any] = []
        for i in range(4):
            x0 = torch.randn(3 + i % 2, requires_grad=True)
            y = call(x0.clone() if dirty else x0)
            first = y[0] if isinstance(y, tuple) else y
            FLAGS["audit"] = i == 3
            (first * 1.5).sum().backward()
            FLAGS["audit"] = False
            out += [[v for v in (y if isinstance(y, tuple) else (y,)) if isinstance(v, torch.Tensor)], x0.grad]
        return out + [list(SEEN)]
    return script


@pytest.mark.parametrize("fn_cls", [MarksDirty, MarksNonDifferentiable, ReturnsNested, OnceDifferentiable,
                                    CallsInner, SavesOutput], ids=lambda f: f.__name__)
def test_ctx_features_on_the_eager_path(fn_cls: type) -> None:
    script = _feature_script(fn_cls is MarksDirty)
    eager = _records(fn_cls.apply, script)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fallback = _records(minihop.function(fn_cls, fallback="eager"), script)
    assert same_normalized(fallback, eager), f"fallback differs from eager:\n{fallback}\n{eager}"
    assert any(".backward eagerly" in str(w.message) for w in caught)
    with pytest.raises(MinihopError):
        _records(minihop.function(fn_cls), script)
