"""``python -m bench parity-data``: docs/parity.md's data-dependent parity rows, measured (eager, Dynamo 2.13, minihop).

Place: bench/, beside the speed measurements but timing nothing. For each ``Idiom`` of
``tests/data_functions.py`` (Functions that take Python values out of tensor data, as their
packages write them) it runs the idiom's calls (inputs taking every branch and size case, the
data changing between calls), forward and backward, four ways, and compares each with eager
exactly (outputs and every ``.grad``):

  eager                 ``F.apply``: the reference.
  Dynamo fullgraph      ``torch.compile(caller, backend=<recording eager>, fullgraph=True)``:
                        one graph per compile, or the error (the first line of Dynamo's reason).
  Dynamo default        the same with ``fullgraph=False``: graph breaks counted through
                        ``torch._dynamo.utils.counters["graph_break"]`` (the first reason shown).
  minihop               ``minihop.function(F)`` (strict: a refusal raises a coded error):
                        captured (how each data-dependent value was handled, from
                        ``minihop.explain``: constant / value-guarded / unbacked / ..., and how
                        many captures the calls needed) or refused with its code.

It prints the markdown table (``table``); ``--write`` puts it into docs/parity.md between
``<!-- parity-data:start -->`` and ``<!-- parity-data:end -->``. The minihop cell is
``minihop_cell(idiom)``, which ``tests/test_data_idioms.py`` recomputes to check the page's rows:
after minihop changes, rerun ``python -m bench parity-data --write``.
"""

from __future__ import annotations

import collections
import re
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT / "tests") not in sys.path:
    sys.path.insert(0, str(ROOT / "tests"))

import torch  # noqa: E402

import minihop  # noqa: E402
from data_functions import IDIOMS, Idiom, Record, idiom_named, record, same_record, validating  # noqa: E402

from .functions import RecordingBackend, fresh_caller  # noqa: E402

__all__ = ["COLUMNS", "IDIOMS", "MARKER", "PAGE", "dynamo_cells", "idiom_named", "minihop_cell", "row", "table"]

PAGE = ROOT / "docs" / "parity.md"  # its "Data-dependent values" section
MARKER = "parity-data"
COLUMNS = ("feature", "eager", "Dynamo 2.13 `fullgraph=True`", "Dynamo 2.13 default (graph breaks)",
           "minihop", "test")
TEST = "tests/test_data_idioms.py::test_idiom_matches_eager"


def _reason(error: BaseException) -> str:
    """The first informative line of an error, short (Dynamo's messages run to pages)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    text = lines[0] if lines else ""
    for line in lines:  # Dynamo puts the reason on an "Explanation:" line under a header
        if line.startswith("Explanation:"):
            text = line.removeprefix("Explanation:").strip()
            break
    return f"error: {type(error).__name__}: {_short(text)}"


def _short(text: str, limit: int = 80) -> str:
    text = re.sub(r"\s+", " ", text).replace("|", "/").replace("`", "'").strip()
    return text[:limit] + ("..." if len(text) > limit else "")


def _calls(n: int) -> str:
    return f"{n} call{'s' if n != 1 else ''}"


def _run(idiom: Idiom, call: Callable[..., Any], eager: Record) -> str | None:
    """None when ``call`` gives eager's record; else what went wrong (an error, or WRONG)."""
    try:
        mine = record(idiom, call)
    except Exception as error:  # noqa: BLE001 - the cell reports any failure
        return _reason(error)
    diff = same_record(eager, mine)
    return None if diff is None else f"WRONG ({diff})"


def dynamo_cells(idiom: Idiom, eager: Record) -> tuple[str, str]:
    """(fullgraph=True cell, fullgraph=False cell) for the idiom, measured now."""
    from torch._dynamo.utils import counters  # bench may use Dynamo; minihop/ never does

    n = len(idiom.inputs())
    torch.compiler.reset()
    backend = RecordingBackend()
    full = torch.compile(fresh_caller(idiom.function, "fullgraph"), backend=backend, fullgraph=True)
    problem = _run(idiom, full, eager)
    full_cell = problem or f"one graph; {backend.graphs} compile(s) for {_calls(n)}, matches eager"
    torch.compiler.reset()
    counters.clear()
    backend = RecordingBackend()
    default = torch.compile(fresh_caller(idiom.function, "default"), backend=backend)
    problem = _run(idiom, default, eager)
    breaks = counters["graph_break"]
    if problem is not None:
        default_cell = problem
    elif not breaks:
        default_cell = f"no graph break; {backend.graphs} compile(s) for {_calls(n)}, matches eager"
    else:
        first = _short(next(iter(breaks)).split(" Explanation:")[0])
        default_cell = (f"{sum(breaks.values())} graph break(s) ({first}); {backend.graphs} "
                        f"graph(s) for {_calls(n)}, matches eager")
    torch.compiler.reset()
    return full_cell, default_cell


def _handling(idiom: Idiom) -> str:
    """How minihop.explain says each data-dependent value was handled, over all the calls."""
    seen: dict[str, None] = {}
    with validating():
        reports = [minihop.explain(idiom.function, *args, print_report=False) for args in idiom.inputs()]
    for report in reports:
        for value in report.data_values:
            kind = re.match(r"refused|[^(]*\(([a-z][a-z -]*)", value)
            phase = re.search(r" in (forward|backward)\b", value)
            if kind is None:
                continue
            what = kind.group(1) or "refused"
            seen[what + (f" in {phase.group(1)}" if phase and what != "refused" else "")] = None
    return ", ".join(seen) if seen else "no data-dependent value"


def minihop_cell(idiom: Idiom, eager: Record | None = None) -> str:
    """The minihop cell: refused with a code, WRONG, or captured (handling, captures, matches)."""
    eager = record(idiom, idiom.function.apply) if eager is None else eager
    captured = minihop.function(idiom.function)
    try:
        mine = record(idiom, captured)
    except minihop.MinihopError as error:
        found = str(getattr(error, "found", "") or "")
        op = re.search(r"\.(forward|backward) calls ([\w.]+)", found)
        return f"refused {error.code}" + (f" (`{op.group(2)}` in {op.group(1)})" if op
                                          else f" ({_short(found)})" if found else "")
    diff = same_record(eager, mine)
    if diff is not None:
        return f"WRONG ({diff})"
    n = len(idiom.inputs())
    return (f"captured ({_handling(idiom)}); {captured.stats.captures} capture(s) for "
            f"{_calls(n)}, matches eager")


def row(idiom: Idiom, *, dynamo: bool = True) -> tuple[str, ...]:
    """One table row, measured now (``dynamo=False``: the Dynamo cells left empty)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            eager = record(idiom, idiom.function.apply)
        except Exception as error:  # noqa: BLE001 - an idiom eager rejects is the table's fault
            raise AssertionError(f"{idiom.name}: eager fails: {error}") from error
        cells = dynamo_cells(idiom, eager) if dynamo else ("", "")
        mine = minihop_cell(idiom, eager)
    return (idiom.name, "works", *cells, mine, f"`{TEST}[{idiom.function.__name__}]`")


def table(rows: list[tuple[str, ...]]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "|".join("---" for _ in COLUMNS) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    counts = collections.Counter(r[-2].split(" ")[0] for r in rows)
    lines += ["", f"minihop: {dict(sorted(counts.items()))} of {len(rows)} idioms; measured by "
              "`python -m bench parity-data --write` (inputs in `tests/data_functions.py`, every "
              "branch and size case taken, the data changing between calls; exact comparison "
              "with eager of outputs and every `.grad`). `torch.distributions` validates arguments in "
              "every run (the first `torch.compile` of a process turns that off process-wide; "
              "`tests/data_functions.py::validating` turns it back on)."]
    return "\n".join(lines)

