"""Shared helpers of every measurement: ``Table``, interleaved timing, profiles, machine facts.

Place: bench/, under every question's module (nothing here knows a benchmark Function). The
invariant: variants compared as a ratio are timed in the same process, interleaved round by
round (each round runs every variant once, in a shuffled order), so that a slow stretch of the
machine lands on all of them alike. A ``Table``'s first column is each row's label (a case, a
variant, a size); tests check the labels, never the numbers.
"""

from __future__ import annotations

import cProfile
import dataclasses
import datetime
import gc
import io
import math
import os
import platform
import pstats
import random
import statistics
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

__all__ = ["Profile", "Table", "Timing", "collected_ns", "gc_paused", "heap_frozen", "machine_facts",
           "profile", "time_interleaved", "time_ns"]


@dataclasses.dataclass(frozen=True)
class Table:
    """A titled markdown table with notes under it."""

    title: str
    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    notes: tuple[str, ...] = ()

    @property
    def labels(self) -> tuple[str, ...]:
        return tuple(row[0] for row in self.rows)

    def to_markdown(self, level: int = 3, *, heading: bool = True) -> str:
        lines = [f"{'#' * level} {self.title}", ""] if heading else []
        lines.append("| " + " | ".join(self.columns) + " |")
        lines.append("|" + "|".join("---" for _ in self.columns) + "|")
        for row in self.rows:
            if len(row) != len(self.columns):
                raise AssertionError(f"bench bug: row {row!r} does not fit columns {self.columns!r}")
            lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |")
        if self.notes:
            lines.append("")
            lines.extend(f"- {note}" for note in self.notes)
        return "\n".join(lines) + "\n"

    def to_text(self) -> str:
        widths = [max(len(c), *(len(r[i]) for r in self.rows)) if self.rows else len(c)
                  for i, c in enumerate(self.columns)]
        out = [self.title, "=" * len(self.title)]
        out.append("  ".join(c.ljust(w) for c, w in zip(self.columns, widths, strict=True)))
        out.append("  ".join("-" * w for w in widths))
        for row in self.rows:
            out.append("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)))
        out.extend(f"  * {note}" for note in self.notes)
        return "\n".join(out) + "\n"


@dataclasses.dataclass(frozen=True)
class Timing:
    """Per-call times of one variant: one sample per round, the mean over a batch of calls."""

    samples_ns: tuple[float, ...]
    per_round: int

    @property
    def rounds(self) -> int:
        return len(self.samples_ns)

    @property
    def median_ns(self) -> float:
        return statistics.median(self.samples_ns)

    @property
    def min_ns(self) -> float:
        return min(self.samples_ns)

    @property
    def rel_iqr(self) -> float:
        """Interquartile range over median: the round-to-round spread."""
        if len(self.samples_ns) < 4:
            return (max(self.samples_ns) - self.min_ns) / self.median_ns
        q1, _, q3 = statistics.quantiles(self.samples_ns, n=4, method="inclusive")
        return (q3 - q1) / self.median_ns

    def ratio_to(self, base: Timing) -> float:
        """Median over rounds of this variant's time over ``base``'s in the same round (the
        two batches ran next to each other, so a slow stretch of the machine cancels out);
        the ratio of the medians when the rounds do not pair up."""
        if len(self.samples_ns) != len(base.samples_ns):
            return self.median_ns / base.median_ns
        return statistics.median(a / b for a, b in zip(self.samples_ns, base.samples_ns, strict=True))

    def ratio_interval(self, base: Timing) -> tuple[float, float]:
        """A ~95% confidence interval for ``ratio_to(base)``: the order statistics of the
        per-round ratios at ranks n/2 -+ 0.98 sqrt(n) (distribution-free, for a median)."""
        if len(self.samples_ns) != len(base.samples_ns):
            ratio = self.ratio_to(base)
            return ratio, ratio
        ratios = sorted(a / b for a, b in zip(self.samples_ns, base.samples_ns, strict=True))
        n = len(ratios)
        half = 0.98 * math.sqrt(n)
        lo = max(0, math.floor(n / 2 - half))
        hi = min(n - 1, math.ceil(n / 2 + half) - 1)
        return ratios[lo], ratios[hi]

    def cell(self, base: Timing) -> str:
        """A table cell: the paired ratio to ``base`` and this variant's median µs."""
        return f"{self.ratio_to(base):.2f}x ({self.median_ns / 1e3:.1f})"


@contextmanager
def heap_frozen() -> Iterator[None]:
    """Collect once, then freeze what is alive (``gc.freeze``) for the block, so that the
    collections the measurements run (or that land in them) only walk the objects made since.
    Once torch._dynamo is loaded, a full collection takes a few hundred ms."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


@contextmanager
def gc_paused() -> Iterator[None]:
    """Collect the young generations, then keep the collector off (as ``timeit`` does)."""
    gc.collect(1)
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def time_ns(fn: Callable[[], Any]) -> float:
    """Wall time of one call of ``fn``, in nanoseconds."""
    start = time.perf_counter_ns()
    fn()
    return float(time.perf_counter_ns() - start)


def collected_ns(fn: Callable[[], Any]) -> float:
    """``time_ns(fn)`` right after a full collection (one capture, one compile: a collection
    landing inside it would be charged to it)."""
    gc.collect()
    return time_ns(fn)


def time_interleaved(steps: Mapping[str, Callable[[], Any]], *, budget_s: float = 0.3,
                     batch_s: float = 0.002, min_rounds: int = 7, max_rounds: int = 400,
                     warmup: int = 20) -> dict[str, Timing]:
    """Per-call timings of each step, interleaved in many short rounds.

    Each step is first warmed up (``warmup`` calls, fewer when a call is slow; the first call,
    which may compile, is not timed). From the warm-up's median, a batch of about ``batch_s``
    per round and the number of rounds that gives the slowest step about ``budget_s`` in all
    (at least ``min_rounds``) are chosen. Each round runs every step's batch once, in an order
    shuffled from round to round (seeded): no step always follows the same other one, so that
    none always inherits warm caches from a twin (or cold ones from a stranger).
    """
    names = list(steps)
    estimate: dict[str, float] = {}
    for name in names:
        fn = steps[name]
        fn()  # may compile
        samples = [time_ns(fn)]
        samples += [time_ns(fn) for _ in range(min(warmup, int(0.05e9 / max(samples[0], 1.0))))]
        estimate[name] = max(statistics.median(samples), 1.0)
    per_round = {name: max(1, round(batch_s * 1e9 / est)) for name, est in estimate.items()}
    round_ns = max(per_round[name] * estimate[name] for name in names)
    n_rounds = max(min_rounds, min(max_rounds, int(budget_s * 1e9 / round_ns)))
    samples_of: dict[str, list[float]] = {name: [] for name in names}
    shuffler = random.Random(0)
    with gc_paused():
        for _ in range(n_rounds):
            order = shuffler.sample(names, len(names))
            for name in order:
                fn, k = steps[name], per_round[name]
                start = time.perf_counter_ns()
                for _ in range(k):
                    fn()
                samples_of[name].append((time.perf_counter_ns() - start) / k)
    return {name: Timing(tuple(samples_of[name]), per_round[name]) for name in names}


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _minihop_revision() -> str:
    """The git commit of the minihop being measured, and whether its files differ from it."""
    import minihop

    package = Path(minihop.__file__).resolve().parent
    try:
        sha = subprocess.run(["git", "-C", str(package), "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(package), "status", "--porcelain", "--", "."],
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return f"{package} (not a git checkout)"
    return f"commit {sha}" + (" with uncommitted changes under minihop/" if dirty else " (clean)")


def machine_facts() -> dict[str, str]:
    """What the numbers were measured on."""
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count() or 0
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "CPU": _cpu_model(),
        "cores": f"{os.cpu_count()} logical ({usable} usable by this process)",
        "python": platform.python_version(),
        "torch": torch.__version__,
        "minihop": _minihop_revision(),
        "torch threads": f"{torch.get_num_threads()} intra-op, {torch.get_num_interop_threads()} inter-op",
        "platform": platform.platform(),
        "load average at start (1, 5, 15 min)": ", ".join(f"{v:.2f}" for v in os.getloadavg()),
    }


@dataclasses.dataclass(frozen=True)
class Profile:
    """A cProfile's headline: what ran; top rows by cumulative time, by own time, minihop's own
    functions by own time (paths from the repository root), and optionally a shares table."""

    what: str
    cumulative: str
    own: str
    minihop_own: str
    shares: str = ""


def _excerpt(profiler: cProfile.Profile, sort: str, top: int, only: str = "") -> str:
    stream = io.StringIO()
    stats = pstats.Stats(profiler, stream=stream)
    (stats if only else stats.strip_dirs()).sort_stats(sort).print_stats(*((only,) if only else ()), top)
    text = stream.getvalue()
    start = text.find("   ncalls")
    return text[start:].rstrip() + "\n" if start >= 0 else text


def profile(what: str, run: Callable[[], Any], *, top: int = 15,
            shares: Callable[[dict[Any, Any]], str] | None = None) -> Profile:
    """cProfile of one call of ``run``; ``shares`` turns the raw pstats dict into a table."""
    import minihop

    root = str(Path(minihop.__file__).resolve().parent.parent) + "/"
    profiler = cProfile.Profile()
    profiler.enable()
    run()
    profiler.disable()
    raw = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    return Profile(what, _excerpt(profiler, "cumulative", top), _excerpt(profiler, "tottime", top),
                   _excerpt(profiler, "tottime", top, r"/minihop/").replace(root, ""),
                   shares(raw) if shares else "")
