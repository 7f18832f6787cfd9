"""(b) Steady-state fwd+bwd time per call, as ratios to eager ``F.apply`` in the same run; where
the time of a small step goes, layer by layer, and its profile (for a missed per-call target).

Place: bench/. For each case every variant runs the same step (``functions.fwd_bwd``), interleaved
(``timing.time_interleaved``). Variants:

  eager              ``F.apply(*args)``, the baseline
  eager (A/A)        the baseline again: its ratio shows the measurement's own noise
  cap(*args)         ``minihop.capture`` once, then call it (guard check included)
  cap.run(args)      the same without the guard check
  minihop.apply      the cache hit of ``minihop.apply(F, *args)``
  compile aot_eager  ``torch.compile(..., fullgraph=True, backend="aot_eager")``
  compile inductor   the same with ``"inductor"`` (when it works on this machine)
  ops only           forward then backward called by hand under ``no_grad``: the floor
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

import minihop

from .functions import CASES, Case, MySin, compiled, fresh_caller, fwd_bwd, ops_only
from .timing import Profile, Table, Timing, profile, time_interleaved

__all__ = ["PerCall", "inductor_problem", "measure_per_call", "per_call_breakdown", "profile_per_call",
           "EAGER", "AA", "CAP", "RUN", "APPLY", "AOT", "INDUCTOR", "FLOOR"]

EAGER, AA, CAP, RUN, APPLY = "eager F.apply", "eager (A/A)", "cap(*args)", "cap.run(args)", "minihop.apply hit"
AOT, INDUCTOR, FLOOR = "compile aot_eager", "compile inductor", "ops only (floor)"

_inductor_problem: list[str | None] = []


def inductor_problem() -> str | None:
    """None when ``torch.compile(backend="inductor")`` compiles and runs fwd+bwd here;
    otherwise why not (checked once per process, on MySin)."""
    if not _inductor_problem:
        try:
            x = torch.randn(4, requires_grad=True)
            fn = torch.compile(fresh_caller(MySin, "probe"), fullgraph=True, backend="inductor")
            fn(x).sum().backward()
            torch.testing.assert_close(x.grad, x.detach().cos())
            _inductor_problem.append(None)
        except Exception as e:  # noqa: BLE001 - any failure means "not available here"
            _inductor_problem.append(f"{type(e).__name__}: {str(e).strip().splitlines()[0][:200] if str(e).strip() else ''}")
    return _inductor_problem[0]


@dataclasses.dataclass(frozen=True)
class PerCall:
    """``timings[case][variant]``; ``inductor`` is None when it ran, else why it did not."""

    table: Table
    timings: dict[str, dict[str, Timing]]
    inductor: str | None


def _steps(case: Case, args: tuple[Any, ...], inductor: bool) -> dict[str, Callable[[], None]]:
    F = case.function
    cap = minihop.capture(F, *args)
    steps = {
        EAGER: fwd_bwd(lambda: F.apply(*args), args),
        AA: fwd_bwd(lambda: F.apply(*args), args),
        CAP: fwd_bwd(lambda: cap(*args), args),
        RUN: fwd_bwd(lambda: cap.run(args), args),
        APPLY: fwd_bwd(lambda: minihop.apply(F, *args), args),
    }
    aot = compiled(F, "aot_eager", case.name)
    _add_if_compiles(steps, AOT, fwd_bwd(lambda: aot(*args), args))
    if inductor:
        ind = compiled(F, "inductor", case.name)
        _add_if_compiles(steps, INDUCTOR, fwd_bwd(lambda: ind(*args), args))
    steps[FLOOR] = ops_only(F, args)
    return steps


def _add_if_compiles(steps: dict[str, Callable[[], None]], name: str, step: Callable[[], None]) -> None:
    """A compiled step, unless ``fullgraph=True`` refuses the Function (a graph break: the
    table says so instead of a time)."""
    try:
        step()
    except torch._dynamo.exc.Unsupported:
        return
    steps[name] = step


def measure_per_call(cases: tuple[Case, ...] = CASES, *, budget_s: float = 0.3, min_rounds: int = 7,
                     inductor: bool = True) -> PerCall:
    """Per-call fwd+bwd timings of every variant for every case."""
    problem = inductor_problem() if inductor else "skipped (--no-inductor or --quick)"
    with_inductor = problem is None
    timings: dict[str, dict[str, Timing]] = {}
    for case in cases:
        args = case.make_args()
        timings[case.name] = time_interleaved(_steps(case, args, with_inductor), budget_s=budget_s,
                                              min_rounds=min_rounds)
    variants = (AA, CAP, RUN, APPLY, AOT, *((INDUCTOR,) if with_inductor else ()), FLOOR)
    columns = ("case", f"{EAGER} µs (min)", *(f"{v} x eager (µs)" for v in variants), "rounds x calls")
    rows = []
    for case in cases:
        t = timings[case.name]
        base = t[EAGER].median_ns
        rows.append((case.name, f"{base / 1e3:.1f} ({t[EAGER].min_ns / 1e3:.1f})",
                     *(t[v].cell(t[EAGER]) if v in t else "graph break" for v in variants),
                     f"{t[EAGER].rounds} x {t[EAGER].per_round}"))
    notes = [
        "Each step: forward, `loss.backward()` (loss = sum of `.sum()` of the outputs), grads "
        "set to None. Times (µs) are medians over rounds of the mean of a batch of calls "
        "(~2 ms per batch); variants interleaved round by round; gc off while timing.",
        "Ratios (x eager) are the median over rounds of the variant's batch time over eager's "
        "in the same round (paired, so that a slow stretch of a shared machine cancels out).",
        "`eager (A/A)` is eager timed again as if it were another variant: its distance from "
        "1.00x is the noise of these ratios.",
        "`ops only (floor)`: the Function's forward and backward called by hand under no_grad "
        "(same tensor ops, no autograd).",
    ]
    if not with_inductor:
        notes.append(f"compile inductor: not available: {problem}")
    return PerCall(Table("(b) Steady-state fwd+bwd per call", columns, tuple(rows), tuple(notes)),
                   timings, problem)


def per_call_breakdown(per_call: PerCall, case_name: str) -> Table | None:
    """Where the per-call time of one case goes, from the interleaved timings."""
    t = per_call.timings.get(case_name)
    if t is None:
        return None
    us = {v: t[v].median_ns / 1e3 for v in (EAGER, FLOOR, RUN, CAP, APPLY)}
    rows = (
        ("the ops themselves, no autograd (floor)", f"{us[FLOOR]:.1f}", "-"),
        ("eager `F.apply`: + autograd and Function machinery", f"{us[EAGER]:.1f}",
         f"+{us[EAGER] - us[FLOOR]:.1f} over floor"),
        ("`cap.run(args)`: + minihop's runtime (fetch, generated fwd/bwd code, rebuild)",
         f"{us[RUN]:.1f}", f"{us[RUN] - us[EAGER]:+.1f} vs eager"),
        ("`cap(*args)`: + binding and guard check", f"{us[CAP]:.1f}", f"{us[CAP] - us[RUN]:+.1f} vs run"),
        ("`minihop.apply` hit: + cache key and lookup instead", f"{us[APPLY]:.1f}",
         f"{us[APPLY] - us[RUN]:+.1f} vs run"),
    )
    return Table(f"Per-call breakdown, {case_name} (µs per fwd+bwd step, medians)",
                 ("layer", "µs", "difference"), rows)


def profile_per_call(calls: int = 2000, top: int = 15, shape: tuple[int, ...] = (8, 8),
                     via: str = "cap") -> Profile:
    """Profile ``calls`` fwd+bwd steps of MySin through ``cap(*args)`` (``via="cap"``) or
    the ``minihop.apply`` cache hit (``via="apply"``)."""
    x = torch.randn(*shape, requires_grad=True)
    cap = minihop.capture(MySin, x)
    if via == "cap":
        step, label = fwd_bwd(lambda: cap(x), (x,)), "`cap(*args)`"
    elif via == "apply":
        step, label = fwd_bwd(lambda: minihop.apply(MySin, x), (x,)), "the `minihop.apply` hit"
    else:
        raise ValueError(f"via must be 'cap' or 'apply', got {via!r}")
    for _ in range(50):
        step()

    def run() -> None:
        for _ in range(calls):
            step()

    return profile(f"{calls} fwd+bwd steps of MySin {'x'.join(map(str, shape))} through {label}", run, top=top)
