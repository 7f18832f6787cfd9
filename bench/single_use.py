"""``python -m bench.single_use [pytest arguments]``: how many of the suite's Functions end
single-use, and why (issue 28: "a Function that reads nothing outside its arguments must never
be single-use").

Place: bench/, measuring the library from outside; nothing here is library behaviour. The
script runs pytest (the whole suite by default, or the files given) in a child process with
this module loaded as a pytest plugin (``-p bench.single_use``) and ``MINIHOP_SINGLE_USE_LOG``
naming a file: the plugin wraps ``minihop.tracer.pystate.StateTracker.finish`` so that every
capture appends one JSON line (the Function's module and qualified name, whether its
``PythonState.single_use`` has reasons, the reasons, how many Python reads and writes it has).
The parent groups the lines by Function class, prints the tables and, with ``--write``, puts
them into the ``<!-- single-use:start -->`` section of ``bench/RESULTS.md``.

A Function is *single-use* when at least one of its captures was. The reasons are grouped by
kind: the text of each reason with its file, line and qualified names taken out. "reads
nothing" counts single-use Functions whose single-use captures read and wrote no Python state
outside their arguments (no ``StateRead``/``StateWrite``): those are the ones to look at first.

Invariant: the wrapped ``finish`` returns what the original returns and raises what it
raises; the log is written only when the environment variable is set.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time
from typing import Any

__all__ = ["group", "kind_of", "main", "render", "pytest_configure"]

_ENV = "MINIHOP_SINGLE_USE_LOG"
_ROOT = pathlib.Path(__file__).resolve().parent.parent


def pytest_configure(config: Any) -> None:
    """Plugin half: wrap ``StateTracker.finish`` to log each capture's single-use reasons."""
    path = os.environ.get(_ENV)
    if not path:
        return
    from minihop.tracer import pystate

    # The wrapper runs while minihop still watches which user code runs (its CallWatch stops
    # inside ``finish``): defined under a minihop module name, it is library code to that
    # watch, so logging does not itself make a capture single-use.
    namespace = {"__name__": "minihop._bench_single_use", "original": pystate.StateTracker.finish,
                 "path": path, "json": json}
    exec(_WRAPPER, namespace)
    pystate.StateTracker.finish = namespace["finish"]  # type: ignore[method-assign]


_WRAPPER = """
def finish(self, ctx):
    state = original(self, ctx)
    cls = getattr(self, "fn_cls", None)
    record = {"function": f"{getattr(cls, '__module__', '?')}.{getattr(cls, '__qualname__', self.name)}",
              "single_use": list(state.single_use), "reads": len(state.reads),
              "writes": len(state.writes)}
    with open(path, "a") as log:
        log.write(json.dumps(record) + "\\n")
    return state
"""


def kind_of(reason: str) -> str:
    """A reason without its places: ``runs helper (f.py, line 3), code minihop did not analyse
    (File ...)`` -> ``runs code minihop did not analyse``."""
    if "did not analyse" in reason:
        return "runs user code minihop did not analyse"
    if "with a name chosen at run time" in reason:
        return "getattr with a name chosen at run time (not an argument, not a plain value)"
    text = re.sub(r"\s*\((File|[^()]*line)[^()]*\)", "", reason)
    text = re.sub(r"\S*<locals>\S*", "F", text)  # qualified names of test-local Functions
    return re.sub(r"\d+", "N", "calls " + text.split(" calls ", 1)[-1] if " calls " in text else text).strip()


def group(lines: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Function -> {captures, single_use (captures), reasons (kinds), reads_nothing, example}."""
    functions: dict[str, dict[str, Any]] = {}
    for line in lines:
        f = functions.setdefault(line["function"], {"captures": 0, "single_use": 0, "kinds": set(),
                                                    "reads_nothing": False, "example": ""})
        f["captures"] += 1
        if line["single_use"]:
            f["single_use"] += 1
            f["kinds"].update(kind_of(r) for r in line["single_use"])
            f["example"] = f["example"] or line["single_use"][0]
            if not line["reads"] and not line["writes"]:
                f["reads_nothing"] = True
    return functions


def _short(reason: str) -> str:
    text = re.sub(r"/[^ ,()\"]*/", "", reason)  # directories out of file names
    return text.replace("|", "/")[:160]


def render(functions: dict[str, dict[str, Any]], command: str, seconds: float) -> str:
    single = {name: f for name, f in functions.items() if f["single_use"]}
    kinds: collections.Counter[str] = collections.Counter(k for f in single.values() for k in f["kinds"])
    nothing = sorted(name for name, f in single.items() if f["reads_nothing"])
    lines = ["## Single-use Functions in the suite", "",
             f"Command: `{command}` ({seconds:.0f} s). Every capture the suite made was logged by "
             "`bench/single_use.py` (a pytest plugin wrapping `StateTracker.finish`); a Function "
             "class is single-use when one of its captures was (its `PythonState.single_use` had a "
             "reason).", "",
             "| Function classes captured | captures | single-use classes | single-use captures |",
             "|---:|---:|---:|---:|",
             f"| {len(functions)} | {sum(f['captures'] for f in functions.values())} | {len(single)} | "
             f"{sum(f['single_use'] for f in functions.values())} |", "",
             "Why (a class counts once per kind of reason):", "",
             "| reason | classes |", "|---|---:|"]
    lines += [f"| {kind.replace('|', '/')} | {n} |" for kind, n in kinds.most_common()]
    lines += ["", "Each single-use class, with its first reason (files shortened):", "",
              "| Function | single-use / captures | first reason |", "|---|---:|---|"]
    lines += [f"| `{name.rsplit('.<locals>.', 1)[-1]}` ({name.split('.')[0]}) | {f['single_use']}/{f['captures']} | "
              f"{_short(f['example'])} |" for name, f in sorted(single.items())[:80]]
    lines += ["", f"Single-use although their single-use captures read and wrote no Python state "
              f"outside their arguments: {len(nothing)}" + (":" if nothing else "."), ""]
    lines += [f"- `{name}`: {single[name]['example'][:200]}" for name in nothing[:30]]
    if nothing:
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="update bench/RESULTS.md's section")
    parser.add_argument("pytest_args", nargs="*", default=[], help="files or options for pytest")
    options = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="minihop_single_use_") as directory:
        log = pathlib.Path(directory) / "captures.jsonl"
        log.touch()
        env = dict(os.environ, **{_ENV: str(log)})
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_ROOT), env.get("PYTHONPATH", "")]))
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
                        "bench.single_use", *(options.pytest_args or ["tests"])], cwd=_ROOT, env=env)
        seconds = time.perf_counter() - start
        lines = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    command = "python -m bench.single_use" + "".join(f" {a}" for a in options.pytest_args)
    section = render(group(lines), command, seconds)
    print(section)
    if options.write:
        from .report import update_section
        results = _ROOT / "bench" / "RESULTS.md"
        results.write_text(update_section(results.read_text() if results.exists() else None,
                                          section, "single-use"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
