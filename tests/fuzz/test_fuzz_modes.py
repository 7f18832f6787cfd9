"""Compositional fuzzing: sizes x non-tensor outputs x torch.func transforms x modes, against eager.

The generator (``generate_modes.py``) crosses what the other generators keep apart: sizes that
change between calls (automatic dynamic makes them symbolic), numbers, ``torch.Size``, dicts
and attributes computed from them, ``torch.func`` transforms and grad/inference/autocast
modes with ``create_graph``/``retain_graph``; the oracle (``oracle_modes.py``) compares
outputs with their exact types, every grad, the transform's result and the Python state with
eager's, strict and ``fallback="eager"``. This is the CI-sized slice (fixed seeds, under a
minute); ``python -m bench fuzz --generator modes`` runs 10,000.
"""

from __future__ import annotations

import pathlib
import shutil
import sys
import tempfile
from collections.abc import Iterator

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from generate import RandomChooser  # noqa: E402
from generate_modes import generate_modes_case  # noqa: E402
from oracle_modes import run_modes_case  # noqa: E402

SEEDS = range(500_000, 500_120)  # the slice: 120 cases, every feature drawn many times


@pytest.fixture(scope="module")
def directory() -> Iterator[pathlib.Path]:
    path = pathlib.Path(tempfile.mkdtemp(prefix="minihop_fuzz_modes_"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_fuzz_modes_slice(directory: pathlib.Path) -> None:
    """Every case of the slice matches eager (or strict refuses with a documented code and the fallback matches)."""
    failures, kinds, features = [], {"matched": 0, "refused": 0}, set()
    for seed in SEEDS:
        case = generate_modes_case(RandomChooser(seed))
        features.update(f.split(":")[0] + ":" + f.split(":")[-1] for f in case.features)
        outcome = run_modes_case(case, directory)
        if outcome.kind in kinds:
            kinds[outcome.kind] += 1
        else:
            failures.append(f"seed {seed}: {outcome.kind}: {outcome.signature}\n{case.source}\n{outcome.detail}")
    assert not failures, f"{len(failures)} failing case(s); first:\n{failures[0]}"
    # The slice reaches every transform and mode, and the symbolic-value outputs.
    for needed in ("transform:grad", "transform:vjp", "transform:jacrev", "transform:vmap", "mode:inference_mode",
                   "mode:autocast", "mode:create_graph", "mode:retain_graph", "mode:no_grad", "extra:size",
                   "extra:attribute", "extra:dict", "extra:state"):
        assert needed in features, needed
