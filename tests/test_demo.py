"""``python -m minihop`` and its ``demo`` subcommand."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path
from typing import Any, NoReturn

import pytest

import minihop.demo as demo
from minihop.__main__ import main


def test_demo_every_example_matches_eager(capsys: pytest.CaptureFixture[str]) -> None:
    """The demo prints each capture's graphs and one ok line per example, and exits 0."""
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    assert out.count("class bwd_body_0(torch.nn.Module):") == len(demo.EXAMPLES) == 4
    for example in demo.EXAMPLES:
        assert f"ok        {example.function.__name__}: outputs and grads (" in out
    assert "params.weight: None, params.bias: None, unused: None" in out
    assert "ms first" in out and "ms warm" in out
    assert out.rstrip().endswith("4 of 4 examples match eager")


def test_demo_no_graphs(capsys: pytest.CaptureFixture[str]) -> None:
    """``--no-graphs`` prints only the results."""
    assert main(["demo", "--no-graphs"]) == 0
    out = capsys.readouterr().out
    assert "fwd_body_0" not in out
    assert out.count("ok        ") == 4


def test_demo_mismatch_exits_nonzero(monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    """A difference from eager prints a MISMATCH line and makes the exit status 1."""
    def differs(*args: Any, **kwargs: Any) -> NoReturn:
        raise AssertionError("output[0]: Tensor-likes are not close!")

    monkeypatch.setattr(demo, "assert_matches_eager", differs)
    assert main(["demo", "--no-graphs"]) == 1
    out = capsys.readouterr().out
    assert "MISMATCH  MySin: differs from eager" in out
    assert "Tensor-likes are not close!" in out
    assert out.rstrip().endswith("0 of 4 examples match eager")


def test_no_subcommand_prints_help(capsys: pytest.CaptureFixture[str]) -> None:
    """``python -m minihop`` alone prints the help, listing the subcommands."""
    assert main([]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: python -m minihop")
    assert "demo" in out


def test_module_entry_point() -> None:
    """``python -m minihop --help`` runs as a module."""
    done = subprocess.run([sys.executable, "-m", "minihop", "--help"], capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert "demo" in done.stdout


def test_demo_does_not_import_dynamo() -> None:
    """The demo module itself never imports torch._dynamo (minihop captures without it)."""
    tree = ast.parse(Path(demo.__file__).read_text())
    imported = [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names]
    imported += [node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
    assert not [name for name in imported if "_dynamo" in name]
