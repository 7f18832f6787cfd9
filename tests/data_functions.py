"""Functions that take Python values out of tensor data, written as the packages that use them write them.

Place: a helper module beside the tests (not a test file), imported by
``tests/test_data_idioms.py`` and by ``bench/parity_data.py`` (which measures eager, Dynamo 2.13
and minihop on each and writes docs/parity.md's "Data-dependent values" parity rows). The Functions
live in a source file because Dynamo reads their source.

Each ``Idiom`` pairs a Function with the argument tuples it is called with, in order: chosen so
that every branch and every size case is taken, and so that the data changes between calls
(a value guard must fire; a stale capture would give a wrong answer). Every call is run
forward and backward.

Invariant: ``inputs()`` builds new tensors each time it is called (leaves requiring grad where
the Function differentiates them), so each runner gets its own copies.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.distributions import Bernoulli, Distribution

__all__ = ["IDIOMS", "LOSS_WEIGHTS", "Idiom", "Record", "idiom_named", "record", "same_record", "validating"]


# ---------------------------------------------------------------------------------------------
# Boolean masks and data-dependent sizes
# ---------------------------------------------------------------------------------------------

class SurrogateSpike(torch.autograd.Function):
    """snntorch / spikingjelly style surrogate gradient: the spike's sign flips the grad in place."""

    @staticmethod
    def forward(ctx: Any, mem: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(mem)
        return mem.sign()

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        (mem,) = ctx.saved_tensors
        grad = grad_output.clone()
        grad[mem >= 0] = -grad[mem >= 0]
        return grad


class MaskIndex(torch.autograd.Function):
    """``x[x > 0]`` in forward (an output whose size is the count of True entries)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return x[x > 0] * 2

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        out = torch.zeros_like(x)
        out[x > 0] = g * 2
        return out


class MaskedSelect(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        mask = x > 0
        ctx.save_for_backward(mask)
        return torch.masked_select(x, mask)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        (mask,) = ctx.saved_tensors
        return torch.zeros(mask.shape, dtype=g.dtype).masked_scatter(mask, g)


class NonzeroIndex(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        idx = torch.nonzero(x > 0).squeeze(1)
        ctx.save_for_backward(idx)
        ctx.n = x.shape[0]
        return x[idx]

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        (idx,) = ctx.saved_tensors
        return torch.zeros(ctx.n, dtype=g.dtype).index_add(0, idx, g)


class SplitSizes(torch.autograd.Function):
    """``split(sizes.tolist())`` in backward, the sizes a tensor argument."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, sizes: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(sizes)
        return x * 3

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        (sizes,) = ctx.saved_tensors
        parts = g.split(sizes.tolist())
        return torch.cat([p * (i + 1) for i, p in enumerate(parts)]), None


# ---------------------------------------------------------------------------------------------
# .item() values and constants made from Python values
# ---------------------------------------------------------------------------------------------

class ScaleByMax(torch.autograd.Function):
    """``x.abs().max().item()`` as a divisor, kept on ctx for backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        scale = x.abs().max().item()
        ctx.scale = scale
        return x / scale

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g / ctx.scale


class ScaleByMaxInBackward(torch.autograd.Function):
    """The same divisor read in backward, from a saved input."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return x * 2

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return g * 2 / x.abs().max().item()


class SavedDim(torch.autograd.Function):
    """torch-struct style: ``torch.tensor(dim)`` saved for backward, ``dim.item()`` there."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, dim: int) -> torch.Tensor:
        ctx.save_for_backward(torch.tensor(dim))
        return x.cumsum(dim)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        (dim,) = ctx.saved_tensors
        return g.flip(dim.item()).cumsum(dim.item()).flip(dim.item()), None


class BernoulliEntropy(torch.autograd.Function):
    """``torch.distributions.Bernoulli(probs=p)`` in forward: its argument check reads ``valid.all()``."""

    @staticmethod
    def forward(ctx: Any, p: torch.Tensor) -> torch.Tensor:
        d = Bernoulli(probs=p)
        ctx.save_for_backward(p)
        return d.entropy()

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        (p,) = ctx.saved_tensors
        return g * (torch.log1p(-p) - torch.log(p))


# ---------------------------------------------------------------------------------------------
# Python branches and loop counts on tensor values
# ---------------------------------------------------------------------------------------------

class SameOrNot(torch.autograd.Function):
    """torch-struct / entmax style: a special case when both inputs are equal (``torch.equal``)."""

    @staticmethod
    def forward(ctx: Any, x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
        if torch.equal(x1, x2):
            return x1 * 2
        return x1 + x2

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return g * 2, g


class BranchOnSum(torch.autograd.Function):
    """``if x.sum() > 0:`` in forward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:
            return x * 2
        return x * 3

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g * 2


class BranchOnSumInBackward(torch.autograd.Function):
    """``if x.sum() > 0:`` in backward, on a saved input."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return x * 2

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        if x.sum() > 0:
            return g * 2
        return g * -2


class BranchOnGrad(torch.autograd.Function):
    """``if (g > 0).all():`` in backward, on the incoming grad."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        if (g > 0).all():
            return g * 2
        return g * 3


class DimArgument(torch.autograd.Function):
    """A 0-d tensor argument compared with an int (``if dim == -1``) and used as one."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, dim: torch.Tensor) -> torch.Tensor:
        if dim == -1:
            return x.softmax(-1)
        return x.softmax(int(dim))

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        return g, None


class LoopCount(torch.autograd.Function):
    """A loop count read from a tensor argument in forward (``range(int(n))``)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
        for _ in range(int(n)):
            x = x * 2
        return x

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        return g, None


class LoopCountInBackward(torch.autograd.Function):
    """The loop count saved for backward and read there."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(n)
        return x * 1

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        (n,) = ctx.saved_tensors
        for _ in range(int(n)):
            g = g * 2
        return g, None


# ---------------------------------------------------------------------------------------------
# The idioms and their inputs
# ---------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Idiom:
    """A docs/parity.md row: the Function, what it shows, and the calls that take every branch."""

    name: str
    description: str
    function: type
    inputs: Callable[[], list[tuple[Any, ...]]]


def _leaf(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32, requires_grad=True)


def _signs() -> list[tuple[Any, ...]]:
    # Mixed signs with different counts of positive entries (1, 3, 0, 4 of 4), and a zero.
    return [(_leaf(1.0, -2.0, -3.0, -0.5),), (_leaf(2.0, 0.5, -1.0, 3.0),),
            (_leaf(-1.0, -2.0, -3.0, -4.0),), (_leaf(0.0, 1.0, 2.0, 3.0),)]


def _sums() -> list[tuple[Any, ...]]:
    # The sum's sign alternates; the third call returns to the first branch with other data.
    return [(_leaf(1.0, 2.0, -0.5),), (_leaf(-3.0, 1.0, -0.5),), (_leaf(4.0, -1.0, 0.25),),
            (_leaf(-1.0, -1.0, -1.0),)]


def _maxima() -> list[tuple[Any, ...]]:
    # Two calls with the same max |x| (the same value), then others.
    return [(_leaf(1.0, -4.0),), (_leaf(2.0, 4.0),), (_leaf(1.0, 2.5),), (_leaf(-8.0, 0.5),)]


def _same_or_not() -> list[tuple[Any, ...]]:
    return [(_leaf(1.0, 2.0), _leaf(1.0, 2.0)), (_leaf(1.0, 2.0), _leaf(1.0, 3.0)),
            (_leaf(5.0, -1.0), _leaf(5.0, -1.0))]


def _probabilities() -> list[tuple[Any, ...]]:
    return [(_leaf(0.2, 0.5, 0.9),), (_leaf(0.7, 0.1, 0.3),)]


def _split_sizes() -> list[tuple[Any, ...]]:
    return [(_leaf(*range(6)), torch.tensor(s)) for s in ([1, 5], [2, 4], [3, 3], [1, 5])]


def _saved_dims() -> list[tuple[Any, ...]]:
    x = [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]
    return [(torch.tensor(x, requires_grad=True), d) for d in (0, 1, 0)]


def _dim_tensors() -> list[tuple[Any, ...]]:
    x = [[1.0, 2.0, 3.0], [0.5, -1.0, 2.0]]
    return [(torch.tensor(x, requires_grad=True), torch.tensor(d)) for d in (-1, 0, 1, -1)]


def _loop_counts() -> list[tuple[Any, ...]]:
    return [(_leaf(1.0, -2.0, 0.5), torch.tensor(n)) for n in (1, 3, 0, 1)]


def _grads_signs() -> list[tuple[Any, ...]]:
    # BranchOnGrad's grad is d(loss)/d(out), the call's weight in LOSS_WEIGHTS (``record``):
    # its sign decides the branch, the inputs themselves are alike.
    return [(_leaf(1.0, 2.0),), (_leaf(3.0, -1.0),), (_leaf(0.5, 0.5),)]


IDIOMS: tuple[Idiom, ...] = (
    Idiom("surrogate gradient `grad[x >= 0] = -grad[x >= 0]` (snntorch, spikingjelly)",
          "boolean-mask read-modify-write in backward", SurrogateSpike, _signs),
    Idiom("`x[x > 0]` in forward", "boolean-mask indexing: output size is the count of True",
          MaskIndex, _signs),
    Idiom("`torch.masked_select(x, x > 0)`", "data-dependent output size", MaskedSelect, _signs),
    Idiom("`torch.nonzero(x > 0)` + index", "data-dependent size, indices saved", NonzeroIndex, _signs),
    Idiom("`g.split(sizes.tolist())` in backward", "`.tolist()` as split sizes", SplitSizes, _split_sizes),
    Idiom("`x.abs().max().item()` divisor in forward", "`.item()` as a scale", ScaleByMax, _maxima),
    Idiom("`x.abs().max().item()` divisor in backward", "`.item()` in backward on a saved input",
          ScaleByMaxInBackward, _maxima),
    Idiom("`torch.tensor(dim)` saved, `dim.item()` in backward (torch-struct)",
          "a constant made from Python values", SavedDim, _saved_dims),
    Idiom("`Bernoulli(probs=p)` in forward", "`torch.distributions` validation reads `valid.all()`",
          BernoulliEntropy, _probabilities),
    Idiom("`if torch.equal(x1, x2):` (torch-struct, entmax)", "a special case on equal inputs",
          SameOrNot, _same_or_not),
    Idiom("`if x.sum() > 0:` in forward", "a branch on input values", BranchOnSum, _sums),
    Idiom("`if x.sum() > 0:` in backward", "a branch on a saved input in backward",
          BranchOnSumInBackward, _sums),
    Idiom("`if (g > 0).all():` in backward", "a branch on the incoming grad", BranchOnGrad, _grads_signs),
    Idiom("`if dim == -1:` on a 0-d tensor argument", "a 0-d tensor compared with an int",
          DimArgument, _dim_tensors),
    Idiom("`for _ in range(int(n)):` in forward", "a loop count from a tensor", LoopCount, _loop_counts),
    Idiom("`for _ in range(int(n)):` in backward", "a loop count saved for backward",
          LoopCountInBackward, _loop_counts),
)

# The weight of call i's loss (``(out * weight).sum()``): signs alternate so that a branch on
# the incoming grad takes both ways, and grads differ from call to call.
LOSS_WEIGHTS = (1.5, -0.5, 2.0, -1.0)


Record = list[tuple[torch.Tensor, tuple[torch.Tensor | None, ...]]]


@contextlib.contextmanager
def validating() -> Iterator[None]:
    """``torch.distributions`` validating arguments, as by default in a fresh process.

    The first ``torch.compile`` of a process turns validation off process-wide (Dynamo's
    patching calls ``Distribution.set_default_validate_args(False)``), which would make what is
    measured depend on whether anything compiled before.
    """
    before = Distribution._validate_args
    Distribution.set_default_validate_args(True)
    try:
        yield
    finally:
        Distribution.set_default_validate_args(before)


def record(idiom: Idiom, call: Callable[..., Any]) -> Record:
    """Each of the idiom's calls through ``call``, forward and backward: (output, every arg's .grad)."""
    out: Record = []
    with validating():
        for i, args in enumerate(idiom.inputs()):
            y = call(*args)
            (y * LOSS_WEIGHTS[i % len(LOSS_WEIGHTS)]).sum().backward()
            out.append((y.detach().clone(), tuple(a.grad.clone() if isinstance(a, torch.Tensor) and a.grad is not None
                                                  else None for a in args)))
    return out


def same_record(a: Record, b: Record) -> str | None:
    """None when the records are equal exactly (values, dtypes, shapes); else the first difference."""
    for i, ((ya, ga), (yb, gb)) in enumerate(zip(a, b, strict=True)):
        try:
            torch.testing.assert_close(yb, ya, rtol=0, atol=0, equal_nan=True)
        except AssertionError as error:
            return f"call {i + 1}, output: {str(error).splitlines()[0]}"
        for j, (x, y) in enumerate(zip(ga, gb, strict=True)):
            if (x is None) != (y is None):
                return f"call {i + 1}, grad of args[{j}]: {x} vs {y}"
            if x is not None:
                try:
                    torch.testing.assert_close(y, x, rtol=0, atol=0, equal_nan=True)
                except AssertionError as error:
                    return f"call {i + 1}, grad of args[{j}]: {str(error).splitlines()[0]}"
    return None


def idiom_named(function_name: str) -> Idiom:
    return next(i for i in IDIOMS if i.function.__name__ == function_name)
