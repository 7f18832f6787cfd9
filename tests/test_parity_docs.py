"""The parity tables are true: every row of docs/parity.md's tables (the README links there and
carries none) names a test that exists (so the row is proven by a test that runs in CI)."""

from __future__ import annotations

import importlib.util
import pathlib
import re
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
ABBREVIATIONS = {"S": "tests/test_semantics.py", "D": "tests/test_dynamic.py"}


def _rows(text: str, heading: str | None) -> list[str]:
    section = text
    if heading is not None:
        start = text.index(heading)
        end = text.find("\n## ", start + len(heading))
        section = text[start:end if end != -1 else None]
    return [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| feature")]


def _resolve(ref: str) -> None:
    if "::" not in ref:
        assert (ROOT / ref).exists(), f"{ref} does not exist"
        return
    file, *names = ref.split("::")
    file = ABBREVIATIONS.get(file, file)
    name = f"_parity_{pathlib.Path(file).stem}"
    module = sys.modules.get(name)
    if module is None:
        spec = importlib.util.spec_from_file_location(name, ROOT / file)
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses in the module look themselves up there
        spec.loader.exec_module(module)
    obj = module
    for name in names:
        name = name.split("[")[0]
        assert hasattr(obj, name), f"{ref}: {name} not found"
        obj = getattr(obj, name)


@pytest.mark.parametrize("doc,heading", [("docs/parity.md", None)])
def test_every_row_names_an_existing_test(doc: str, heading: str | None) -> None:
    """Each table row's last cell names a test (file, class or function) that exists."""
    rows = _rows((ROOT / doc).read_text(), heading)
    assert len(rows) >= 10
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        if set(cells[0]) <= {"-", " "}:
            continue
        refs = re.findall(r"`([^`]+)`", cells[-1])
        assert refs, f"{doc}: row has no test: {row}"
        for ref in refs:
            _resolve(ref)
