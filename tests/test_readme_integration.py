"""The README's section "Using minihop in a training loop / with DDP / with torch.compile" runs.

Its three ```python blocks are taken from README.md (exactly that section) and executed, each in
a fresh namespace: the training loop alone; the DDP and the torch.compile examples each after
the training loop, which they continue (they use its ``LinearFn``, ``make_model``, ``train`` and
eager reference). Each block ends by asserting that it matches eager PyTorch; the tests check
besides that minihop's captures served the calls (no eager fallback).

The blocks are not marked ``<!-- runnable -->``: ``test_readme.py`` runs those all in one
namespace, and the DDP block's process group or the compile block's state must not leak there.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

import minihop

README = Path(__file__).resolve().parents[1] / "README.md"
HEADING = "## Using minihop in a training loop / with DDP / with torch.compile"


def section_blocks() -> list[tuple[int, str]]:
    """The section's ```python blocks as (line number of their first line, code)."""
    lines = README.read_text().split("\n")
    assert lines.count(HEADING) == 1, f"README.md has no single {HEADING!r}"
    start = lines.index(HEADING) + 1
    end = next((i for i in range(start, len(lines)) if lines[i].startswith("## ")), len(lines))
    blocks = []
    i = start
    while i < end:
        opening = re.match(r"^```(\w*)\s*$", lines[i])
        if opening is None:
            i += 1
            continue
        close = next((j for j in range(i + 1, end) if lines[j].rstrip() == "```"), None)
        assert close is not None, f"README.md:{i + 1}: fenced block never closed in the section"
        if opening.group(1) == "python":
            blocks.append((i + 2, "\n".join(lines[i + 1:close]) + "\n"))
        i = close + 1
    return blocks


def run_block(block: tuple[int, str], namespace: dict[str, Any]) -> None:
    line, code = block
    # Padded so that tracebacks give README.md's own line numbers. Named "<README.md>", not
    # README.md's path: code that reads a function's source (Dynamo does) must not take the
    # markdown file for Python.
    exec(compile("\n" * (line - 1) + code, "<README.md>", "exec"), namespace)  # noqa: S102


def delta(before: dict[str, int]) -> dict[str, int]:
    return {name: value - before[name] for name, value in minihop.counters().items()}


def test_section_has_the_three_examples() -> None:
    """The section holds exactly three python blocks: training loop, DDP, torch.compile."""
    blocks = section_blocks()
    assert len(blocks) == 3, [line for line, _ in blocks]
    training, ddp, compiled = (code for _, code in blocks)
    assert "minihop.apply(" in training and "torch.optim." in training and "torch.no_grad()" in training
    assert "DistributedDataParallel(" in ddp and "destroy_process_group()" in ddp
    assert "torch.compile(fullgraph=True" in compiled and "minihop.apply(" in compiled


def test_training_loop_example() -> None:
    """The training loop trains through minihop.apply and ends equal to torch's own Linear
    (the block asserts it); its calls were captures and cache hits, none eager."""
    minihop.clear_cache()
    before = minihop.counters()
    run_block(section_blocks()[0], {"__name__": "__readme__"})
    counts = delta(before)
    assert counts["fallbacks"] == 0, counts
    assert counts["captures"] > 0, counts
    assert counts["cache_hits"] > counts["captures"], counts  # later steps reuse the captures


def test_ddp_example() -> None:
    """The DDP block (a job of one process over gloo) trains the same model wrapped in
    DistributedDataParallel to the eager result (the block asserts it), through minihop's
    cache, and leaves no process group behind."""
    training, ddp, _ = section_blocks()
    namespace: dict[str, Any] = {"__name__": "__readme__"}
    run_block(training, namespace)
    before = minihop.counters()
    try:
        run_block(ddp, namespace)
    finally:
        left_initialised = dist.is_initialized()
        if left_initialised:
            dist.destroy_process_group()
    assert not left_initialised, "the DDP example left its process group initialised"
    counts = delta(before)
    assert counts["fallbacks"] == 0, counts
    assert counts["cache_hits"] > 0, counts


def test_torch_compile_example() -> None:
    """torch.compile(fullgraph=True) over a function calling minihop.apply compiles without a
    graph break and gives eager's output and gradients (the block asserts it)."""
    training, _, compiled = section_blocks()
    namespace: dict[str, Any] = {"__name__": "__readme__"}
    run_block(training, namespace)
    try:
        run_block(compiled, namespace)
    finally:
        torch.compiler.reset()
