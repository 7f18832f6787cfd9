"""Differential fuzzing of reads (issue 28): a random Function reading Python state along
composed paths matches eager, strict and fallback, or is refused with a documented code.

The generator (``generate_reads.py``) composes holders (modules, objects, classes, bound
methods, containers, cells, globals holding library functions or tensors, signed zeros,
run-time attribute names) with access forms (direct, helper, lambda, method, another
Function's apply, getattr) and where they are read; ``oracle_state.run_state_case`` changes
the state between calls and before ``.backward()``. A CI-sized slice of fixed seeds here;
``python -m bench fuzz --generator reads`` runs 10,000.
"""

from __future__ import annotations

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from generate import RandomChooser  # noqa: E402
from generate_reads import generate_reads_case  # noqa: E402
from oracle_state import run_state_case  # noqa: E402

SEEDS = range(150)


@pytest.mark.parametrize("chunk", range(0, len(SEEDS), 50))
def test_fuzz_reads_match_eager_or_refuse(chunk: int, tmp_path: pathlib.Path) -> None:
    """Each case: matched, or refused by strict with a documented code while the fallback matched."""
    bad = []
    for seed in SEEDS[chunk:chunk + 50]:
        case = generate_reads_case(RandomChooser(seed))
        outcome = run_state_case(case, tmp_path)
        if outcome.kind not in ("matched", "refused"):
            bad.append(f"seed {seed}: {outcome.kind}: {outcome.signature}\n{case.source}\n{outcome.detail}")
    assert not bad, f"{len(bad)} failing case(s); the first:\n{bad[0]}"


def test_holders_name_distinct_parameters() -> None:
    """Two holders in one case must not both add a forward parameter of the same name (seed
    531877 of round 14's run was invalid: ``km`` twice)."""
    from generate_reads import HOLDERS, _holder

    names: dict[str, str] = {}
    for holder in HOLDERS:
        param = _holder(RandomChooser(0), holder)[4]
        for name in filter(None, (p.strip().split("=")[0] for p in param.split(","))):
            assert names.setdefault(name, holder) == holder, (name, holder, names[name])
