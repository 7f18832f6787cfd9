"""CI-sized slice of the effects fuzzer (``generate_effects.py``): generated Functions that write
along many paths match eager in strict and fallback mode, or strict refuses with a code.

Fixed seeds, so a failure reproduces with ``python tests/fuzz/generate_effects.py 30 7`` (and the
case's index). The 10,000-example run is ``python tests/fuzz/generate_effects.py 10000 SEED``;
its numbers are in ``bench/RESULTS.md``.
"""

from __future__ import annotations

import pathlib
import random
import sys
import tempfile

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from generate_effects import generate_source, run_case  # noqa: E402

SEED = 7
CASES = 30


@pytest.fixture(scope="module")
def directory() -> pathlib.Path:
    return pathlib.Path(tempfile.mkdtemp(prefix="minihop_fuzz_effects_"))


@pytest.mark.parametrize("index", range(CASES))
def test_generated_effects_match_eager_or_are_refused(index: int, directory: pathlib.Path) -> None:
    source = generate_source(random.Random(SEED * 1_000_003 + index))
    outcome, detail = run_case(source, directory, index)
    assert outcome in ("captured", "refused"), f"{outcome}: {detail}\n{source}"


# Cases the 10,000-example budget's seeds found silent, pinned (while KINDS stays as it is, the
# same source: ``generate_source(random.Random(seed * 1_000_003 + index))``). Round 25's
# ``method_rebound`` cases: a backward traced again for a call (the class's backward rebound
# before ``.backward()``) that made an object with a ``__del__`` on ctx (it died as ctx was put
# back, mid-call), kept a refusal's frames (``errors.MADE``), or wrote an object forward had
# put on ctx (left written for fallback's eager run of the call); and the 10,000-example run's
# seed 1352189 (``bench/fuzz.py``'s seed s is ``(0, s)`` here): a rebound backward that writes
# state in the call's arguments, which the capture had not kept (the runtime replayed the write
# on none: IndexError, both modes).
FOUND = [(1341000, 635), (1342000, 727), (1342000, 1080), (0, 1352189)]


@pytest.mark.parametrize("seed,index", FOUND)
def test_found_cases_match_eager_or_are_refused(seed: int, index: int, directory: pathlib.Path) -> None:
    source = generate_source(random.Random(seed * 1_000_003 + index))
    outcome, detail = run_case(source, directory, index)
    assert outcome in ("captured", "refused"), f"{outcome}: {detail}\n{source}"
