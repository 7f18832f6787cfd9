"""Differential fuzzing: every random autograd.Function matches eager or is refused with a documented code.

The generator (``generate.py``) writes each Function as Python source; the oracle
(``oracle.py``) runs it through ``minihop.testing.assert_matches_eager`` and a second call of
the capture. A wrong answer or any exception other than a documented ``MinihopError`` fails the
test with minihop's own exception (so hypothesis tells distinct bugs apart and shrinks each),
carrying the generated source as a note. The budget is fixed (derandomized, 300 examples);
``python -m bench fuzz`` runs the same generator for 10,000. ``test_fuzz_summary`` prints the counts.
"""

from __future__ import annotations

import atexit
import pathlib
import shutil
import sys
import tempfile
from collections.abc import Sequence
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from tally import Tally  # noqa: E402
from generate import Case, generate_case  # noqa: E402
from oracle import run_case  # noqa: E402

T = TypeVar("T")

EXAMPLES = 300

TALLY = Tally("minihop fuzz", EXAMPLES)
_DIRECTORY = pathlib.Path(tempfile.mkdtemp(prefix="minihop_fuzz_"))  # the cases' source files
atexit.register(shutil.rmtree, _DIRECTORY, ignore_errors=True)


class _DrawChooser:
    """The generator's ``Chooser`` over hypothesis draws; every choice shrinks to its first option."""

    def __init__(self, draw: Any) -> None:
        self.draw = draw

    def integer(self, lo: int, hi: int) -> int:
        return int(self.draw(st.integers(lo, hi)))

    def choice(self, options: Sequence[T]) -> T:
        return options[self.draw(st.integers(0, len(options) - 1))]

    def chance(self, percent: int) -> bool:
        # Shrinks to 0, i.e. to False: a minimal example uses as few features as it can.
        return bool(self.draw(st.integers(0, 99)) >= 100 - percent)


def fuzz_settings(examples: int) -> Any:
    """The fuzz tests' hypothesis settings: a fixed budget, derandomized, no deadline, no database."""
    return settings(derandomize=True, max_examples=examples, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much, HealthCheck.large_base_example])


@st.composite
def cases(draw: Any) -> Case:
    return generate_case(_DrawChooser(draw))


@fuzz_settings(EXAMPLES)
@given(case=cases())
def test_fuzz_matches_eager_or_refuses(case: Case) -> None:
    """A random Function matches eager (outputs, grads, contract, a second call) or is refused with a documented code."""
    outcome = run_case(case, _DIRECTORY)
    TALLY.record(outcome, case.source)


def test_fuzz_summary(capsys: pytest.CaptureFixture[str]) -> None:
    """Print the fuzz counts (runs after the fuzz test, in file order)."""
    with capsys.disabled():
        print(TALLY.summary())


# ---------------------------------------------------------------------------------------------
# What the fuzzer found, minimized by hand: each a generated-style case, run through the oracle
# ---------------------------------------------------------------------------------------------

FOUND = {
    # torch.enable_grad() inside backward (the true-VJP backward) was not recorded: the
    # recomputed ops ran under no_grad and torch.autograd.grad crashed at run time.
    "recompute-vjp-under-enable-grad": '''
import torch


class Fuzz(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x0):
        ctx.save_for_backward(x0)
        return x0.sin()

    @staticmethod
    def backward(ctx, g0):
        x0, = ctx.saved_tensors
        with torch.enable_grad():
            x0 = x0.detach().requires_grad_()
            v0 = x0.sin()
        gx0, = torch.autograd.grad([v0], [x0], [g0])
        return gx0


def make_args():
    return (torch.randn(3).requires_grad_(True),)
''',
    # The same tensor passed twice, one gradient broadcast-bigger than the input: eager sums
    # each gradient to the input's shape, then accumulates; minihop added the two first.
    "same-tensor-twice-broadcast-grad": '''
import torch


class Fuzz(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x0, x1):
        return x0 * x1

    @staticmethod
    def backward(ctx, g0):
        return g0.expand(2, 3), g0


def make_args():
    x0 = torch.ones(3).requires_grad_(True)
    return (x0, x0)
''',
    # ... and with two broadcast-bigger gradients of different sizes, a crash in bwd.
    "same-tensor-twice-two-broadcast-grads": '''
import torch


class Fuzz(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x0, x1):
        return x0 * x1

    @staticmethod
    def backward(ctx, g0):
        return g0.expand(2, 3), g0.expand(4, 3)


def make_args():
    x0 = torch.ones(3).requires_grad_(True)
    return (x0, x0)
''',
    # mark_non_differentiable on an input returned as it is: eager's output does not
    # require grad; minihop's did.
    "non-differentiable-input-returned": '''
import torch


class Fuzz(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x0, x1):
        ctx.mark_non_differentiable(x1)
        return x0 * 2, x1

    @staticmethod
    def backward(ctx, g0, g1):
        return g0 * 2, None


def make_args():
    return (torch.randn(3).requires_grad_(True), torch.randn(3).requires_grad_(True))
''',
    # backward returns a tensor for an integer argument: eager drops it; minihop built a pair
    # that breaks its own contract (MH401) at capture.
    "gradient-for-integer-argument": '''
import torch


class Fuzz(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x0, x1):
        return x1 * x0

    @staticmethod
    def backward(ctx, g0):
        return torch.zeros(g0.shape), g0 * 2


def make_args():
    return (torch.arange(4), torch.randn(4).requires_grad_(True))
''',
}


@pytest.mark.parametrize("name", sorted(FOUND))
def test_found_by_the_fuzzer(name: str) -> None:
    """A minimized fuzz finding now matches eager (or is refused with a documented code)."""
    case = Case(FOUND[name].lstrip(), (name,))
    outcome = run_case(case, _DIRECTORY)
    assert outcome.kind != "invalid", outcome.detail
    if outcome.kind in ("mismatched", "crashed"):
        assert outcome.error is not None
        outcome.error.add_note(f"minihop fuzz finding {name!r}:\n{case.source}")
        raise outcome.error
