"""What ``pytest --minihop-audit`` costs a test suite: ``python -m bench.audit``.

Place: bench/, on its own (it runs whole pytest sessions in child processes, minutes, so it is
not part of ``python -m bench``). For each suite it times the same pytest command three ways,
in fresh processes: without the option, with ``--minihop-audit`` and with
``--minihop-audit=dynamo``; and reads the audit's own line (Functions, calls, audited calls,
seconds spent checking). The watcher's cost while the tests run is the audited session's
wall time less the checking time less the plain session's wall time (noise included: one run
each, on a shared machine); ``measure_wrapper`` times the watcher's cost per ``F.apply`` call
in-process, plain and watched loops alternating, which a loaded machine disturbs less. Writes
the ``audit`` section of bench/RESULTS.md unless ``--no-write``.

Suites: minihop's own ``tests/test_capture_cases.py`` and ``tests/test_semantics.py`` (the
Dynamo sweep off, ``-p no:dynamo_sweep``, so only the audit differs); and, when given, real
packages' suites prepared as docs/audit.md says: ``--suite NAME DIR PYTHONPATH`` (pytest runs
in DIR with that PYTHONPATH prepended, ``-p no:cacheprovider``).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from minihop.audit import Watcher

from .report import update_section
from .timing import Table, machine_facts

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "RESULTS.md"
MARKER = "audit"
_AUDIT_LINE = re.compile(r"(\d+) Functions, (\d+) calls, (\d+) audited \(([\d.]+) s")
_PASSED = re.compile(r"(\d+) passed")


def _session(cwd: Path, pythonpath: str, args: list[str]) -> tuple[float, str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (pythonpath, str(ROOT)) if p))
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=3600)
    return time.perf_counter() - start, done.stdout


def measure(name: str, cwd: Path, pythonpath: str, args: list[str]) -> list[tuple[str, ...]]:
    """Rows for one suite: plain, minihop audit, minihop and Dynamo audit."""
    rows = []
    plain_s, out = _session(cwd, pythonpath, args)
    passed = _PASSED.search(out)
    rows.append((name, "plain", f"{plain_s:.1f}", "1.00x", passed.group(1) if passed else "?", "", "", "", ""))
    for mode in ("--minihop-audit", "--minihop-audit=dynamo"):
        wall, out = _session(cwd, pythonpath, [*args, mode])
        found = _AUDIT_LINE.search(out)
        passed = _PASSED.search(out)
        if found is None:
            rows.append((name, mode, f"{wall:.1f}", f"{wall / plain_s:.2f}x", "?", "?", "?", "?", "?"))
            continue
        functions, calls, audited, check_s = found.groups()
        per_call = float(check_s) / int(audited) if int(audited) else 0.0
        watching = wall - float(check_s) - plain_s
        rows.append((name, mode, f"{wall:.1f}", f"{wall / plain_s:.2f}x", passed.group(1) if passed else "?",
                     f"{functions} / {calls} / {audited}", f"{float(check_s):.1f}", f"{per_call:.2f}",
                     f"{watching:+.1f}"))
    return rows


class _Double(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        return x * 2

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad * 2, None


def measure_wrapper(calls: int = 5000, reps: int = 7) -> Table:
    """What watching adds to one ``F.apply`` (forward only), in this process: plain and watched
    loops alternate, best of ``reps``; the watched Function has stopped looking for signatures."""
    torch.set_num_threads(1)
    x = torch.ones(4, requires_grad=True)

    def loop() -> float:
        start = time.perf_counter()
        for _ in range(calls):
            _Double.apply(x, -1)
        return (time.perf_counter() - start) / calls * 1e6

    loop()
    watcher = Watcher()
    plain, watched = [], []
    for _ in range(reps):
        plain.append(loop())
        watcher.install()
        try:
            watched.append(loop())
        finally:
            watcher.uninstall()
    p, w = min(plain), min(watched)
    return Table("Watching: cost per F.apply call while the suite runs", ("F.apply", "us per call", "vs plain"),
                 (("plain", f"{p:.1f}", "1.00x"), ("watched", f"{w:.1f}", f"{w / p:.2f}x"),
                  ("added", f"{w - p:.1f}", "")),
                 (f"a one-op Function, {calls} calls a loop, best of {reps}; after its first 200 calls "
                  "without a new signature a Function is only counted",))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.audit", description=__doc__.split("\n")[0])
    parser.add_argument("--suite", nargs=3, action="append", default=[], metavar=("NAME", "DIR", "PYTHONPATH"),
                        help="a real package's prepared test directory (docs/audit.md)")
    parser.add_argument("--no-write", action="store_true", help="print only")
    options = parser.parse_args(argv)
    start = time.perf_counter()
    wrapper = measure_wrapper()
    print(wrapper.to_text())
    rows = measure("minihop: test_capture_cases + test_semantics", ROOT, "",
                   ["-p", "no:dynamo_sweep", "tests/test_capture_cases.py", "tests/test_semantics.py"])
    for name, directory, pythonpath in options.suite:
        rows += measure(name, Path(directory), pythonpath, [])
    table = Table(
        "Audit overhead per suite (one run each, fresh processes)",
        ("suite", "run", "wall s", "vs plain", "passed", "Functions / calls / audited", "checking s",
         "s per audited call", "watching s"),
        tuple(rows),
        ("checking s: the audit's replay after the last test (eager, minihop, Dynamo, each loss); "
         "watching s: the rest of the difference to the plain run (the apply wrapper and the "
         "argument copies while the tests run), machine noise included",))
    text = table.to_text()
    print(text)
    if not options.no_write:
        facts = machine_facts()
        command = "python -m bench.audit " + " ".join(f"--suite {' '.join(s)}" for s in options.suite)
        section = (f"## Audit overhead (`pytest --minihop-audit`)\n\nGenerated by `{command.strip()}` in "
                   f"{time.perf_counter() - start:.0f} s on {facts.get('date', '?')} "
                   f"(load average at start {facts.get('load average at start (1, 5, 15 min)', '?')}); "
                   f"the real suites are prepared as docs/audit.md says.\n\n{table.to_markdown(heading=False)}\n"
                   f"{wrapper.to_markdown(heading=False)}")
        RESULTS.write_text(update_section(RESULTS.read_text(), section, MARKER))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
