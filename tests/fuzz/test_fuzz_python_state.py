"""Differential fuzzing of Python state: a random Function reading and writing Python values matches eager or is refused.

The generator (``generate_state.py``) writes Functions that read class attributes, attributes
of an argument object, module globals and closure cells, and write counters, a log list, an
outside object's attribute, or print; the oracle (``oracle_state.py``) changes the values between
calls and between forward and ``.backward()``, and compares outputs, grads, the Python state
and printed text with eager, through ``minihop.apply`` (strict: a documented code is a refusal)
and ``minihop.function(F, fallback="eager")`` (must always match). Kept apart from
``test_fuzz.py`` (its budget and generator unchanged); ``python -m bench fuzz --generator
python-state`` runs the same generator for longer.
"""

from __future__ import annotations

import atexit
import pathlib
import shutil
import sys
import tempfile
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from tally import Tally  # noqa: E402
from generate import Case  # noqa: E402
from generate_state import generate_state_case  # noqa: E402
from oracle_state import run_state_case  # noqa: E402
from test_fuzz import _DrawChooser, fuzz_settings  # noqa: E402

EXAMPLES = 300

TALLY = Tally("minihop fuzz, Python state", EXAMPLES)
_DIRECTORY = pathlib.Path(tempfile.mkdtemp(prefix="minihop_fuzz_state_"))
atexit.register(shutil.rmtree, _DIRECTORY, ignore_errors=True)


@st.composite
def state_cases(draw: Any) -> Case:
    return generate_state_case(_DrawChooser(draw))


@fuzz_settings(EXAMPLES)
@given(case=state_cases())
def test_fuzz_python_state_matches_eager_or_refuses(case: Case) -> None:
    """A random Function using Python state matches eager (strict and fallback="eager") or is refused with a documented code."""
    outcome = run_state_case(case, _DIRECTORY)
    TALLY.record(outcome, case.source)


def test_fuzz_python_state_summary(capsys: pytest.CaptureFixture[str]) -> None:
    """Print the Python-state fuzz counts (runs after the fuzz test, in file order)."""
    with capsys.disabled():
        print(TALLY.summary())
