"""``python -m bench.before_after``: the hot path before and after, measured in one run.

Place: bench/, beside the speed measurements. It checks out ``--ref`` (default ``dfa4c17``,
the commit before the hot-path work) as a temporary ``git worktree``, then runs child
processes that import minihop from that old tree ("before") or from this working tree
("after"), alternately (``--rounds`` of each, the order flipped every round), so that a slow
stretch of a shared machine lands on both (``--after REF`` measures a commit instead of the
working tree, from a second worktree: minihop/ may hold someone's uncommitted work).
``bench/`` comes from this working tree in both children: only minihop differs.

Each child measures, as table (b) of ``python -m bench`` does (``steps.fwd_bwd`` steps timed
by ``timing.time_interleaved``), the steady-state fwd+bwd per call of eager ``F.apply``,
``cap(*args)`` and the ``minihop.apply`` hit on the small cases, each as a paired ratio to
eager in the same child, and, as table (a) does (``capture_latency.minihop_capture_ns``), the
warm capture time of MySin and Add 8x8. The report gives the medians over the children of
each tree.

It writes its table into ``bench/RESULTS.md`` between ``<!-- before-after:start -->`` and
``<!-- before-after:end -->`` (placed before the fuzz section when absent; a rerun of
``python -m bench`` keeps it). ``--no-write`` prints only. The worktree and its temporary
directory are removed at the end, also on error. About 1-2 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if __package__ in (None, ""):
    # ``python bench/before_after.py``: make ``bench`` importable (keep bench/ itself off sys.path).
    sys.path[:1] = [str(ROOT)]
    __package__ = "bench"  # noqa: A001

from .table import Table  # noqa: E402

__all__ = ["CASE_NAMES", "CAPTURE_NAMES", "END", "START", "main", "place_section", "summarise"]

RESULTS = ROOT / "bench" / "RESULTS.md"
START, END = "<!-- before-after:start -->", "<!-- before-after:end -->"
FUZZ_START = "<!-- fuzz:start -->"
DEFAULT_REF = "dfa4c17"
CASE_NAMES = ("MySin 8x8", "Add 8x8", "MLP 8x8", "LayerNorm 8x8")
CAPTURE_NAMES = ("MySin 8x8", "Add 8x8")
# The variants' names as in table (b) (bench/per_call.py); the child checks they still match.
EAGER, AA, CAP, APPLY = "eager F.apply", "eager (A/A)", "cap(*args)", "minihop.apply hit"

# The child: a script file, so that the order of sys.path is ours. minihop is imported first,
# from the tree under test; then this working tree goes in front, so that ``bench`` (and
# nothing else: minihop is already in sys.modules, its submodules load from its own __path__)
# comes from the current tree in both children.
_CHILD = r'''
import json, os, sys
tree, current, options = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])

def under(path, root):
    return os.path.realpath(path).startswith(os.path.realpath(root) + os.sep)

sys.path.insert(0, tree)
import torch
import minihop
if not under(minihop.__file__, tree):
    raise SystemExit(f"minihop imported from {minihop.__file__}, not from {tree}")
print(f"child: minihop from {os.path.realpath(minihop.__file__)}", flush=True)
sys.path.insert(0, current)
import bench
if not under(bench.__file__, current):
    raise SystemExit(f"bench imported from {bench.__file__}, not from {current}")
torch.set_num_threads(1)

from bench.capture_latency import minihop_capture_ns
from bench.functions import Warmup, case_named
from bench.per_call import AA, APPLY, CAP, EAGER
from bench.steps import fwd_bwd
from bench.timing import heap_frozen, time_interleaved

if (EAGER, AA, CAP, APPLY) != tuple(options["variants"]):
    raise SystemExit(f"bench.per_call's variant names changed: {(EAGER, AA, CAP, APPLY)}")
if not under(sys.modules["minihop"].__file__, tree):
    raise SystemExit("bench replaced the imported minihop")

# Warm capture, as table (a): after a first capture of another Function; every capture of a
# case is timed (the first one separately reported).
minihop.capture(Warmup, torch.randn(4, requires_grad=True))
capture_ms = {}
with heap_frozen():
    for name in options["capture"]:
        case = case_named(name)
        capture_ms[name] = [minihop_capture_ns(case) / 1e6 for _ in range(options["capture_reps"])]

# Per call, as table (b): the same steps, interleaved, paired ratios to eager.
cases = {}
for name in options["cases"]:
    case = case_named(name)
    F, args = case.function, case.make_args()
    cap = minihop.capture(F, *args)
    steps = {
        EAGER: fwd_bwd(lambda: F.apply(*args), args),
        AA: fwd_bwd(lambda: F.apply(*args), args),
        CAP: fwd_bwd(lambda: cap(*args), args),
        APPLY: fwd_bwd(lambda: minihop.apply(F, *args), args),
    }
    t = time_interleaved(steps, budget_s=options["budget_s"], min_rounds=options["min_rounds"])
    cases[name] = {"eager_us": t[EAGER].median_ns / 1e3, "rounds": t[EAGER].rounds,
                   "ratios": {v: t[v].ratio_to(t[EAGER]) for v in (AA, CAP, APPLY)}}
print(json.dumps({"minihop_file": os.path.realpath(minihop.__file__),
                  "capture_ms": capture_ms, "cases": cases}))
'''


def _git(*args: str, cwd: Path = ROOT) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True,
                          check=True).stdout.strip()


def _subject(sha: str) -> str:
    subject = _git("log", "-1", "--format=%s", sha)
    return subject if len(subject) <= 80 else subject[:77].rstrip() + "..."


def _current_state() -> str:
    sha = _git("rev-parse", "--short", "HEAD")
    dirty = _git("status", "--porcelain", "--", "minihop")
    return f"`{sha}`, working tree" + (" with uncommitted changes under minihop/" if dirty
                                       else " (minihop/ clean)")


def _minihop_commit(ref: str) -> str:
    """``ref``, and the last commit at or before it that changed minihop/."""
    sha = _git("rev-parse", "--short", f"{ref}^{{commit}}")
    last = _git("log", "-1", "--format=%h", sha, "--", "minihop")
    if last == sha:
        return f"`{sha}` ({_subject(sha)})"
    return f"`{sha}` (minihop/ as last changed by `{last}`: {_subject(last)})"


def _run_child(script: Path, tree: Path, options: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(tree)  # the tree's root: its minihop is found before the installed one
    proc = subprocess.run([sys.executable, str(script), str(tree), str(ROOT), json.dumps(options)],
                          cwd=script.parent, env=env, capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0:
        raise RuntimeError(f"child for {tree} failed (exit {proc.returncode}):\n"
                           f"{(proc.stdout + proc.stderr).strip()[-2000:]}")
    lines = proc.stdout.strip().splitlines()
    for line in lines[:-1]:
        print(f"    {line}", flush=True)
    found: dict[str, Any] = json.loads(lines[-1])
    if not Path(found["minihop_file"]).is_relative_to(tree.resolve()):
        raise RuntimeError(f"child imported minihop from {found['minihop_file']}, not {tree}")
    return found


def _spread(values: Sequence[float], fmt: str) -> str:
    median = statistics.median(values)
    if len(values) < 2:
        return fmt.format(median)
    return f"{fmt.format(median)} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def summarise(before: Sequence[dict[str, Any]], after: Sequence[dict[str, Any]],
              cases: Sequence[str] = CASE_NAMES) -> Table:
    """The before/after table from the children's results (medians over children; the range
    over children in parentheses)."""
    rows = []
    for name in cases:
        for variant in (CAP, APPLY):
            cells = [_spread([r["cases"][name]["ratios"][variant] for r in runs], "{:.2f}x")
                     for runs in (before, after)]
            captures = ["", ""]
            if variant == CAP and all(name in r["capture_ms"] for r in (*before, *after)):
                captures = [f"{statistics.median([ms for r in runs for ms in r['capture_ms'][name]]):.1f} "
                            f"(first {statistics.median([r['capture_ms'][name][0] for r in runs]):.1f})"
                            for runs in (before, after)]
            eager = "/".join(f"{statistics.median([r['cases'][name]['eager_us'] for r in runs]):.1f}"
                             for runs in (before, after))
            aa = "/".join(f"{statistics.median([r['cases'][name]['ratios'][AA] for r in runs]):.2f}x"
                          for runs in (before, after))
            rows.append((f"{name}: {variant}", *cells, *captures, eager, aa))
    columns = ("case", "before x eager", "after x eager", "capture ms before", "capture ms after",
               "eager µs before/after", "A/A before/after")
    notes = (
        f"Each cell: the median over the children of that tree ({len(before)} before, "
        f"{len(after)} after, run alternately) of the child's paired ratio to eager `F.apply` "
        "(median over rounds of the variant's batch time over eager's in the same round, as in "
        "table (b)); the range over the children in parentheses.",
        "capture ms: warm `minihop.capture` of the case, median over every capture in the "
        "children of that tree (each child captures another Function first); 'first' is the "
        "median of each child's first capture of the case (later ones may reuse per-class "
        "work that the capture remembers).",
        "eager µs: eager `F.apply` fwd+bwd, median over the children: the baseline, the same "
        "code in both; on a shared machine it drifts by tens of percent between processes (and "
        "between stretches of one), which is why only the paired ratios are compared. A/A: "
        "eager timed against itself as a variant, the noise of the ratios.",
    )
    return Table("Before/after: the hot path (fwd+bwd per call, small cases)", columns,
                 tuple(rows), notes)


def place_section(text: str | None, block: str) -> str:
    """``text`` with the before-after section replaced by ``block``; when absent, inserted
    before the fuzz section (or appended when there is none)."""
    if not text:
        return block + "\n"
    if START in text and END in text:
        before, rest = text.split(START, 1)
        _, after = rest.split(END, 1)
        return before + block + after
    if FUZZ_START in text:
        before, after = text.split(FUZZ_START, 1)
        return before + block + "\n\n" + FUZZ_START + after
    return text.rstrip("\n") + "\n\n" + block + "\n"


def render(table: Table, *, facts: dict[str, str], command: str, seconds: float, old: str,
           new: str) -> str:
    lines = [START, "## Before/after: the hot path", "",
             f"Generated by `{command}` in {seconds:.0f} s (this section only; `python -m bench` "
             "keeps it as it is). Before: minihop at " + old + ". After: minihop at " + new +
             ". Commits are checked out as temporary git worktrees; `bench/` comes from the "
             "current tree in both child processes: only minihop differs.", "",
             "Machine: " + "; ".join(f"{k}: {v}" for k, v in facts.items()), "",
             table.to_markdown(level=3).rstrip(), END]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.before_after",
                                     description=__doc__.split("\n")[0].split(": ", 1)[1])
    parser.add_argument("--ref", default=DEFAULT_REF,
                        help=f"the 'before' commit (default {DEFAULT_REF}, before the hot-path work)")
    parser.add_argument("--after", default=None, metavar="REF",
                        help="the 'after' commit (default: this working tree, as it is)")
    parser.add_argument("--budget", type=float, default=0.3, metavar="S",
                        help="timing budget per case and variant in each child, seconds (default 0.3)")
    parser.add_argument("--rounds", type=int, default=3, help="children per tree (default 3)")
    parser.add_argument("--capture-reps", type=int, default=5, help="captures per case per child")
    parser.add_argument("--output", type=Path, default=RESULTS, help="default bench/RESULTS.md")
    parser.add_argument("--no-write", action="store_true", help="print only")
    options = parser.parse_args(argv)

    import torch

    from .timing import machine_facts

    torch.set_num_threads(1)  # as in the children, so that the facts line says what they ran with
    facts = machine_facts()
    facts.pop("minihop", None)  # both commits are named below
    print("; ".join(f"{k}: {v}" for k, v in facts.items()), flush=True)
    try:  # resolved once: a commit made meanwhile changes neither the trees nor their names
        refs = {"before": _git("rev-parse", f"{options.ref}^{{commit}}"),
                "after": None if options.after is None else _git("rev-parse", f"{options.after}^{{commit}}")}
    except subprocess.CalledProcessError as e:
        print(f"not a commit: {e.cmd[-1]}", file=sys.stderr)
        return 2
    old = _minihop_commit(refs["before"])
    new = _current_state() if refs["after"] is None else _minihop_commit(refs["after"])
    child_options = {"cases": list(CASE_NAMES), "capture": list(CAPTURE_NAMES),
                     "capture_reps": options.capture_reps, "budget_s": options.budget,
                     "min_rounds": 11, "variants": [EAGER, AA, CAP, APPLY]}
    start = time.perf_counter()
    runs: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
    temp = Path(tempfile.mkdtemp(prefix="minihop_before_after_"))
    trees = {"before": temp / "before", "after": ROOT if options.after is None else temp / "after"}
    added: list[Path] = []
    try:
        for who, tree in trees.items():
            if tree != ROOT:
                _git("worktree", "add", "--detach", str(tree), f"{refs[who]}^{{commit}}")
                added.append(tree)
        script = temp / "child.py"
        script.write_text(_CHILD)
        for i in range(options.rounds):
            for who in ("before", "after") if i % 2 == 0 else ("after", "before"):
                t = time.perf_counter()
                print(f"  round {i + 1}/{options.rounds}, {who}:", flush=True)
                runs[who].append(_run_child(script, trees[who], child_options, timeout_s=300))
                print(f"    [{time.perf_counter() - t:.1f} s]", flush=True)
    finally:
        for tree in added:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT,
                           capture_output=True)
        shutil.rmtree(temp, ignore_errors=True)
        subprocess.run(["git", "worktree", "prune"], cwd=ROOT, capture_output=True)
    seconds = time.perf_counter() - start
    facts["load average at end (1, 5, 15 min)"] = ", ".join(f"{v:.2f}" for v in os.getloadavg())
    table = summarise(runs["before"], runs["after"])
    print(table.to_text())
    print(f"before: {old}; after: {new}; {seconds:.0f} s")
    if not options.no_write:
        command = " ".join(["python -m bench.before_after",
                            *(argv if argv is not None else sys.argv[1:])]).strip()
        block = render(table, facts=facts, command=command, seconds=seconds, old=old, new=new)
        text = options.output.read_text() if options.output.exists() else None
        options.output.write_text(place_section(text, block))
        print(f"wrote the before-after section of {options.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
