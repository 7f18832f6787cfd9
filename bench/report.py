"""RESULTS.md: the machine's facts, how to reproduce, the targets, the misses explained, the tables.

Place: bench/, last. ``render`` only formats what the measurements returned; it measures
nothing itself.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from .per_call import APPLY, CAP, EAGER, FLOOR, RUN, PerCall
from .profiling import Profile
from .table import Table
from .targets import CAPTURE_GROUP, PER_CALL_GROUP, SAVED_GROUP, SIZES_GROUP, Targets

__all__ = ["keep_marked_sections", "per_call_breakdown", "render", "update_section"]

# Sections other scripts write into RESULTS.md (bench/fuzz.py: ``<!-- fuzz:start -->`` ..
# ``<!-- fuzz:end -->``; bench/before_after.py: ``<!-- before-after:start -->`` ..); a rerun of
# the speed benchmarks keeps them as they are, in their order.
_MARKED = re.compile(r"<!-- ([\w-]+):start -->.*?<!-- \1:end -->", re.DOTALL)

REPRODUCE = """\
From the repository root, with minihop installed (`python -m pip install -e .`):

```sh
python -m bench              # everything (~3 min on 2 cores); writes bench/RESULTS.md
python bench/run.py          # the same
python -m bench --quick      # a ~30 s pass; prints the tables, writes nothing unless --output
python bench/gpu_check.py    # on a CUDA machine: correctness vs eager (also on a side stream) and overhead
python -m bench.before_after # the hot path at dfa4c17 vs now (~2 min); its own section of RESULTS.md
```

Options: `--no-inductor` (skip `torch.compile(backend="inductor")`), `--no-cold` (skip the
fresh-process runs), `--output PATH`. The plot needs matplotlib, which minihop does not depend
on (`python -m pip install -e '.[bench]'`); without it the run says so and skips the plot.
Everything is measured in one process (the cold rows in fresh child processes), with
`torch.set_num_threads(1)`, `time.perf_counter_ns`, warm-up first, medians over many
repetitions, and every number that is compared given as a ratio to a baseline timed in the
same run.
"""


def per_call_breakdown(per_call: PerCall, case_name: str) -> Table | None:
    """Where the per-call time of one case goes, from the interleaved timings."""
    t = per_call.timings.get(case_name)
    if t is None:
        return None
    us = {v: t[v].median_ns / 1e3 for v in (EAGER, FLOOR, RUN, CAP, APPLY)}
    rows = (
        ("the ops themselves, no autograd (floor)", f"{us[FLOOR]:.1f}", "-"),
        ("eager `F.apply`: + autograd and Function machinery", f"{us[EAGER]:.1f}",
         f"+{us[EAGER] - us[FLOOR]:.1f} over floor"),
        ("`cap.run(args)`: + minihop's runtime (fetch, generated fwd/bwd code, rebuild)",
         f"{us[RUN]:.1f}", f"{us[RUN] - us[EAGER]:+.1f} vs eager"),
        ("`cap(*args)`: + binding and guard check", f"{us[CAP]:.1f}", f"{us[CAP] - us[RUN]:+.1f} vs run"),
        ("`minihop.apply` hit: + cache key and lookup instead", f"{us[APPLY]:.1f}",
         f"{us[APPLY] - us[RUN]:+.1f} vs run"),
    )
    return Table(f"Per-call breakdown, {case_name} (µs per fwd+bwd step, medians)",
                 ("layer", "µs", "difference"), rows)


def update_section(text: str | None, section: str, marker: str = "fuzz") -> str:
    """``text`` with the ``marker`` section replaced by ``section`` (or appended; or the whole
    file if ``text`` is empty). bench/fuzz.py, bench/guard_cost.py, bench/parity_data.py."""
    start, end = f"<!-- {marker}:start -->", f"<!-- {marker}:end -->"
    block = f"{start}\n{section.rstrip()}\n{end}"
    if not text:
        return block + "\n"
    if start in text and end in text:
        before, rest = text.split(start, 1)
        _, after = rest.split(end, 1)
        return before + block + after
    return text.rstrip("\n") + "\n\n" + block + "\n"


def keep_marked_sections(old: str, new: str) -> str:
    """``new``, followed by every marked section of ``old`` that ``new`` does not have."""
    have = {m.group(1) for m in _MARKED.finditer(new)}
    kept = [m.group(0) for m in _MARKED.finditer(old) if m.group(1) not in have]
    return new if not kept else new.rstrip() + "\n\n" + "\n\n".join(kept) + "\n"


# Why the capture targets are missed and what would close the gap; the shares it cites are
# the "time by kind of work" tables this run prints above it.
CAPTURE_PLAN = """**Why, and the plan.** minihop runs every op of forward and backward once on fake
tensors, as Dynamo does; torch's fake-tensor dispatch and its fake copies of the arguments are
the largest measured shares above and are the floor for any tracer built on `FakeTensorMode`
(a fresh `FakeTensorMode` alone is about 0.12 ms, `from_tensor` about 0.4 ms per argument).
Dynamo's extra cost (bytecode analysis, guards, its own graph passes) is what minihop saves,
which is why the ratio is largest for one-op Functions and shrinks per op (table (d)). Done:
runtime code emitted straight from the graphs, GraphModules built only when read (fx's code
generation was about a third of a capture), the outer graph built on first access, no
`fx.Tracer` per graph, pytree walks replaced on the per-op path. Tried and dropped: fake
arguments made with `empty_strided` instead of `from_tensor` (0.08 ms saved per argument, at
the cost of losing `from_tensor`'s aliasing between arguments). Next: (1) build the pair's
graphs directly while tracing instead of copying every node in rewiring (about half of the
fx node-creation share, and part of "everything else"); (2) trim the tracer's per-capture
set-up (frame snapshots, name hints, closure routes), which makes up most of "everything
else" for a one-op Function. Neither removes the fake-dispatch floor, so 20x Dynamo on
multi-op Functions is out of reach for this design; the one-op target (5 ms) is within
about 1.5x.
"""


PER_CALL_PLAN = """**Why, and the plan.** After the work shown in the before/after section, a
captured call runs the same tensor ops as eager through one autograd.Function; what remains on
top is fixed per call and shows only on the small sizes: the guard (is this call like the
captured one: grad mode, autocast, and per tensor its type, dtype, requires_grad, device,
layout and shape; about 0.8 us for one tensor), the compiler check (`torch.compiler.is_compiling`,
about 0.15 us), and two Python frames (`Capture.__call__`, the prepared runner); the
`minihop.apply` hit adds the cache lookup on the class and a lock for its hit counter.
`cap.run(args)` (no guard) is the floor of this design, within noise of eager in table (b).
Next: fold the guard, the runner and the Function's apply into one generated function per
capture (one frame instead of three), and check the guard's tensor properties in one C call
(`torch._C._dispatch_keys` plus sizes) instead of six attribute reads.
"""


def _profile_block(profile: Profile) -> str:
    shares = f"Time by kind of work, {profile.what} (cProfile):\n\n{profile.shares}\n" if profile.shares else ""
    return (shares + f"cProfile, {profile.what}; top 15 by cumulative time:\n\n```\n{profile.cumulative}```\n\n"
            f"Top 15 by own time:\n\n```\n{profile.own}```\n\n"
            f"minihop's own functions, by own time:\n\n```\n{profile.minihop_own}```\n")


def render(*, facts: dict[str, str], command: str, elapsed_s: float, targets: Targets,
           tables: Sequence[Table], breakdown: Table | None, per_call_profiles: Sequence[Profile],
           capture_profiles: Sequence[Profile], plot_note: str) -> str:
    out = ["# minihop benchmarks", "",
           f"Generated by `{command}` in {elapsed_s:.0f} s. Do not edit by hand: rerun it. "
           "Sections between `<!-- name:start -->` and `<!-- name:end -->` markers come from "
           "other scripts (`bench/before_after.py`, `bench/fuzz.py`; `bench/guard_cost.py`, which this run "
           "also rewrites) and are kept by a rerun.", "",
           "## Machine", ""]
    out += [f"- {k}: {v}" for k, v in facts.items()]
    out += ["", "## Reproduce", "", REPRODUCE, "## Targets", ""]
    out.append(targets.table.to_markdown(heading=False))
    if any(targets.missed.values()):
        out += ["## Misses: by how much, and where the time goes", ""]
    if targets.missed[CAPTURE_GROUP]:
        out += ["### Capture", "",
                "The capture rows marked MISS above give the factor. Profile of minihop's "
                "warm capture (the work is tracing forward and backward on fake tensors, then "
                "rewiring); a one-op Function shows the fixed cost, a 100-op chain the cost per op:", ""]
        out += [_profile_block(p) for p in capture_profiles]
        out += [CAPTURE_PLAN]
    if targets.missed[PER_CALL_GROUP]:
        out += ["### Per call", "", "The per-call rows marked MISS above give the ratio. The time of "
                "one small step, layer by layer (from table (b), same run):", ""]
        if breakdown is not None:
            out.append(breakdown.to_markdown(level=4))
        out += [_profile_block(p) for p in per_call_profiles]
        out += [PER_CALL_PLAN]
    if targets.missed[SIZES_GROUP]:
        out += ["### Many batch sizes", "", "See table (e): the rows marked MISS above give the "
                "factor; the loop's time is mostly its two captures (the symbolic one traces with "
                "a ShapeEnv).", ""]
    if targets.missed[SAVED_GROUP]:
        out += ["### Saved bytes", "", "See table (c): minihop keeps more for backward than eager "
                "for the rows marked MISS.", ""]
    out += ["## Tables", ""]
    for table in tables:
        out.append(table.to_markdown(level=3))
    if plot_note:
        out += [plot_note, ""]
    return "\n".join(out).rstrip() + "\n"
