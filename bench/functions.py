"""The benchmark Functions, the cases (Function x size) and the step every variant runs.

Place: bench/, a consumer of minihop's public API; this module imports only torch so a fresh
process (the cold-capture measurement) can import it without paying for anything else.

Each Function has a hand-written backward, as a user would write it:

  MySin      one op; saves its input; backward grad * cos(x).
  Add        the seed's two-output Function: a = sin(x), b = cos(y); saves a, x and the
             result a * b; returns (result, a + b).
  MLP        x @ W1 -> relu -> @ W2; saves x, W1, the relu output and W2.
  LayerNorm  normalise the last dimension, scale and shift; saves xhat, rstd and weight.
  chain(n)   generated: forward chains n elementwise ops, backward the matching n (scaling).
  ScaledSin  MySin times a global read in forward and backward (per call only:
             the guard on a Python value).
  SignedSin  MySin whose backward branches on its saved input's sum (per call only: the
             value guard run before each backward).
  SavesUnused  SiLU, x * sigmoid(x); saves x and the sigmoid, but its backward recomputes the
             sigmoid from x and never reads the saved one (saved bytes only: SAVED_EXTRA_CASES).

Every variant of a case runs the same step (``fwd_bwd``): the forward, ``loss.backward()``
where ``loss`` is the sum of ``.sum()`` of each output that requires grad, then the grads of
the leaf arguments cleared, so that only the call itself differs between variants.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["CASES", "GUARDED_CASES", "SAVED_EXTRA_CASES", "Add", "Case", "LayerNorm", "MLP", "MySin",
           "RecordingBackend", "SavesUnused", "ScaledSin", "SignedSin", "Warmup", "case_named", "compiled",
           "fresh_caller", "fwd_bwd", "grad_leaves", "loss_of", "make_chain", "ops_only"]


class MySin(torch.autograd.Function):
    """sin(x), saving x."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return x.sin()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return grad * x.cos()


SIN_SCALE = 2.0


class ScaledSin(torch.autograd.Function):
    """sin(x) * SIN_SCALE: forward and backward read a global (a Python value minihop guards
    on every call, and again when backward runs). A global, not a class attribute: Dynamo
    graph-breaks on a Function reading its own class's attribute, and the table compares."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return x.sin() * SIN_SCALE

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return grad * x.cos() * SIN_SCALE


class SignedSin(MySin):
    """MySin whose backward branches on its saved input's value (``if x.sum() > 0``): minihop
    recomputes that value before each backward to pick the bwd traced for it."""

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        if x.sum() > 0:
            return grad * x.cos()
        return -grad * x.cos()


class Add(torch.autograd.Function):
    """The seed's ``Add``: saves an intermediate, an input and an output."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a = torch.sin(x)
        b = torch.cos(y)
        result = a * b
        ctx.save_for_backward(a, x, result)
        return result, a + b

    @staticmethod
    def backward(ctx: Any, grad_a: torch.Tensor, grad_b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a, x, result = ctx.saved_tensors
        return a * grad_b * 2 + x, result + grad_a * 3


class MLP(torch.autograd.Function):
    """relu(x @ w1) @ w2 with its backward written out (the relu output doubles as the mask)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
        r = (x @ w1).relu()
        ctx.save_for_backward(x, w1, r, w2)
        return r @ w2

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x, w1, r, w2 = ctx.saved_tensors
        grad_w2 = r.t() @ grad
        grad_h = (grad @ w2.t()) * (r > 0)
        return grad_h @ w1.t(), x.t() @ grad_h, grad_w2


class LayerNorm(torch.autograd.Function):
    """Layer norm over the last dimension with a hand-written backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                eps: float) -> torch.Tensor:
        mean = x.mean(-1, keepdim=True)
        centered = x - mean
        var = (centered * centered).mean(-1, keepdim=True)
        rstd = torch.rsqrt(var + eps)
        xhat = centered * rstd
        ctx.save_for_backward(xhat, rstd, weight)
        return xhat * weight + bias

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, None]:
        xhat, rstd, weight = ctx.saved_tensors
        dxhat = grad * weight
        grad_x = rstd * (dxhat - dxhat.mean(-1, keepdim=True)
                         - xhat * (dxhat * xhat).mean(-1, keepdim=True))
        grad_w = (grad * xhat).flatten(0, -2).sum(0)
        grad_b = grad.flatten(0, -2).sum(0)
        return grad_x, grad_w, grad_b, None


class SavesUnused(torch.autograd.Function):
    """SiLU whose forward still saves the sigmoid "for later" although its backward was changed
    to recompute it from x (a leftover of the kind that costs memory unnoticed): backward reads
    only the saved x."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        s = x.sigmoid()
        ctx.save_for_backward(x, s)
        return x * s

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        x, _ = ctx.saved_tensors
        s = x.sigmoid()
        return grad * s * (1 + x * (1 - s))


class Warmup(torch.autograd.Function):
    """Captured (and compiled) first, so that the warm measurements pay no one-off start-up."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return x.cos()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return -grad * x.sin()


def make_chain(n: int, directory: str | None = None) -> type[torch.autograd.Function]:
    """A Function whose forward is n elementwise ops in a row (alternately ``* c`` and
    ``neg``), written out line by line, and whose backward is the matching n ops reversed.
    With ``directory``, its source is a file there (as a user's code is: tracebacks and
    graphs then point at its lines); otherwise it has none."""
    fwd = ["    @staticmethod", "    def forward(ctx, x):", "        y = x"]
    bwd = ["    @staticmethod", "    def backward(ctx, g):"]
    for i in range(n):
        fwd.append("        y = y * 1.0001" if i % 2 == 0 else "        y = y.neg()")
    for i in reversed(range(n)):
        bwd.append("        g = g * 1.0001" if i % 2 == 0 else "        g = g.neg()")
    fwd.append("        return y")
    bwd.append("        return g")
    name = f"Chain{n}"
    source = "\n".join([f"class {name}(torch.autograd.Function):", *fwd, *bwd]) + "\n"
    namespace: dict[str, Any] = {"torch": torch}
    filename = f"<bench chain {n}>"
    if directory is not None:
        filename = os.path.join(directory, f"chain_{n}.py")
        with open(filename, "w") as f:
            f.write(source)
    exec(compile(source, filename, "exec"), namespace)
    cls: type[torch.autograd.Function] = namespace[name]
    return cls


@dataclasses.dataclass(frozen=True)
class Case:
    """One Function at one size: ``make_args`` builds fresh leaf tensors (seeded)."""

    name: str
    function: type[torch.autograd.Function]
    small: bool
    make_args: Callable[[], tuple[Any, ...]]


def _leaf(gen: torch.Generator, *shape: int, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(*shape, generator=gen) * scale).requires_grad_()


def _args(build: Callable[[torch.Generator], tuple[Any, ...]]) -> Callable[[], tuple[Any, ...]]:
    return lambda: build(torch.Generator().manual_seed(0))


def _cases() -> tuple[Case, ...]:
    cases = []
    for small, (n, d, h) in ((True, (8, 8, 8)), (False, (256, 1024, 1024))):
        shape = f"{n}x{d}"
        cases += [
            Case(f"MySin {shape}", MySin, small, _args(lambda g, n=n, d=d: (_leaf(g, n, d),))),
            Case(f"Add {shape}", Add, small,
                 _args(lambda g, n=n, d=d: (_leaf(g, n, d), _leaf(g, n, d)))),
            Case(f"MLP {shape}" + ("" if small else f" (hidden {h})"), MLP, small,
                 _args(lambda g, n=n, d=d, h=h: (_leaf(g, n, d), _leaf(g, d, h, scale=d ** -0.5),
                                                 _leaf(g, h, d, scale=h ** -0.5)))),
            Case(f"LayerNorm {shape}", LayerNorm, small,
                 _args(lambda g, n=n, d=d: (_leaf(g, n, d), _leaf(g, d), _leaf(g, d), 1e-5))),
        ]
    return tuple(cases)


CASES: tuple[Case, ...] = _cases()

# Measured in (c) saved bytes only (and its targets), so that the other tables keep their rows.
SAVED_EXTRA_CASES: tuple[Case, ...] = tuple(
    Case(f"SavesUnused {n}x{d}", SavesUnused, small, _args(lambda g, n=n, d=d: (_leaf(g, n, d),)))
    for small, (n, d) in ((True, (8, 8)), (False, (256, 1024))))


# Measured per call only: the cost of guarding a Python value the Function reads, and of a
# value guard before backward.
GUARDED_CASES: tuple[Case, ...] = (
    Case("ScaledSin 8x8 (reads a global)", ScaledSin, True,
         _args(lambda g: (_leaf(g, 8, 8),))),
    Case("SignedSin 8x8 (backward branches on a saved value)", SignedSin, True,
         _args(lambda g: (_leaf(g, 8, 8),))),)


def case_named(name: str) -> Case:
    for case in CASES:
        if case.name == name:
            return case
    raise KeyError(f"no benchmark case {name!r}; cases: {', '.join(c.name for c in CASES)}")


def grad_leaves(args: tuple[Any, ...]) -> tuple[torch.Tensor, ...]:
    """The tensor arguments whose ``.grad`` a step fills (and then clears)."""
    return tuple(a for a in args if isinstance(a, torch.Tensor) and a.requires_grad)


def loss_of(out: Any) -> torch.Tensor:
    """Sum of ``.sum()`` over the tensor outputs that require grad."""
    outs = out if isinstance(out, (tuple, list)) else (out,)
    parts = [o.sum() for o in outs if isinstance(o, torch.Tensor) and o.requires_grad]
    loss = parts[0]
    for p in parts[1:]:
        loss = loss + p
    return loss


def fwd_bwd(call: Callable[[], Any], args: tuple[Any, ...],
            sync: Callable[[], None] | None = None) -> Callable[[], None]:
    """One training-style step through ``call``: forward, backward, clear grads (then
    ``sync()``: on a GPU, so that a step's time includes its kernels)."""
    leaves = grad_leaves(args)

    def step() -> None:
        loss_of(call()).backward()
        for t in leaves:
            t.grad = None
        if sync is not None:
            sync()

    return step


def fresh_caller(fn_cls: type, tag: str) -> Callable[..., Any]:
    """``lambda *a: fn_cls.apply(*a)`` with a code object of its own, so that each compiled
    caller has its own Dynamo cache (no recompile limits, no sharing between backends)."""
    namespace: dict[str, Any] = {"F": fn_cls}
    source = "def call(*args):\n    return F.apply(*args)\n"
    exec(compile(source, f"<bench caller {fn_cls.__qualname__} {tag}>", "exec"), namespace)
    caller: Callable[..., Any] = namespace["call"]
    return caller


class RecordingBackend:
    """A Dynamo backend that records the graph and runs it as is (``backend="eager"``'s work)."""

    def __init__(self) -> None:
        self.graphs = 0

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Any) -> Callable[..., Any]:
        self.graphs += 1
        return gm.forward


def compiled(fn_cls: type, backend: Any, tag: str) -> Callable[..., Any]:
    """``torch.compile`` of a fresh caller, ``fullgraph=True``."""
    return torch.compile(fresh_caller(fn_cls, tag), fullgraph=True, backend=backend)


class _PlainCtx:
    """Just enough of a ctx to run a Function's forward and backward by hand."""

    def __init__(self, num_inputs: int) -> None:
        self.saved_tensors: tuple[Any, ...] = ()
        self.needs_input_grad = (True,) * num_inputs

    def save_for_backward(self, *tensors: Any) -> None:
        self.saved_tensors = tensors

    def mark_non_differentiable(self, *args: Any) -> None:
        pass

    def mark_dirty(self, *args: Any) -> None:
        pass

    def set_materialize_grads(self, value: bool) -> None:
        pass


def ops_only(fn_cls: Any, args: tuple[Any, ...]) -> Callable[[], None]:
    """The floor: the user's forward then backward called directly under ``no_grad`` (the same
    tensor ops, no autograd graph, no Function machinery)."""
    plain = tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in args)
    with torch.no_grad():
        out = fn_cls.forward(_PlainCtx(len(args)), *plain)
        outs = out if isinstance(out, tuple) else (out,)
        grads = tuple(torch.ones_like(o) for o in outs)

    def step() -> None:
        with torch.no_grad():
            ctx = _PlainCtx(len(plain))
            fn_cls.forward(ctx, *plain)
            fn_cls.backward(ctx, *grads)

    return step
