"""(d) Capture time vs Function size: generated chains of 10, 100, 1000 elementwise ops.

Place: bench/. ``functions.make_chain(n)`` writes a Function whose forward is n ops and whose
backward is n ops. minihop's capture time and Dynamo's (recording ``eager`` backend, measured
as in ``capture_latency``) should both grow linearly in n: the table reports ms per op and a
least-squares slope; ``plot_scaling`` draws both on log-log axes when matplotlib is importable.
"""

from __future__ import annotations

import dataclasses
import gc
import statistics
import time
from pathlib import Path

import torch

import minihop

from .capture_latency import dynamo_capture_ns
from .functions import Warmup, make_chain
from .table import Table
from .timing import heap_frozen

__all__ = ["Scaling", "measure_scaling", "plot_scaling"]


@dataclasses.dataclass(frozen=True)
class Scaling:
    """``ms[who][n]``: median capture time for an n-op chain, who in ("minihop", "Dynamo eager")."""

    table: Table
    ms: dict[str, dict[int, float]]


def _slope(points: dict[int, float]) -> float:
    """Least-squares ms per op."""
    xs, ys = list(points), list(points.values())
    if len(xs) < 2:
        return ys[0] / xs[0]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)


def _reps(n: int, reps: int) -> int:
    return max(1, reps if n < 500 else reps // 2)


def _measure_sizes(sizes: tuple[int, ...], reps: int, dynamo: bool, x: torch.Tensor,
                   ms: dict[str, dict[int, float]]) -> None:
    for n in sizes:
        chain = make_chain(n)
        samples = []
        for _ in range(_reps(n, reps)):
            gc.collect()
            start = time.perf_counter_ns()
            minihop.capture(chain, x)
            samples.append(time.perf_counter_ns() - start)
        ms["minihop"][n] = statistics.median(samples) / 1e6
        if dynamo:
            ms["Dynamo eager"][n] = statistics.median(
                dynamo_capture_ns(chain, (x,), "eager", str(i)) for i in range(_reps(n, reps))) / 1e6


def measure_scaling(sizes: tuple[int, ...] = (10, 100, 1000), *, reps: int = 3,
                    dynamo: bool = True) -> Scaling:
    """Capture time of an n-op chain for each n, minihop vs Dynamo backend eager."""
    x = torch.randn(8, 8, requires_grad=True)
    minihop.capture(Warmup, x)
    if dynamo:
        dynamo_capture_ns(Warmup, (x,), "eager", "warmup")
    ms: dict[str, dict[int, float]] = {"minihop": {}, "Dynamo eager": {}}
    with heap_frozen():
        _measure_sizes(sizes, reps, dynamo, x, ms)
    whos = [w for w in ms if ms[w]]
    rows = []
    for n in sizes:
        cells: list[str] = [str(n)]
        for w in whos:
            cells += [f"{ms[w][n]:.1f}", f"{ms[w][n] / n:.3f}"]
        if dynamo:
            cells.append(f"{ms['Dynamo eager'][n] / ms['minihop'][n]:.1f}x")
        rows.append(tuple(cells))
    columns = ["ops (fwd; bwd has as many)"]
    for w in whos:
        columns += [f"{w} ms", f"{w} ms/op"]
    if dynamo:
        columns.append("minihop speed-up")
    notes = [f"Least-squares slope: " + "; ".join(f"{w} {_slope(ms[w]):.3f} ms/op" for w in whos) + "."]
    if len(sizes) >= 2:
        lo, hi = sizes[-2], sizes[-1]
        notes.append("Linearity, ms/op at {hi} over ms/op at {lo} (1.0 = linear): ".format(hi=hi, lo=lo)
                     + "; ".join(f"{w} {(ms[w][hi] / hi) / (ms[w][lo] / lo):.2f}" for w in whos) + ".")
    notes.append(f"Median of {reps} captures per size ({max(1, reps // 2)} at 500 ops and over); "
                 "Dynamo measured as in (a).")
    return Scaling(Table("(d) Capture time vs Function size", tuple(columns), tuple(rows), tuple(notes)), ms)


def plot_scaling(scaling: Scaling, path: Path) -> str:
    """Write the capture-time-vs-size PNG; returns a line saying what was done."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: no plot (pip install -e '.[bench]', then rerun)."
    fig, ax = plt.subplots(figsize=(5.5, 4))
    for who, points in scaling.ms.items():
        if points:
            ax.plot(list(points), list(points.values()), marker="o", label=who)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("elementwise ops in forward (backward has as many)")
    ax.set_ylabel("capture time, ms (warm)")
    ax.set_title("Capture time vs Function size")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return f"![Capture time vs Function size: minihop and Dynamo]({path.name})"
