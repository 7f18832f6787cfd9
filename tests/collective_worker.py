"""The rank worker ``tests/test_collectives.py`` spawns, and the checks each rank runs.

Each check compares minihop with eager ``F.apply`` on this rank (outputs and every ``.grad``,
exactly) for a Function of ``collective_functions``; ``worker`` runs the cases it is given in
model-parallel groups of ``tp_size`` ranks and writes each case's value, or its traceback, to
``rank{rank}.json`` for the parent.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

import collective_functions as cf
import minihop
from collective_functions import (PATTERNS, _CopyToModelParallelRegion, _ReduceFromModelParallelRegion,
                                  get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size)

MODES = ("apply", "fallback")
# The bodies Dynamo captures (fullgraph=True), compared strictly: pattern -> phases. The other
# phases differ in one place only, not about collectives: for ``return t.contiguous()`` of an
# already-contiguous ``t`` minihop's output is ``t``'s node, Dynamo's the ``contiguous`` node.
# Dynamo cannot capture ``dist.broadcast`` (Unsupported: a pybind11 object's ``__new__``).
DYNAMO_PHASES = {"copy_to_tp": ("fwd", "bwd"), "reduce_from_tp": ("fwd", "bwd"), "scatter_to_tp": ("fwd",),
                 "gather_from_tp": ("bwd",), "scatter_to_sp": ("bwd",), "gather_from_sp": ("fwd", "bwd"),
                 "reduce_scatter_sp": ("fwd", "bwd"), "all_to_all": ("fwd", "bwd"),
                 "functional": ("fwd", "bwd"), "reduce_then_scale": ("fwd", "bwd"), "broadcast": ()}


def _with_grad(args: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(a.detach().clone().requires_grad_() if isinstance(a, torch.Tensor) else a for a in args)


def check_pattern(name: str, mode: str) -> None:
    """Each size through ``mode`` and through eager ``F.apply``: outputs and every .grad equal
    (the grad fed back differs by rank); the second size is captured dynamic (the third
    reuses its capture)."""
    fn_cls, make, sizes = PATTERNS[name]
    if mode == "apply":
        def run(*args: Any) -> Any:
            return minihop.apply(fn_cls, *args)
    else:
        run = minihop.function(fn_cls, fallback="eager").apply
    world = get_tensor_model_parallel_world_size()
    captures = []
    for n in sizes:
        torch.manual_seed(100 * n + dist.get_rank())
        args = make(n, world)
        eager_args, mine_args = _with_grad(args), _with_grad(args)
        before = minihop.counters()
        eager, mine = fn_cls.apply(*eager_args), run(*mine_args)
        captures.append(minihop.counters()["captures"] - before["captures"])
        torch.testing.assert_close(mine, eager, rtol=0, atol=0, msg=lambda m: f"{name} n={n} output: {m}")
        grad = torch.randn_like(eager) * (1 + dist.get_rank())
        eager.backward(grad.clone())  # clones: Megatron's backward all-reduces its grad in place
        mine.backward(grad.clone())
        for i, (e, m) in enumerate(zip(eager_args, mine_args, strict=True)):
            if isinstance(e, torch.Tensor):
                torch.testing.assert_close(m.grad, e.grad, rtol=0, atol=0,
                                           msg=lambda s, i=i: f"{name} n={n} args[{i}].grad: {s}")
    # One static capture, one dynamic capture serving the second and third sizes; the eager
    # fallback never ran.
    assert captures == [1, 1, 0], (name, mode, captures)
    assert minihop.counters()["fallbacks"] == 0, minihop.counters()


def graphs_of(name: str) -> dict[str, Any]:
    """The collectives in the captured bodies and whether they equal Dynamo's."""
    from minihop.testing import assert_same_graph, dynamo_graphs

    fn_cls, make, sizes = PATTERNS[name]
    args = _with_grad(make(sizes[0], get_tensor_model_parallel_world_size()))
    cap = minihop.capture(fn_cls, *args)
    found = {phase: [str(n.target) for n in gm.graph.nodes if "c10d" in str(n.target) or n.target == "copy_"]
             for phase, gm in (("fwd", cap.fwd), ("bwd", cap.bwd))}
    try:
        theirs = dynamo_graphs(fn_cls, *args)
    except torch._dynamo.exc.Unsupported:
        found["dynamo"] = "unsupported"
    else:
        for phase in DYNAMO_PHASES[name]:
            assert_same_graph(getattr(cap, phase), getattr(theirs, phase))
        found["dynamo"] = list(DYNAMO_PHASES[name])
    found["printed"] = str(cap)
    return found


# -- a column-parallel + row-parallel MLP (Megatron's ParallelMLP, without bias splitting) --

class ParallelMLP(torch.nn.Module):
    def __init__(self, hidden: int, ffn: int, world: int, rank: int) -> None:
        super().__init__()
        torch.manual_seed(0)  # the full weights, the same on every rank; each keeps its shard
        w1, w2 = torch.randn(ffn, hidden) / hidden ** 0.5, torch.randn(hidden, ffn) / ffn ** 0.5
        per = ffn // world
        self.w1 = torch.nn.Parameter(w1[rank * per:(rank + 1) * per].clone())  # column-parallel
        self.b1 = torch.nn.Parameter(torch.zeros(per))
        self.w2 = torch.nn.Parameter(w2[:, rank * per:(rank + 1) * per].clone())  # row-parallel
        self.b2 = torch.nn.Parameter(torch.zeros(hidden))

    def forward(self, x: torch.Tensor, apply: Callable[..., Any]) -> torch.Tensor:
        h = torch.nn.functional.gelu(torch.nn.functional.linear(apply(_CopyToModelParallelRegion, x), self.w1, self.b1))
        return apply(_ReduceFromModelParallelRegion, torch.nn.functional.linear(h, self.w2)) + self.b2


def train_mlp(apply: Callable[..., Any], steps: int = 3) -> tuple[list[float], dict[str, torch.Tensor]]:
    world, rank = get_tensor_model_parallel_world_size(), get_tensor_model_parallel_rank()
    model = ParallelMLP(8, 4 * world, world, rank)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for step in range(steps):
        torch.manual_seed(1000 + step)  # the same batch on every rank (tensor parallel)
        x, y = torch.randn(6, 8), torch.randn(6, 8)
        loss = torch.nn.functional.mse_loss(model(x, apply), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}


def check_mlp() -> dict[str, Any]:
    eager_losses, eager_params = train_mlp(lambda f, *a: f.apply(*a))
    losses, params = train_mlp(minihop.apply)
    assert losses == eager_losses, (losses, eager_losses)
    for k, v in params.items():
        torch.testing.assert_close(v, eager_params[k], rtol=0, atol=0, msg=lambda m, k=k: f"{k}: {m}")
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, losses)
    assert all(g == losses for g in gathered), gathered  # the reduced output is replicated
    return {"losses": losses}


# -- what is refused, and the world a capture belongs to ------------------------------------

class ScaleByWorld(torch.autograd.Function):
    """Reads the rank and the world size: constants in the graphs."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x * dist.get_world_size() + dist.get_rank()

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g * dist.get_world_size()


def _refused_forward(body: Callable[[torch.Tensor], Any]) -> type:
    class Refused(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            y = x.clone()
            body(y)
            return y

        @staticmethod
        def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
            return g
    return Refused


def _async_all_reduce(y: torch.Tensor) -> None:
    work = dist.all_reduce(y, async_op=True)
    work.wait()


def _send_recv(y: torch.Tensor) -> None:
    if dist.get_rank() == 0:
        dist.send(y, 1)
    else:
        dist.recv(y, 0)


REFUSED: dict[str, tuple[Callable[[torch.Tensor], Any], str]] = {
    "async_op": (_async_all_reduce, r"calls torch.distributed.all_reduce, with async_op=True"),
    "send_recv": (_send_recv, r"calls torch.distributed.(send|recv), a point-to-point transfer"),
    "reduce": (lambda y: dist.reduce(y, 0), r"calls torch.distributed.reduce, a collective minihop has no functional form for"),
    "barrier": (lambda y: dist.barrier(), r"calls torch.distributed.barrier"),
    "complex": (lambda y: dist.all_reduce(torch.view_as_complex(y)), r"on a complex tensor"),
}


def check_refused(name: str) -> None:
    """Strict: a coded refusal naming the call. ``fallback="eager"``: eager's answer."""
    import pytest

    body, message = REFUSED[name]
    fn_cls = _refused_forward(body)
    x = torch.randn(3, 2) + dist.get_rank()
    with pytest.raises(minihop.UnsupportedOperationError, match=message):
        minihop.apply(fn_cls, x)
    dist.barrier()
    eager = fn_cls.apply(x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fallback says once that it ran eagerly
        mine = minihop.function(fn_cls, fallback="eager").apply(x)
    torch.testing.assert_close(mine, eager, rtol=0, atol=0)


def check_world() -> dict[str, Any]:
    """A capture made in this world is not run in another: after the group is replaced by a
    one-rank world, the same call is captured again and matches eager there."""
    x = torch.arange(6.0).reshape(3, 2)
    first = minihop.apply(ScaleByWorld, x)
    torch.testing.assert_close(first, ScaleByWorld.apply(x))
    dist.destroy_process_group()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    before = minihop.counters()["captures"]
    again = minihop.apply(ScaleByWorld, x)
    torch.testing.assert_close(again, ScaleByWorld.apply(x), rtol=0, atol=0)
    assert minihop.counters()["captures"] == before + 1, minihop.counters()
    return {"first": first.tolist(), "again": again.tolist()}


def check_rebound_group() -> dict[str, Any]:
    """The model-parallel group the module-level global holds, rebound between calls (to the
    world, then back): each call matches eager in its group, through one cache (issue 28: a
    global read by a helper the Function calls)."""
    saved, seen = cf._TENSOR_MODEL_PARALLEL_GROUP, []
    try:
        for step, group in enumerate((saved, dist.group.WORLD, saved, dist.group.WORLD)):
            cf._TENSOR_MODEL_PARALLEL_GROUP = group
            for fn_cls in (_ReduceFromModelParallelRegion, cf._GatherFromModelParallelRegion):
                x = torch.arange(8.0).reshape(2, 4) + 10 * dist.get_rank() + step
                eager_x, mine_x = x.clone().requires_grad_(), x.clone().requires_grad_()
                eager, mine = fn_cls.apply(eager_x), minihop.apply(fn_cls, mine_x)
                torch.testing.assert_close(mine, eager, rtol=0, atol=0)
                grad = torch.ones_like(eager) * (1 + dist.get_rank())
                eager.backward(grad.clone())
                mine.backward(grad.clone())
                torch.testing.assert_close(mine_x.grad, eager_x.grad, rtol=0, atol=0)
                seen.append(list(mine.shape))
    finally:
        cf._TENSOR_MODEL_PARALLEL_GROUP = saved
    return {"shapes": seen}


# -- the worker ------------------------------------------------------------------------------

def worker(rank: int, world_size: int, port: int, out_dir: str, cases: list[str], tp_size: int) -> None:
    """One rank: run each case (``pattern:<name>:<mode>``, ``graphs:<name>``, ``mlp``,
    ``refused:<name>``, ``world``) in model-parallel groups of ``tp_size`` consecutive ranks,
    record its value or its traceback, write ``rank{rank}.json``."""
    warnings.simplefilter("ignore", FutureWarning)  # torch 2.13 deprecates the names Megatron calls
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size, init_method=f"tcp://127.0.0.1:{port}",
                            timeout=datetime.timedelta(seconds=60))
    for first in range(0, world_size, tp_size):  # every rank makes every group, as c10d requires
        group = dist.new_group(list(range(first, first + tp_size)))
        if first <= rank < first + tp_size:
            cf._TENSOR_MODEL_PARALLEL_GROUP = group
    results: dict[str, Any] = {}
    try:
        for case in cases:
            kind, *rest = case.split(":")
            minihop.reset()
            try:
                if kind == "pattern":
                    check_pattern(rest[0], rest[1])
                    value: Any = "ok"
                elif kind == "graphs":
                    value = graphs_of(rest[0])
                elif kind == "mlp":
                    value = check_mlp()
                elif kind == "refused":
                    check_refused(rest[0])
                    value = "ok"
                elif kind == "rebind":
                    value = check_rebound_group()
                elif kind == "world":
                    value = check_world()  # last: it replaces the process group
                else:
                    raise ValueError(case)
                results[case] = {"ok": True, "value": value}
            except Exception:
                results[case] = {"ok": False, "error": traceback.format_exc()}
            if kind != "world":
                dist.barrier()
    finally:
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(results))
        dist.destroy_process_group()
    # Leave without the interpreter's teardown: there gloo's threads met C++ destructors and,
    # now and then, aborted a rank whose results were written ("terminate called without an
    # active exception", SIGABRT: the whole module failed).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
