"""A small model built from hand-written autograd.Functions, shared by ``test_training.py`` and
``test_ddp.py``; the DDP children run ``ddp_worker`` from here.

Every layer calls its Function through an *apply strategy* ``apply(F, *args)``: ``eager_apply``
(``F.apply``), ``minihop.apply``, or a ``FunctionApply`` (one ``minihop.function(F)`` per
Function). The model is otherwise the same, so a run with each strategy from the same
``state_dict`` on the same batches must give the same losses and parameters.

This file is no test module (pytest does not collect it). ``multiprocessing``'s spawn start
method imports it in each child by its name, ``training_model``: the tests put this directory
on ``sys.path`` (spawn hands the parent's ``sys.path`` to its children).
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn
from torch.autograd import Function

import minihop
from minihop.cache import CapturedFunction

Apply = Callable[..., Any]


# ---------------------------------------------------------------------------------------------
# The Functions: each with a hand-written backward
# ---------------------------------------------------------------------------------------------

class LinearFn(Function):
    """``x @ weight.T + bias``."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        return x @ weight.t() + bias

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, ...]:
        x, weight = ctx.saved_tensors
        return grad @ weight, grad.t() @ x, grad.sum(0)


class LeakyReLUFn(Function):
    """Leaky ReLU with a Python-number slope (a non-tensor argument, part of the cache key)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, slope: float) -> torch.Tensor:
        ctx.save_for_backward(x)
        ctx.slope = slope
        return torch.where(x > 0, x, x * slope)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        (x,) = ctx.saved_tensors
        return torch.where(x > 0, grad, grad * ctx.slope), None


class RMSNormFn(Function):
    """RMS normalisation over the last dimension with a learnt scale (2-d inputs)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        rstd = (x.pow(2).mean(-1, keepdim=True) + eps).rsqrt()
        ctx.save_for_backward(x, weight, rstd)
        return x * rstd * weight

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, weight, rstd = ctx.saved_tensors
        xhat = x * rstd
        g = grad * weight
        grad_x = rstd * (g - xhat * (g * xhat).mean(-1, keepdim=True))
        return grad_x, (grad * xhat).sum(0), None


class MSELossFn(Function):
    """Mean squared error; the target gets a gradient too (``None`` is not needed)."""

    @staticmethod
    def forward(ctx: Any, pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        diff = pred - target
        ctx.save_for_backward(diff)
        return diff.pow(2).mean()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        (diff,) = ctx.saved_tensors
        g = grad * 2.0 * diff / diff.numel()
        return g, -g


FUNCTIONS: tuple[type[Function], ...] = (LinearFn, LeakyReLUFn, RMSNormFn, MSELossFn)


# ---------------------------------------------------------------------------------------------
# Apply strategies
# ---------------------------------------------------------------------------------------------

def eager_apply(fn_cls: type[Function], *args: Any) -> Any:
    """Plain PyTorch: ``F.apply``."""
    return fn_cls.apply(*args)


class FunctionApply:
    """One ``minihop.function(F, **options)`` per Function, made on first use."""

    def __init__(self, **options: Any) -> None:
        self.options = options
        self.functions: dict[type[Function], CapturedFunction] = {}

    def __call__(self, fn_cls: type[Function], *args: Any) -> Any:
        cf = self.functions.get(fn_cls)
        if cf is None:
            cf = self.functions[fn_cls] = minihop.function(fn_cls, **self.options)
        return cf(*args)


class CountingApply:
    """Wraps a strategy and counts its calls (to check minihop's hit and capture counts)."""

    def __init__(self, inner: Apply) -> None:
        self.inner = inner
        self.calls = 0

    def __call__(self, fn_cls: type[Function], *args: Any) -> Any:
        self.calls += 1
        return self.inner(fn_cls, *args)


# ---------------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------------

D_IN, HIDDEN, D_OUT = 6, 16, 3


class Linear(nn.Module):
    def __init__(self, apply: Apply, d_in: int, d_out: int) -> None:
        super().__init__()
        self.apply_fn = apply
        self.weight = nn.Parameter(torch.randn(d_out, d_in) / d_in ** 0.5)
        self.bias = nn.Parameter(0.1 * torch.randn(d_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.apply_fn(LinearFn, x, self.weight, self.bias)


class LeakyReLU(nn.Module):
    def __init__(self, apply: Apply, slope: float = 0.1) -> None:
        super().__init__()
        self.apply_fn = apply
        self.slope = slope

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.apply_fn(LeakyReLUFn, x, self.slope)


class RMSNorm(nn.Module):
    def __init__(self, apply: Apply, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.apply_fn = apply
        self.weight = nn.Parameter(1.0 + 0.1 * torch.randn(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.apply_fn(RMSNormFn, x, self.weight, self.eps)


class Net(nn.Module):
    """linear -> leaky -> rmsnorm -> linear -> leaky -> linear: 6 Function calls a forward."""

    def __init__(self, apply: Apply) -> None:
        super().__init__()
        self.fc1 = Linear(apply, D_IN, HIDDEN)
        self.act1 = LeakyReLU(apply)
        self.norm = RMSNorm(apply, HIDDEN)
        self.fc2 = Linear(apply, HIDDEN, HIDDEN)
        self.act2 = LeakyReLU(apply)
        self.fc3 = Linear(apply, HIDDEN, D_OUT)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(self.act2(self.fc2(self.norm(self.act1(self.fc1(x))))))


# Distinct cache keys one (static-shape) forward + loss makes: fc1 (input without grad),
# fc2 and fc3 (other shapes), the two activations (one key), the norm and the loss.
KEYS_PER_BATCH_SHAPE = 6
CALLS_PER_STEP = 7  # six in the model, one for the loss


def make_models(strategies: Sequence[Apply], seed: int = 0) -> list[Net]:
    """One ``Net`` per strategy, all starting from the first one's ``state_dict``."""
    torch.manual_seed(seed)
    models = [Net(apply) for apply in strategies]
    for model in models[1:]:
        model.load_state_dict(models[0].state_dict())
    return models


def make_batches(sizes: Sequence[int], seed: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Regression data from a seeded generator: a fixed random teacher plus noise."""
    gen = torch.Generator().manual_seed(seed)
    teacher = torch.randn(D_IN, D_OUT, generator=gen)
    batches = []
    for size in sizes:
        x = torch.randn(size, D_IN, generator=gen)
        y = torch.tanh(x @ teacher) + 0.05 * torch.randn(size, D_OUT, generator=gen)
        batches.append((x, y))
    return batches


OPTIMIZERS: dict[str, Callable[[Any], torch.optim.Optimizer]] = {
    "sgd_momentum": lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.9),
    "adam": lambda params: torch.optim.Adam(params, lr=1e-2),
}


@dataclasses.dataclass
class Step:
    """What one training step left: its loss, the parameters after it, an eval loss if any, and
    ``minihop.counters()`` (process-wide totals) after the training step and after the eval."""

    loss: torch.Tensor
    params: dict[str, torch.Tensor]
    counters: dict[str, int]
    eval_loss: torch.Tensor | None = None
    eval_counters: dict[str, int] | None = None


def snapshot(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def train(model: nn.Module, apply: Apply, optimizer: torch.optim.Optimizer,
          batches: Sequence[tuple[torch.Tensor, torch.Tensor]],
          evaluate_after: frozenset[int] = frozenset(),
          eval_batch: tuple[torch.Tensor, torch.Tensor] | None = None) -> list[Step]:
    """Train one step per batch; after the steps in ``evaluate_after``, evaluate ``eval_batch``
    in ``model.eval()`` under ``torch.no_grad()`` and go back to training mode."""
    steps = []
    for i, (x, y) in enumerate(batches):
        model.train()
        loss = apply(MSELossFn, model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step = Step(loss.detach().clone(), snapshot(model), minihop.counters())
        if i in evaluate_after:
            assert eval_batch is not None
            model.eval()
            with torch.no_grad():
                step.eval_loss = apply(MSELossFn, model(eval_batch[0]), eval_batch[1])
            assert not step.eval_loss.requires_grad
            step.eval_counters = minihop.counters()
            model.train()
        steps.append(step)
    return steps


# ---------------------------------------------------------------------------------------------
# The DDP worker (run in spawned children by test_ddp.py)
# ---------------------------------------------------------------------------------------------

DDP_MODES = ("eager", "apply", "function")


def ddp_worker(rank: int, world_size: int, port: int, out_dir: str, steps: int,
               per_rank_batch: int, fail_rank: int | None = None) -> None:
    """One rank: train the same ``Net`` under DistributedDataParallel once per mode (eager,
    ``minihop.apply``, ``minihop.function``) on this rank's slice of the global batches; check
    here that the modes agree and that every rank holds the same parameters (all_gather); save
    the parameters and minihop's counts to ``out_dir/rank{rank}.pt`` for the parent.

    ``fail_rank`` (for the harness's own test) makes that rank raise just before the
    all_gather, which leaves the other ranks waiting in it."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size,
                            init_method=f"tcp://127.0.0.1:{port}",
                            timeout=datetime.timedelta(seconds=60))
    try:
        batches = [(x[rank * per_rank_batch:(rank + 1) * per_rank_batch],
                    y[rank * per_rank_batch:(rank + 1) * per_rank_batch])
                   for x, y in make_batches([world_size * per_rank_batch] * steps)]
        strategies = {"eager": CountingApply(eager_apply), "apply": CountingApply(minihop.apply),
                      "function": CountingApply(FunctionApply())}
        models = make_models(list(strategies.values()))
        minihop.clear_cache()
        before = minihop.counters()
        params: dict[str, dict[str, torch.Tensor]] = {}
        for (mode, apply), model in zip(strategies.items(), models, strict=True):
            ddp = DistributedDataParallel(model)
            opt = OPTIMIZERS["sgd_momentum"](ddp.parameters())
            train(ddp, apply, opt, batches)
            params[mode] = snapshot(model)
        after = minihop.counters()

        if rank == fail_rank:
            raise RuntimeError(f"injected failure on rank {rank}")
        # Every rank's parameters, for every mode, gathered on every rank.
        flat = torch.cat([p.reshape(-1) for mode in DDP_MODES for p in params[mode].values()])
        gathered = [torch.empty_like(flat) for _ in range(world_size)]
        try:
            dist.all_gather(gathered, flat)
        except Exception:
            # A peer failed (gloo: connection closed). Let the failing rank's exit be seen first,
            # so the parent reports its traceback, not this consequence (a race otherwise).
            time.sleep(3)
            raise
        function_apply = strategies["function"].inner
        assert isinstance(function_apply, FunctionApply)
        torch.save({
            "params": params,
            "counters": {name: after[name] - before[name] for name in after},
            "calls": {mode: s.calls for mode, s in strategies.items()},
            "function_stats": {f.__name__: dataclasses.asdict(cf.stats)
                               for f, cf in function_apply.functions.items()},
            "pid": os.getpid(),
        }, os.path.join(out_dir, f"rank{rank}.pt"))

        for mode in DDP_MODES[1:]:
            torch.testing.assert_close(params[mode], params["eager"],
                                       msg=lambda m, mode=mode: f"rank {rank}, {mode} vs eager: {m}")
        for other, theirs in enumerate(gathered):
            torch.testing.assert_close(theirs, flat, rtol=0, atol=0,
                                       msg=lambda m, o=other: f"rank {rank} vs rank {o}: {m}")
    finally:
        dist.destroy_process_group()
