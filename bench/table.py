"""``Table``: what every measurement returns, printed to the console and into RESULTS.md.

Place: bench/, at the bottom. The first column of each row is its label (a case name, a
variant, a size); tests check the labels, never the numbers.
"""

from __future__ import annotations

import dataclasses

__all__ = ["Table"]


@dataclasses.dataclass(frozen=True)
class Table:
    """A titled markdown table with notes under it."""

    title: str
    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    notes: tuple[str, ...] = ()

    @property
    def labels(self) -> tuple[str, ...]:
        return tuple(row[0] for row in self.rows)

    def to_markdown(self, level: int = 3, *, heading: bool = True) -> str:
        lines = [f"{'#' * level} {self.title}", ""] if heading else []
        lines.append("| " + " | ".join(self.columns) + " |")
        lines.append("|" + "|".join("---" for _ in self.columns) + "|")
        for row in self.rows:
            if len(row) != len(self.columns):
                raise AssertionError(f"bench bug: row {row!r} does not fit columns {self.columns!r}")
            lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |")
        if self.notes:
            lines.append("")
            lines.extend(f"- {note}" for note in self.notes)
        return "\n".join(lines) + "\n"

    def to_text(self) -> str:
        widths = [max(len(c), *(len(r[i]) for r in self.rows)) if self.rows else len(c)
                  for i, c in enumerate(self.columns)]
        out = [self.title, "=" * len(self.title)]
        out.append("  ".join(c.ljust(w) for c, w in zip(self.columns, widths, strict=True)))
        out.append("  ".join("-" * w for w in widths))
        for row in self.rows:
            out.append("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)))
        out.extend(f"  * {note}" for note in self.notes)
        return "\n".join(out) + "\n"
