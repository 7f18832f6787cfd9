"""``python -m bench [question]``: the one entry point of minihop's benchmarks.

Place: bench/, above every question's module. Without a question it runs the speed benchmarks:
(a) capture latency warm and cold, (b) per-call fwd+bwd, (c) saved bytes, (d) capture scaling,
(e) the per-call cost of value guards (the ``guard-cost`` marked section, as
``python -m bench guard-cost`` writes it), (f) the 20-size loop, checks the targets, profiles
where a target is missed, and writes ``bench/RESULTS.md`` (and ``bench/capture_scaling.png``
when matplotlib is there); ``--quick`` runs the same with fewer repetitions (~30 s) and writes
nothing unless ``--output``. The questions run on their own:

  guard-cost   (e) only, into its marked section of RESULTS.md
  fuzz         the differential fuzzer's long budget, into its marked section (bench/fuzz.py)
  parity-data  docs/parity.md's data-dependent parity rows (bench/parity_data.py), ``--write`` into it
  gpu          minihop on CUDA against eager, streams included, and its per-call cost (bench/gpu.py)
  collectives  (h) tensor-parallel Functions on a 2-process gloo group, minihop against eager,
               into its marked section (bench/collectives.py)
  floor        (g) capture against its floor (fake-tensor propagation alone) and Dynamo, warm at
               1 to 1,000 ops and cold, into its marked section (bench/floor.py)
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from . import floor, gpu, guard_cost, parity_data
from .capture import measure_cold, measure_scaling, measure_warm, plot_scaling, profile_capture
from .functions import CASES, GUARDED_CASES, SAVED_EXTRA_CASES, Case, case_named, make_chain
from .per_call import measure_per_call, per_call_breakdown, profile_per_call
from .report import CAPTURE_GROUP, PER_CALL_GROUP, check_targets, keep_marked_sections, render, update_section
from .saved import measure_saved
from .sizes import measure_sizes
from .timing import Profile, Table, machine_facts

__all__ = ["FULL", "QUICK", "Settings", "main"]

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "RESULTS.md"


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


def _write_section(path: Path, section: str, marker: str) -> None:
    path.write_text(update_section(path.read_text() if path.exists() else None, section, marker))
    print(f"wrote the {marker} section of {path}")


def _speed(options: argparse.Namespace, command: str) -> int:
    """Every speed table, the targets, the profiles of the misses; then RESULTS.md."""
    settings = QUICK if options.quick else FULL
    if options.no_inductor:
        settings = dataclasses.replace(settings, inductor=False)
    output = options.output or (None if options.quick else RESULTS)
    start = time.perf_counter()
    facts = machine_facts()
    print("; ".join(f"{k}: {v}" for k, v in facts.items()), flush=True)

    tables: list[Table] = []

    def measured(measure: Callable[[], Any]) -> Any:
        """``measure()``, its table printed (with its seconds) and kept for RESULTS.md."""
        t = time.perf_counter()
        result = measure()
        _show(result.table, t)
        tables.append(result.table)
        return result

    capture_cases = tuple(c for c in CASES if c.small) if settings.capture_small_only else CASES
    warm = measured(lambda: measure_warm(capture_cases, reps=settings.capture_reps, dynamo_reps=settings.dynamo_reps))
    if settings.cold and not options.no_cold:
        measured(lambda: measure_cold("MySin 8x8", reps=settings.cold_reps, backends=settings.cold_backends))
    per_call = measured(lambda: measure_per_call((*CASES, *GUARDED_CASES), budget_s=settings.per_call_budget_s,
                                                 min_rounds=settings.per_call_min_rounds, inductor=settings.inductor))
    t = time.perf_counter()
    guards = guard_cost.measure_guard_cost(budget_s=settings.per_call_budget_s,
                                           min_rounds=settings.per_call_min_rounds)
    guards_seconds = time.perf_counter() - t
    _show(guards, t)
    saved = measured(lambda: measure_saved((*CASES, *SAVED_EXTRA_CASES)))
    scaling = measured(lambda: measure_scaling(settings.scaling_sizes, reps=settings.scaling_reps))
    sizes = measured(lambda: measure_sizes(settings.sizes_reps, budget_s=settings.per_call_budget_s,
                                           min_rounds=settings.per_call_min_rounds))

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
        text = render(facts=facts, command=command, elapsed_s=elapsed, targets=targets,
                      tables=tables, breakdown=breakdown, per_call_profiles=per_call_profiles,
                      capture_profiles=capture_profiles, plot_note=plot_note)
        text = update_section(text, guard_cost.section(guards, command, guards_seconds), guard_cost.MARKER)
        old = output.read_text() if output.exists() else ""
        output.write_text(keep_marked_sections(old, text))
        print(f"wrote {output} ({plot_note})")
    print(f"bench: done in {elapsed:.0f} s")
    return 0


def _guard_cost(options: argparse.Namespace, command: str) -> int:
    start = time.perf_counter()
    table = guard_cost.measure_guard_cost(**({"budget_s": 0.05, "min_rounds": 5} if options.quick else {}))
    print(table.to_text())
    if not options.no_write:
        _write_section(RESULTS, guard_cost.section(table, command, time.perf_counter() - start), guard_cost.MARKER)
    return 0


def _parity_data(options: argparse.Namespace, command: str) -> int:
    rows = []
    for idiom in parity_data.IDIOMS:
        rows.append(parity_data.row(idiom, dynamo=not options.no_dynamo))
        print(" | ".join(rows[-1][:-1]), flush=True)
    text = parity_data.table(rows)
    print(text)
    if options.write:
        _write_section(parity_data.PAGE, text, parity_data.MARKER)
    return 1 if any("WRONG" in r[-2] for r in rows) else 0


def _fuzz(options: argparse.Namespace, command: str) -> int:
    from . import fuzz  # only here: it puts tests/fuzz on sys.path for its generators

    return fuzz.main(options)


def _floor(options: argparse.Namespace, command: str) -> int:
    write = None if options.no_write else options.output
    return floor.run(quick=options.quick, write=write, command=command, dynamo=not options.no_dynamo,
                     cold=not options.no_cold)


def _collectives(options: argparse.Namespace, command: str) -> int:
    from . import collectives  # only here: it puts tests/ on sys.path for its Functions

    start = time.perf_counter()
    table = collectives.measure_collectives(**({"rounds": 5, "calls": 2} if options.quick else {}))
    print(table.to_text())
    if not options.no_write:
        _write_section(RESULTS, collectives.section(table, command, time.perf_counter() - start),
                       collectives.MARKER)
    return 0


def _gpu(options: argparse.Namespace, command: str) -> int:
    return gpu.main(options.device, options.budget)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.set_defaults(run=_speed)
    parser.add_argument("--quick", action="store_true",
                        help="fewer repetitions (~30 s): capture of the small cases only, no cold runs, no inductor")
    parser.add_argument("--no-inductor", action="store_true", help="skip torch.compile(backend='inductor')")
    parser.add_argument("--no-cold", action="store_true", help="skip the fresh-process captures")
    parser.add_argument("--output", type=Path, default=None,
                        help="where to write the results (default bench/RESULTS.md; --quick: nowhere)")
    questions = parser.add_subparsers(title="questions", metavar="QUESTION")
    guards = questions.add_parser("guard-cost", help="(e) the per-call cost of value guards")
    guards.set_defaults(run=_guard_cost)
    guards.add_argument("--no-write", action="store_true", help="do not touch bench/RESULTS.md")
    guards.add_argument("--quick", action="store_true", help="fewer rounds")
    fuzz = questions.add_parser("fuzz", help="the differential fuzzer against eager (10,000 cases)")
    fuzz.set_defaults(run=_fuzz)
    fuzz.add_argument("--examples", type=int, default=10_000)
    fuzz.add_argument("--seed", type=int, default=0, help="first seed")
    fuzz.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    fuzz.add_argument("--no-write", action="store_true", help="do not touch bench/RESULTS.md")
    fuzz.add_argument("--output", type=Path, default=RESULTS)
    fuzz.add_argument("--dump", type=Path, help="write each failing case's source here")
    fuzz.add_argument("--generator", choices=("data-dependent", "effects", "modes", "outside", "plain", "python-state",
                                                       "reads"),
                      default="plain",
                      help="python-state: the Python-state generator (tests/fuzz/generate_state.py); "
                           "data-dependent: the data-dependent one (tests/fuzz/generate_data.py); "
                           "modes: sizes x values x transforms x modes (tests/fuzz/generate_modes.py); "
                           "reads: what a capture reads (tests/fuzz/generate_reads.py); "
                           "outside: the red team's spellings (tests/fuzz/generate_outside.py); "
                           "effects: the effects one (tests/fuzz/generate_effects.py)")
    parity = questions.add_parser("parity-data", help="docs/parity.md's data-dependent parity rows (no timing)")
    parity.set_defaults(run=_parity_data)
    parity.add_argument("--write", action="store_true", help="put the table into docs/parity.md")
    parity.add_argument("--no-dynamo", action="store_true", help="minihop cells only (fast)")
    floor_ = questions.add_parser("floor", help="(g) capture against fake-tensor propagation alone, and Dynamo")
    floor_.set_defaults(run=_floor)
    floor_.add_argument("--quick", action="store_true", help="sizes 1-100, few repetitions, one cold run")
    floor_.add_argument("--no-dynamo", action="store_true", help="floor and minihop only")
    floor_.add_argument("--no-cold", action="store_true", help="skip the fresh-process runs")
    floor_.add_argument("--no-write", action="store_true", help="do not touch bench/RESULTS.md")
    floor_.add_argument("--output", type=Path, default=RESULTS)
    coll = questions.add_parser("collectives", help="(h) tensor-parallel Functions on 2 processes")
    coll.set_defaults(run=_collectives)
    coll.add_argument("--quick", action="store_true", help="few rounds (a smoke run)")
    coll.add_argument("--no-write", action="store_true", help="do not touch bench/RESULTS.md")
    gpu = questions.add_parser("gpu", help="minihop on CUDA against eager, and its per-call cost")
    gpu.set_defaults(run=_gpu)
    gpu.add_argument("--device", default="cuda", help="cuda (default) or cpu, to try the checks")
    gpu.add_argument("--budget", type=float, default=0.3, help="seconds of timing per variant and case")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    options = _parser().parse_args(argv)
    torch.set_num_threads(1)
    return int(options.run(options, " ".join(("python -m bench", *argv))))
