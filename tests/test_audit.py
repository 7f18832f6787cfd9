"""``pytest --minihop-audit``: a small project's suite run with and without the option (pytester,
in a subprocess) gives the same outcomes, output and observed state, and the right verdicts."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from minihop.audit import Call, Verdict, Watcher, audit_call
from minihop.audit.watch import uncopyable

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # bench/ is a directory of the repository, not an installed package
    sys.path.insert(0, str(ROOT))

pytest_plugins = ["pytester"]

# The project: Functions written the way packages write them, and tests that record what they
# observe (counters, random draws, captured output, warnings) in a file, one JSON line each.
PROJECT = '''
import json, os, random, warnings
import numpy
import pytest
import torch


def observe(name, value):
    with open(os.environ["AUDIT_OBSERVED"], "a") as f:
        f.write(json.dumps([name, value]) + "\\n")


class Square(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return 2 * x * grad


class Unmaterialized(torch.autograd.Function):
    """Two outputs; backward treats an unused output's None grad differently from zeros."""

    @staticmethod
    def forward(ctx, x):
        ctx.set_materialize_grads(False)
        return x * 2, x * 3

    @staticmethod
    def backward(ctx, g_double, g_triple):
        grad = g_double * 2
        if g_triple is not None:
            grad = grad + 1
        return grad


class Printing(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        print("Printing.forward ran")
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        return grad * 2


class Counting(torch.autograd.Function):
    calls = 0

    @staticmethod
    def forward(ctx, x):
        Counting.calls += 1
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        return grad * 2


class Noisy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x + torch.rand_like(x)

    @staticmethod
    def backward(ctx, grad):
        return grad


class Warns(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        warnings.warn("Warns.forward is deprecated", DeprecationWarning)
        return x.exp()

    @staticmethod
    def backward(ctx, grad):
        return grad


def test_square():
    x = torch.randn(4, requires_grad=True)
    Square.apply(x).sum().backward()
    observe("square grad", x.grad.tolist())


def test_square_other_shape():
    Square.apply(torch.randn(2, 3, requires_grad=True)).sum().backward()


def test_unmaterialized():
    x = torch.randn(3, requires_grad=True)
    doubled, _ = Unmaterialized.apply(x)
    doubled.sum().backward()
    observe("unmaterialized grad", x.grad.tolist())


def test_printing():
    Printing.apply(torch.ones(2, requires_grad=True))


def test_counting_first():
    Counting.apply(torch.ones(2, requires_grad=True))
    observe("calls after first", Counting.calls)


def test_counting_second():
    Counting.apply(torch.ones(2, requires_grad=True))
    observe("calls after second", Counting.calls)


def test_random_stream():
    torch.manual_seed(1)
    out = Noisy.apply(torch.zeros(3, requires_grad=True))
    observe("noisy", out.tolist())
    observe("streams", [torch.rand(2).tolist(), random.random(), numpy.random.rand()])


def test_warns():
    Warns.apply(torch.zeros(2, requires_grad=True))


def test_fails():
    assert Square.apply(torch.ones(2)).sum().item() == 3.0


def test_skipped():
    pytest.skip("not on this platform")
'''

# What runs after the audit: a hook that finishes later sees the state the suite left.
CONFTEST = '''
import random
import numpy
import torch

from test_project import Counting, observe

# One stream for the whole session: every test's draws depend on every earlier draw.
torch.manual_seed(0)
random.seed(0)
numpy.random.seed(0)


def pytest_unconfigure(config):
    observe("at exit", [Counting.calls, torch.rand(2).tolist(), random.random(), numpy.random.rand()])
'''


def run_project(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, *options: str) -> tuple[pytest.RunResult, list[object]]:
    """The project's suite in a fresh interpreter; its result and what its tests observed."""
    observed = pytester.path / f"observed{len(options)}.jsonl"
    pytester.makepyfile(test_project=PROJECT, conftest=CONFTEST)
    monkeypatch.setenv("AUDIT_OBSERVED", str(observed))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rA", "-W", "default", *options)
    return result, [json.loads(line) for line in observed.read_text().splitlines()]


def suite_lines(result: pytest.RunResult) -> list[str]:
    """The session's output without the audit's section, the timings and object addresses."""
    lines, in_audit = [], False
    for line in result.outlines:
        if "minihop audit" in line:
            in_audit = True
        elif in_audit and line.startswith(("=", "_")):
            in_audit = False
        if not in_audit:
            line = re.sub(r"\d+\.\d+s( \(\d+:\d+:\d+\))?", "Ns", line)  # a time, and the rule's width with it
            lines.append(re.sub(r"0x[0-9a-f]+", "0x", line).strip("= "))
    return lines


class TestAudit:
    def test_suite_unchanged_and_verdicts(self, pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
        """Outcomes, output and observed state are the same with the audit; the verdicts are right."""
        plain, plain_observed = run_project(pytester, monkeypatch)
        report = pytester.path / "audit.json"
        audited, audited_observed = run_project(pytester, monkeypatch, "--minihop-audit=dynamo",
                                                f"--minihop-audit-report={report}")
        assert audited.parseoutcomes() == plain.parseoutcomes() == {
            "failed": 1, "passed": 8, "skipped": 1, "warnings": 1}
        assert audited.ret == plain.ret == 1
        assert audited_observed == plain_observed
        assert suite_lines(audited) == suite_lines(plain)
        assert "Printing.forward ran" in audited.stdout.str()  # its -rA captured output, once
        assert audited.stdout.str().count("Printing.forward ran") == 1

        records = {r["function"]: r for r in json.loads(report.read_text())}
        first = json.loads(report.read_text())[0]
        assert first["function"] == "Unmaterialized"  # Dynamo silently wrong: flagged first
        assert first["minihop"]["verdict"] == "agrees"
        assert first["dynamo"]["verdict"] == "differs"
        assert "grad of x" in first["dynamo"]["message"] and "output 0 alone" in first["dynamo"]["message"]
        square = records["Square"]
        assert (square["calls"], square["audited_calls"]) == (3, 3)  # (4,), (2, 3) and no-grad (2,)
        assert square["minihop"]["verdict"] == square["dynamo"]["verdict"] == "agrees"
        assert square["graphs_equal"] is True
        square_line = PROJECT.strip().splitlines().index("class Square(torch.autograd.Function):") + 1
        assert square["location"] == f"test_project.py:{square_line}"
        assert records["Printing"]["minihop"]["verdict"] == "refused"
        assert records["Printing"]["minihop"]["code"] == "MH106"
        assert records["Printing"]["dynamo"]["verdict"] == "not audited"
        assert records["Counting"]["calls"] == 2
        assert records["Counting"]["minihop"]["verdict"] == "agrees"
        assert records["Noisy"]["minihop"]["verdict"] == "agrees"
        # A warning in forward is sent on every eager call; a capture would send it once: MH106.
        assert records["Warns"]["minihop"]["verdict"] == "refused"
        assert records["Warns"]["minihop"]["code"] == "MH106"
        assert set(records) == {"Square", "Unmaterialized", "Printing", "Counting", "Noisy", "Warns"}
        assert (pytester.path / "audit.md").read_text().startswith("| Function |")
        # bench/audit.py reads the summary's headline: 6 Functions, 9 calls, 8 audited
        from bench.audit import _AUDIT_LINE
        assert _AUDIT_LINE.search(audited.stdout.str()).groups()[:3] == ("6", "9", "8")

    def test_signatures_are_bounded(self, pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
        """``--minihop-audit-signatures=1`` audits one call needing a grad per Function and one needing
        none; the rest are only counted."""
        report = pytester.path / "audit.json"
        result, _ = run_project(pytester, monkeypatch, "--minihop-audit", "--minihop-audit-signatures=1",
                                f"--minihop-audit-report={report}")
        records = {r["function"]: r for r in json.loads(report.read_text())}
        assert (records["Square"]["calls"], records["Square"]["audited_calls"]) == (3, 2)
        assert records["Square"]["dynamo"] is None  # minihop only
        assert "minihop audit (minihop against eager)" in result.stdout.str()


class TestWatcher:
    def test_install_and_uninstall_put_apply_back(self) -> None:
        """The watcher sees calls while installed and leaves ``Function.apply`` as it found it."""
        before = torch.autograd.Function.__dict__["apply"]
        watcher = Watcher()
        watcher.install()
        try:
            y = _Double.apply(torch.ones(2, requires_grad=True))
        finally:
            watcher.uninstall()
        assert torch.autograd.Function.__dict__["apply"] is before
        assert torch.equal(y, torch.full((2,), 2.0))
        assert watcher.seen[_Double].calls == 1 and len(watcher.seen[_Double].kept) == 1
        _Double.apply(torch.ones(2))
        assert watcher.seen[_Double].calls == 1  # no longer watching

    def test_calls_inside_transforms_are_not_copied(self) -> None:
        """A call under vmap is counted with its reason, not copied (its tensors are wrapped)."""
        watcher = Watcher()
        watcher.install()
        try:
            torch.func.vmap(_Double.apply)(torch.ones(3, 2))
        finally:
            watcher.uninstall()
        seen = watcher.seen[_Double]
        assert seen.kept == [] and "functorch transform" in next(iter(seen.uncopied))
        assert uncopyable((torch.ones(1),), {}) is None


class TestChecks:
    def test_a_call_eager_refuses_too_agrees(self) -> None:
        """A call eager itself rejects (the suite tests the error) agrees when minihop rejects it alike."""

        class ShiftCtx(torch.autograd.Function):
            @staticmethod
            def forward(ctx: object, x: torch.Tensor, scale: float = 2.0, shift: float = 0.0) -> torch.Tensor:
                return x * scale + shift

            @staticmethod
            def backward(ctx: object, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
                return grad * 2, None, None

        x = torch.ones(3, requires_grad=True)
        with pytest.raises(TypeError, match="missing required argument: 'scale'"):
            ShiftCtx.apply(x, shift=1.0)
        call = Call((x,), {"shift": 1.0}, True, ())
        result = audit_call(ShiftCtx, call, dynamo=False)
        assert result.minihop == Verdict("agrees", "eager raises too (TypeError)")

    def test_unmaterialized_grads_agree_for_each_output_alone(self) -> None:
        """The per-output losses reach a backward that tells None from zeros; minihop agrees."""

        class Unmaterialized(torch.autograd.Function):
            @staticmethod
            def forward(ctx: Any, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
                ctx.set_materialize_grads(False)
                return x * 2, x * 3

            @staticmethod
            def backward(ctx: Any, g1: torch.Tensor | None, g2: torch.Tensor | None) -> torch.Tensor:
                return (g1 * 2 if g1 is not None else 0) + (g2 * 3 if g2 is not None else 7)

        call = Call((torch.randn(3, requires_grad=True),), {}, True, ())
        assert audit_call(Unmaterialized, call, dynamo=False).minihop == Verdict("agrees")


class _Double(torch.autograd.Function):
    generate_vmap_rule = True

    @staticmethod
    def forward(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @staticmethod
    def setup_context(ctx: object, inputs: object, output: object) -> None:
        pass

    @staticmethod
    def backward(ctx: object, grad: torch.Tensor) -> torch.Tensor:
        return grad * 2
