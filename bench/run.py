"""``python -m bench`` / ``python bench/run.py``: every measurement, printed, then RESULTS.md.

Place: bench/, the entry point. Runs (a) capture latency warm and cold, (b) per-call fwd+bwd,
(c) saved bytes, (d) capture scaling, (e) the per-call cost of value guards (written as the
``guard-cost`` marked section, as ``python -m bench.guard_cost`` writes it), (f) the 20-size loop,
checks the targets, profiles where a target is missed, and writes ``bench/RESULTS.md`` (and
``bench/capture_scaling.png`` when matplotlib is there).
``--quick`` runs the same with fewer repetitions (~30 s) and writes nothing unless ``--output``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    # ``python bench/run.py``: make ``bench`` importable as a package (and keep bench/ itself
    # off sys.path, where its module names could shadow others).
    _root = str(Path(__file__).resolve().parent.parent)
    sys.path[:1] = [_root]
    __package__ = "bench"  # noqa: A001

import torch

from . import guard_cost
from .capture_latency import measure_cold, measure_warm
from .functions import CASES, GUARDED_CASES, SAVED_EXTRA_CASES, Case, case_named, make_chain
from .per_call import measure_per_call
from .profiling import Profile, profile_capture, profile_per_call
from .report import keep_marked_sections, per_call_breakdown, render, update_section
from .saved import measure_saved
from .scaling import measure_scaling, plot_scaling
from .sizes import measure_sizes
from .table import Table
from .targets import CAPTURE_GROUP, PER_CALL_GROUP, check_targets
from .timing import machine_facts

__all__ = ["FULL", "QUICK", "Settings", "main"]

HERE = Path(__file__).resolve().parent


@dataclasses.dataclass(frozen=True)
class Settings:
    """Repetition counts and budgets for one run."""

    capture_small_only: bool
    capture_reps: int
    dynamo_reps: int
    cold: bool
    cold_reps: int
    cold_backends: tuple[str, ...]
    per_call_budget_s: float
    per_call_min_rounds: int
    inductor: bool
    scaling_sizes: tuple[int, ...]
    scaling_reps: int
    profile_calls: int
    sizes_reps: int


FULL = Settings(capture_small_only=False, capture_reps=7, dynamo_reps=3, cold=True, cold_reps=2,
                cold_backends=("eager", "aot_eager"), per_call_budget_s=0.3, per_call_min_rounds=11,
                inductor=True, scaling_sizes=(10, 100, 1000), scaling_reps=3, profile_calls=2000,
                sizes_reps=5)
QUICK = Settings(capture_small_only=True, capture_reps=3, dynamo_reps=1, cold=False, cold_reps=1,
                 cold_backends=("eager",), per_call_budget_s=0.05, per_call_min_rounds=5, inductor=False,
                 scaling_sizes=(10, 100, 300), scaling_reps=1, profile_calls=2000, sizes_reps=1)


def _show(table: Table, since: float | None = None) -> None:
    print(table.to_text(), flush=True)
    if since is not None:
        print(f"  [{time.perf_counter() - since:.1f} s]\n", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (~30 s): capture of the small cases only, no cold runs, no inductor")
    parser.add_argument("--no-inductor", action="store_true", help="skip torch.compile(backend='inductor')")
    parser.add_argument("--no-cold", action="store_true", help="skip the fresh-process captures")
    parser.add_argument("--output", type=Path, default=None,
                        help="where to write the results (default bench/RESULTS.md; --quick: nowhere)")
    options = parser.parse_args(argv)
    settings = QUICK if options.quick else FULL
    if options.no_inductor:
        settings = dataclasses.replace(settings, inductor=False)
    output = options.output or (None if options.quick else HERE / "RESULTS.md")

    torch.set_num_threads(1)
    start = time.perf_counter()
    facts = machine_facts()
    print("; ".join(f"{k}: {v}" for k, v in facts.items()), flush=True)

    tables: list[Table] = []
    t = time.perf_counter()
    capture_cases = tuple(c for c in CASES if c.small) if settings.capture_small_only else CASES
    warm = measure_warm(capture_cases, reps=settings.capture_reps, dynamo_reps=settings.dynamo_reps)
    tables.append(warm.table)
    _show(warm.table, t)
    t = time.perf_counter()
    if settings.cold and not options.no_cold:
        cold = measure_cold("MySin 8x8", reps=settings.cold_reps, backends=settings.cold_backends)
        tables.append(cold.table)
        _show(cold.table, t)
    t = time.perf_counter()
    per_call = measure_per_call((*CASES, *GUARDED_CASES), budget_s=settings.per_call_budget_s,
                                min_rounds=settings.per_call_min_rounds, inductor=settings.inductor)
    tables.append(per_call.table)
    _show(per_call.table, t)
    t = time.perf_counter()
    guards = guard_cost.measure_guard_cost(budget_s=settings.per_call_budget_s,
                                           min_rounds=settings.per_call_min_rounds)
    guards_seconds = time.perf_counter() - t
    _show(guards, t)
    t = time.perf_counter()
    saved = measure_saved((*CASES, *SAVED_EXTRA_CASES))
    tables.append(saved.table)
    _show(saved.table, t)
    t = time.perf_counter()
    scaling = measure_scaling(settings.scaling_sizes, reps=settings.scaling_reps)
    tables.append(scaling.table)
    _show(scaling.table, t)
    t = time.perf_counter()

    sizes = measure_sizes(settings.sizes_reps, budget_s=settings.per_call_budget_s,
                          min_rounds=settings.per_call_min_rounds)
    tables.append(sizes.table)
    _show(sizes.table, t)
    t = time.perf_counter()

    targets = check_targets(CASES, warm=warm, per_call=per_call, saved=saved, sizes=sizes)
    _show(targets.table)
    breakdown = per_call_breakdown(per_call, "MySin 8x8")
    per_call_profiles: list[Profile] = []
    capture_profiles: list[Profile] = []
    if targets.missed[PER_CALL_GROUP]:
        if breakdown is not None:
            _show(breakdown)
        per_call_profiles = [profile_per_call(settings.profile_calls),
                             profile_per_call(settings.profile_calls, via="apply")]
    if targets.missed[CAPTURE_GROUP]:
        chain = Case("chain of 100 ops", make_chain(100), True,
                     lambda: (torch.randn(8, 8, requires_grad=True),))
        capture_profiles = [profile_capture(case_named("MySin 8x8")), profile_capture(chain, reps=2)]
    for p in (*capture_profiles, *per_call_profiles):
        print(f"{p.what}, top by cumulative time:\n{p.cumulative}\nminihop's own:\n{p.minihop_own}",
              flush=True)

    elapsed = time.perf_counter() - start
    facts["load average at end (1, 5, 15 min)"] = ", ".join(f"{v:.2f}" for v in os.getloadavg())
    facts["note"] = ("the machine may be shared: other processes' load shows in the absolute "
                     "times; the paired ratios and the A/A column show how much it moved them")
    if output is not None:
        output.parent.mkdir(parents=True, exist_ok=True)
        plot_note = plot_scaling(scaling, output.parent / "capture_scaling.png")
        command = "python -m bench" + (" " + " ".join(argv if argv is not None else sys.argv[1:])).rstrip()
        text = render(facts=facts, command=command.strip(), elapsed_s=elapsed, targets=targets,
                      tables=tables, breakdown=breakdown, per_call_profiles=per_call_profiles,
                      capture_profiles=capture_profiles, plot_note=plot_note)
        text = update_section(text, guard_cost.section(guards, command.strip(), guards_seconds),
                              guard_cost.MARKER)
        old = output.read_text() if output.exists() else ""
        output.write_text(keep_marked_sections(old, text))
        print(f"wrote {output} ({plot_note})")
    print(f"bench: done in {elapsed:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
