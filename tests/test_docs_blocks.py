"""Every docs page stays true: each runnable block of each ``docs/*.md`` page runs, with that
page's own set-up.

The README's mechanism (``tests/test_readme.py``), generalised to pages. The marker on the line
just above a fenced ``python`` block says how it runs:

  ``<!-- setup -->``            the page's set-up: runs first, before every group of the page;
  ``<!-- runnable -->``         the page's main group: these blocks run in order in one namespace;
  ``<!-- runnable: NAME -->``   a group of its own: its blocks run in order in a fresh namespace
                                (after the set-up), so one example's state (a process group, a
                                compiled function) does not leak into another's.

Each group of each page is one test case (``docs/integration.md::ddp``). A marker that is
misspelt, or sits above a block that is not Python, fails the suite rather than leaving the block
unrun. The code is compiled under the page's own path, padded so that tracebacks and minihop's
error locations give the page's line numbers.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
MARKER = re.compile(r"<!-- (setup|runnable(?:: ([\w-]+))?) -->")
# Pages the README's front page links to (issue 33): each must exist and have a runnable block.
LINKED_PAGES = ("dynamic_shapes.md", "integration.md", "graph_contract.md", "oracle.md")
# Pages whose blocks a test file of their own runs (with checks of its own), so that they run
# once, not twice: their groups are not cases here.
OWN_TEST_FILE = {"integration.md": "tests/test_integration_page.py"}


def fenced_blocks(path: Path) -> list[tuple[str, int, str, str]]:
    """Every fenced block of ``path`` as ``(marker line above it, first code line, language, code)``."""
    blocks = []
    lines = path.read_text().split("\n")
    i = 0
    while i < len(lines):
        opening = re.match(r"^```(\w*)(?:[ \t]+\S.*)?\s*$", lines[i])  # info string: "python example"
        if opening is None:
            i += 1
            continue
        end = i + 1
        while end < len(lines) and lines[end].rstrip() != "```":
            end += 1
        if end == len(lines):
            raise AssertionError(f"{path.name}:{i + 1}: fenced block never closed")
        marker = lines[i - 1].strip() if i > 0 else ""
        blocks.append((marker, i + 2, opening.group(1), "\n".join(lines[i + 1:end]) + "\n"))
        i = end + 1
    return blocks


def page_groups(path: Path) -> tuple[list[tuple[int, str]], dict[str, list[tuple[int, str]]]]:
    """``(set-up blocks, {group name: blocks})`` of a page; the main group is named ``main``."""
    setup: list[tuple[int, str]] = []
    groups: dict[str, list[tuple[int, str]]] = {}
    for marker, line, lang, code in fenced_blocks(path):
        m = MARKER.fullmatch(marker)
        if m is None:
            continue
        if lang != "python":
            raise AssertionError(f"{path.name}:{line - 1}: {marker} above a {lang or 'plain'} block")
        if m.group(1) == "setup":
            setup.append((line, code))
        else:
            groups.setdefault(m.group(2) or "main", []).append((line, code))
    return setup, groups


def _cases() -> list[Any]:
    cases = []
    for path in sorted(DOCS.glob("*.md")):
        if path.name in OWN_TEST_FILE:
            continue
        for group in page_groups(path)[1]:
            cases.append(pytest.param(path.name, group, id=f"{path.name}::{group}"))
    return cases


def run_group(page: str, group: str) -> dict[str, Any]:
    path = DOCS / page
    setup, groups = page_groups(path)
    namespace: dict[str, Any] = {"__name__": f"__docs_{path.stem}__"}
    for line, code in [*setup, *groups[group]]:
        exec(compile("\n" * (line - 1) + code, str(path), "exec"), namespace)  # noqa: S102
    return namespace


@pytest.mark.parametrize(("page", "group"), _cases())
def test_docs_page_blocks_run(page: str, group: str) -> None:
    """The group's blocks run after the page's set-up, as a reader would run them."""
    run_group(page, group)


def test_linked_pages_have_runnable_blocks() -> None:
    """The pages the README links to exist, and each shows its subject in code that runs."""
    for name in LINKED_PAGES:
        assert (DOCS / name).exists(), f"docs/{name} is missing"
        assert page_groups(DOCS / name)[1], f"docs/{name} has no runnable block"


def test_no_misspelt_markers() -> None:
    """A comment above a fenced block that looks like a marker is one (else the block would
    silently not run)."""
    for path in [*sorted(DOCS.glob("*.md")), ROOT / "README.md"]:
        for marker, line, _lang, _code in fenced_blocks(path):
            looks = re.match(r"<!--\s*(run|setup)", marker)
            if looks and path.name != "README.md":
                assert MARKER.fullmatch(marker), f"{path.name}:{line - 1}: unknown marker {marker!r}"


def test_marker_parser_groups_blocks(tmp_path: Path) -> None:
    """The parser itself: set-up, main group, a named group, a marker over a non-Python block."""
    fence = "```"
    page = tmp_path / "page.md"
    page.write_text(f"<!-- setup -->\n{fence}python\na = 1\n{fence}\n\n<!-- runnable -->\n{fence}python\n"
                    f"b = a + 1\n{fence}\n\n<!-- runnable: other -->\n{fence}python\nc = a\n{fence}\n"
                    f"\n{fence}python\nnot_run = 1\n{fence}\n")
    setup, groups = page_groups(page)
    assert [code for _, code in setup] == ["a = 1\n"]
    assert {name: [code for _, code in blocks] for name, blocks in groups.items()} == {
        "main": ["b = a + 1\n"], "other": ["c = a\n"]}
    page.write_text(f"<!-- runnable -->\n{fence}text\nout\n{fence}\n")
    with pytest.raises(AssertionError, match="above a text block"):
        page_groups(page)
