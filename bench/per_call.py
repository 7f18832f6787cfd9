"""(b) Steady-state fwd+bwd time per call, as ratios to eager ``F.apply`` in the same run.

Place: bench/. For each case every variant runs the same step (``steps.fwd_bwd``), interleaved
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

from .functions import CASES, Case
from .steps import compiled, fresh_caller, fwd_bwd, ops_only
from .table import Table
from .timing import Timing, time_interleaved

__all__ = ["PerCall", "inductor_problem", "measure_per_call", "EAGER", "AA", "CAP", "RUN", "APPLY",
           "AOT", "INDUCTOR", "FLOOR"]

EAGER, AA, CAP, RUN, APPLY = "eager F.apply", "eager (A/A)", "cap(*args)", "cap.run(args)", "minihop.apply hit"
AOT, INDUCTOR, FLOOR = "compile aot_eager", "compile inductor", "ops only (floor)"

_inductor_problem: list[str | None] = []


def inductor_problem() -> str | None:
    """None when ``torch.compile(backend="inductor")`` compiles and runs fwd+bwd here;
    otherwise why not (checked once per process)."""
    if not _inductor_problem:
        try:
            x = torch.randn(4, requires_grad=True)
            fn = torch.compile(fresh_caller(_Probe, "probe"), fullgraph=True, backend="inductor")
            fn(x).sum().backward()
            torch.testing.assert_close(x.grad, 2 * x.detach())
            _inductor_problem.append(None)
        except Exception as e:  # noqa: BLE001 - any failure means "not available here"
            _inductor_problem.append(f"{type(e).__name__}: {str(e).strip().splitlines()[0][:200] if str(e).strip() else ''}")
    return _inductor_problem[0]


class _Probe(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return 2 * grad * x


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
                     *(f"{t[v].ratio_to(t[EAGER]):.2f}x ({t[v].median_ns / 1e3:.1f})" if v in t
                       else "graph break" for v in variants),
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
