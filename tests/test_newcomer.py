"""The oracle toolkit as a newcomer meets it (issue 33's acceptance).

A new user's oracle test file, written as docs/oracle.md tells them to (a Function in their own
module; ``capture``, ``assert_matches_eager``, ``assert_pair_matches_eager`` on torch.compile's
bodies, ``assert_same_graph`` on an ``fx.Graph``, the ``minihop_oracle`` fixture), runs in a
fresh pytest process and passes; a deliberately wrong pair in it fails at the test's own line,
not inside minihop. Besides: the reprs a REPL shows are one short line, and the command line
answers ``--version`` and reports a bad ``show`` target in one line.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import minihop
from minihop import demo

ROOT = Path(__file__).resolve().parents[1]

USER_MODULE = '''
import torch


class ScaledSin(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, scale):
        ctx.save_for_backward(x)
        ctx.scale = scale
        return torch.sin(x) * scale

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * torch.cos(x) * ctx.scale, None


class WrongBackward(torch.autograd.Function):
    """Another system's mistake: the same forward, backward forgets the scale."""

    @staticmethod
    def forward(ctx, x, scale):
        ctx.save_for_backward(x)
        return torch.sin(x) * scale

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * torch.cos(x), None
'''

USER_TESTS = '''
import torch
import torch.fx as fx

import minihop
from minihop.testing import (assert_matches_eager, assert_pair_matches_eager, assert_same_graph,
                             dynamo_graphs)
from my_functions import ScaledSin, WrongBackward


def args():
    return torch.randn(4, 3, requires_grad=True), 2.0


def test_capture_reads_well():
    cap = minihop.capture(ScaledSin, *args())
    assert repr(cap) == "Capture(ScaledSin, x: f32[4, 3] grad, scale: 2.0)"
    assert "class fwd_body_0" in str(cap)


def test_capture_matches_eager():
    assert_matches_eager(ScaledSin, *args())


def test_compiled_pair_matches_eager():
    a = args()
    d = dynamo_graphs(ScaledSin, *a)
    assert_pair_matches_eager(ScaledSin, a, d.fwd, d.bwd)


def test_same_graph_as_torch_compile_on_graphs():
    a = args()
    cap = minihop.capture(ScaledSin, *a)
    d = dynamo_graphs(ScaledSin, *a)
    assert isinstance(d.fwd.graph, fx.Graph)
    assert_same_graph(cap.fwd.graph, d.fwd.graph, check_meta=True)
    assert_same_graph(cap.bwd, d.bwd.graph, check_meta=True)


def test_fixture(minihop_oracle):
    a = args()
    cap = minihop_oracle.capture(ScaledSin, *a)
    minihop_oracle.assert_pair_matches_eager(ScaledSin, a, cap.fwd, cap.bwd)
    assert minihop_oracle.check_consistent(cap.fwd, cap.bwd).num_inputs == 1
    y = minihop_oracle.apply(ScaledSin, *a)
    assert y.shape == (4, 3)


def test_wrong_pair_is_caught():
    a = args()
    wrong = minihop.capture(WrongBackward, *a)   # stands for another system's pair
    assert_pair_matches_eager(ScaledSin, a, wrong.fwd, wrong.bwd)   # EXPECTED TO FAIL HERE
'''


@pytest.fixture(scope="module")
def newcomer_run(tmp_path_factory: pytest.TempPathFactory) -> subprocess.CompletedProcess[str]:
    project = tmp_path_factory.mktemp("newcomer")
    (project / "my_functions.py").write_text(USER_MODULE)
    (project / "test_my_oracle.py").write_text(USER_TESTS)
    # The fixture comes from the installed entry point; this checkout's minihop comes first.
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "PYTEST_PLUGINS", "PYTEST_ADDOPTS")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(project), env.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "test_my_oracle.py", "-p", "no:cacheprovider",
         "-p", "no:hypothesispytest", "-p", "no:benchmark"],
        cwd=project, env=env, capture_output=True, text=True, timeout=600, check=False)


def test_newcomer_oracle_file_passes(newcomer_run: subprocess.CompletedProcess[str]) -> None:
    """Every test of the new user's file passes but the one that hands over a wrong pair."""
    out = newcomer_run.stdout + newcomer_run.stderr
    assert "5 passed" in out and "1 failed" in out, out
    assert "FAILED test_my_oracle.py::test_wrong_pair_is_caught" in out, out


def test_failure_points_at_the_users_line(newcomer_run: subprocess.CompletedProcess[str]) -> None:
    """The wrong pair's failure shows the test's line and the grad that differs, no minihop frame."""
    out = newcomer_run.stdout
    assert "EXPECTED TO FAIL HERE" in out
    assert "grad of" in out and "Tensor-likes are not close" in out
    assert "minihop/testing.py" not in out and "minihop/pytest_plugin.py" not in out, out


def test_sweep_filter_knows_every_option() -> None:
    """tests/dynamo_sweep passes the comparison options, not capture's, to the original."""
    import inspect

    options = [p for p in inspect.signature(minihop.testing.assert_matches_eager).parameters
               if p not in ("fn_cls", "args", "kwargs")]
    sweep = (ROOT / "tests" / "dynamo_sweep.py").read_text()
    for name in options:
        assert f'"{name}"' in sweep, name


# The Functions the README and its docs pages show (MySin; the demo's in docs/graph_contract.md;
# LinearFn in docs/integration.md), with the arguments they give them.
class LinearFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias):  # type: ignore[no-untyped-def]
        ctx.save_for_backward(x, weight)
        return x @ weight.t() + bias

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def]
        x, weight = ctx.saved_tensors
        return grad @ weight, grad.t() @ x, grad.sum(0)


README_CALLS = [
    (demo.MySin, lambda: (torch.randn(8, requires_grad=True),), {}),
    (demo.MySin, lambda: (torch.randn(6, 4, requires_grad=True),), {"dynamic": True}),
    (demo.ExpTimesAndSquare, lambda: (torch.randn(4, requires_grad=True),), {}),
    (demo.ScaleShift, lambda: (torch.randn(2, 3, requires_grad=True),
                               demo.Affine(torch.randn(3), torch.randn(3)), torch.randn(2)), {}),
    (demo.WithArgmax, lambda: (torch.randn(3, 4, requires_grad=True),), {}),
    (LinearFn, lambda: (torch.randn(32, 4), torch.randn(16, 4, requires_grad=True),
                        torch.randn(16, requires_grad=True)), {"dynamic": {"x": [0]}}),
]


@pytest.mark.parametrize(("fn_cls", "make_args", "options"), README_CALLS,
                         ids=[f"{c[0].__name__}-{i}" for i, c in enumerate(README_CALLS)])
def test_capture_repr_is_one_short_line(fn_cls: type, make_args: object, options: dict[str, object]) -> None:
    cap = minihop.capture(fn_cls, *make_args(), **options)  # type: ignore[operator]
    text = repr(cap)
    assert len(text) < 200 and "\n" not in text, text
    assert text.startswith(f"Capture({fn_cls.__name__}, ")
    for name in cap.argnames:
        assert f"{name}: " in text
    if options.get("dynamic"):
        assert "; dynamic " in text


def test_capture_repr_names_dynamic_dims() -> None:
    cap = minihop.capture(LinearFn, torch.randn(32, 4), torch.randn(16, 4, requires_grad=True),
                          torch.randn(16, requires_grad=True), dynamic={"x": [0]})
    assert repr(cap) == "Capture(LinearFn, x: f32[?, 4], weight: f32[16, 4] grad, bias: f32[16] grad; dynamic x[0])"


def test_capture_repr_stays_short_for_many_arguments() -> None:
    class Many(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *xs):  # type: ignore[no-untyped-def]
            return sum(xs)

        @staticmethod
        def backward(ctx, g):  # type: ignore[no-untyped-def]
            return (g,) * 30

    cap = minihop.capture(Many, *[torch.randn(100, 100, 3, requires_grad=True) for _ in range(30)])
    assert len(repr(cap)) < 200 and repr(cap).endswith("...)")


def test_explanation_prints_once_in_a_repl(capsys: pytest.CaptureFixture[str]) -> None:
    """A REPL prints ``explain``'s report, then the returned value's repr: one line, not the report again."""
    report = minihop.explain(demo.MySin, torch.randn(4, requires_grad=True))
    printed = capsys.readouterr().out
    assert printed.count("minihop.explain: MySin") == 1
    assert "\n" not in repr(report) and len(repr(report)) < 200
    assert repr(report).startswith("Explanation(MySin: captured")
    assert str(report).startswith("minihop.explain: MySin")


def test_check_consistent_returns_the_public_pair_shape() -> None:
    cap = minihop.capture(demo.ExpTimesAndSquare, torch.randn(4, requires_grad=True))
    shape = minihop.check_consistent(cap.fwd, cap.bwd)
    assert isinstance(shape, minihop.PairShape)
    assert shape.num_inputs == len(cap.inputs)


def _cli(*argv: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-m", "minihop", *argv], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300, check=False)


def test_cli_version() -> None:
    result = _cli("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"minihop {minihop.__version__} (torch {torch.__version__})"


@pytest.mark.parametrize("target", ["no_such_file.py:F", "json:NoSuchName", "no_such_module_xyz:F",
                                    "BROKEN.py:F", "json:dumps", "NOTAFUNCTION.py:Jitter"])
def test_cli_show_errors_are_one_line(tmp_path: Path, target: str) -> None:
    """A bad target, a broken file, a non-Function or a refused Function: one line on stderr,
    no traceback, no internal module name; exit status 2."""
    (tmp_path / "BROKEN.py").write_text("raise RuntimeError('boom')\n")
    (tmp_path / "NOTAFUNCTION.py").write_text(textwrap.dedent('''
        import torch
        class Jitter(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x.clone()
            @staticmethod
            def backward(ctx, grad):
                if torch.rand(()) < 0.5:
                    return grad
                return -grad
        '''))
    result = _cli("show", target, "--args", "f32[4]", cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    err = result.stderr.strip()
    assert "\n" not in err and "Traceback" not in err, err
    assert err.startswith("minihop show: "), err
    assert "_minihop_show_target" not in err and "minihop.tracer" not in err, err
    if target.startswith("NOTAFUNCTION"):
        assert "[MH103]" in err


def test_cli_bench_from_another_directory(tmp_path: Path) -> None:
    """``python -m minihop bench`` finds bench/ beside the package, from any directory."""
    result = _cli("bench", "--help", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "usage: python -m bench" in result.stdout
