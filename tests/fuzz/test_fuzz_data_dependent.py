"""Differential fuzzing of data-dependent values: a random Function taking Python values out of tensor data matches eager.

The generator (``generate_data.py``) writes Functions whose forward and backward use
``.item()``, ``.tolist()``, boolean masks, ``masked_select``, ``nonzero``, Python branches on
tensor values and constants made from Python values; the oracle (``oracle_state.run_data_case``)
calls each 3-5 times with data that changes (branches alternate, mask counts change), forward
and backward, and compares outputs and every ``.grad`` with eager exactly, through
``minihop.apply`` and ``minihop.function(F, fallback="eager")``. A mismatch (a silent wrong
answer, e.g. a stale capture served after a value changed) or a crash fails the test.
``python -m bench fuzz --generator data-dependent`` runs the same generator for longer.

No refusal is allowed (``ALLOWED_REFUSALS`` is empty): every construct the generator writes is
one a mechanism of issue 15 applies to (an unbacked symbol, a constant, a value guard before
forward or before backward), so a refusal, MH103 included, is minihop failing its subject. But
for one: an op that raises for some values inside the user's ``try`` (``try_raises``, round 13)
must be refused (MH104-op-in-try: a fake never raises there), and fallback must match.
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
from generate_data import generate_data_case  # noqa: E402
from oracle_state import run_data_case  # noqa: E402
from test_fuzz import _DrawChooser, fuzz_settings  # noqa: E402

EXAMPLES = 40
ALLOWED_REFUSALS: frozenset[str] = frozenset()

TALLY = Tally("minihop fuzz, data-dependent values", EXAMPLES)
_DIRECTORY = pathlib.Path(tempfile.mkdtemp(prefix="minihop_fuzz_data_"))
atexit.register(shutil.rmtree, _DIRECTORY, ignore_errors=True)


@st.composite
def data_cases(draw: Any) -> Case:
    return generate_data_case(_DrawChooser(draw))


@fuzz_settings(EXAMPLES)
@given(case=data_cases())
def test_fuzz_data_dependent_matches_eager(case: Case) -> None:
    """A random data-dependent Function matches eager exactly (strict and fallback="eager"), never refused."""
    outcome = run_data_case(case, _DIRECTORY)
    TALLY.record(outcome, case.source)
    allowed = ALLOWED_REFUSALS | ({"MH104"} if any(f.endswith("try_raises") for f in case.features) else set())
    if outcome.kind == "refused":
        assert outcome.code in allowed, f"refused with {outcome.code}: {outcome.signature}\n{case.source}"


def test_fuzz_data_dependent_summary(capsys: pytest.CaptureFixture[str]) -> None:
    """Print the data-dependent fuzz counts (runs after the fuzz test, in file order)."""
    with capsys.disabled():
        print(TALLY.summary())


# A generated-style case whose forward branches on the data: its calls alternate the branch.
_BRANCH_CASE = '''import torch


class Fuzz(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x0):
        v = x0 * 2
        if v.sum() > 0:
            v = v * 2
        else:
            v = v - 1
        ctx.save_for_backward(x0)
        return v

    @staticmethod
    def backward(ctx, g):
        x0, = ctx.saved_tensors
        gx = g * 1
        return gx


SHAPE = (3,)
X0 = [[1.0, 2.0, -0.5], [-1.0, -2.0, 0.5], [1.0, 2.0, -0.5]]
LOSS_WEIGHT = [1.5, -0.5, 2.0]
STEPS = [(0, 0), (1, 1), (2, 2)]
CALL = 0


def set_value(value):
    global CALL
    CALL = int(value)


def read_state():
    return {}


def loss_weight():
    return LOSS_WEIGHT[CALL]


def make_args():
    x0 = torch.tensor(X0[CALL]).reshape(SHAPE).requires_grad_(True)
    return (x0,)
'''


def test_branch_case_matches() -> None:
    """The hand-written branch case matches eager through the oracle (value guards recapture)."""
    assert run_data_case(Case(_BRANCH_CASE, ("fwd-branch_sum",)), _DIRECTORY).kind == "matched"


def test_oracle_sees_a_stale_capture(monkeypatch: pytest.MonkeyPatch) -> None:
    """With minihop's value checks made to always pass, the second call (other branch) is served
    the first capture: the oracle must call that a mismatch, at call 2 (the fuzz test can fail)."""
    import minihop.runtime.assumptions as assumptions_module

    monkeypatch.setattr(assumptions_module, "_value_check", lambda read: lambda args: True)
    outcome = run_data_case(Case(_BRANCH_CASE, ("fwd-branch_sum",)), _DIRECTORY)
    assert outcome.kind == "mismatched", outcome
    assert "call 2" in outcome.signature
