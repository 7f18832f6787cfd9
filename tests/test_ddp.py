"""minihop under DistributedDataParallel is eager under DDP (issue #8, item 2).

The test starts two processes itself (``torch.multiprocessing``, spawn) that meet over gloo on a
free localhost port. Each trains ``training_model.Net`` under DDP for a few SGD+momentum steps on
its own slice of every global batch, once with ``F.apply``, once with ``minihop.apply`` and once
with ``minihop.function``, in the same process (``training_model.ddp_worker``). Each child checks
that the three runs end with the same parameters and, by ``all_gather``, that every rank holds
exactly the same ones; it saves them, with minihop's counts, for the parent, which checks again:

- eager and minihop parameters are equal on every rank, and equal across ranks;
- they equal one process training on the whole global batches eagerly (DDP averaged the
  gradients minihop's backward produced: the ranks really trained together);
- each rank captured for itself (captures and hits, no eager fallback).

A failing child fails the test with the child's traceback; children still running after the
time limit are killed. Nothing is timed (the run time is printed, for the record).
"""

from __future__ import annotations

import socket
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp

HERE = str(Path(__file__).resolve().parent)
if HERE not in sys.path:  # training_model.py; spawned children get this sys.path too
    sys.path.insert(0, HERE)

from training_model import (  # noqa: E402
    CALLS_PER_STEP,
    DDP_MODES,
    FUNCTIONS,
    KEYS_PER_BATCH_SHAPE,
    OPTIMIZERS,
    ddp_worker,
    eager_apply,
    make_batches,
    make_models,
    snapshot,
    train,
)

WORLD_SIZE = 2
STEPS = 5
PER_RANK_BATCH = 8
TIMEOUT_S = 120.0  # a hang (e.g. a rank stuck in a collective) fails long before pytest's patience


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_children(out_dir: Path, steps: int = STEPS, fail_rank: int | None = None) -> None:
    """Spawn the ranks and wait; re-raise a child's failure (with its traceback); kill the
    children if they outlive ``TIMEOUT_S``."""
    args = (WORLD_SIZE, free_port(), str(out_dir), steps, PER_RANK_BATCH, fail_rank)
    context = mp.start_processes(ddp_worker, args=args, nprocs=WORLD_SIZE, join=False,
                                 start_method="spawn")
    deadline = time.monotonic() + TIMEOUT_S
    try:
        # join() raises ProcessRaisedException (carrying the child's traceback) or
        # ProcessExitedException when a child fails, after stopping the others (SIGTERM after
        # the grace period, SIGKILL after another).
        while not context.join(timeout=max(0.0, deadline - time.monotonic()), grace_period=2.0):
            if time.monotonic() >= deadline:
                raise AssertionError(f"DDP children still running after {TIMEOUT_S:.0f} s; killed")
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()
            process.join(timeout=10)


def single_process_reference() -> dict[str, torch.Tensor]:
    """Eager training on the whole global batches in one process: what DDP over the ranks'
    slices must reproduce (mean loss over equal slices, gradients averaged across ranks)."""
    (model,) = make_models([eager_apply])
    batches = make_batches([WORLD_SIZE * PER_RANK_BATCH] * STEPS)
    train(model, eager_apply, OPTIMIZERS["sgd_momentum"](model.parameters()), batches)
    return snapshot(model)


def test_ddp_two_processes_minihop_matches_eager(tmp_path: Path) -> None:
    """Under DDP (gloo, 2 processes) minihop.apply and minihop.function end with eager's
    parameters on every rank, all ranks agree, and each rank captured for itself."""
    start = time.perf_counter()
    run_children(tmp_path)
    print(f"DDP: {WORLD_SIZE} processes x {STEPS} steps x {len(DDP_MODES)} modes in "
          f"{time.perf_counter() - start:.1f} s")

    results: list[dict[str, Any]] = [torch.load(tmp_path / f"rank{rank}.pt") for rank in range(WORLD_SIZE)]
    assert len({r["pid"] for r in results}) == WORLD_SIZE, "the ranks did not run in separate processes"
    reference = single_process_reference()
    for rank, result in enumerate(results):
        params = result["params"]
        assert set(params) == set(DDP_MODES)
        for mode in DDP_MODES:
            # Eager and minihop compute the same thing the same way: equal within float tolerance.
            torch.testing.assert_close(params[mode], params["eager"],
                                       msg=lambda m, mode=mode: f"rank {rank}: {mode} vs eager: {m}")
            # DDP broadcasts and averages: every rank ends with rank 0's parameters, exactly.
            torch.testing.assert_close(params[mode], results[0]["params"][mode], rtol=0, atol=0,
                                       msg=lambda m, mode=mode: f"{mode}: rank {rank} vs rank 0: {m}")
            # Averaging the ranks' gradients = the gradient of the whole batch (summed in
            # another order: default float tolerance).
            torch.testing.assert_close(params[mode], reference,
                                       msg=lambda m, mode=mode: f"rank {rank}, {mode} vs one process: {m}")

        # Each process captured for itself: one capture per cache key, hits for every other
        # call, no eager fallback, in both minihop modes (two modes, one set of captures each).
        calls = result["calls"]
        assert calls == {mode: STEPS * CALLS_PER_STEP for mode in DDP_MODES}, calls
        counters = result["counters"]
        assert counters == {"captures": 2 * KEYS_PER_BATCH_SHAPE,
                            "cache_hits": 2 * (STEPS * CALLS_PER_STEP - KEYS_PER_BATCH_SHAPE),
                            "fallbacks": 0, "internal_errors": 0}, (rank, counters)
        stats = result["function_stats"]
        assert set(stats) == {f.__name__ for f in FUNCTIONS}, stats
        assert sum(s["captures"] for s in stats.values()) == KEYS_PER_BATCH_SHAPE, stats
        assert all(s["eager_calls"] == 0 and s["evictions"] == 0 for s in stats.values()), stats


def test_ddp_child_failure_is_reported(tmp_path: Path) -> None:
    """When one rank fails while the other waits for it in a collective, ``run_children``
    stops both and fails with the failing child's traceback, promptly (not after gloo's
    timeout): the test above cannot pass, or hang, when a rank breaks."""
    with pytest.raises(mp.ProcessRaisedException, match=r"(?s)Traceback.*injected failure on rank 1"):
        run_children(tmp_path, steps=0, fail_rank=1)
    assert not (tmp_path / "rank0.pt").exists() and not (tmp_path / "rank1.pt").exists()
