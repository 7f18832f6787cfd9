"""``pytest --minihop-audit``: every autograd.Function a test suite applies, checked against eager.

Above the pipeline, a consumer of the public API like ``minihop.testing``: ``watch`` keeps
copies of the suite's ``Function.apply`` calls (the first few argument signatures per
Function), ``check`` replays them after the last test under eager, minihop and optionally
Dynamo and compares, ``report`` folds the verdicts into one record per Function (terminal,
JSON, Markdown), ``plugin`` holds the pytest hooks. docs/audit.md is the user's page.

Invariant: the suite's results are what they are without the option (outcomes, output,
random streams, the Python state its tests observe); what the audit cannot isolate it
reports as "not audited", with the reason.
"""

from .check import CallResult, Verdict, audit_call
from .report import Record
from .watch import Call, Watcher

__all__ = ["Call", "CallResult", "Record", "Verdict", "Watcher", "audit_call"]
