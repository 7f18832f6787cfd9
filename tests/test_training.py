"""Training with minihop is training with eager PyTorch (issue #8, item 1).

A small ``nn.Module`` made of hand-written autograd.Functions (linear, leaky ReLU, RMS norm,
MSE loss: ``training_model.py``) is trained for 50 steps with SGD+momentum and with Adam,
once calling its Functions with ``F.apply`` and once per minihop entry point (``minihop.apply``,
``minihop.function(F)``, both automatic dynamic by default; ``minihop.function(F, dynamic=False)``
and ``dynamic=True``), from the same ``state_dict``
on the same seeded batches. The loss and every parameter must equal eager's after every step,
and minihop's counters must show that each call went through a capture (captured once per
cache key, hit after that, never run eagerly), so the test cannot pass by running eagerly.

Two scenarios: evaluation in ``model.eval()`` under ``torch.no_grad()`` mid-training (new
captures for grad mode off, then back to the training captures), and a smaller last batch (new
static captures with ``dynamic=False``, symbolic ones under the automatic policy; none with
``dynamic=True``). Nothing is timed.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import minihop

HERE = str(Path(__file__).resolve().parent)
if HERE not in sys.path:  # training_model.py is a helper module beside this file
    sys.path.insert(0, HERE)

from training_model import (  # noqa: E402
    CALLS_PER_STEP,
    FUNCTIONS,
    KEYS_PER_BATCH_SHAPE,
    OPTIMIZERS,
    CountingApply,
    FunctionApply,
    LeakyReLUFn,
    LinearFn,
    MSELossFn,
    RMSNormFn,
    Step,
    eager_apply,
    make_batches,
    make_models,
    train,
)

STEPS = 50
BATCH = 16


@dataclasses.dataclass(frozen=True)
class Scenario:
    sizes: tuple[int, ...]                      # the batch size of each step
    evaluate_after: frozenset[int] = frozenset()  # steps followed by an eval (no_grad) pass
    eval_size: int = BATCH


SCENARIOS = {
    "eval_mid_training": Scenario((BATCH,) * STEPS, frozenset({9, 24, 39})),
    "last_batch_smaller": Scenario((BATCH,) * (STEPS - 1) + (BATCH - 6,)),
}

# How each mode calls a Function; a fresh strategy (own caches) per test.
MODES: dict[str, Callable[[], CountingApply]] = {
    "minihop.apply": lambda: CountingApply(minihop.apply),
    "minihop.function": lambda: CountingApply(FunctionApply()),
    "minihop.function(dynamic=False)": lambda: CountingApply(FunctionApply(dynamic=False)),
    "minihop.function(dynamic=True)": lambda: CountingApply(FunctionApply(dynamic=True)),
}
POLICIES = {"minihop.function(dynamic=False)": "static", "minihop.function(dynamic=True)": "dynamic"}


def run(apply: Callable[..., object], scenario: Scenario,
        optimizer: str) -> tuple[list[Step], dict[str, int]]:
    """Train a fresh copy of the seed-0 model; return its steps and minihop's counters before."""
    (model,) = make_models([apply])
    batches = make_batches(scenario.sizes)
    (eval_batch,) = make_batches([scenario.eval_size], seed=2)
    minihop.clear_cache()  # minihop.apply's caches are per Function class: start them empty
    before = minihop.counters()
    steps = train(model, apply, OPTIMIZERS[optimizer](model.parameters()), batches,
                  scenario.evaluate_after, eval_batch)
    return steps, before


def delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {name: after[name] - before[name] for name in after}


def assert_same_trajectory(mine: list[Step], eager: list[Step], mode: str) -> None:
    """Loss, parameters and eval loss equal eager's after every step."""
    assert len(mine) == len(eager) == STEPS
    for i, (m, e) in enumerate(zip(mine, eager, strict=True)):
        where = f"{mode}, step {i}"
        torch.testing.assert_close(m.loss, e.loss, msg=lambda msg: f"{where}, loss: {msg}")
        torch.testing.assert_close(m.params, e.params, msg=lambda msg: f"{where}, parameters: {msg}")
        assert (m.eval_loss is None) == (e.eval_loss is None), where
        if e.eval_loss is not None:
            torch.testing.assert_close(m.eval_loss, e.eval_loss,
                                       msg=lambda msg: f"{where}, eval loss: {msg}")


def assert_captured(steps: list[Step], before: dict[str, int], scenario: Scenario,
                    policy: str, calls: int) -> None:
    """Every call went through minihop's cache: captures only where a new cache key appears,
    hits everywhere else, and no eager fallback. ``policy``: "static" (dynamic=False),
    "automatic" (the default) or "dynamic" (dynamic=True)."""
    total = delta(steps[-1].eval_counters or steps[-1].counters, before)
    assert total["fallbacks"] == 0, total
    assert total["captures"] + total["cache_hits"] == calls, (total, calls)
    assert total["captures"] > 0, total

    evaluated = False
    previous = before
    for i, step in enumerate(steps):
        train_part = delta(step.counters, previous)
        new_size = i > 0 and scenario.sizes[i] != scenario.sizes[i - 1]
        if (i == 0 or new_size) and policy == "automatic":
            # Layers of one Function with different sizes make those dimensions symbolic and
            # then share a capture; a new batch size makes the batch dimension symbolic: at
            # most one capture per key, and some.
            assert 1 <= train_part["captures"] <= KEYS_PER_BATCH_SHAPE, (f"step {i}", train_part)
            expected = train_part["captures"]
        elif i == 0 and policy == "dynamic":
            # Layers of different sizes may share one symbolic capture: at most one per key.
            assert 1 <= train_part["captures"] <= KEYS_PER_BATCH_SHAPE, (f"step {i}", train_part)
            expected = train_part["captures"]
        elif i == 0:
            expected = KEYS_PER_BATCH_SHAPE  # static: one capture per key
        elif new_size and policy == "static":
            expected = KEYS_PER_BATCH_SHAPE  # a batch size not seen: every key is new
        else:
            expected = 0  # a step like the ones before: cache hits only
        assert train_part["captures"] == expected, (f"step {i}", train_part)
        assert train_part["cache_hits"] == CALLS_PER_STEP - expected, (f"step {i}", train_part)
        previous = step.counters
        if step.eval_counters is not None:
            eval_part = delta(step.eval_counters, previous)
            where = (f"eval after step {i}", eval_part)
            if evaluated:
                assert eval_part["captures"] == 0, where
            elif policy != "static":
                assert 1 <= eval_part["captures"] <= KEYS_PER_BATCH_SHAPE, where
            else:
                # Grad mode off is part of the key: eval at the training batch size still
                # needs its own captures (and must not run the training ones).
                assert eval_part["captures"] == KEYS_PER_BATCH_SHAPE, where
            assert eval_part["captures"] + eval_part["cache_hits"] == CALLS_PER_STEP, where
            evaluated = True
            previous = step.eval_counters


@functools.cache
def eager_reference(scenario_name: str, optimizer: str) -> list[Step]:
    """The eager run of a scenario (made once per module); it must not touch minihop."""
    steps, before = run(eager_apply, SCENARIOS[scenario_name], optimizer)
    assert delta(steps[-1].eval_counters or steps[-1].counters, before) == {
        "captures": 0, "cache_hits": 0, "fallbacks": 0, "internal_errors": 0}, "the eager reference went through minihop"
    return steps


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("scenario_name", SCENARIOS)
@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_training_matches_eager(optimizer: str, scenario_name: str, mode: str) -> None:
    """50 steps through minihop give eager's loss and parameters after every step (and eager's
    eval losses), with every Function call served by a capture."""
    scenario = SCENARIOS[scenario_name]
    eager = eager_reference(scenario_name, optimizer)
    apply = MODES[mode]()
    steps, before = run(apply, scenario, optimizer)

    assert_same_trajectory(steps, eager, mode)
    assert_captured(steps, before, scenario, policy=POLICIES.get(mode, "automatic"), calls=apply.calls)
    if isinstance(apply.inner, FunctionApply):
        assert set(apply.inner.functions) == set(FUNCTIONS)
        for fn_cls, cf in apply.inner.functions.items():
            assert cf.stats.captures > 0 and cf.stats.hits > 0, (fn_cls.__name__, cf.stats)
            assert cf.stats.eager_calls == 0 and cf.stats.evictions == 0, (fn_cls.__name__, cf.stats)


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_the_model_learns(optimizer: str) -> None:
    """The reference training is real training: the loss falls (so equal trajectories are no
    accident of a model that does nothing)."""
    steps, _ = run(eager_apply, SCENARIOS["eval_mid_training"], optimizer)
    first, last = steps[0].loss.item(), steps[-1].loss.item()
    assert last < 0.5 * first, (first, last)
    assert all(torch.isfinite(s.loss) for s in steps)


@pytest.mark.parametrize("fn_cls,make_args", [
    (LinearFn, lambda: (torch.randn(5, 4), torch.randn(3, 4), torch.randn(3))),
    (LeakyReLUFn, lambda: (torch.randn(5, 4), 0.1)),
    (RMSNormFn, lambda: (torch.randn(5, 4), 1.0 + torch.rand(4), 1e-5)),
    (MSELossFn, lambda: (torch.randn(5, 3), torch.randn(5, 3))),
])
def test_hand_written_backwards_are_right(fn_cls: type, make_args: Callable[[], tuple[object, ...]]) -> None:
    """Each Function's hand-written backward is the true gradient (gradcheck in float64), in
    eager and through minihop.apply."""
    torch.manual_seed(0)
    args = tuple(a.double().requires_grad_() if isinstance(a, torch.Tensor) else a
                     for a in make_args())
    assert torch.autograd.gradcheck(lambda *a: fn_cls.apply(*a), args)
    assert torch.autograd.gradcheck(lambda *a: minihop.apply(fn_cls, *a), args)
