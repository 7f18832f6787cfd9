"""(e) What a value guard costs per call: ``python -m bench guard-cost`` (and ``python -m bench``).

Place: bench/, beside (b) per call. A value-guarded Function (forward turns tensor data into a
Python value, so every call first recomputes that value from the inputs and compares it) is
timed fwd+bwd, interleaved round by round (``timing.time_interleaved``), as ratios to eager
``F.apply`` in the same run:

  eager F.apply          the baseline (and again, A/A: the noise of the ratios)
  minihop.apply hit      the cache hit, value guards included
  cap.run(args)          the same capture without any guard check (and without the value's
                         own computation: the capture holds it as a constant)
  compile eager          ``torch.compile(caller, backend="eager")`` (``fullgraph=False``:
                         Dynamo graph-breaks or errors with ``fullgraph=True`` on these)

The Functions come from ``tests/data_functions.py`` (docs/parity.md's data-dependent idioms), with MySin
(no value guard) as the reference for what a hit costs without one. The table goes into
``bench/RESULTS.md`` between ``<!-- guard-cost:start -->`` and ``<!-- guard-cost:end -->``
(``--no-write`` prints only); ``python -m bench`` measures and writes the same section.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

import minihop

from .functions import MySin, fresh_caller, fwd_bwd
from .parity_data import idiom_named  # the idioms of tests/data_functions.py
from .per_call import AA, APPLY, EAGER, RUN
from .timing import Table, time_interleaved

__all__ = ["CASES", "MARKER", "VARIANTS", "measure_guard_cost", "section"]

MARKER = "guard-cost"
COMPILE = "compile eager"
VARIANTS = (AA, APPLY, RUN, COMPILE)


def _x(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0)).requires_grad_(True)


def _equal_pair() -> tuple[torch.Tensor, torch.Tensor]:
    x = _x(8, 8)
    return x, x.detach().clone().requires_grad_(True)


# (label, Function, arguments)
CASES: tuple[tuple[str, type, Callable[[], tuple[Any, ...]]], ...] = (
    ("MySin 8x8 (no value guard)", MySin, lambda: (_x(8, 8),)),
    ("ScaleByMax 8x8 (`x.abs().max().item()`: unbacked, no guard)", idiom_named("ScaleByMax").function,
     lambda: (_x(8, 8),)),
    ("SameOrNot 8x8 (`torch.equal(x1, x2)`)", idiom_named("SameOrNot").function, _equal_pair),
    ("BranchOnSum 8x8 (`if x.sum() > 0`)", idiom_named("BranchOnSum").function, lambda: (_x(8, 8),)),
    ("BranchOnSumInBackward 8x8 (guard before backward)", idiom_named("BranchOnSumInBackward").function,
     lambda: (_x(8, 8),)),
    ("BranchOnSum 256x1024", idiom_named("BranchOnSum").function, lambda: (_x(256, 1024),)),
)


def measure_guard_cost(*, budget_s: float = 0.3, min_rounds: int = 11) -> Table:
    rows = []
    for label, fn_cls, make in CASES:
        args = make()
        cap = minihop.capture(fn_cls, *args)
        compiled = torch.compile(fresh_caller(fn_cls, f"guard cost {label}"), backend="eager")
        guards = sum(1 for r in cap.data_reads if r.kind == "guarded")
        steps = {EAGER: fwd_bwd(lambda f=fn_cls, a=args: f.apply(*a), args),
                 AA: fwd_bwd(lambda f=fn_cls, a=args: f.apply(*a), args),
                 APPLY: fwd_bwd(lambda f=fn_cls, a=args: minihop.apply(f, *a), args),
                 RUN: fwd_bwd(lambda c=cap, a=args: c.run(a), args),
                 COMPILE: fwd_bwd(lambda c=compiled, a=args: c(*a), args)}
        t = time_interleaved(steps, budget_s=budget_s, min_rounds=min_rounds)
        base = t[EAGER]
        rows.append((label, str(guards), f"{base.median_ns / 1e3:.1f}",
                     *(t[v].cell(base) for v in VARIANTS),
                     f"{base.rounds} x {base.per_round}"))
    columns = ("case", "value guards", f"{EAGER} µs", *(f"{v} x eager (µs)" for v in VARIANTS),
               "rounds x calls")
    notes = ("Each step: forward, `loss.backward()`, grads set to None (as table (b)); paired "
             "ratios to eager in the same round, medians over rounds.",
             "`value guards`: the capture's value checks, each a small graph run on the call's "
             "inputs before the captured forward (or, for a backward read, on the grads and "
             "saved values before the captured backward). `minihop.apply hit` minus `cap.run(args)` is "
             "the whole check of a hit (call key, Python-state and value guards); `cap.run` "
             "also skips computing the value itself (a constant of the capture), so it can be "
             "below eager.",
             "`compile eager`: `torch.compile(backend=\"eager\")` with its default "
             "`fullgraph=False` (see docs/parity.md's data-dependent rows for why not "
             "`fullgraph=True`).")
    return Table("(e) Value-guard cost per call (fwd+bwd)", columns, tuple(rows), notes)


def section(table: Table, command: str, seconds: float) -> str:
    return (f"## Value-guard cost\n\nGenerated by `{command}` in {seconds:.0f} s (torch "
            f"{torch.__version__}, {torch.get_num_threads()} thread).\n\n" + table.to_markdown())

