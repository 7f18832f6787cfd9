"""The audit's pytest hooks: watch while the suite runs, check after it, report at the end.

Registered by ``minihop/pytest_plugin.py`` only when ``--minihop-audit`` is given, so a suite
without the option never imports this. The order of a session: ``pytest_configure`` installs
``watch.Watcher`` (before collection: a Function applied at import time is seen too);
``pytest_sessionfinish`` uninstalls it, then replays every kept call (``check.audit_call``)
once the suite's outcome is settled; ``pytest_terminal_summary`` prints one line per Function
and writes the JSON and Markdown reports.

Why after the suite, not at each call: the checks run the user's Function many more times
(eager, minihop, Dynamo, once per loss), which a Function counting its calls, a test reading a
random stream or a warning filter would otherwise see. After the last test nothing of the
suite observes them, and the torch (CPU and CUDA), ``random`` and numpy random states, the
warning filters and the Python state minihop knows a Function writes are put back anyway, for
hooks and fixtures that finish after this one. The audit never changes the exit status.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import random
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from .check import CallResult, Verdict, audit_call
from .report import Record, build_record, ordered, summary_lines, to_json, to_markdown
from .watch import Watcher

__all__ = ["AuditPlugin"]


@contextlib.contextmanager
def preserved_random_state() -> Iterator[None]:
    """torch's CPU and CUDA generators, ``random`` and numpy's global state, as they were."""
    cpu = torch.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    py = random.getstate()
    try:
        import numpy
        np_state: Any = numpy.random.get_state()
    except ImportError:
        numpy, np_state = None, None  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)
        random.setstate(py)
        if numpy is not None:
            numpy.random.set_state(np_state)


class AuditPlugin:
    """``--minihop-audit[=dynamo]``: the session's watcher and its report."""

    def __init__(self, config: pytest.Config) -> None:
        self.dynamo = config.getoption("minihop_audit") == "dynamo"
        self.json_path: str | None = config.getoption("minihop_audit_report")
        self.root = str(config.rootpath) + os.sep
        self.watcher = Watcher(config.getoption("minihop_audit_signatures"))
        self.records: list[Record] = []
        self.seconds = 0.0
        self.audited = 0
        self.watcher.install()

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        self.watcher.uninstall()  # a session ended early (usage error, -x) still puts apply back

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        self.watcher.uninstall()
        start = time.perf_counter()
        # What the audit's runs print or warn, the suite already printed or warned once.
        with preserved_random_state(), warnings.catch_warnings(), \
                contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            for seen in self.watcher.seen.values():
                results = []
                for call in seen.kept:
                    try:
                        results.append(audit_call(seen.fn_cls, call, self.dynamo))
                    except Exception as e:  # the audit's own failure is a verdict, never the suite's
                        results.append(CallResult(Verdict("error", f"the audit failed: {type(e).__name__}: {e}"[:300]),
                                                  None, None))
                    self.audited += 1
                record = build_record(seen, results, self.dynamo)
                self.records.append(dataclasses.replace(record, location=record.location.removeprefix(self.root)))
        self.seconds = time.perf_counter() - start

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        tr = terminalreporter
        mode = "minihop and Dynamo" if self.dynamo else "minihop"
        tr.write_sep("=", f"minihop audit ({mode} against eager)")
        calls = sum(r.calls for r in self.records)
        per_call = self.seconds / self.audited if self.audited else 0.0
        tr.write_line(f"{len(self.records)} Functions, {calls} calls, {self.audited} audited "
                      f"({self.seconds:.1f} s, {per_call:.2f} s per audited call)")
        for line in summary_lines(self.records):
            tr.write_line(line)
        if self.json_path:
            path = Path(self.json_path)
            path.write_text(to_json(self.records))
            path.with_suffix(".md").write_text(to_markdown(ordered(self.records)))
            tr.write_line(f"report: {path} and {path.with_suffix('.md')}")
