"""``python -m minihop demo``: capture four instructive Functions and check them against eager.

Not part of the pipeline; a consumer of the public API (``minihop.capture``) and of
``minihop.testing.assert_matches_eager``. Each example is a small ``autograd.Function`` chosen
to show one part of the graph contract (see docs/graph_contract.md):

  MySin              saves its input: the input is both a fwd input and a saved value.
  ExpTimesAndSquare  two outputs (two grads into bwd) and saves an input, an output and an
                     intermediate, which bwd takes in the order backward first reads them.
  ScaleShift         takes an object holding tensors (lifted inputs, never a gradient) and a
                     tensor it never uses (still a fwd input, so bwd's outputs line up).
  WithArgmax         returns its input unchanged (``view_as``, as eager does) and a
                     ``mark_non_differentiable`` index tensor (its grad input is ``unused_0``).

For each one it prints the capture (``str(cap)``: the outer graph, ``fwd_body_0`` and
``bwd_body_0``) and one line saying whether the outputs and every input's gradient match eager
PyTorch, with the capture time: first and warm (a second capture of the same Function, after
torch's own one-off start-up costs are paid). Exit status 0 when every example matches, 1 when
any does not.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import time
from collections.abc import Callable
from typing import Any

import torch

from .pipeline import capture
from .errors import MinihopError
from .structure import format_path, iter_leaves
from .testing import assert_matches_eager

__all__ = ["EXAMPLES", "Example", "add_arguments", "run", "run_example"]


# -- the examples ---------------------------------------------------------------------------


class MySin(torch.autograd.Function):
    """sin(x), saving x for the backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return x.sin()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return grad * x.cos()


class ExpTimesAndSquare(torch.autograd.Function):
    """(x * exp(x), x * x), saving the input x, the output y and the intermediate e."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        e = x.exp()
        y = e * x
        z = x * x
        ctx.save_for_backward(x, y, e)
        return y, z

    @staticmethod
    def backward(ctx: Any, grad_y: torch.Tensor, grad_z: torch.Tensor) -> torch.Tensor:
        x, y, e = ctx.saved_tensors
        # d(x e^x)/dx = x e^x + e^x = y + e;  d(x^2)/dx = 2x
        return grad_y * (y + e) + grad_z * 2 * x


class Affine:
    """A plain object holding tensors: eager's Function never sees them as inputs."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor) -> None:
        self.weight = weight
        self.bias = bias


class ScaleShift(torch.autograd.Function):
    """x * params.weight + params.bias; ``unused`` is a tensor argument forward ignores."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, params: Affine, unused: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(params.weight)
        return x * params.weight + params.bias

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        (weight,) = ctx.saved_tensors
        return grad * weight, None, None


class WithArgmax(torch.autograd.Function):
    """Returns x unchanged and its argmax, which is marked non-differentiable."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        idx = x.argmax(dim=-1)
        ctx.mark_non_differentiable(idx)
        return x, idx

    @staticmethod
    def backward(ctx: Any, grad_x: torch.Tensor, grad_idx: torch.Tensor) -> torch.Tensor:
        return grad_x


@dataclasses.dataclass(frozen=True)
class Example:
    """One demo case: a Function, how to make its arguments, and what its graphs show."""

    function: type[torch.autograd.Function]
    make_args: Callable[[torch.Generator], tuple[Any, ...]]
    shows: str


def _randn(gen: torch.Generator, *shape: int, requires_grad: bool = True) -> torch.Tensor:
    return torch.randn(*shape, generator=gen).requires_grad_(requires_grad)


EXAMPLES: tuple[Example, ...] = (
    Example(MySin, lambda g: (_randn(g, 4),),
            "the input x is a fwd input and a saved value; bwd returns one grad per fwd input"),
    Example(ExpTimesAndSquare, lambda g: (_randn(g, 4),),
            "two outputs -> two grads into bwd; saved = output y, intermediate e, input x, "
            "in the order backward first reads them"),
    Example(ScaleShift,
            lambda g: (_randn(g, 2, 3), Affine(_randn(g, 3), _randn(g, 3, requires_grad=False)),
                       _randn(g, 2)),
            "params.weight and params.bias are lifted (bwd gives them None); the unused "
            "tensor is still the last fwd input, with a None grad"),
    Example(WithArgmax, lambda g: (_randn(g, 2, 3),),
            "an output that is an input comes back as view_as; the non-differentiable idx "
            "has non_differentiable_idx = [1] and its grad is the placeholder unused_0"),
)


# -- running them ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ExampleResult:
    """What running one example found: ``ok``, and the line that says so."""

    ok: bool
    line: str


def _describe_grads(args: tuple[Any, ...], argnames: tuple[str, ...]) -> str:
    """``x, params.weight: None, ...``: every tensor input, and which get no gradient."""
    parts = []
    for i, arg in enumerate(args):
        for path, leaf in iter_leaves(arg, (("arg", i),)):
            if issubclass(type(leaf), torch.Tensor):
                name = format_path(path, argnames)
                parts.append(name if leaf.grad is not None else f"{name}: None")
    return ", ".join(parts)


def run_example(example: Example, *, show_graphs: bool = True,
                print_fn: Callable[[str], None] = print) -> ExampleResult:
    """Capture ``example`` twice (first, warm), print its graphs, compare it with eager."""
    name = example.function.__name__
    args = example.make_args(torch.Generator().manual_seed(0))
    try:
        start = time.perf_counter()
        capture(example.function, *args)
        first_ms = (time.perf_counter() - start) * 1000
        # Collect now, so a pending collection of torch's start-up garbage (a few hundred ms)
        # does not land inside the warm measurement; timeit goes further and disables gc.
        gc.collect()
        start = time.perf_counter()
        cap = capture(example.function, *args)
        warm_ms = (time.perf_counter() - start) * 1000
    except MinihopError as e:
        return ExampleResult(False, f"ERROR     {name}: minihop could not capture it:\n{e}")
    if show_graphs:
        print_fn(f"=== {name}: {example.shows}")
        print_fn(str(cap))
    timing = f"capture {first_ms:.1f} ms first, {warm_ms:.1f} ms warm"
    try:
        result = assert_matches_eager(example.function, *args)
    except AssertionError as e:
        return ExampleResult(False, f"MISMATCH  {name}: differs from eager ({timing})\n  {e}")
    except MinihopError as e:
        return ExampleResult(False, f"ERROR     {name}: ({timing})\n{e}")
    grads = _describe_grads(result.captured_args, cap.argnames)
    return ExampleResult(True, f"ok        {name}: outputs and grads ({grads}) match eager; {timing}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``demo`` subcommand's options."""
    parser.add_argument("--no-graphs", dest="show_graphs", action="store_false",
                        help="print only the one-line result per example, not the graphs")


def run(options: argparse.Namespace) -> int:
    """Run every example; 0 if all match eager, 1 otherwise."""
    results = []
    for example in EXAMPLES:
        results.append(run_example(example, show_graphs=options.show_graphs))
    print("=== results")
    for r in results:
        print(r.line)
    failed = sum(not r.ok for r in results)
    print(f"{len(results) - failed} of {len(results)} examples match eager")
    return 1 if failed else 0
