"""docs/integration.md runs: the training loop, DDP and torch.compile examples, through minihop.

The page's blocks are taken from docs/integration.md with ``tests/test_docs_blocks.py``'s parser
and executed here (and only here: ``test_docs_blocks`` leaves this page to this file, so each
block runs once per test below, not twice): the training loop (the page's ``<!-- setup -->``
block) alone; the DDP and the torch.compile groups each after the training loop, which they
continue (they use its ``LinearFn``, ``make_model``, ``train`` and eager reference), each in a
fresh namespace. Each block ends by asserting that it matches eager PyTorch; the tests check
besides that minihop's captures served the calls (no eager fallback), and that the DDP example
leaves no process group behind.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from test_docs_blocks import DOCS, page_groups

import minihop

PAGE = DOCS / "integration.md"


def blocks() -> tuple[tuple[int, str], tuple[int, str], tuple[int, str]]:
    """``(training loop, DDP, torch.compile)``, each as (line of its first code line, code)."""
    setup, groups = page_groups(PAGE)
    assert len(setup) == 1 and sorted(groups) == ["compile", "ddp"], (setup, sorted(groups))
    assert len(groups["ddp"]) == 1 and len(groups["compile"]) == 1, groups
    return setup[0], groups["ddp"][0], groups["compile"][0]


def run_block(block: tuple[int, str], namespace: dict[str, Any]) -> None:
    line, code = block
    # Padded so that tracebacks give the page's own line numbers. Named "<docs/integration.md>",
    # not the page's path: code that reads a function's source (Dynamo does) must not take the
    # markdown file for Python.
    exec(compile("\n" * (line - 1) + code, "<docs/integration.md>", "exec"), namespace)  # noqa: S102


def delta(before: dict[str, int]) -> dict[str, int]:
    return {name: value - before[name] for name, value in minihop.counters().items()}


def test_page_has_the_three_examples() -> None:
    """The page holds exactly three python examples: training loop, DDP, torch.compile."""
    training, ddp, compiled = (code for _, code in blocks())
    assert "minihop.apply(" in training and "torch.optim." in training and "torch.no_grad()" in training
    assert "DistributedDataParallel(" in ddp and "destroy_process_group()" in ddp
    assert "torch.compile(fullgraph=True" in compiled and "minihop.apply(" in compiled


def test_training_loop_example() -> None:
    """The training loop trains through minihop.apply and ends equal to torch's own Linear
    (the block asserts it); its calls were captures and cache hits, none eager."""
    minihop.clear_cache()
    before = minihop.counters()
    run_block(blocks()[0], {"__name__": "__docs_integration__"})
    counts = delta(before)
    assert counts["fallbacks"] == 0, counts
    assert counts["captures"] > 0, counts
    assert counts["cache_hits"] > counts["captures"], counts  # later steps reuse the captures


def test_ddp_example() -> None:
    """The DDP block (a job of one process over gloo) trains the same model wrapped in
    DistributedDataParallel to the eager result (the block asserts it), through minihop's
    cache, and leaves no process group behind."""
    training, ddp, _ = blocks()
    namespace: dict[str, Any] = {"__name__": "__docs_integration__"}
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
    training, _, compiled = blocks()
    namespace: dict[str, Any] = {"__name__": "__docs_integration__"}
    run_block(training, namespace)
    try:
        run_block(compiled, namespace)
    finally:
        torch.compiler.reset()
