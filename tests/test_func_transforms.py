"""torch.func transforms over captured Functions behave as over the eager Function (issue #8, item 4).

Eager's rules in torch 2.13, each checked against eager inside the test that relies on it:

- a Function in the ``setup_context`` style (``forward`` without ``ctx``) works under
  ``torch.func.grad``, ``vjp`` and ``jacrev``;
- ``torch.func.vmap`` needs ``generate_vmap_rule = True`` or a ``vmap`` staticmethod; without
  either it raises ``RuntimeError`` ("... does not have vmap support ...");
- an old-style Function (``forward(ctx, ...)``) raises ``RuntimeError`` under every transform
  ("... it must override the setup_context staticmethod ...").

Every case runs the same computation three ways: over eager ``F.apply``, over
``minihop.apply(F, ...)`` inside the transformed function, and over a ``Capture`` made beforehand
(``cap = minihop.capture(F, ...)``). Values and gradients are compared with eager's; the
``minihop.apply`` runs also check ``minihop.counters()`` so that a test cannot pass by minihop
quietly running ``F.apply``.

A ``Capture`` is specialised on ``requires_grad``; inside ``torch.func.grad``/``vjp``/``jacrev`` the
differentiated tensors are wrapped tensors whose ``requires_grad`` is True (inside ``vmap`` alone
it is False, and the shape is the per-sample one). The Captures below are made for exactly those
properties; ``test_capture_made_without_grad_called_under_grad`` records what happens otherwise.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.autograd import Function

import minihop
from shared_functions import MySin

SETUP_CONTEXT_MESSAGE = "must override the setup_context staticmethod"
NO_VMAP_MESSAGE = "does not have vmap support"


# ---------------------------------------------------------------------------------------------
# Functions
# ---------------------------------------------------------------------------------------------

class Sin(Function):
    """One op; saves its input."""

    @staticmethod
    def forward(x):
        return x.sin()

    @staticmethod
    def setup_context(ctx, inputs, output):
        (x,) = inputs
        ctx.save_for_backward(x)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * x.cos()


class TwoOutputs(Function):
    """Two inputs, two outputs; saves both inputs."""

    @staticmethod
    def forward(x, y):
        return x.sin() * y, x.cos() + y

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, y = inputs
        ctx.save_for_backward(x, y)

    @staticmethod
    def backward(ctx, ga, gb):
        x, y = ctx.saved_tensors
        return ga * x.cos() * y - gb * x.sin(), ga * x.sin() + gb


class ScalePow(Function):
    """Non-tensor arguments (a float and an int), kept on ctx; saves its input and its output."""

    @staticmethod
    def forward(x, scale, power):
        return scale * x ** power

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, scale, power = inputs
        ctx.scale = scale
        ctx.power = power
        ctx.save_for_backward(x, output)

    @staticmethod
    def backward(ctx, grad):
        x, out = ctx.saved_tensors
        return grad * out * ctx.power / x, None, None


class SinV(Sin):
    generate_vmap_rule = True


class TwoOutputsV(TwoOutputs):
    generate_vmap_rule = True


class ScalePowV(ScalePow):
    generate_vmap_rule = True


VMAP_RULE_CALLS: list[tuple[int, tuple[Any, ...]]] = []


class SinCustomVmap(Sin):
    """A hand-written vmap rule: move the batch dimension to the front, apply on the batch."""

    @staticmethod
    def vmap(info, in_dims, x):
        VMAP_RULE_CALLS.append((info.batch_size, tuple(in_dims)))
        (x_bdim,) = in_dims
        return SinCustomVmap.apply(x.movedim(x_bdim, 0)), 0


# Old style (forward takes ctx): eager refuses it under every torch.func transform.
OldSin = MySin


# ---------------------------------------------------------------------------------------------
# Cases and helpers
# ---------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Case:
    fn: type
    make_args: Callable[[], tuple[Any, ...]]   # full arguments (tensors do not require grad)
    argnums: tuple[int, ...]                   # the tensor arguments to differentiate/batch

    @property
    def id(self) -> str:
        return self.fn.__name__


def _t(*shape: int, seed: int, positive: bool = False) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    t = torch.randn(*shape, generator=gen, dtype=torch.float32)
    return t.abs() + 0.5 if positive else t


def _args_sin() -> tuple[Any, ...]:
    return (_t(3, 4, seed=0),)


def _args_two() -> tuple[Any, ...]:
    return (_t(3, 4, seed=1), _t(3, 4, seed=2))


def _args_scale_pow() -> tuple[Any, ...]:
    return (_t(3, 4, seed=3, positive=True), 1.5, 3)


CASES = [Case(Sin, _args_sin, (0,)), Case(TwoOutputs, _args_two, (0, 1)),
         Case(ScalePow, _args_scale_pow, (0,))]
VMAP_CASES = [Case(SinV, _args_sin, (0,)), Case(TwoOutputsV, _args_two, (0, 1)),
              Case(ScalePowV, _args_scale_pow, (0,)), Case(SinCustomVmap, _args_sin, (0,))]


def _weights(i: int, shape: torch.Size) -> torch.Tensor:
    n = 1
    for s in shape:
        n *= s
    return torch.linspace(0.5, 1.5, n).reshape(shape) * (i + 1)


def scalar(out: Any) -> torch.Tensor:
    """A scalar of every output, each weighted differently (so each output's grad matters)."""
    outs = out if isinstance(out, tuple) else (out,)
    total = (outs[0] * _weights(0, outs[0].shape)).sum()
    for i, o in enumerate(outs[1:], start=1):
        total = total + (o * _weights(i, o.shape)).sum()
    return total


def merge(args: tuple[Any, ...], argnums: tuple[int, ...], tensors: tuple[Any, ...]) -> tuple[Any, ...]:
    full = list(args)
    for i, t in zip(argnums, tensors, strict=True):
        full[i] = t
    return tuple(full)


Runner = Callable[..., Any]


def eager_runner(case: Case, _args: tuple[Any, ...], _transformed: tuple[int, ...]) -> Runner:
    return case.fn.apply


def apply_runner(case: Case, _args: tuple[Any, ...], _transformed: tuple[int, ...]) -> Runner:
    return lambda *a: minihop.apply(case.fn, *a)


def capture_runner(case: Case, args: tuple[Any, ...], transformed: tuple[int, ...],
                   per_sample: bool = False) -> Runner:
    """A Capture made for what the transformed function will see: the transformed tensors
    require grad (grad/vjp/jacrev) or have the per-sample shape (vmap)."""
    example = []
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor):
            a = a.detach().clone()
            if i in transformed:
                a = a[0].clone() if per_sample else a.requires_grad_(True)
        example.append(a)
    return minihop.capture(case.fn, *example)


RUNNERS = {"minihop.apply": apply_runner, "Capture": capture_runner}


class Through:
    """Counts minihop.apply's captures and cache hits during a block; no eager fallbacks."""

    def __init__(self, runner_name: str) -> None:
        self.runner_name = runner_name

    def __enter__(self) -> Through:
        self.before = minihop.counters()
        return self

    def __exit__(self, *exc: Any) -> None:
        if exc[0] is not None or self.runner_name != "minihop.apply":
            return
        after = minihop.counters()
        used = (after["captures"] - self.before["captures"]) + (after["cache_hits"] - self.before["cache_hits"])
        assert used >= 1, f"minihop.apply neither captured nor hit its cache: {self.before} -> {after}"
        assert after["fallbacks"] == self.before["fallbacks"], \
            f"minihop.apply ran F.apply eagerly: {self.before} -> {after}"


def assert_same(mine: Any, eager: Any) -> None:
    torch.testing.assert_close(mine, eager)


@pytest.fixture(autouse=True)
def fresh_cache() -> Any:
    minihop.clear_cache()
    VMAP_RULE_CALLS.clear()
    yield
    minihop.clear_cache()


# ---------------------------------------------------------------------------------------------
# torch.func.grad / vjp / jacrev on setup_context-style Functions
# ---------------------------------------------------------------------------------------------

def do_grad(run: Runner, case: Case, args: tuple[Any, ...]) -> Any:
    def f(*tensors: Any) -> torch.Tensor:
        return scalar(run(*merge(args, case.argnums, tensors)))

    tensors = tuple(args[i] for i in case.argnums)
    return torch.func.grad(f, argnums=tuple(range(len(tensors))))(*tensors)


def do_grad_and_value(run: Runner, case: Case, args: tuple[Any, ...]) -> Any:
    def f(*tensors: Any) -> tuple[torch.Tensor, Any]:
        out = run(*merge(args, case.argnums, tensors))
        return scalar(out), out

    tensors = tuple(args[i] for i in case.argnums)
    return torch.func.grad_and_value(f, argnums=tuple(range(len(tensors))), has_aux=True)(*tensors)


def do_vjp(run: Runner, case: Case, args: tuple[Any, ...]) -> Any:
    tensors = tuple(args[i] for i in case.argnums)
    out, pullback = torch.func.vjp(lambda *t: run(*merge(args, case.argnums, t)), *tensors)
    outs = out if isinstance(out, tuple) else (out,)
    cotangents = tuple(_weights(i, o.shape) for i, o in enumerate(outs))
    grads = pullback(cotangents if isinstance(out, tuple) else cotangents[0])
    return out, grads


def do_jacrev(run: Runner, case: Case, args: tuple[Any, ...]) -> Any:
    tensors = tuple(args[i] for i in case.argnums)
    return torch.func.jacrev(lambda *t: run(*merge(args, case.argnums, t)),
                             argnums=tuple(range(len(tensors))))(*tensors)


TRANSFORMS = {"grad": do_grad, "grad_and_value": do_grad_and_value, "vjp": do_vjp,
              "jacrev": do_jacrev}


@pytest.mark.parametrize("runner", list(RUNNERS))
@pytest.mark.parametrize("transform", list(TRANSFORMS))
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_reverse_transform_matches_eager(case: Case, transform: str, runner: str) -> None:
    """grad / grad_and_value / vjp / jacrev over a captured setup_context-style Function give
    eager's values and gradients."""
    do = TRANSFORMS[transform]
    args = case.make_args()
    expected = do(eager_runner(case, args, case.argnums), case, args)
    run = RUNNERS[runner](case, args, case.argnums)
    with Through(runner):
        got = do(run, case, args)
    assert_same(got, expected)


@pytest.mark.parametrize("runner", list(RUNNERS))
def test_grad_of_grad_matches_eager(runner: str) -> None:
    """Second order through the Function's own (differentiable) backward: d2/dx2 sin = -sin."""
    case = Case(Sin, _args_sin, (0,))
    (x,) = case.make_args()

    def second(run: Runner) -> torch.Tensor:
        first = torch.func.grad(lambda x: run(x).sum())
        return torch.func.grad(lambda x: first(x).sum())(x)

    expected = second(Sin.apply)
    torch.testing.assert_close(expected, -x.sin())  # eager's rule, checked
    if runner == "Capture":
        # Both levels wrap x: at each the tensor requires grad.
        run = minihop.capture(Sin, x.detach().clone().requires_grad_(True))
    else:
        run = apply_runner(case, (x,), (0,))
    with Through(runner):
        got = second(run)
    assert_same(got, expected)


# ---------------------------------------------------------------------------------------------
# vmap: generate_vmap_rule, a custom vmap staticmethod, and no rule
# ---------------------------------------------------------------------------------------------

def in_dims_of(case: Case, args: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(0 if i in case.argnums else None for i in range(len(args)))


@pytest.mark.parametrize("runner", list(RUNNERS))
@pytest.mark.parametrize("case", VMAP_CASES, ids=lambda c: c.id)
def test_vmap_matches_eager(case: Case, runner: str) -> None:
    args = case.make_args()
    in_dims = in_dims_of(case, args)
    expected = torch.func.vmap(case.fn.apply, in_dims=in_dims)(*args)
    eager_rule_calls = list(VMAP_RULE_CALLS)
    VMAP_RULE_CALLS.clear()
    run = RUNNERS[runner](case, args, case.argnums, **({"per_sample": True} if runner == "Capture" else {}))
    with Through(runner):
        got = torch.func.vmap(run, in_dims=in_dims)(*args)
    assert_same(got, expected)
    # A custom vmap rule is the user's code: eager calls it once per vmap call.
    assert VMAP_RULE_CALLS == eager_rule_calls


@pytest.mark.parametrize("runner", list(RUNNERS))
def test_custom_vmap_rule_with_other_in_dim(runner: str) -> None:
    """vmap over dimension 1: the rule must move the batch dimension (eager calls it with (1,))."""
    x = _t(4, 3, seed=5)
    expected = torch.func.vmap(SinCustomVmap.apply, in_dims=1)(x)
    assert VMAP_RULE_CALLS == [(3, (1,))]  # eager's rule, checked
    torch.testing.assert_close(expected, x.t().sin())
    VMAP_RULE_CALLS.clear()
    if runner == "Capture":
        run = minihop.capture(SinCustomVmap, x[:, 0].clone())
    else:
        run = lambda x: minihop.apply(SinCustomVmap, x)  # noqa: E731
    with Through(runner):
        got = torch.func.vmap(run, in_dims=1)(x)
    assert_same(got, expected)
    assert VMAP_RULE_CALLS == [(3, (1,))]


@pytest.mark.parametrize("runner", list(RUNNERS))
@pytest.mark.parametrize("case", VMAP_CASES, ids=lambda c: c.id)
def test_per_sample_grads_matches_eager(case: Case, runner: str) -> None:
    """vmap(grad(...)): per-sample gradients through the vmap rule and the backward."""
    args = case.make_args()

    def per_sample(run: Runner) -> Any:
        def loss(*tensors: Any) -> torch.Tensor:
            out = run(*merge(args, case.argnums, tensors))
            outs = out if isinstance(out, tuple) else (out,)
            return sum(((o * (i + 1)).sum() for i, o in enumerate(outs)), torch.zeros(()))

        tensors = tuple(args[i] for i in case.argnums)
        g = torch.func.grad(loss, argnums=tuple(range(len(tensors))))
        return torch.func.vmap(g)(*tensors)

    expected = per_sample(case.fn.apply)
    if runner == "Capture":
        example = [a[0].clone().requires_grad_(True) if i in case.argnums else a
                   for i, a in enumerate(args)]
        run = minihop.capture(case.fn, *example)
    else:
        run = apply_runner(case, args, case.argnums)
    with Through(runner):
        got = per_sample(run)
    assert_same(got, expected)


@pytest.mark.parametrize("runner", list(RUNNERS))
def test_vmap_without_rule_raises_like_eager(runner: str) -> None:
    """A setup_context-style Function with neither generate_vmap_rule nor vmap: eager refuses."""
    (x,) = _args_sin()
    with pytest.raises(RuntimeError, match=NO_VMAP_MESSAGE):
        torch.func.vmap(Sin.apply)(x)
    run = minihop.capture(Sin, x[0].clone()) if runner == "Capture" else apply_runner(Case(Sin, _args_sin, (0,)), (x,), (0,))
    with pytest.raises(RuntimeError, match="vmap") as info:
        torch.func.vmap(run)(x)
    assert "setup_context" not in str(info.value), (
        "minihop's refusal blames setup_context, which the user's Function does override: "
        f"{info.value}")


# ---------------------------------------------------------------------------------------------
# Old-style Functions: eager raises under every transform; minihop must too
# ---------------------------------------------------------------------------------------------

OLD_STYLE_TRANSFORMS: dict[str, Callable[[Runner, torch.Tensor], Any]] = {
    "grad": lambda run, x: torch.func.grad(lambda x: run(x).sum())(x),
    "vjp": lambda run, x: torch.func.vjp(run, x),
    "jacrev": lambda run, x: torch.func.jacrev(run)(x),
    "vmap": lambda run, x: torch.func.vmap(run)(x),
}


@pytest.mark.parametrize("runner", list(RUNNERS))
@pytest.mark.parametrize("transform", list(OLD_STYLE_TRANSFORMS))
def test_old_style_function_raises_like_eager(transform: str, runner: str) -> None:
    do = OLD_STYLE_TRANSFORMS[transform]
    x = _t(3, 4, seed=7)
    with pytest.raises(RuntimeError, match=SETUP_CONTEXT_MESSAGE):
        do(OldSin.apply, x)
    if runner == "Capture":
        example = x[0].clone() if transform == "vmap" else x.clone().requires_grad_(True)
        run = minihop.capture(OldSin, example)
    else:
        run = lambda x: minihop.apply(OldSin, x)  # noqa: E731
    with pytest.raises(RuntimeError, match="setup_context"):
        do(run, x)


def test_old_style_function_still_works_outside_transforms() -> None:
    """The refusal is only under transforms: plain use of the old-style Function matches eager."""
    x = _t(3, 4, seed=8)
    xe = x.clone().requires_grad_(True)
    xm = x.clone().requires_grad_(True)
    OldSin.apply(xe).sum().backward()
    with Through("minihop.apply"):
        minihop.apply(OldSin, xm).sum().backward()
    torch.testing.assert_close(xm.grad, xe.grad)


# ---------------------------------------------------------------------------------------------
# A Capture made for a tensor that does not require grad, called under torch.func.grad
# ---------------------------------------------------------------------------------------------

def test_capture_made_without_grad_called_under_grad() -> None:
    """Inside torch.func.grad the argument is a wrapped tensor with requires_grad=True, unlike
    the one the Capture was made for. Acceptable: GuardMismatchError (the documented
    requires_grad guard) or eager's result. Found (dfa4c17 and 5ded4df): GuardMismatchError
    naming requires_grad, which is asserted; a Capture made for a tensor that requires grad works
    (test_reverse_transform_matches_eager)."""
    (x,) = _args_sin()
    torch.func.grad(lambda x: Sin.apply(x).sum())(x)  # eager works here
    cap = minihop.capture(Sin, x)
    with pytest.raises(minihop.GuardMismatchError, match="requires_grad"):
        torch.func.grad(lambda x: cap(x).sum())(x)
    # Outside the transform, as captured, it matches eager.
    assert_same(cap(x), Sin.apply(x))
