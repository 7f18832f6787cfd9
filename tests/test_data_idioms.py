"""The data-dependent idioms of ``tests/data_functions.py`` (issue 15): minihop captures each and matches eager, and docs/parity.md says how.

Each idiom is called with inputs that take every branch and size case, the data changing
between calls, forward and backward. ``minihop.function(F)`` (strict) must capture it and give
eager's outputs and every ``.grad`` exactly (a refusal fails the test: each of these idioms is
one a mechanism of issue 15 applies to); with ``fallback="eager"`` it must give eager's too. docs/parity.md's "Data-dependent values" rows
(``python -m bench parity-data --write``) must say what minihop does now.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest

import minihop

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # bench/ is a directory of the repository, not an installed package
    sys.path.insert(0, str(ROOT))

from bench.parity_data import COLUMNS, MARKER, PAGE, minihop_cell  # noqa: E402
from data_functions import IDIOMS, Idiom, record, same_record  # noqa: E402

IDS = [i.function.__name__ for i in IDIOMS]


@pytest.mark.parametrize("idiom", IDIOMS, ids=IDS)
def test_idiom_matches_eager(idiom: Idiom) -> None:
    """Strict: captured, eager's record exactly; fallback="eager": eager's record."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        eager = record(idiom, idiom.function.apply)
        strict = record(idiom, minihop.function(idiom.function))
        assert same_record(eager, strict) is None, same_record(eager, strict)
        fallback = record(idiom, minihop.function(idiom.function, fallback="eager"))
    assert same_record(eager, fallback) is None, same_record(eager, fallback)


def _page_rows() -> dict[str, list[str]]:
    text = PAGE.read_text()
    section = text.split(f"<!-- {MARKER}:start -->", 1)[1].split(f"<!-- {MARKER}:end -->", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == len(COLUMNS) and cells[0] != COLUMNS[0] and not set(cells[0]) <= {"-"}:
            rows[cells[0]] = cells
    return rows


def test_parity_rows_say_what_minihop_does() -> None:
    """Each idiom has a docs/parity.md row whose minihop cell is measured again here (rerun
    ``python -m bench parity-data --write`` when minihop changes)."""
    rows = _page_rows()
    assert sorted(rows) == sorted(i.name for i in IDIOMS)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        stale = {i.name: (rows[i.name][COLUMNS.index("minihop")], now) for i in IDIOMS
                 if rows[i.name][COLUMNS.index("minihop")] != (now := minihop_cell(i))}
    assert not stale, f"docs/parity.md's data-dependent rows are stale (page, measured): {stale}"
    assert not any("WRONG" in cells[COLUMNS.index("minihop")] for cells in rows.values())
