"""(f) Many batch sizes: a training-style loop over 20 sizes, from empty caches, side by side.

Place: bench/. The loop applies one Function at 20 batch sizes (``SIZES``), fwd+bwd each step
(``functions.fwd_bwd``'s step), starting with nothing captured or compiled; its total time
includes every capture (compile) it needs. Variants, run round-robin in each repetition:

  eager F.apply            the baseline: no capture at all
  minihop automatic        ``minihop.function(F)``: the default policy (first size static,
                           then one symbolic capture; see ``minihop.cache``)
  minihop dynamic=False    static shapes: one capture per size
  compile eager            ``torch.compile(..., fullgraph=True)`` with a backend doing
                           ``backend="eager"``'s work (counts its graphs), after
                           ``torch.compiler.reset()``: Dynamo's automatic dynamic shapes

And the steady state of a symbolic capture: a hit at MySin 8x8 on the capture the automatic
policy made symbolic in dimension 0 (after sizes 5 and 6), against eager ``F.apply``, timed as
table (b) times ``minihop.apply``'s hit.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable
from typing import Any

import torch

import minihop

from .functions import MLP, MySin, RecordingBackend, compiled, fwd_bwd, grad_leaves, loss_of
from .timing import Table, Timing, gc_paused, time_interleaved, time_ns

__all__ = ["SIZES", "Sizes", "measure_sizes", "LOOP_EAGER", "AUTOMATIC", "STATIC", "COMPILE",
           "SYMBOLIC_HIT"]

SIZES = (8, 9, 3, 17, 2, 31, 5, 12, 7, 64, 6, 10, 4, 23, 15, 11, 33, 13, 16, 40)
LOOP_EAGER, AUTOMATIC, STATIC, COMPILE = ("eager F.apply", "minihop automatic",
                                          "minihop dynamic=False", "compile eager")
SYMBOLIC_HIT = "minihop hit, dim 0 symbolic"


@dataclasses.dataclass(frozen=True)
class Sizes:
    """``loop_ms[case][variant]``: total loop times (ms) per repetition; ``made[case][variant]``:
    captures (minihop) or graphs (Dynamo) the last repetition made; ``hit``: the steady-state
    timings at MySin 8x8 (eager and the symbolic capture's hit)."""

    table: Table
    loop_ms: dict[str, dict[str, list[float]]]
    made: dict[str, dict[str, int]]
    hit: dict[str, Timing]


def _batches(fn_cls: type, gen: torch.Generator) -> list[tuple[Any, ...]]:
    if fn_cls is MySin:
        return [(torch.randn(n, 8, generator=gen).requires_grad_(),) for n in SIZES]
    w1 = torch.randn(8, 16, generator=gen).requires_grad_()
    w2 = torch.randn(16, 4, generator=gen).requires_grad_()
    return [(torch.randn(n, 8, generator=gen).requires_grad_(), w1, w2) for n in SIZES]


def _loop(call: Callable[..., Any], batches: list[tuple[Any, ...]]) -> None:
    """The whole loop once: fwd+bwd at each size, grads cleared (as ``functions.fwd_bwd``)."""
    for args in batches:
        loss_of(call(*args)).backward()
        for t in grad_leaves(args):
            t.grad = None


def _variants(fn_cls: type, rep: int) -> dict[str, tuple[Callable[..., Any], Callable[[], int]]]:
    """Fresh callers (empty caches) and, for each, how many captures/graphs it made."""
    automatic = minihop.function(fn_cls)
    static = minihop.function(fn_cls, dynamic=False, cache_limit=len(SIZES))
    backend = RecordingBackend()
    torch.compiler.reset()
    dynamo = compiled(fn_cls, backend, f"sizes {rep}")
    return {
        LOOP_EAGER: (fn_cls.apply, lambda: 0),
        AUTOMATIC: (automatic.apply, lambda: automatic.stats.captures),
        STATIC: (static.apply, lambda: static.stats.captures),
        COMPILE: (dynamo, lambda: backend.graphs),
    }


def measure_sizes(reps: int = 5, *, budget_s: float = 0.3, min_rounds: int = 7) -> Sizes:
    """The 20-size loop for MySin and MLP, and the symbolic hit at MySin 8x8."""
    loop_ms: dict[str, dict[str, list[float]]] = {}
    made: dict[str, dict[str, int]] = {}
    for fn_cls in (MySin, MLP):
        name = f"{fn_cls.__name__}, {len(SIZES)} sizes"
        batches = _batches(fn_cls, torch.Generator().manual_seed(0))
        times: dict[str, list[float]] = {v: [] for v in (LOOP_EAGER, AUTOMATIC, STATIC, COMPILE)}
        for rep in range(reps):
            variants = _variants(fn_cls, rep)
            with gc_paused():
                for variant, (call, _) in variants.items():
                    times[variant].append(time_ns(lambda c=call: _loop(c, batches)) / 1e6)
            made[name] = {variant: count() for variant, (_, count) in variants.items()}
        loop_ms[name] = times
    hit = _symbolic_hit(budget_s, min_rounds)
    return Sizes(_table(loop_ms, made, hit), loop_ms, made, hit)


def _symbolic_hit(budget_s: float, min_rounds: int) -> dict[str, Timing]:
    x = torch.randn(8, 8, generator=torch.Generator().manual_seed(0)).requires_grad_()
    symbolic = minihop.function(MySin)
    for n in (5, 6):  # static at 5, then symbolic in dimension 0: the 8x8 calls hit that one
        symbolic.apply(torch.randn(n, 8))
    if symbolic.stats.captures != 2 or symbolic.captures[-1].dynamic_dims != {0: (0,)}:
        raise AssertionError(f"bench bug: expected a capture symbolic in dimension 0, got {symbolic}")
    steps = {LOOP_EAGER: fwd_bwd(lambda: MySin.apply(x), (x,)),
             SYMBOLIC_HIT: fwd_bwd(lambda: symbolic.apply(x), (x,))}
    return time_interleaved(steps, budget_s=budget_s, min_rounds=min_rounds)


def _table(loop_ms: dict[str, dict[str, list[float]]], made: dict[str, dict[str, int]],
           hit: dict[str, Timing]) -> Table:
    rows = []
    for name, times in loop_ms.items():
        compile_ms = statistics.median(times[COMPILE])
        for variant, samples in times.items():
            ms = statistics.median(samples)
            count = "-" if variant == LOOP_EAGER else str(made[name][variant])
            rows.append((f"{name}: {variant}", f"{ms:.1f} ({min(samples):.1f})", count,
                         f"{ms / compile_ms:.2f}x"))
    ratio = hit[SYMBOLIC_HIT].ratio_to(hit[LOOP_EAGER])
    rows.append((f"MySin 8x8: {SYMBOLIC_HIT}", f"{hit[SYMBOLIC_HIT].median_ns / 1e6:.4f} per call",
                 "-", f"{ratio:.2f}x eager F.apply"))
    notes = (
        f"The loop: batch sizes {', '.join(map(str, SIZES))}; x is (n, 8) (MLP: hidden 16, "
        "out 4, weights shared); each step forward, `loss.backward()`, grads cleared. Every "
        "variant starts from empty caches (a fresh `minihop.function`, `torch.compiler.reset()` "
        "and a fresh caller), so the totals include every capture or compile.",
        "Total ms: median over repetitions (min in brackets), variants run one after the other "
        "in each repetition. Captures: minihop's captures (automatic: the first size static, "
        "then one symbolic capture); for compile eager, the graphs Dynamo compiled (it "
        "recompiles once with the batch dimension symbolic).",
        "The last row: one step at MySin 8x8 on the capture the automatic policy made "
        "symbolic in dimension 0 (after sizes 5 and 6), paired ratio to eager `F.apply` as in "
        "table (b).",
    )
    return Table("(f) Many batch sizes: 20-size loop from empty caches", (
        "case: variant", "total ms (min)", "captures / graphs", "x compile eager"), tuple(rows), notes)
