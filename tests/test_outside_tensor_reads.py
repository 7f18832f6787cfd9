"""What the code reads of a tensor it does not get as an argument (issue 28, round 7 from outside).

A tensor held in a global, a dict, a module passed in or a list passed in, read only for a
property (``T.shape[0]``, ``P.grad is None``, ``t.is_contiguous()``) and never used in an op, was
not a graph input: nothing guarded it, and a replacement between calls reused the capture. Its
autograd state (``.grad``, ``._version``) was read off the trace's fake copy, which has its
own. Each case below was a silent difference from eager before this round, strict and fallback:

- a global tensor's shape, dtype, ``requires_grad``, ``len``, ``numel``... read without an op: now
  a graph input of the capture, its properties guarded as any fetched tensor's;
- ``P.grad`` of a global parameter or of a module's parameter, ``T._version``: answered from the
  caller's tensor, and the capture single-use (no key holds them);
- ``stride()``/``is_contiguous()`` of a global tensor or of one in a list argument: single-use.

Each runs against eager in strict, apply and fallback mode (``eager_modes.matches_eager``).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import minihop
from eager_modes import matches_eager


def x_(i):
    return (torch.linspace(-1, 1, 4) + i).requires_grad_()


# (the expression forward multiplies by, and the tensor put in its place before the third call)
PROPERTIES = {
    "shape": ("t.shape[0]", lambda: torch.ones(6)),
    "dim": ("t.dim()", lambda: torch.ones(2, 2)),
    "numel": ("t.numel()", lambda: torch.ones(5)),
    "len": ("len(t)", lambda: torch.ones(7)),
    "dtype": ("2 if t.dtype == torch.float32 else 3", lambda: torch.ones(4, dtype=torch.float64)),
    "is_floating_point": ("2 if t.is_floating_point() else 3", lambda: torch.ones(4, dtype=torch.int64)),
    "requires_grad": ("2 if t.requires_grad else 3", lambda: torch.ones(4, requires_grad=True)),
    "element_size": ("t.element_size()", lambda: torch.ones(4, dtype=torch.float64)),
    "contiguity": ("2 if t.is_contiguous() else 3", lambda: torch.ones(8)[::2]),
    "stride": ("t.stride(0)", lambda: torch.ones(8)[::2]),
}


@pytest.mark.parametrize("prop", sorted(PROPERTIES))
def test_property_of_a_global_tensor_used_in_no_op(prop) -> None:
    """``t = TABLES["t"]; x * t.shape[0]``: the table replaced between calls."""
    expr, replacement = PROPERTIES[prop]
    tables = {"t": torch.ones(4)}
    namespace = {"torch": torch, "TABLES": tables}
    exec(f"""
class Scaled(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        t = TABLES["t"]
        return x * ({expr})

    @staticmethod
    def backward(ctx, g):
        return g
""", namespace)
    first = tables["t"]

    def between(i):
        if i == 2:
            tables["t"] = replacement()

    matches_eager(namespace["Scaled"], lambda i: (x_(i),), between=between,
                  reset=lambda: tables.__setitem__("t", first))


def first_step_of(weight) -> type:
    """A Function branching on ``weight.grad is None`` (the caller's ``zero_grad(set_to_none=True)``
    or a first backward), ``weight`` a parameter it does not get as an argument."""

    class FirstStep(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * (2 if weight.grad is None else 3)

        @staticmethod
        def backward(ctx, g):
            return g

    return FirstStep


def test_grad_of_a_global_parameter_decides_a_branch() -> None:
    weight = nn.Parameter(torch.ones(4))
    FirstStep = first_step_of(weight)

    def between(i):
        if i == 2:
            weight.grad = torch.ones(4)

    matches_eager(FirstStep, lambda i: (x_(i),), between=between, reset=lambda: setattr(weight, "grad", None))


def test_accumulated_grad_of_a_global_parameter() -> None:
    weight = nn.Parameter(torch.ones(4))

    class GradScaled(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * weight.grad.sum()

        @staticmethod
        def backward(ctx, g):
            return g

    def between(i):
        weight.grad.add_(1.0)

    matches_eager(GradScaled, lambda i: (x_(i),), between=between,
                  reset=lambda: setattr(weight, "grad", torch.ones(4)))


def test_grad_of_a_module_arguments_parameter() -> None:
    """``m.weight.grad is None`` of a module passed in: the module is keyed, its grads are not."""
    lin = nn.Linear(4, 4)

    class Accumulating(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, m):
            return x * (2 if m.weight.grad is None else 3)

        @staticmethod
        def backward(ctx, g):
            return g, None

    def between(i):
        if i == 2:
            lin.weight.grad = torch.ones(4, 4)

    matches_eager(Accumulating, lambda i: (x_(i), lin), between=between,
                  reset=lambda: setattr(lin.weight, "grad", None))


def test_layout_of_a_tensor_in_a_list_argument() -> None:
    """``ws[0].is_contiguous()``: a list argument is keyed by its tensors' properties, not strides."""

    class Packed(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, ws):
            return x * (2 if ws[0].is_contiguous() else 3)

        @staticmethod
        def backward(ctx, g):
            return g, None

    base = torch.ones(2, 2)
    matches_eager(Packed, lambda i: (x_(i), [base.t() if i >= 2 else base]))


def test_version_counter_of_a_global_tensor() -> None:
    """``T._version`` counts the caller's in-place writes (a version counter cannot be reset,
    so eager is called beside each call)."""
    counter = torch.zeros(4)

    class Versioned(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * counter._version

        @staticmethod
        def backward(ctx, g):
            return g

    for fn in (minihop.function(Versioned), minihop.function(Versioned, fallback="eager")):
        for _ in range(3):
            counter.add_(0.0)
            x = x_(0)
            assert torch.equal(fn(x), Versioned.apply(x))


def test_reading_the_grad_of_a_global_names_why_the_capture_is_single_use() -> None:
    text = str(minihop.explain(first_step_of(nn.Parameter(torch.ones(4))), x_(0)))
    assert "single-use" in text and "reads weight.grad of a tensor it does not get as an argument" in text


def test_shape_of_a_global_tensor_is_a_guard_not_single_use() -> None:
    """A property every fetched tensor's guard holds keeps the capture reusable."""
    table = torch.ones(4)

    class Scaled(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * table.shape[0]

        @staticmethod
        def backward(ctx, g):
            return g

    f = minihop.function(Scaled)
    for i in range(4):
        x = x_(i)
        assert torch.equal(f(x), Scaled.apply(x))
    assert (f.stats.captures, f.stats.hits) == (1, 3), f.stats
