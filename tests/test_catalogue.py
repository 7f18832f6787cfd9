"""docs/unsupported.md is true: each example raises its code, with the documented first line."""

from __future__ import annotations

import pathlib
import re

import pytest
import torch

import minihop

DOC = pathlib.Path(__file__).resolve().parent.parent / "docs" / "unsupported.md"
ENTRY = re.compile(
    r"^### (?P<id>MH\d{3}-[\w-]+):.*?```python example\n(?P<code>.*?)```\s*\nMessage: `(?P<message>.*?)`$",
    re.S | re.M)
ENTRIES = {m["id"]: (m["code"], m["message"]) for m in ENTRY.finditer(DOC.read_text())}


def test_every_error_class_has_an_entry() -> None:
    """Each public error code appears in the catalogue."""
    codes = {entry.split("-")[0] for entry in ENTRIES}
    for name in minihop.errors.__all__:
        cls = getattr(minihop.errors, name)
        if cls is not minihop.MinihopError:
            assert cls.code in codes, f"{name} ({cls.code}) has no entry in docs/unsupported.md"


@pytest.mark.parametrize("entry", sorted(ENTRIES))
def test_entry(entry: str) -> None:
    """The entry's example raises its code, and the message starts as documented."""
    code, message = ENTRIES[entry]
    namespace = {"torch": torch, "minihop": minihop, "x": torch.randn(3, requires_grad=True),
                 "__name__": f"catalogue_{entry.replace('-', '_')}"}
    with pytest.raises(minihop.MinihopError) as info:
        exec(compile(code, f"<{entry}>", "exec"), namespace)
    first_line = str(info.value).splitlines()[0]
    assert info.value.code == entry.split("-")[0]
    pattern = re.escape(message).replace(r"\*", ".*")
    assert re.fullmatch(pattern, first_line), f"\n  documented: {message}\n  raised:     {first_line}"
