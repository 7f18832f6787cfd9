"""The audit's report: one record per Function, as terminal lines, JSON and a Markdown table.

The last step of ``pytest --minihop-audit`` (``minihop.audit``): the verdicts ``check.py``
gave each kept call of a Function are folded into one ``Record`` (the worst call decides,
and its message is the first difference shown). The JSON schema is docs/audit.md's; a change
to ``Record``'s fields is a change to that page.

Invariant: a Function where Dynamo differs silently from eager comes first, then minihop's
differences and errors, then refusals, then the rest; within a group, by location.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
from collections.abc import Iterable
from typing import Any

from .check import CallResult, Verdict
from .watch import Seen

__all__ = ["Record", "build_record", "ordered", "to_json", "to_markdown", "summary_lines"]

# Worst first: the verdict a Function gets is its worst call's.
MINIHOP_ORDER = ("differs", "error", "refused", "not audited", "agrees")
DYNAMO_ORDER = ("differs", "error", "breaks", "not audited", "agrees")


@dataclasses.dataclass(frozen=True)
class Record:
    """One Function's line of the report (docs/audit.md, "The JSON report")."""

    function: str
    module: str
    location: str
    calls: int
    audited_calls: int
    minihop: dict[str, Any]
    dynamo: dict[str, Any] | None
    graphs_equal: bool | None


def location_of(fn_cls: type) -> str:
    """``file:line`` of the class statement (of its forward when the source cannot be read)."""
    try:
        _, line = inspect.getsourcelines(fn_cls)
        return f"{inspect.getsourcefile(fn_cls)}:{line}"
    except (OSError, TypeError):
        code = getattr(getattr(fn_cls, "forward", None), "__code__", None)
        return f"{code.co_filename}:{code.co_firstlineno}" if code else "?"


def _worst(verdicts: list[Verdict], order: tuple[str, ...]) -> Verdict:
    # Among equals, a verdict without a note (a call checked in full) speaks for the Function.
    return min(verdicts, key=lambda v: (order.index(v.verdict), bool(v.message)))


def _as_dict(v: Verdict, with_code: bool) -> dict[str, Any]:
    d: dict[str, Any] = {"verdict": v.verdict}
    if with_code:
        d["code"] = v.code
    d["message"] = v.message
    return d


def build_record(seen: Seen, results: list[CallResult], dynamo: bool) -> Record:
    """Fold one Function's call results into its record."""
    if results:
        mine = _worst([r.minihop for r in results], MINIHOP_ORDER)
    else:
        why = "; ".join(f"{n} call(s) {reason}" for reason, n in seen.uncopied.items()) or "no call kept"
        mine = Verdict("not audited", why)
    dyn: dict[str, Any] | None = None
    if dynamo:
        dyn_verdicts = [r.dynamo for r in results if r.dynamo is not None]
        dyn = _as_dict(_worst(dyn_verdicts, DYNAMO_ORDER) if dyn_verdicts
                       else Verdict("not audited", mine.message), False)
    equal = [r.graphs_equal for r in results if r.graphs_equal is not None]
    return Record(
        function=seen.fn_cls.__qualname__, module=seen.fn_cls.__module__, location=location_of(seen.fn_cls),
        calls=seen.calls, audited_calls=len(results), minihop=_as_dict(mine, True), dynamo=dyn,
        graphs_equal=all(equal) if equal else None)


def _rank(r: Record) -> tuple[int, int, str]:
    dyn = r.dynamo["verdict"] if r.dynamo else "agrees"
    return (0 if dyn == "differs" else 1, MINIHOP_ORDER.index(r.minihop["verdict"]), r.location)


def ordered(records: Iterable[Record]) -> list[Record]:
    """Dynamo's silent differences first, then minihop's verdicts worst first."""
    return sorted(records, key=_rank)


def to_json(records: list[Record]) -> str:
    return json.dumps([dataclasses.asdict(r) for r in ordered(records)], indent=2)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _reason(r: Record) -> str:
    for part in (r.dynamo if r.dynamo and r.dynamo["verdict"] == "differs" else None, r.minihop, r.dynamo):
        if part and part["message"]:
            return str(part["message"])
    return ""


def to_markdown(records: list[Record]) -> str:
    lines = ["| Function | defined at | calls | minihop | Dynamo | bodies equal | first difference or reason |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in ordered(records):
        code = f" ({r.minihop['code']})" if r.minihop.get("code") else ""
        dyn = r.dynamo["verdict"] if r.dynamo else "-"
        equal = {True: "yes", False: "no", None: "-"}[r.graphs_equal]
        lines.append(f"| `{r.module}.{_cell(r.function)}` | {_cell(r.location)} | {r.calls} | "
                     f"{r.minihop['verdict']}{code} | {dyn} | {equal} | {_cell(_reason(r))[:200]} |")
    return "\n".join(lines) + "\n"


def summary_lines(records: list[Record]) -> list[str]:
    """The terminal summary: one line per Function."""
    lines = []
    for r in ordered(records):
        code = f" {r.minihop['code']}" if r.minihop.get("code") else ""
        dyn = f", Dynamo {r.dynamo['verdict']}" if r.dynamo else ""
        equal = {True: ", bodies equal", False: ", bodies differ", None: ""}[r.graphs_equal]
        reason = _reason(r)
        lines.append(f"{r.module}.{r.function} ({r.location}): {r.calls} calls, "
                     f"minihop {r.minihop['verdict']}{code}{dyn}{equal}" + (f": {reason[:160]}" if reason else ""))
    return lines
