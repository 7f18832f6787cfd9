"""(h) What a captured tensor-parallel Function costs per call on a real process group:
``python -m bench collectives``.

Place: bench/, beside (b) per call. Two ranks (``torch.multiprocessing``, spawn; gloo on a
free 127.0.0.1 port) run the Megatron-style Functions of ``tests/collective_functions.py``
fwd+bwd (``a loss with a dense grad), eager ``F.apply`` against the ``minihop.apply`` cache hit,
each round timing a batch of each in an order that alternates from round to round. The ranks
must make the same collectives in the same order, so the counts are fixed (not chosen from a
warm-up, as ``timing.time_interleaved`` does) and both ranks run the same schedule. Reported:
rank 0's medians and the median of the per-round ratios on each rank (a collective waits for
the slower rank, so both ranks' times include the other's).

The table goes into ``bench/RESULTS.md`` between ``<!-- collectives:start -->`` and
``<!-- collectives:end -->`` (``--no-write`` prints only).
"""

from __future__ import annotations

import datetime
import json
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from collections.abc import Callable
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT / "tests") not in sys.path:  # the Functions; spawned ranks get this sys.path too
    sys.path.insert(0, str(ROOT / "tests"))

from .timing import Table, gc_paused  # noqa: E402

__all__ = ["CASES", "MARKER", "measure_collectives", "section"]

MARKER = "collectives"
WORLD = 2
# (label, pattern of collective_functions.PATTERNS, shape of the rank's input)
CASES: tuple[tuple[str, str, tuple[int, int]], ...] = (
    ("reduce from TP region (all_reduce fwd) 8x8", "reduce_from_tp", (8, 8)),
    ("reduce from TP region (all_reduce fwd) 256x1024", "reduce_from_tp", (256, 1024)),
    ("copy to TP region (all_reduce bwd) 8x8", "copy_to_tp", (8, 8)),
    ("gather from SP region (all_gather fwd, reduce_scatter bwd) 8x8", "gather_from_sp", (8, 8)),
    ("gather from SP region (all_gather fwd, reduce_scatter bwd) 256x1024", "gather_from_sp", (256, 1024)),
    ("all-to-all (fwd and bwd) 8x8", "all_to_all", (8, 8)),
)


def _args(pattern: str, shape: tuple[int, int]) -> tuple[Any, ...]:
    import collective_functions as cf

    x = torch.randn(*shape, generator=torch.Generator().manual_seed(0)).requires_grad_(True)
    return (cf.get_tensor_model_parallel_group(), x, None, None) if pattern == "all_to_all" else (x,)


def _step(call: Callable[[], torch.Tensor], args: tuple[Any, ...]) -> Callable[[], None]:
    """forward, a loss whose grad is dense, backward, grads cleared. (``functions.fwd_bwd``'s
    ``.sum()`` hands backward an expanded grad, one element seen 64 times: gloo's in-place
    all_reduce of it, in Megatron's ``_reduce``, writes past its storage in eager itself.)"""
    leaves = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]

    def step() -> None:
        out = call()
        (out * torch.linspace(-1.0, 1.0, out.shape[-1])).sum().backward()
        for t in leaves:
            t.grad = None

    return step


def _rank(rank: int, port: int, out: str, rounds: int, calls: int) -> None:
    import torch.distributed as dist

    import collective_functions as cf
    import minihop

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD, init_method=f"tcp://127.0.0.1:{port}",
                            timeout=datetime.timedelta(seconds=60))
    cf._TENSOR_MODEL_PARALLEL_GROUP = dist.new_group(list(range(WORLD)))
    found: dict[str, Any] = {}
    try:
        for label, pattern, shape in CASES:
            fn_cls = cf.PATTERNS[pattern][0]
            args = _args(pattern, shape)
            steps = {"eager": _step(lambda: fn_cls.apply(*args), args),
                     "minihop": _step(lambda: minihop.apply(fn_cls, *args), args)}
            for step in steps.values():  # warm: the capture, allocator, gloo's buffers
                for _ in range(5):
                    step()
            times: dict[str, list[float]] = {name: [] for name in steps}
            with gc_paused():
                for r in range(rounds):
                    for name in (("eager", "minihop") if r % 2 == 0 else ("minihop", "eager")):
                        dist.barrier()  # both ranks start the batch together
                        start = time.perf_counter_ns()
                        for _ in range(calls):
                            steps[name]()
                        times[name].append((time.perf_counter_ns() - start) / calls / 1e3)
            found[label] = times
        # Both ranks done before either tears gloo down: a rank that destroys its group while
        # the other still talks to it aborts the other ("terminate called without an active
        # exception", seen once in the suite's smoke run).
        dist.barrier()
    finally:
        Path(out, f"rank{rank}.json").write_text(json.dumps(found))
        dist.destroy_process_group()


def measure_collectives(rounds: int = 41, calls: int = 20) -> Table:
    """Spawn the two ranks, time every case, return the table."""
    import torch.multiprocessing as mp

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    out = tempfile.mkdtemp(prefix="minihop-bench-collectives-")
    mp.start_processes(_rank, args=(port, out, rounds, calls), nprocs=WORLD, start_method="spawn")
    ranks = [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(WORLD)]
    rows = []
    for label, _, _ in CASES:
        eager = statistics.median(ranks[0][label]["eager"])
        mine = statistics.median(ranks[0][label]["minihop"])
        ratios = [statistics.median(m / e for m, e in zip(rk[label]["minihop"], rk[label]["eager"], strict=True))
                  for rk in ranks]
        rows.append((label, f"{eager:.1f}", f"{mine:.1f}", *(f"{x:.2f}x" for x in ratios)))
    return Table(
        "(h) Tensor-parallel Functions on a 2-process gloo group: fwd+bwd per call",
        ("case", "eager F.apply µs (rank 0)", "minihop.apply hit µs (rank 0)",
         *(f"minihop / eager, rank {r}" for r in range(WORLD))),
        tuple(rows),
        (f"{rounds} rounds x {calls} calls of each variant, alternating which goes first; both ranks "
         "run the same schedule (a barrier before each batch). Ratios: median of the per-round ratios.",
         "Each step: forward, `(out * w).sum().backward()` (a dense grad), grads set to None; one intra-op thread per rank; "
         "gloo over 127.0.0.1 on one machine (the collectives' own time is in both columns).",
         "Where the extra time goes: the hit's guard and runtime Function (as table (b)), and, for "
         "an in-place collective, the functional form's copies: the op communicates a new tensor "
         "that `copy_` writes back into the buffer (Dynamo's graphs do the same), a cost that grows "
         "with the tensor (not measured apart here).",))


def section(table: Table, command: str, seconds: float) -> str:
    return (f"## Across processes: tensor-parallel Functions\n\nGenerated by `{command}` in "
            f"{seconds:.0f} s (torch {torch.__version__}, 1 thread per rank, {WORLD} ranks).\n\n"
            + table.to_markdown())
