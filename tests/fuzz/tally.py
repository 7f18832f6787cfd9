"""The fuzz tests' bookkeeping: outcomes counted per budget, and the summary line they print.

Outcomes of the budget's examples are counted up to the first failure; after it hypothesis
runs extra calls (more search, then shrinking) that are no examples of the budget: counted apart.
"""

from __future__ import annotations

import collections
from typing import Any

from hypothesis import reject


class Tally:
    """Counts for one fuzz test (``label`` names it in notes and in the summary)."""

    def __init__(self, label: str, budget: int) -> None:
        self.label = label
        self.budget = budget
        self.counts: collections.Counter[str] = collections.Counter()
        self.refused: collections.Counter[str] = collections.Counter()
        self.after_first_failure: collections.Counter[str] = collections.Counter()

    def record(self, outcome: Any, source: str) -> None:
        """Count ``outcome``; reject an invalid case; raise a failure with the case as a note."""
        failed_before = self.counts["mismatched"] + self.counts["crashed"] > 0
        counts = self.after_first_failure if failed_before else self.counts
        counts[outcome.kind] += 1
        if outcome.kind == "refused" and not failed_before:
            self.refused[outcome.code] += 1
        if outcome.kind == "invalid":
            reject()  # eager rejects the case: the generator's fault, not an example
        if outcome.kind in ("mismatched", "crashed"):
            assert outcome.error is not None
            outcome.error.add_note(f"{self.label}: {outcome.kind} ({outcome.signature}); the "
                                   f"generated Function:\n{source}")
            raise outcome.error

    def summary(self) -> str:
        c = self.counts
        examples = sum(v for k, v in c.items() if k != "invalid")
        lines = ["", f"{self.label} (tests/fuzz, derandomized, budget {self.budget}): examples "
                 f"{examples}, matched {c['matched']}, refused {c['refused']} "
                 f"{dict(sorted(self.refused.items()))}, mismatched {c['mismatched']}, "
                 f"crashed {c['crashed']} (invalid cases rejected: {c['invalid']})"]
        if self.after_first_failure:
            lines.append("  counted up to the first failure; after it hypothesis made "
                         f"{sum(self.after_first_failure.values())} more calls (search and "
                         f"shrinking): {dict(sorted(self.after_first_failure.items()))}")
        if not examples:
            lines.append("  (the fuzz test did not run in this session)")
        return "\n".join(lines)
