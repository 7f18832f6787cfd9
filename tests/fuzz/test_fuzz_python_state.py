"""Differential fuzzing of Python state: a random Function reading and writing Python values matches eager or is refused.

The generator (``generate_state.py``) writes Functions that read class attributes, attributes
of an argument object, module globals and closure cells, and write counters, a log list, an
outside object's attribute, or print; the oracle (``oracle_state.py``) changes the values between
calls and between forward and ``.backward()``, and compares outputs, grads, the Python state
and printed text with eager, through ``minihop.apply`` (strict: a documented code is a refusal)
and ``minihop.function(F, fallback="eager")`` (must always match). Kept apart from
``test_fuzz.py`` (its budget and generator unchanged); ``python bench/fuzz.py --generator
python-state`` runs the same generator for longer.
"""

from __future__ import annotations

import atexit
import collections
import pathlib
import shutil
import sys
import tempfile
from typing import Any

import pytest
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from generate import Case  # noqa: E402
from generate_state import generate_state_case  # noqa: E402
from oracle_state import run_state_case  # noqa: E402
from test_fuzz import _DrawChooser  # noqa: E402

EXAMPLES = 300

COUNTS: collections.Counter[str] = collections.Counter()
REFUSED: collections.Counter[str] = collections.Counter()
AFTER_FIRST_FAILURE: collections.Counter[str] = collections.Counter()
_DIRECTORY = pathlib.Path(tempfile.mkdtemp(prefix="minihop_fuzz_state_"))
atexit.register(shutil.rmtree, _DIRECTORY, ignore_errors=True)


@st.composite
def state_cases(draw: Any) -> Case:
    return generate_state_case(_DrawChooser(draw))


@settings(derandomize=True, max_examples=EXAMPLES, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.filter_too_much, HealthCheck.large_base_example])
@given(case=state_cases())
def test_fuzz_python_state_matches_eager_or_refuses(case: Case) -> None:
    """A random Function using Python state matches eager (strict and fallback="eager") or is refused with a documented code."""
    outcome = run_state_case(case, _DIRECTORY)
    failed_before = COUNTS["mismatched"] + COUNTS["crashed"] > 0
    counts = AFTER_FIRST_FAILURE if failed_before else COUNTS
    counts[outcome.kind] += 1
    if outcome.kind == "refused" and not failed_before:
        REFUSED[outcome.code] += 1
    if outcome.kind == "invalid":
        reject()
    if outcome.kind in ("mismatched", "crashed"):
        assert outcome.error is not None
        outcome.error.add_note(f"minihop fuzz (Python state): {outcome.kind} ({outcome.signature}); "
                               f"the generated Function:\n{case.source}")
        raise outcome.error


def test_fuzz_python_state_summary(capsys: pytest.CaptureFixture[str]) -> None:
    """Print the Python-state fuzz counts (runs after the fuzz test, in file order)."""
    examples = sum(v for k, v in COUNTS.items() if k != "invalid")
    lines = ["", "minihop fuzz, Python state (tests/fuzz, derandomized, budget "
             f"{EXAMPLES}): examples {examples}, matched {COUNTS['matched']}, refused "
             f"{COUNTS['refused']} {dict(sorted(REFUSED.items()))}, mismatched {COUNTS['mismatched']}, "
             f"crashed {COUNTS['crashed']} (invalid cases rejected: {COUNTS['invalid']})"]
    if AFTER_FIRST_FAILURE:
        lines.append("  counted up to the first failure; after it hypothesis made "
                     f"{sum(AFTER_FIRST_FAILURE.values())} more calls (search and shrinking): "
                     f"{dict(sorted(AFTER_FIRST_FAILURE.items()))}")
    if not examples:
        lines.append("  (the fuzz test did not run in this session)")
    with capsys.disabled():
        print("\n".join(lines))
