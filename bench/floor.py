"""(g) Capture against its floor: ``python -m bench floor``.

Place: bench/, one question: how close does ``minihop.capture`` come to the least any tracer
built on fake tensors must pay, which is running the same forward and backward on fake tensors
with nothing recorded? And how does that compare with Dynamo (``backend="eager"``)?

Warm (one process, one thread, after a first capture and compile of another Function), for
n-op chains (``functions.make_chain``: n ops in forward, n in backward; n = 1, 10, 100, 1000)
and the MLP and LayerNorm cases, three variants, each on a fresh copy of the Function (a new
class whose forward and backward have new code objects, so that nothing is remembered from an
earlier capture of it, by minihop or by Python's caches keyed by code):

  fake-only floor   a fresh ``FakeTensorMode``, fake copies of the arguments (``from_tensor``),
                    then, under ``no_grad`` and the mode, forward with a plain ctx, fake
                    contiguous grads for its outputs, and backward: what minihop runs, with
                    nothing recorded
  minihop capture   ``minihop.capture(F, *args)``
  Dynamo eager      what compiling added to the first fwd+bwd step of a fresh
                    ``torch.compile(..., fullgraph=True)`` caller with a backend doing
                    ``backend="eager"``'s work (``capture.dynamo_capture_ns``)

The floor and minihop alternate in a shuffled order each repetition (the ratio is the median
of the per-repetition ratios); Dynamo, slower by far, runs fewer times. Cold (fresh processes,
after ``import torch``): ``import minihop`` and a first capture, against FakeTensorMode's own
cold cost (import it, create a mode, one fake op: most of it is the ``torch._dynamo`` package
its constructor imports) and Dynamo's first compiled call. The per-call rows of table (b)
(``cap(*args)`` and the ``minihop.apply`` hit against eager ``F.apply``) are measured again in
the same run, since per-op capture work must not move to the call path.

The tables, the targets and, for a missed capture target, a profile of where the time goes,
go into ``bench/RESULTS.md`` between ``<!-- floor:start -->`` and ``<!-- floor:end -->``, and a
log-log plot of capture ms against ops into ``bench/capture_floor.png`` (with matplotlib).
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import minihop

from .capture import dynamo_capture_ns
from .functions import MLP, Case, LayerNorm, MySin, Warmup, _PlainCtx, case_named, make_chain
from .per_call import APPLY, CAP, EAGER, measure_per_call
from .timing import Profile, Table, Timing, collected_ns, heap_frozen, profile

__all__ = ["COLD", "FLOOR", "DYNAMO", "MARKER", "MINIHOP", "SIZES", "ColdStart", "Floor", "fake_only",
           "fresh_function", "measure_cold_start", "measure_floor", "misses", "plot_floor", "profile_floor", "section",
           "targets"]

MARKER = "floor"
SIZES = (1, 10, 100, 1000)
FLOOR, MINIHOP, DYNAMO = "fake-only floor", "minihop capture", "Dynamo eager"
REPO = Path(__file__).resolve().parent.parent
PLOT = "capture_floor.png"
# The chains' source files: a user's Function lives in a file, and minihop reads its lines
# (names of results, stack traces) as it records each op.
_SOURCES = tempfile.mkdtemp(prefix="minihop-bench-floor-")
atexit.register(shutil.rmtree, _SOURCES, True)


def fresh_function(fn_cls: type, tag: object) -> type:
    """A copy of ``fn_cls`` never seen before: a new class whose staticmethods' functions have
    new code objects (one extra, unused constant makes them unequal to the originals, so
    ``lru_cache``s keyed by code miss), with the same source lines."""
    body: dict[str, Any] = {}
    for name in ("forward", "backward", "setup_context"):
        raw = fn_cls.__dict__.get(name)
        if isinstance(raw, staticmethod):
            fn = raw.__func__
            code = fn.__code__.replace(co_consts=(*fn.__code__.co_consts, f"fresh {tag}"))
            copy = types.FunctionType(code, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
            copy.__qualname__ = fn.__qualname__
            body[name] = staticmethod(copy)
    return type(fn_cls.__name__, (fn_cls,), body)


def fake_only(fn_cls: Any, args: tuple[Any, ...]) -> None:
    """The floor: ``fn_cls``'s forward and backward on fake copies of ``args`` under a fresh
    ``FakeTensorMode`` and ``no_grad`` (as minihop runs them), nothing recorded."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode()
    fake = tuple(mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args)
    with torch.no_grad(), mode:
        ctx = _PlainCtx(len(args))
        out = fn_cls.forward(ctx, *fake)
        outs = out if isinstance(out, tuple) else (out,)
        grads = tuple(torch.empty(o.shape, dtype=o.dtype, device=o.device) if isinstance(o, torch.Tensor)
                      else None for o in outs)
        fn_cls.backward(ctx, *grads)


def _cases(sizes: tuple[int, ...]) -> tuple[tuple[str, int, Callable[[], type], Callable[[], tuple[Any, ...]]], ...]:
    """(label, ops in forward and backward, a fresh Function, its arguments)."""
    x = lambda: (torch.randn(8, 8, requires_grad=True),)  # noqa: E731
    rows = [(f"chain {n}", 2 * n, lambda n=n: make_chain(n, _SOURCES), x) for n in sizes]
    for name, ops in (("MLP 8x8", 8), ("LayerNorm 8x8", 24)):
        case = case_named(name)
        rows.append((name, ops, lambda f=case.function: f, case.make_args))
    return tuple(rows)


def _reps(ops: int, reps: int) -> int:
    return max(min(reps, 3), reps if ops < 200 else reps // 2 if ops < 1000 else reps // 4)


def _dynamo_reps(ops: int, reps: int) -> int:
    return max(1, reps if ops < 1000 else reps // 3)


@dataclasses.dataclass(frozen=True)
class Floor:
    """``ms[label][who]``: median ms, who in (FLOOR, MINIHOP, DYNAMO); ``ratio[label]``: the
    paired median of minihop over floor with its ~95% interval; ``ops[label]``."""

    table: Table
    ms: dict[str, dict[str, float]]
    ratio: dict[str, tuple[float, float, float]]
    ops: dict[str, int]


def measure_floor(sizes: tuple[int, ...] = SIZES, *, reps: int = 15, dynamo_reps: int = 3,
                  dynamo: bool = True) -> Floor:
    """Floor, minihop and Dynamo eager for each chain size and case (see the module doc)."""
    x = torch.randn(8, 8, requires_grad=True)
    minihop.capture(Warmup, x)
    fake_only(Warmup, (x,))
    if dynamo:
        dynamo_capture_ns(Warmup, (x,), "eager", "floor warmup")
    shuffler = random.Random(0)
    ms: dict[str, dict[str, float]] = {}
    ratio: dict[str, tuple[float, float, float]] = {}
    ops_of: dict[str, int] = {}
    counts: dict[str, tuple[int, int]] = {}
    with heap_frozen():
        for label, ops, make, make_args in _cases(sizes):
            base = make()
            args = make_args()
            samples: dict[str, list[float]] = {FLOOR: [], MINIHOP: [], DYNAMO: []}
            n, nd = _reps(ops, reps), (_dynamo_reps(ops, dynamo_reps) if dynamo else 0)
            for i in range(max(n, nd)):
                variants: list[tuple[str, Callable[[], float]]] = []
                if i < n:
                    floor_fn, mine_fn = fresh_function(base, (i, "floor")), fresh_function(base, (i, "minihop"))
                    variants += [(FLOOR, lambda f=floor_fn: collected_ns(lambda: fake_only(f, args))),
                                 (MINIHOP, lambda f=mine_fn: collected_ns(lambda: minihop.capture(f, *args)))]
                if i < nd:
                    dyn_fn = fresh_function(base, (i, "dynamo"))
                    variants.append((DYNAMO, lambda f=dyn_fn: dynamo_capture_ns(f, args, "eager", f"floor {i}")))
                for who, run in shuffler.sample(variants, len(variants)):
                    samples[who].append(run())
            ms[label] = {who: statistics.median(s) / 1e6 for who, s in samples.items() if s}
            paired = Timing(tuple(samples[MINIHOP]), 1)
            floor = Timing(tuple(samples[FLOOR]), 1)
            ratio[label] = (paired.ratio_to(floor), *paired.ratio_interval(floor))
            ops_of[label] = ops
            counts[label] = (n, nd)
    rows = []
    for label in ms:
        m, (r, lo, hi) = ms[label], ratio[label]
        cells = [label, str(ops_of[label]), f"{m[FLOOR]:.2f}", f"{m[MINIHOP]:.2f}",
                 f"{r:.2f}x [{lo:.2f}, {hi:.2f}]"]
        if dynamo:
            cells += [f"{m[DYNAMO]:.1f}", f"{m[DYNAMO] / m[MINIHOP]:.1f}x"]
        cells.append(f"{counts[label][0]} / {counts[label][1]}")
        rows.append(tuple(cells))
    columns = ["case", "ops (fwd + bwd)", "floor ms", "minihop ms", "minihop / floor [95%]"]
    if dynamo:
        columns += ["Dynamo eager ms", "Dynamo / minihop"]
    columns.append("reps (floor+minihop / Dynamo)")
    notes = (
        "Medians over the repetitions. Floor: a fresh FakeTensorMode, `from_tensor` copies of the "
        "arguments, forward and backward on them under `no_grad` with nothing recorded. Each "
        "repetition uses a fresh copy of the Function (new class, new code objects).",
        "`minihop / floor` is the median of the per-repetition ratios (floor and minihop run back "
        "to back in a shuffled order), with a distribution-free ~95% interval.",
        "Dynamo eager: what compiling added to the first fwd+bwd step of a fresh "
        "`torch.compile(..., fullgraph=True)` caller after `torch._dynamo.reset()`, as in table (a).",
    )
    return Floor(Table("(g) Capture against its floor: fake-tensor propagation alone", tuple(columns),
                       tuple(rows), notes), ms, ratio, ops_of)


# A fresh process, after ``import torch`` (paid alike by all): {body} is timed.
_COLD = """
import json, time
t0 = time.perf_counter()
import torch
t1 = time.perf_counter()
torch.set_num_threads(1)
x = torch.randn(8, 8, requires_grad=True)

class MySin(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.sin()

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * x.cos()

t2 = time.perf_counter()
{body}
t3 = time.perf_counter()
print(json.dumps({{"torch": t1 - t0, "cold": t3 - t2}}))
"""
COLD = {
    "FakeTensorMode: import, create, one fake op":
        "from torch._subclasses.fake_tensor import FakeTensorMode\n"
        "mode = FakeTensorMode()\nfake = mode.from_tensor(x)\nwith mode:\n    fake.sin()",
    "minihop: import, first capture":
        "import minihop\nminihop.capture(MySin, x)",
    "Dynamo eager: first compiled fwd+bwd":
        "f = torch.compile(lambda a: MySin.apply(a), fullgraph=True, backend=lambda gm, ex: gm.forward)\n"
        "f(x).sum().backward()",
}
COLD_BASE, COLD_MINIHOP = tuple(COLD)[:2]


@dataclasses.dataclass(frozen=True)
class ColdStart:
    """``seconds[who]``: the fresh-process runs' timed part, one per repetition."""

    table: Table
    seconds: dict[str, list[float]]

    @property
    def ratio(self) -> float:
        """minihop over FakeTensorMode's own cold cost: the median of per-repetition ratios
        (the two ran one after the other)."""
        pairs = zip(self.seconds[COLD_MINIHOP], self.seconds[COLD_BASE], strict=True)
        return statistics.median(m / f for m, f in pairs)


def _cold_run(body: str, timeout_s: float) -> float:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    proc = subprocess.run([sys.executable, "-c", _COLD.format(body=body)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0:
        raise RuntimeError(f"cold run failed (exit {proc.returncode}): {proc.stderr.strip()[-500:]}")
    return float(json.loads(proc.stdout.strip().splitlines()[-1])["cold"])


def measure_cold_start(reps: int = 5, *, dynamo: bool = True, timeout_s: float = 180.0) -> ColdStart:
    """Each body of ``COLD`` in ``reps`` fresh processes, the bodies alternating in a shuffled
    order each repetition."""
    whos = [w for w in COLD if dynamo or not w.startswith("Dynamo")]
    seconds: dict[str, list[float]] = {w: [] for w in whos}
    shuffler = random.Random(0)
    for _ in range(reps):
        for who in shuffler.sample(whos, len(whos)):
            seconds[who].append(_cold_run(COLD[who], timeout_s))
    base = statistics.median(seconds[COLD_BASE])
    rows = tuple((w, f"{statistics.median(s):.2f}", f"{min(s):.2f}", f"{statistics.median(s) / base:.2f}x")
                 for w, s in seconds.items())
    cold = ColdStart(Table("(g) Cold start: a fresh process, after `import torch`",
                           ("who", "median s", "min s", "vs FakeTensorMode's own"), rows,
                           (f"Median of {reps} fresh processes each, run alternately; timed from after "
                            "`import torch` and the Function's definition to the end of the body.",
                            "Most of each is the import of `torch._dynamo` (FakeTensorMode's constructor "
                            "imports it; minihop never does). minihop's own share is the import of its "
                            "modules (about 0.3 s on this machine: module and dataclass set-up) and the "
                            "first capture's one-off work; the process-to-process spread is of the same "
                            "size on a shared machine, hence the paired ratio below.")), seconds)
    pairs = f"paired median minihop / FakeTensorMode: {cold.ratio:.2f}x"
    return dataclasses.replace(cold, table=dataclasses.replace(cold.table, notes=(*cold.table.notes, pairs + ".")))


def per_call_rows(budget_s: float = 0.3, min_rounds: int = 11) -> tuple[Table, float, float]:
    """Table (b) again for MySin 8x8: (its table, cap(*args) / eager, apply hit / eager)."""
    found = measure_per_call((case_named("MySin 8x8"),), budget_s=budget_s, min_rounds=min_rounds,
                             inductor=False)
    t = found.timings["MySin 8x8"]
    return found.table, t[CAP].ratio_to(t[EAGER]), t[APPLY].ratio_to(t[EAGER])


def targets(floor: Floor, cold: ColdStart | None, per_call: tuple[float, float] | None) -> tuple[Table, bool]:
    """The issue's targets, PASS or MISS (by how much); and whether a capture target missed."""
    rows: list[tuple[str, ...]] = []
    capture_missed = False

    def add(target: str, case: str, measured: float, limit: float, unit: str, at_most: bool,
            capture: bool = False) -> None:
        nonlocal capture_missed
        ok = measured <= limit if at_most else measured >= limit
        by = measured / limit if at_most else limit / measured
        rows.append((target, case, f"{measured:.2f}{unit}", f"{'<=' if at_most else '>='} {limit:g}{unit}",
                     "PASS" if ok else f"MISS ({by:.2f}x {'over' if at_most else 'short'})"))
        capture_missed |= capture and not ok

    for label in ("chain 1", "chain 100"):
        if label in floor.ratio:
            add("minihop capture / fake-only floor", label, floor.ratio[label][0], 1.5, "x", True, True)
    for label, limit in (("chain 1", 20.0), ("chain 100", 5.0)):
        if label in floor.ms and DYNAMO in floor.ms[label]:
            add("Dynamo eager / minihop capture", label, floor.ms[label][DYNAMO] / floor.ms[label][MINIHOP],
                limit, "x", False, True)
    if cold is not None:
        add("fresh process: import minihop + first capture / FakeTensorMode's own", "MySin 8x8", cold.ratio,
            1.1, "x", True)
    if per_call is not None:
        add("cap(*args) fwd+bwd / eager F.apply", "MySin 8x8", per_call[0], 1.1, "x", True)
        add("minihop.apply hit / eager F.apply", "MySin 8x8", per_call[1], 1.3, "x", True)
    return Table("(g) Targets", ("target", "case", "measured", "threshold", "result"), tuple(rows)), capture_missed


# Kinds of work in a capture, by the function that does it (file suffix, function name). Each
# is cumulative time, and no kind runs inside another.
_KINDS = (
    ("fake-tensor op dispatch (torch)", ("torch/_subclasses/fake_tensor.py", "__torch_dispatch__")),
    ("fake copies of the arguments (torch: from_tensor)", ("torch/_subclasses/fake_tensor.py", "from_tensor")),
    ("FakeTensorMode() (torch)", ("torch/_subclasses/fake_tensor.py", "__init__")),
    ("fx nodes, recorded and copied (minihop: fxgraph.append_node)", ("minihop/fxgraph.py", "append_node")),
    ("fx nodes made by fx itself (torch: Graph.create_node)", ("torch/fx/graph.py", "create_node")),
    ("fx code generation (torch: Graph.python_code)", ("torch/fx/graph.py", "python_code")),
    ("graph copies (torch: Graph.node_copy)", ("torch/fx/graph.py", "node_copy")),
    ("rewiring (minihop: rewire.pair.make_pair)", ("minihop/rewire/pair.py", "make_pair")),
    ("runtime build (minihop: runtime.capture.make_capture)", ("minihop/runtime/capture.py", "make_capture")),
)


def _shares(stats: dict[Any, Any]) -> str:
    total = sum(ct for (file, _, name), (_, _, _, ct, _) in stats.items()
                if file.endswith("minihop/pipeline.py") and name == "capture")
    rows = []
    for label, (suffix, func) in _KINDS:
        seconds = sum(ct for (file, _, name), (_, _, _, ct, _) in stats.items()
                      if file.endswith(suffix) and name == func)
        rows.append(f"| {label} | {100 * seconds / total:.0f}% |")
    return "\n".join(["| work (cumulative; rewiring and runtime include their own fx work) | share of capture |",
                      "|---|---|", *rows]) + "\n"


def profile_floor(ops: int, reps: int) -> Profile:
    """cProfile of ``reps`` warm captures of a fresh ``ops``-op chain (each a fresh copy)."""
    x = torch.randn(8, 8, requires_grad=True)
    base = make_chain(ops, _SOURCES)
    minihop.capture(Warmup, x)
    fresh = [fresh_function(base, ("profile", i)) for i in range(reps)]

    def run() -> None:
        for f in fresh:
            minihop.capture(f, x)

    return profile(f"{reps} warm `minihop.capture` of a fresh {ops}-op chain", run, shares=_shares)


def plot_floor(floor: Floor, path: Path) -> str:
    """Capture ms against ops (fwd + bwd) on log-log axes, one line per variant, chains only."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: no plot (pip install -e '.[bench]', then rerun)."
    chains = [label for label in floor.ms if label.startswith("chain ")]
    fig, ax = plt.subplots(figsize=(5.5, 4))
    for who in (FLOOR, MINIHOP, DYNAMO):
        points = [(floor.ops[c], floor.ms[c][who]) for c in chains if who in floor.ms[c]]
        if points:
            ax.plot(*zip(*points, strict=True), marker="o", label=who)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("ops traced (forward + backward)")
    ax.set_ylabel("capture time, ms (warm)")
    ax.set_title("Capture vs fake-only floor vs Dynamo eager")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return f"![Capture time vs ops: fake-only floor, minihop, Dynamo eager]({path.name})"


def section(*, command: str, seconds: float, floor: Floor, target_table: Table, cold: ColdStart | None,
            per_call: Table | None, profiles: tuple[Profile, ...], plot_note: str, misses: str = "") -> str:
    out = [f"## Capture against its floor\n\nGenerated by `{command}` in {seconds:.0f} s (torch "
           f"{torch.__version__}, {torch.get_num_threads()} thread; machine as above).\n",
           target_table.to_markdown(), floor.table.to_markdown()]
    if plot_note:
        out.append(plot_note + "\n")
    if cold is not None:
        out.append(cold.table.to_markdown())
    if per_call is not None:
        out.append(dataclasses.replace(per_call, title="(g) Per call, MySin 8x8, this run").to_markdown())
    if misses:
        out.append(misses)
    for p in profiles:
        out.append(f"Time by kind of work, {p.what} (cProfile):\n\n{p.shares}\n"
                   f"Top 15 by cumulative time:\n\n```\n{p.cumulative}```\n\n"
                   f"minihop's own functions, by own time:\n\n```\n{p.minihop_own}```\n")
    return "\n".join(out)


def run(*, quick: bool, write: Path | None, command: str, dynamo: bool = True, cold: bool = True) -> int:
    """Measure, print, and (``write``) put the section into RESULTS.md and the plot beside it."""
    start = time.perf_counter()
    sizes = (1, 10, 100) if quick else SIZES
    floor = measure_floor(sizes, reps=5 if quick else 15, dynamo_reps=1 if quick else 3, dynamo=dynamo)
    print(floor.table.to_text(), flush=True)
    cold_start = measure_cold_start(1 if quick else 5, dynamo=dynamo) if cold else None
    if cold_start is not None:
        print(cold_start.table.to_text(), flush=True)
    per_call_table, cap_ratio, apply_ratio = per_call_rows(*((0.05, 5) if quick else (0.3, 11)))
    print(per_call_table.to_text(), flush=True)
    target_table, capture_missed = targets(floor, cold_start, (cap_ratio, apply_ratio))
    print(target_table.to_text(), flush=True)
    profiles: tuple[Profile, ...] = ()
    if capture_missed:
        profiles = (profile_floor(1, 20), profile_floor(100, 3))
        for p in profiles:
            print(f"{p.what}:\n{p.shares}\n{p.cumulative}\nminihop's own:\n{p.minihop_own}", flush=True)
    if write is not None:
        from .report import update_section

        plot_note = plot_floor(floor, write.parent / PLOT)
        text = section(command=command, seconds=time.perf_counter() - start, floor=floor,
                       target_table=target_table, cold=cold_start, per_call=per_call_table,
                       profiles=profiles, plot_note=plot_note, misses=misses(floor) if capture_missed else "")
        write.write_text(update_section(write.read_text() if write.exists() else None, text, MARKER))
        print(f"wrote the {MARKER} section of {write} ({plot_note})")
    return 0


def misses(floor: Floor) -> str:
    """Why a capture target is missed and what would close it, with this run's numbers (the
    profiles printed under it show the shares)."""
    def per_op_us(label: str, who: str) -> float:
        return 1e3 * floor.ms[label][who] / floor.ops[label]

    parts = ["**Why the capture targets are missed, and what would close them.**"]
    if "chain 1" in floor.ms:
        m = floor.ms["chain 1"]
        parts.append(
            f"At one op the floor is {m[FLOOR]:.1f} ms (a FakeTensorMode, a `from_tensor` copy, three fake "
            f"ops) and minihop {m[MINIHOP]:.1f} ms: the {m[MINIHOP] - m[FLOOR]:.1f} ms between them is "
            "fixed per capture and spread thin (profile below): the Python-state analysis of forward "
            "and backward (their bytecode, the globals and closures they read), resolving a Function "
            "seen for the first time (`inspect.signature`), the snapshot of objects forward could "
            "write to, the pair's two graphs (rewire), the runtime's `autograd.Function` class and "
            "generated code, the call guard; each 0.1-0.5 ms. 1.5x needs them under half the floor "
            "in all: remembering the analysis and the runtime class per code object helps only a "
            "Function captured again (not the fresh copies measured here); building the pair's "
            "graphs and the runtime code in one pass over the recorded ops would remove one of the "
            "two graph builds.")
    if "chain 100" in floor.ms:
        added = per_op_us("chain 100", MINIHOP) - per_op_us("chain 100", FLOOR)
        parts.append(
            f"Per op (100-op chain) the floor is {per_op_us('chain 100', FLOOR):.0f} µs and minihop adds "
            f"{added:.0f} µs: the recording mode's Python `__torch_function__` and the operator slot's "
            "note of which operator the user wrote, one fx node recorded and one copied into the pair "
            "under the user's names, the op's source line (stack trace) and the bytecode look-up of "
            "where its result is stored, one line of generated code. 1.5x needs that under half the "
            "floor per op: recording into a plain list and building each named graph once (no second "
            "node per op), and the names and lines read once per source line instead of per op.")
    parts.append(
        "Done in this round (each measured against the floor in one process): the profile hook that "
        "names results now turns itself off once the user's frame starts (it ran on every Python "
        "and C call of every fake op: about half of a 100-op capture); fx nodes appended without "
        "fx's per-node pytree walk; stack-trace text written directly; bytecode decoded once per "
        "code object by a decoder three times faster than `dis`; the import of `minihop.testing`, "
        "the artifact reader and the whole-function tracer deferred to first use.")
    return "\n\n".join(parts) + "\n"
