"""The Dynamo sweep (``dynamo_sweep.py``): it is on, it can fail, it leaves tests alone, and its
list of known differences is docs/oracle.md's."""

from __future__ import annotations

import pathlib
import re
from typing import Any

import pytest
import torch
from torch.autograd import Function

import minihop
import minihop.testing
from dynamo_sweep import KNOWN_DIFFERENCES, Tally, checked, compare, function_key

ORACLE_PAGE = pathlib.Path(__file__).resolve().parent.parent / "docs" / "oracle.md"

# docs/oracle.md bullets whose Functions the sweep does not meet, and the test that pins each instead.
PINNED_ELSEWHERE = {"A size computed in Python": "tests/test_automatic_dynamic.py"}


class Doubles(Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return 2 * x

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return 2 * g


class DoublesAsMethod(Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.mul(2)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return 2 * g


def x4() -> torch.Tensor:
    return torch.rand(4, requires_grad=True)


def listed_differences() -> list[str]:
    """The bold titles of docs/oracle.md's "Where minihop's words still differ from Dynamo's" bullets."""
    text = ORACLE_PAGE.read_text()
    start = text.index("Where minihop's words still differ from Dynamo's")
    end = text.find("\n## ", start)  # the list may close the page
    section = text[start:end if end != -1 else None]
    return re.findall(r"^- \*\*(.+?)\*\*", section, flags=re.MULTILINE)


def test_sweep_is_installed(pytestconfig: pytest.Config) -> None:
    """In a normal run every ``assert_matches_eager`` of the suite goes through the sweep."""
    if not pytestconfig.pluginmanager.has_plugin("dynamo_sweep"):
        pytest.skip("run with -p no:dynamo_sweep")
    import test_capture_cases

    for fn in (minihop.testing.assert_matches_eager, test_capture_cases.assert_matches_eager):
        assert getattr(fn, "__wrapped__", None) is not None, fn


def test_known_differences_are_the_docs() -> None:
    """Each known difference names a docs/oracle.md bullet; each bullet is a known difference of a
    swept Function or pinned by another test."""
    titles = listed_differences()
    assert len(titles) == len(set(titles))
    assert set(KNOWN_DIFFERENCES.values()) <= set(titles), set(KNOWN_DIFFERENCES.values()) - set(titles)
    assert set(titles) - set(KNOWN_DIFFERENCES.values()) == set(PINNED_ELSEWHERE)


def test_an_unlisted_difference_fails_with_both_graphs() -> None:
    """A pair written differently from Dynamo's (``x.mul(2)`` where Dynamo has ``2 * x``) fails
    the test's call, naming the Function and showing the diff, the way to fix it and the list."""
    mine = minihop.capture(DoublesAsMethod, x4())

    def passes(fn_cls: type, *args: Any, **kwargs: Any) -> Any:
        return minihop.testing.EagerComparison(mine, None, None, args, args)

    tally = Tally()
    sweep = checked(passes, known={}, tally=tally)
    with pytest.raises(AssertionError, match=r"(?s)minihop's bodies for test_dynamo_sweep:Doubles differ "
                       r"from torch.compile\(fullgraph=True\)'s.*fwd_body_0 \(a: minihop, b: Dynamo\).*"
                       r"-outs = Tensor.mul\(l_x_, 2\).*return x.mul\(2\).*\+outs = _operator.mul\(2, l_a_0_\).*return 2 \* x.*"
                       r"KNOWN_DIFFERENCES"):
        sweep(Doubles, x4())
    assert tally.differ == {"test_dynamo_sweep:Doubles"} and not tally.agree


def test_a_listed_difference_that_agrees_fails() -> None:
    """A known difference that has gone away fails too, so the list cannot go stale."""
    cap = minihop.capture(Doubles, x4())
    known = {function_key(Doubles): "some listed bullet"}
    message = compare(Doubles, cap, (x4(),), {}, known=known, tally=Tally())
    assert message is not None and "now agrees" in message and "some listed bullet" in message
    assert compare(Doubles, cap, (x4(),), {}, known={}, tally=Tally()) is None


def test_not_one_hop_is_counted_not_failed() -> None:
    """A Function Dynamo does not capture as one HOP is tallied, not compared."""

    class NoGradAnywhere(Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            return x * 2

        @staticmethod
        def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
            return g * 2

    x = torch.rand(4)  # no input needs a grad: Dynamo inlines forward
    tally = Tally()
    assert compare(NoGradAnywhere, minihop.capture(NoGradAnywhere, x), (x,), {}, known={}, tally=tally) is None
    assert list(tally.not_one_hop) == [function_key(NoGradAnywhere)]


def test_side_effects_happen_once() -> None:
    """Dynamo's compiled code never runs: a Function's Python side effects happen exactly as
    often with the sweep as without it (here, once for eager's call)."""
    log: list[int] = []

    class Logs(Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            log.append(1)
            return x * 2

        @staticmethod
        def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
            return g * 2

    original = minihop.testing.assert_matches_eager
    original = getattr(original, "__wrapped__", original)
    original(Logs, x4())
    without = len(log)
    tally = Tally()
    checked(original, known={}, tally=tally)(Logs, x4())
    assert len(log) - without == without and tally.agree == {function_key(Logs)}

