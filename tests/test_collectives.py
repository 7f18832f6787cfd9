"""Tensor- and sequence-parallel Functions on a real process group (issue #30).

The module starts its ranks once (``torch.multiprocessing``, spawn; gloo on a free
127.0.0.1 port; bounded and killed after ``TIMEOUT_S``): two processes run every case, four
(in two model-parallel groups of two) run five patterns and the MLP. Each rank compares ``minihop.apply`` and
``minihop.function(F, fallback="eager")`` with eager ``F.apply`` for every pattern of
``collective_functions`` (outputs and every ``.grad``, exactly, at two sizes, the second
through automatic dynamic), trains a column-parallel + row-parallel MLP both ways, checks
the refusals, captures the graphs (collectives in them; equal to Dynamo's bodies where it
captures the Function) and replaces its world to check the world guard. Each test below
reads its case's result from every rank; a rank's traceback is the failure message.
"""

from __future__ import annotations

import json
import socket
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch.multiprocessing as mp

HERE = str(Path(__file__).resolve().parent)
if HERE not in sys.path:  # collective_functions.py and collective_worker.py; the children get it too
    sys.path.insert(0, HERE)

from collective_functions import PATTERNS  # noqa: E402
from collective_worker import DYNAMO_PHASES, MODES, REFUSED, worker  # noqa: E402

TIMEOUT_S = 400.0  # a rank stuck in a collective fails the module (gloo itself times out after 60 s)
CASES_2 = [*(f"pattern:{p}:{m}" for p in PATTERNS for m in MODES), *(f"graphs:{p}" for p in PATTERNS),
           "mlp", *(f"refused:{r}" for r in REFUSED), "world"]
# Four ranks in two model-parallel groups of two (the groups are not the world).
CASES_4 = ["pattern:copy_to_tp:apply", "pattern:gather_from_sp:apply", "pattern:reduce_scatter_sp:apply",
           "pattern:all_to_all:apply", "pattern:broadcast:apply", "mlp", "rebind"]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_ranks(world_size: int, cases: list[str], out_dir: Path, tp_size: int) -> list[dict[str, Any]]:
    """Spawn the ranks, wait (killing them after ``TIMEOUT_S``), return each rank's results."""
    context = mp.start_processes(worker, args=(world_size, free_port(), str(out_dir), cases, tp_size),
                                 nprocs=world_size, join=False, start_method="spawn")
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while not context.join(timeout=max(0.0, deadline - time.monotonic()), grace_period=2.0):
            if time.monotonic() >= deadline:
                raise AssertionError(f"{world_size} ranks still running after {TIMEOUT_S:.0f} s; killed")
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()
            process.join(timeout=10)
    return [json.loads((out_dir / f"rank{r}.json").read_text()) for r in range(world_size)]


@pytest.fixture(scope="module")
def two(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    start = time.perf_counter()
    results = run_ranks(2, CASES_2, tmp_path_factory.mktemp("two"), tp_size=2)
    print(f"2 ranks x {len(CASES_2)} cases in {time.perf_counter() - start:.1f} s")
    return results


@pytest.fixture(scope="module")
def four(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return run_ranks(4, CASES_4, tmp_path_factory.mktemp("four"), tp_size=2)


def passed(results: list[dict[str, Any]], case: str) -> list[Any]:
    """The case's value on every rank; fails with the first failing rank's traceback."""
    for rank, result in enumerate(results):
        assert case in result, f"rank {rank} did not run {case}"
        if not result[case]["ok"]:
            pytest.fail(f"rank {rank}, {case}:\n{result[case]['error']}", pytrace=False)
    return [result[case]["value"] for result in results]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("pattern", list(PATTERNS))
def test_pattern_matches_eager_on_every_rank(two: list[dict[str, Any]], pattern: str, mode: str) -> None:
    """Each pattern, strict and fallback, matches eager on both ranks at both sizes."""
    passed(two, f"pattern:{pattern}:{mode}")


_EXPECTED = {  # the functional collectives each pattern's bodies must hold (by hand, from the code)
    "copy_to_tp": ([], ["all_reduce", "wait_tensor", "copy_"]),
    "reduce_from_tp": (["all_reduce", "wait_tensor", "copy_"], []),
    "scatter_to_tp": ([], ["all_gather_into_tensor", "wait_tensor"]),
    "gather_from_tp": (["all_gather_into_tensor", "wait_tensor"], []),
    "scatter_to_sp": ([], ["all_gather_into_tensor", "wait_tensor", "copy_"]),
    "gather_from_sp": (["all_gather_into_tensor", "wait_tensor", "copy_"], ["reduce_scatter_tensor", "wait_tensor", "copy_"]),
    "reduce_scatter_sp": (["reduce_scatter_tensor", "wait_tensor", "copy_"], ["all_gather_into_tensor", "wait_tensor", "copy_"]),
    "all_to_all": (["all_to_all_single", "wait_tensor", "copy_"], ["all_to_all_single", "wait_tensor", "copy_"]),
    "broadcast": (["broadcast", "wait_tensor", "copy_"], ["all_reduce", "wait_tensor", "copy_"]),
    "functional": (["all_gather_into_tensor", "wait_tensor"], ["reduce_scatter_tensor", "wait_tensor", "all_reduce", "wait_tensor"]),
    "reduce_then_scale": (["all_reduce", "wait_tensor", "copy_"], ["all_reduce", "wait_tensor", "copy_"]),
}


@pytest.mark.parametrize("pattern", list(PATTERNS))
def test_collectives_in_the_graphs(two: list[dict[str, Any]], pattern: str) -> None:
    """The captured bodies hold the functional collectives (a dropped call cannot pass as a
    one-rank identity), and equal Dynamo's (see ``DYNAMO_PHASES``)."""
    for value in passed(two, f"graphs:{pattern}"):
        fwd, bwd = _EXPECTED[pattern]
        for phase, expected in (("fwd", fwd), ("bwd", bwd)):
            ops = [t.split(".")[-1] if "c10d" in t else t for t in value[phase]]
            for op in expected:
                assert op in ops, (pattern, phase, value[phase])
            assert [o for o in ops if o != "copy_"] == [o for o in expected if o != "copy_"] or \
                set(expected) <= set(ops), (pattern, phase, value[phase])
        # Compared with Dynamo's bodies (which raise for broadcast: Dynamo cannot trace it).
        assert value["dynamo"] == (list(DYNAMO_PHASES[pattern]) if pattern != "broadcast" else "unsupported")
        assert "torch.ops._c10d_functional." in value["printed"]


def test_mlp_trains_like_eager(two: list[dict[str, Any]], four: list[dict[str, Any]]) -> None:
    """Column-parallel + row-parallel MLP, 3 SGD steps: losses and weights equal eager's on
    every rank (2 and 4 ranks), and the losses equal across ranks."""
    for results in (two, four):
        values = passed(results, "mlp")
        assert all(v == values[0] for v in values)


@pytest.mark.parametrize("case", [c for c in CASES_4 if c.startswith("pattern:")])
def test_four_ranks(four: list[dict[str, Any]], case: str) -> None:
    """Four ranks in two model-parallel groups: the patterns match eager on every rank."""
    passed(four, case)


@pytest.mark.parametrize("name", list(REFUSED))
def test_refused(two: list[dict[str, Any]], name: str) -> None:
    """What cannot be written as a functional collective is refused (MH104), naming the call;
    ``fallback="eager"`` gives eager's answer."""
    passed(two, f"refused:{name}")


def test_capture_belongs_to_its_world(two: list[dict[str, Any]]) -> None:
    """A capture reading the rank and world size is captured again in a new world."""
    values = passed(two, "world")
    assert values[1]["first"] != values[1]["again"]  # the world really changed what the code computes


def test_without_a_process_group_eagers_error() -> None:
    """With no process group a collective in forward raises eager's own ValueError, unchanged."""
    import torch
    import torch.distributed as dist

    import minihop

    if dist.is_initialized():
        pytest.skip("a process group is initialised in this process")

    class AllReduce(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            y = x.clone()
            dist.all_reduce(y)
            return y

        @staticmethod
        def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
            return g

    x = torch.randn(3, requires_grad=True)
    with pytest.raises(ValueError, match="Default process group has not been initialized") as eager:
        AllReduce.apply(x)
    with pytest.raises(ValueError, match="Default process group has not been initialized") as mine:
        minihop.apply(AllReduce, x)
    assert type(mine.value) is type(eager.value)


def test_bench_collectives_runs() -> None:
    """``python -m bench collectives`` (two ranks, tiny counts) gives a row per case with a
    ratio for each rank. Never a timing assertion: the numbers live in bench/RESULTS.md."""
    root = str(Path(__file__).resolve().parent.parent)
    if root not in sys.path:  # bench/ is a directory of the repository, not an installed package
        sys.path.insert(0, root)
    from bench import collectives

    table = collectives.measure_collectives(rounds=2, calls=1)
    assert table.labels == tuple(label for label, _, _ in collectives.CASES)
    assert all(row[-1].endswith("x") and row[-2].endswith("x") for row in table.rows)


import torch  # noqa: E402


class BranchesOnWorld(torch.autograd.Function):
    """A Function that branches on whether a process group exists (a library's fallback path)."""

    @staticmethod
    def forward(ctx, x):
        if torch.distributed.is_initialized():
            return x * torch.distributed.get_world_size() + 1
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2


def test_capture_before_init_is_not_reused_after() -> None:
    """A capture made before init_process_group is guarded on 'no group': after init (a world of
    one, in this process) the next call is captured again and matches eager's other branch."""
    import tempfile

    import torch.distributed as dist

    import minihop

    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    f = minihop.function(BranchesOnWorld)
    x = torch.ones(3)
    torch.testing.assert_close(f(x), BranchesOnWorld.apply(x))
    dist.init_process_group("gloo", rank=0, world_size=1, init_method=f"file://{tempfile.mkdtemp()}/rendezvous")
    try:
        torch.testing.assert_close(f(x), BranchesOnWorld.apply(x))  # x * 1 + 1, not x * 2
        assert f.stats.captures == 2
    finally:
        dist.destroy_process_group()
    torch.testing.assert_close(f(x), BranchesOnWorld.apply(x))


def test_a_rebound_model_parallel_group(four: list[dict[str, Any]]) -> None:
    # Groups of two, then the world of four, then back: each call matches eager in its group.
    shapes = passed(four, "rebind")
    assert all(v["shapes"] == shapes[0]["shapes"] for v in shapes)
    assert shapes[0]["shapes"][:4] == [[2, 4], [2, 8], [2, 4], [2, 16]]
