"""The README stays true: its runnable snippets run, and its set-up commands are what CI runs."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
CI_RUN = ROOT / ".ci" / "run"

# A fenced block is runnable when the line just above its opening fence is this marker.
RUNNABLE = "<!-- runnable -->"
# The set-up commands are marked the same way: <!-- setup: main --> / <!-- setup: test -->.
SETUP = re.compile(r"<!-- setup: (\w+) -->")

from test_docs_blocks import fenced_blocks  # noqa: E402  (one fence parser for every page)


def runnable_blocks() -> list[tuple[int, str]]:
    return [(line, code) for marker, line, lang, code in fenced_blocks(README)
            if marker == RUNNABLE and lang == "python"]


def setup_commands() -> dict[str, str]:
    commands = {}
    for marker, _line, _lang, code in fenced_blocks(README):
        m = SETUP.fullmatch(marker)
        if m:
            commands[m.group(1)] = code.strip()
    return commands


def test_readme_is_a_front_page() -> None:
    """The README stays a front page a newcomer reads in ten minutes (issue 33): at most 300
    lines; a subject's details go to its page under docs/, with a pointer here."""
    lines = README.read_text().splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines; move details into a docs/ page"


def test_readme_has_runnable_snippets() -> None:
    """The README marks at least the quick start as runnable (so the test below tests something)."""
    assert len(runnable_blocks()) >= 2


def test_readme_runnable_snippets_run(capsys: pytest.CaptureFixture[str]) -> None:
    """Every runnable ```python block runs, in order, in one namespace, as a reader would."""
    namespace: dict[str, Any] = {"__name__": "__readme__"}
    for line, code in runnable_blocks():
        # Padded so tracebacks (and minihop's error locations) give README.md's own line numbers.
        exec(compile("\n" * (line - 1) + code, str(README), "exec"), namespace)  # noqa: S102
    out = capsys.readouterr().out
    assert "class fwd_body_0(torch.nn.Module):" in out


def test_readme_has_exactly_two_setup_commands() -> None:
    """One command runs the main job (install + demo), one runs the tests (install + pytest)."""
    commands = setup_commands()
    assert sorted(commands) == ["main", "test"]
    for command in commands.values():
        assert "\n" not in command, "a set-up command is one line"
    assert commands["main"].endswith("python -m minihop demo")
    assert "python -m pytest" in commands["test"]


def _ci_runs(step: str) -> bool:
    lines = [line.strip() for line in CI_RUN.read_text().split("\n")]
    return any(line == step or line.startswith(step + " ") for line in lines)


def test_ci_runs_the_readme_test_command() -> None:
    """Each step of the README's test command appears verbatim, in order, in .ci/run."""
    steps = setup_commands()["test"].split(" && ")
    text = CI_RUN.read_text()
    for step in steps:
        shlex.split(step)  # valid shell words
        assert _ci_runs(step), f".ci/run does not run the README's step {step!r}"
    positions = [text.index(step) for step in steps]
    assert positions == sorted(positions), ".ci/run runs the README's steps out of order"


def test_ci_runs_the_readme_main_job() -> None:
    """.ci/run installs what the main job installs and runs its demo step."""
    main_steps = setup_commands()["main"].split(" && ")
    test_steps = setup_commands()["test"].split(" && ")
    assert main_steps[0] == test_steps[0]  # the same torch install
    assert main_steps[1] == "python -m pip install -e ."
    assert test_steps[1] == "python -m pip install -e '.[test]'"  # covers main's install
    assert _ci_runs(main_steps[-1])


def test_ci_run_strict_and_pins_torch() -> None:
    """.ci/run stops on the first failure and installs exactly torch==2.13.0 (the wheel on disk)."""
    text = CI_RUN.read_text()
    assert "set -euo pipefail" in text
    assert re.findall(r"pip install torch\S*", text) == ["pip install torch==2.13.0"]
