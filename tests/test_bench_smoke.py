"""Smoke tests for bench/: each measurement runs with tiny repetition counts and returns a
table with the expected rows. Never timing assertions: speed claims live in bench/RESULTS.md."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # bench/ is a directory of the repository, not an installed package
    sys.path.insert(0, str(ROOT))

import bench  # noqa: E402
from bench import floor, fuzz, gpu, guard_cost, parity_data, run  # noqa: E402
from bench.capture import measure_cold, measure_scaling, measure_warm, plot_scaling, profile_capture  # noqa: E402
from bench.functions import CASES, SAVED_EXTRA_CASES, case_named, make_chain  # noqa: E402
from bench.per_call import (AA, APPLY, AOT, CAP, EAGER, FLOOR, RUN, measure_per_call,  # noqa: E402
                            per_call_breakdown, profile_per_call)
from bench.report import check_targets, keep_marked_sections, render, update_section  # noqa: E402
from bench.saved import measure_saved  # noqa: E402
from bench.sizes import AUTOMATIC, COMPILE, LOOP_EAGER, STATIC, SYMBOLIC_HIT, measure_sizes  # noqa: E402
from bench.timing import machine_facts  # noqa: E402

SMALL = (case_named("MySin 8x8"),)


@pytest.fixture(autouse=True)
def _threads_kept() -> Iterator[None]:
    """``bench.run.main`` sets one intra-op thread, as every benchmark runs; the other tests'
    processes keep theirs."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_cases_cover_each_function_small_and_large() -> None:
    """Every benchmark Function appears at a small and a large size, and matches eager."""
    names = {c.function.__name__ for c in CASES}
    assert names == {"MySin", "Add", "MLP", "LayerNorm"}
    for name in names:
        assert {c.small for c in CASES if c.function.__name__ == name} == {True, False}
    from minihop.testing import assert_matches_eager

    for case in (*CASES, *SAVED_EXTRA_CASES):
        if case.small:
            assert_matches_eager(case.function, *case.make_args())
    assert_matches_eager(make_chain(5), torch.randn(3, requires_grad=True))


def test_measurements_return_their_rows(tmp_path: Path) -> None:
    """(a)-(d), targets, profiles and the report, each at the smallest setting."""
    warm = measure_warm(SMALL, reps=1, dynamo_reps=1, backends=("eager",))
    assert warm.table.labels == ("MySin 8x8",)
    per_call = measure_per_call(SMALL, budget_s=0.002, min_rounds=1, inductor=False)
    assert per_call.table.labels == ("MySin 8x8",)
    assert set(per_call.timings["MySin 8x8"]) == {EAGER, AA, CAP, RUN, APPLY, AOT, FLOOR}
    saved = measure_saved(SMALL, with_compile=False)
    assert saved.table.labels == ("MySin 8x8",)
    assert saved.bytes["MySin 8x8"]["eager"][0] == 8 * 8 * 4  # x, saved by forward
    scaling = measure_scaling((2, 4), reps=1, dynamo=False)
    assert scaling.table.labels == ("2", "4")
    assert plot_scaling(scaling, tmp_path / "plot.png")

    sizes = measure_sizes(reps=1, budget_s=0.002, min_rounds=1)
    assert sizes.table.labels == (
        *(f"{f}, 20 sizes: {v}" for f in ("MySin", "MLP") for v in (LOOP_EAGER, AUTOMATIC, STATIC, COMPILE)),
        f"MySin 8x8: {SYMBOLIC_HIT}")
    for name in ("MySin, 20 sizes", "MLP, 20 sizes"):  # counts, not times
        assert sizes.made[name] == {LOOP_EAGER: 0, AUTOMATIC: 2, STATIC: 20, COMPILE: 2}, name

    targets = check_targets(SMALL, warm=warm, per_call=per_call, saved=saved, sizes=sizes)
    assert [row[0] for row in targets.table.rows] == [
        "warm capture, one-op case", "warm capture vs Dynamo eager", "cap(*args) fwd+bwd vs eager",
        "minihop.apply hit vs eager", "bytes saved for backward vs eager",
        *(["captures over the 20-size loop", "20-size loop vs compile eager"] * 2),
        "hit on a symbolic capture vs eager"]
    assert all(row[-1] == "PASS" or row[-1].startswith("MISS (") for row in targets.table.rows)

    per_call_profile = profile_per_call(calls=3)
    capture_profile = profile_capture(SMALL[0], reps=1)
    assert "cumtime" in per_call_profile.cumulative and "tottime" in capture_profile.own
    breakdown = per_call_breakdown(per_call, "MySin 8x8")
    assert breakdown is not None and len(breakdown.rows) == 5
    text = render(facts=machine_facts(), command="python -m bench", elapsed_s=1.0, targets=targets,
                  tables=[warm.table, per_call.table, saved.table, scaling.table, sizes.table], breakdown=breakdown,
                  per_call_profiles=[per_call_profile], capture_profiles=[capture_profile], plot_note="")
    for heading in ("## Machine", "## Reproduce", "## Targets", "## Tables", "(b) Steady-state"):
        assert heading in text
    assert bench.Table is type(warm.table)


def test_guard_cost_rows() -> None:
    """(e) times each value-guarded case against eager; MySin and the unbacked ScaleByMax have no value guard, the others one."""
    table = guard_cost.measure_guard_cost(budget_s=0.002, min_rounds=1)
    assert [row[:2] for row in table.rows] == [
        ("MySin 8x8 (no value guard)", "0"),
        ("ScaleByMax 8x8 (`x.abs().max().item()`: unbacked, no guard)", "0"),
        ("SameOrNot 8x8 (`torch.equal(x1, x2)`)", "1"), ("BranchOnSum 8x8 (`if x.sum() > 0`)", "1"),
        ("BranchOnSumInBackward 8x8 (guard before backward)", "1"), ("BranchOnSum 256x1024", "1")]
    section = guard_cost.section(table, "python -m bench guard-cost", 1.0)
    assert section.startswith("## Value-guard cost") and "(e) Value-guard cost" in section


def test_parity_data_row_without_dynamo() -> None:
    """A parity row names its idiom and test; eager works; the Dynamo cells are left empty."""
    idiom = parity_data.IDIOMS[0]
    row = parity_data.row(idiom, dynamo=False)
    assert len(row) == len(parity_data.COLUMNS)
    assert row[:4] == (idiom.name, "works", "", "")
    assert row[-1] == f"`{parity_data.TEST}[{idiom.function.__name__}]`"


def test_rerun_keeps_sections_other_scripts_wrote() -> None:
    """A marked section (the fuzzer's) survives a rewrite of RESULTS.md; a run replaces its own
    section in place and leaves the others as they are."""
    old = "# old\n\n<!-- fuzz:start -->\n## Fuzzing\nrows\n<!-- fuzz:end -->\n"
    merged = keep_marked_sections(old, "# new\n")
    assert merged == "# new\n\n<!-- fuzz:start -->\n## Fuzzing\nrows\n<!-- fuzz:end -->\n"
    assert keep_marked_sections("# old\n", "# new\n") == "# new\n"
    both = old + "\n<!-- guard-cost:start -->\nold\n<!-- guard-cost:end -->\n\ntail\n"
    assert update_section(both, "new", "guard-cost") == both.replace("\nold\n", "\nnew\n")
    assert update_section(None, "s", "fuzz") == "<!-- fuzz:start -->\ns\n<!-- fuzz:end -->\n"


def test_command_line_names_each_question(capsys: pytest.CaptureFixture[str]) -> None:
    """``python -m bench QUESTION``: each question parses to its runner; the fuzzer takes each
    generator it has, and nothing else."""
    parse = run._parser().parse_args
    assert parse([]).run is run._speed and parse(["--quick"]).quick
    assert parse(["guard-cost", "--no-write"]).run is run._guard_cost
    options = parse(["fuzz", "--examples", "3", "--generator", "data-dependent"])
    assert options.run is run._fuzz and options.examples == 3 and options.generator == "data-dependent"
    assert [parse(["fuzz", "--generator", g]).generator for g in fuzz.GENERATORS] == list(fuzz.GENERATORS)
    assert parse(["parity-data", "--write"]).run is run._parity_data
    assert parse(["gpu", "--device", "cpu"]).run is run._gpu
    assert parse(["floor", "--quick", "--no-write"]).run is run._floor
    with pytest.raises(SystemExit):
        parse(["fuzz", "--generator", "nope"])
    assert "invalid choice" in capsys.readouterr().err


def test_fuzz_runs_a_few_seeds(tmp_path: Path) -> None:
    """``python -m bench fuzz --examples 2 --jobs 1``: counts written into its marked section."""
    out = tmp_path / "RESULTS.md"
    assert run.main(["fuzz", "--examples", "2", "--jobs", "1", "--output", str(out)]) == 0
    text = out.read_text()
    assert text.startswith("<!-- fuzz:start -->\n## Fuzzing") and "`python -m bench fuzz --examples 2`" in text


def test_saved_bytes_drop_an_intermediate_backward_never_reads() -> None:
    """SavesUnused saves x and sigmoid(x) but its backward reads only x: minihop keeps x (an
    input, by reference) and not the sigmoid, so its residual bytes are 0 and eager's are not."""
    small = SAVED_EXTRA_CASES[:1]
    saved = measure_saved(small, with_compile=False)
    b = saved.bytes["SavesUnused 8x8"]
    assert b["eager"] == (2 * 256, 256, 0, 256)  # x and the sigmoid; the sigmoid is residual
    assert b["minihop"] == (256, 256, 0, 0)  # x only
    targets = check_targets(small, saved=saved)
    assert [row[0] for row in targets.table.rows] == [
        "bytes saved for backward vs eager",
        "bytes saved below eager where a saved value is unused by backward"]
    assert [row[-1] for row in targets.table.rows] == ["PASS", "PASS"]


def test_cold_capture_runs_in_a_fresh_process() -> None:
    """The fresh-process capture reports import and capture seconds for minihop."""
    cold = measure_cold("MySin 8x8", reps=1, backends=())
    assert cold.table.labels == ("minihop",)
    assert set(cold.seconds) == {"minihop"}


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CUDA run is `python -m bench gpu`'s own job")
def test_gpu_check_skips_without_cuda(capsys: pytest.CaptureFixture[str]) -> None:
    """Without CUDA the GPU check says so and succeeds; its checks and overhead table run on
    CPU on request."""
    assert run.main(["gpu"]) == 0
    assert capsys.readouterr().out.strip() == "no CUDA device; skipped"
    assert all(r[2] == "ok" for r in gpu.check_case(SMALL[0], "cpu"))
    assert gpu.overhead_table(SMALL, "cpu", budget_s=0.002).labels == ("MySin 8x8",)


def test_floor_rows_targets_and_section(tmp_path: Path) -> None:
    """(g) at two small sizes, without Dynamo or fresh processes: floor and minihop per case,
    the issue's targets (PASS or MISS by how much), the plot and the marked section."""
    found = floor.measure_floor((1, 2), reps=1, dynamo=False)
    assert found.table.labels == ("chain 1", "chain 2", "MLP 8x8", "LayerNorm 8x8")
    assert set(found.ms["chain 1"]) == {floor.FLOOR, floor.MINIHOP}
    table, _ = floor.targets(found, None, (1.0, 2.0))
    assert [row[:2] for row in table.rows] == [
        ("minihop capture / fake-only floor", "chain 1"), ("cap(*args) fwd+bwd / eager F.apply", "MySin 8x8"),
        ("minihop.apply hit / eager F.apply", "MySin 8x8")]
    assert table.rows[-1][-1].startswith("MISS (1.54x over") and table.rows[-2][-1] == "PASS"
    assert floor.plot_floor(found, tmp_path / "floor.png")
    profile_ = floor.profile_floor(1, 1)
    text = floor.section(command="python -m bench floor", seconds=1.0, floor=found, target_table=table,
                         cold=None, per_call=None, profiles=(profile_,), plot_note="")
    assert text.startswith("## Capture against its floor") and "(g) Targets" in text and "share of capture" in text
    assert floor.misses(found).startswith("**Why the capture targets are missed")
    fresh = floor.fresh_function(case_named("MySin 8x8").function, "smoke")
    assert fresh.forward.__code__ != case_named("MySin 8x8").function.forward.__code__
