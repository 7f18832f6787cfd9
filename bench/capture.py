"""Capture cost: (a) warm and cold latency, (d) time vs Function size (and its plot), and a
profile of where a warm capture's time goes (printed and written where a capture target is missed).

Place: bench/, one question: what does ``minihop.capture`` cost against Dynamo
(``torch.compile``, ``fullgraph=True``)?

Warm: in this process, after a first capture (and compile) of another Function (``Warmup``), so
that one-off start-up costs are paid. minihop's time is the wall time of
``minihop.capture(F, *args)``; Dynamo's is the first fwd+bwd step of a freshly compiled caller
(``torch._dynamo.reset()`` before each) minus a normal step of it, i.e. what the compile added.
Backends: a recording backend returning ``gm.forward`` (what ``backend="eager"`` does) and
``"aot_eager"`` (which also traces the joint forward/backward graph).

Cold: a fresh ``python -c`` that imports torch and minihop and captures once (and the same for
Dynamo: import torch, compile, first step), timed inside the process; the process's whole wall
time (interpreter start-up included) is measured from outside.

Scaling: ``functions.make_chain(n)`` writes a Function whose forward is n ops and whose backward
is n ops; both capture times should grow linearly in n: the table reports ms per op and a
least-squares slope; ``plot_scaling`` draws both on log-log axes when matplotlib is importable.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

import minihop

from .functions import CASES, Case, RecordingBackend, Warmup, compiled, fwd_bwd, make_chain
from .timing import Profile, Table, collected_ns, heap_frozen, profile, time_ns

__all__ = ["CaptureLatency", "ColdCapture", "DYNAMO_BACKENDS", "Scaling", "dynamo_capture_ns", "measure_cold",
           "measure_scaling", "measure_warm", "minihop_capture_ns", "plot_scaling", "profile_capture"]

REPO = Path(__file__).resolve().parent.parent
DYNAMO_BACKENDS = ("eager", "aot_eager")


def _backend(name: str) -> Any:
    return RecordingBackend() if name == "eager" else name


def minihop_capture_ns(fn_cls: type, args: tuple[Any, ...]) -> float:
    """One warm ``minihop.capture``, in ns (garbage collected first)."""
    return collected_ns(lambda: minihop.capture(fn_cls, *args))


def dynamo_capture_ns(fn_cls: type, args: tuple[Any, ...], backend: str, tag: str = "") -> float:
    """What compiling added to the first fwd+bwd step of a fresh ``torch.compile`` caller."""
    import torch._dynamo

    torch._dynamo.reset()
    fn = compiled(fn_cls, _backend(backend), f"{backend} {tag}")
    step = fwd_bwd(lambda: fn(*args), args)
    first = collected_ns(step)
    normal = statistics.median(time_ns(step) for _ in range(3))
    return max(first - normal, 0.0)


def _warm_up(backends: tuple[str, ...]) -> None:
    x = torch.randn(4, requires_grad=True)
    minihop.capture(Warmup, x)
    for backend in backends:
        dynamo_capture_ns(Warmup, (x,), backend, "warmup")


@dataclasses.dataclass(frozen=True)
class CaptureLatency:
    """Warm capture times in ms per case: ``ms[case][who]`` with who in
    ``("minihop", *DYNAMO_BACKENDS)``, each (median, min)."""

    table: Table
    ms: dict[str, dict[str, tuple[float, float]]]


def _ms(samples: list[float]) -> tuple[float, float]:
    return statistics.median(samples) / 1e6, min(samples) / 1e6


def measure_warm(cases: tuple[Case, ...] = CASES, *, reps: int = 7, dynamo_reps: int = 3,
                 backends: tuple[str, ...] = DYNAMO_BACKENDS) -> CaptureLatency:
    """Warm capture latency of every case, minihop vs Dynamo with each backend."""
    _warm_up(backends)
    ms: dict[str, dict[str, tuple[float, float]]] = {}
    with heap_frozen():
        for case in cases:
            # Interleaved, so that a slow stretch of the machine lands on both sides.
            args = case.make_args()
            samples: dict[str, list[float]] = {who: [] for who in ("minihop", *backends)}
            for i in range(max(reps, dynamo_reps)):
                if i < reps:
                    samples["minihop"].append(minihop_capture_ns(case.function, case.make_args()))
                for backend in backends if i < dynamo_reps else ():
                    samples[backend].append(dynamo_capture_ns(case.function, args, backend, str(i)))
            ms[case.name] = {who: _ms(found) for who, found in samples.items()}
    columns = ("case", "minihop ms (min)",
               *(f"Dynamo {b} ms (min)" for b in backends),
               *(f"minihop speed-up vs {b}" for b in backends))
    rows = []
    for case in cases:
        m = ms[case.name]
        rows.append((case.name, f"{m['minihop'][0]:.1f} ({m['minihop'][1]:.1f})",
                     *(f"{m[b][0]:.1f} ({m[b][1]:.1f})" for b in backends),
                     *(f"{m[b][0] / m['minihop'][0]:.1f}x" for b in backends)))
    notes = (
        f"Medians over {reps} minihop captures and {dynamo_reps} Dynamo compiles per case "
        "(min in parentheses), interleaved, after a first capture/compile of another Function.",
        "Dynamo: first fwd+bwd step of a fresh `torch.compile(..., fullgraph=True)` caller "
        "after `torch._dynamo.reset()`, minus a normal step. `eager` is a recording backend "
        "returning `gm.forward`.",
    )
    return CaptureLatency(Table("(a) Warm capture latency", columns, tuple(rows), notes), ms)


# One fresh process: {imports} and {capture} say whose; "dynamo" is whether the capture
# imported torch._dynamo (a recording backend stands for backend="eager", as in the warm rows).
_COLD = """
import json, sys, time
t0 = time.perf_counter()
import torch{imports}
t1 = time.perf_counter()
torch.set_num_threads(1)
from bench.functions import case_named
case = case_named({name!r})
args, F = case.make_args(), case.function
backend = (lambda gm, example_inputs: gm.forward) if {backend!r} == "eager" else {backend!r}
before = "torch._dynamo" in sys.modules
t2 = time.perf_counter()
{capture}
t3 = time.perf_counter()
print(json.dumps({{"import": t1 - t0, "capture": t3 - t2,
                  "dynamo": ("torch._dynamo" in sys.modules) and not before}}))
"""
_MINIHOP_CAPTURE = "minihop.capture(F, *args)"
_DYNAMO_CAPTURE = ("out = torch.compile(lambda *a: F.apply(*a), fullgraph=True, backend=backend)(*args)\n"
                   "(out[0] if isinstance(out, tuple) else out).sum().backward()")


@dataclasses.dataclass(frozen=True)
class ColdCapture:
    """Cold (fresh process) capture: ``seconds[who] = (process wall, import, capture)``."""

    table: Table
    seconds: dict[str, tuple[float, float, float]]


def _run_cold(code: str, timeout_s: float) -> tuple[float, float, float, bool]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout_s)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"cold run failed (exit {proc.returncode}): {proc.stderr.strip()[-500:]}")
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    return wall, float(found["import"]), float(found["capture"]), bool(found["dynamo"])


def measure_cold(case_name: str = "MySin 8x8", *, reps: int = 2,
                 backends: tuple[str, ...] = DYNAMO_BACKENDS, timeout_s: float = 180.0) -> ColdCapture:
    """Import + first capture in a fresh process, minihop vs Dynamo (medians over ``reps``)."""
    codes = {"minihop": _COLD.format(imports=", minihop", name=case_name, backend="", capture=_MINIHOP_CAPTURE)}
    for backend in backends:
        codes[f"Dynamo {backend}"] = _COLD.format(imports="", name=case_name, backend=backend,
                                                  capture=_DYNAMO_CAPTURE)
    seconds: dict[str, tuple[float, float, float]] = {}
    dynamo_loaded: dict[str, bool] = {}
    failed: dict[str, str] = {}
    for who, code in codes.items():
        try:
            runs = [_run_cold(code, timeout_s) for _ in range(reps)]
        except (RuntimeError, subprocess.TimeoutExpired, ValueError) as e:
            failed[who] = str(e).splitlines()[-1][:200] if str(e) else type(e).__name__
            continue
        seconds[who] = tuple(statistics.median(r[i] for r in runs) for i in range(3))  # type: ignore[assignment]
        dynamo_loaded[who] = any(r[3] for r in runs)
    rows = []
    base = seconds.get("minihop")
    for who in codes:
        if who in failed:
            rows.append((who, "failed", "", "", failed[who], ""))
            continue
        wall, imp, cap = seconds[who]
        ratio = f"{(imp + cap) / (base[1] + base[2]):.2f}x" if base else "n/a"
        rows.append((who, f"{wall:.2f}", f"{imp:.2f}", f"{cap:.2f}", ratio,
                     "yes" if dynamo_loaded[who] else "no"))
    notes = (f"{case_name}; median of {reps} fresh processes each. 'import' is `import torch` "
             "(and minihop); 'capture' is `minihop.capture` or Dynamo's compile plus first "
             "fwd+bwd step; 'process wall' adds interpreter start-up and exit.",
             "'loads torch._dynamo': whether `torch._dynamo` was imported during the capture "
             "(minihop never imports it, but torch's fake-tensor dispatch, wrapped in "
             "`torch._disable_dynamo`, imports it lazily on first use; that import is most of "
             "minihop's cold capture).")
    table = Table(f"(a) Cold capture latency (fresh process, {case_name})",
                  ("who", "process wall s", "import s", "capture s", "import+capture vs minihop",
                   "loads torch._dynamo"),
                  tuple(rows), notes)
    return ColdCapture(table, seconds)


@dataclasses.dataclass(frozen=True)
class Scaling:
    """``ms[who][n]``: median capture time for an n-op chain, who in ("minihop", "Dynamo eager")."""

    table: Table
    ms: dict[str, dict[int, float]]


def _slope(points: dict[int, float]) -> float:
    """Least-squares ms per op."""
    xs, ys = list(points), list(points.values())
    if len(xs) < 2:
        return ys[0] / xs[0]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)


def _reps(n: int, reps: int) -> int:
    return max(1, reps if n < 500 else reps // 2)


def _measure_sizes(sizes: tuple[int, ...], reps: int, dynamo: bool, x: torch.Tensor,
                   ms: dict[str, dict[int, float]]) -> None:
    for n in sizes:
        chain = make_chain(n)
        ms["minihop"][n] = statistics.median(minihop_capture_ns(chain, (x,)) for _ in range(_reps(n, reps))) / 1e6
        if dynamo:
            ms["Dynamo eager"][n] = statistics.median(
                dynamo_capture_ns(chain, (x,), "eager", str(i)) for i in range(_reps(n, reps))) / 1e6


def measure_scaling(sizes: tuple[int, ...] = (10, 100, 1000), *, reps: int = 3,
                    dynamo: bool = True) -> Scaling:
    """Capture time of an n-op chain for each n, minihop vs Dynamo backend eager."""
    x = torch.randn(8, 8, requires_grad=True)
    minihop.capture(Warmup, x)
    if dynamo:
        dynamo_capture_ns(Warmup, (x,), "eager", "warmup")
    ms: dict[str, dict[int, float]] = {"minihop": {}, "Dynamo eager": {}}
    with heap_frozen():
        _measure_sizes(sizes, reps, dynamo, x, ms)
    whos = [w for w in ms if ms[w]]
    rows = []
    for n in sizes:
        cells: list[str] = [str(n)]
        for w in whos:
            cells += [f"{ms[w][n]:.1f}", f"{ms[w][n] / n:.3f}"]
        if dynamo:
            cells.append(f"{ms['Dynamo eager'][n] / ms['minihop'][n]:.1f}x")
        rows.append(tuple(cells))
    columns = ["ops (fwd; bwd has as many)"]
    for w in whos:
        columns += [f"{w} ms", f"{w} ms/op"]
    if dynamo:
        columns.append("minihop speed-up")
    notes = [f"Least-squares slope: " + "; ".join(f"{w} {_slope(ms[w]):.3f} ms/op" for w in whos) + "."]
    if len(sizes) >= 2:
        lo, hi = sizes[-2], sizes[-1]
        notes.append("Linearity, ms/op at {hi} over ms/op at {lo} (1.0 = linear): ".format(hi=hi, lo=lo)
                     + "; ".join(f"{w} {(ms[w][hi] / hi) / (ms[w][lo] / lo):.2f}" for w in whos) + ".")
    notes.append(f"Median of {reps} captures per size ({max(1, reps // 2)} at 500 ops and over); "
                 "Dynamo measured as in (a).")
    return Scaling(Table("(d) Capture time vs Function size", tuple(columns), tuple(rows), tuple(notes)), ms)


def plot_scaling(scaling: Scaling, path: Path) -> str:
    """Write the capture-time-vs-size PNG; returns a line saying what was done."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: no plot (pip install -e '.[bench]', then rerun)."
    fig, ax = plt.subplots(figsize=(5.5, 4))
    for who, points in scaling.ms.items():
        if points:
            ax.plot(list(points), list(points.values()), marker="o", label=who)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("elementwise ops in forward (backward has as many)")
    ax.set_ylabel("capture time, ms (warm)")
    ax.set_title("Capture time vs Function size")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return f"![Capture time vs Function size: minihop and Dynamo]({path.name})"


# Kinds of work in a capture, by the function that does it (file suffix, function name); their
# cumulative times do not nest in one another.
_CAPTURE_KINDS = (
    ("fake-tensor op dispatch (torch: shape propagation of each op)",
     ("torch/_subclasses/fake_tensor.py", "__torch_dispatch__")),
    ("fake copies of the arguments (torch: FakeTensorMode.from_tensor)",
     ("torch/_subclasses/fake_tensor.py", "from_real_tensor")),
    ("fx node creation (torch: Graph.create_node, recording and rewiring)",
     ("torch/fx/graph.py", "create_node")),
    ("runtime code emission (minihop: runtime/codegen.py)",
     ("minihop/runtime/codegen.py", "emit")),
)


def _capture_shares(stats: dict[Any, Any]) -> str:
    """Where a capture's time goes, by kind of work, as a share of ``minihop.capture``."""
    total = sum(ct for (file, _, name), (_, _, _, ct, _) in stats.items()
                if file.endswith("minihop/pipeline.py") and name == "capture")
    rows = []
    counted = 0.0
    for label, (suffix, func) in _CAPTURE_KINDS:
        seconds = sum(ct for (file, _, name), (_, _, _, ct, _) in stats.items()
                      if file.endswith(suffix) and name == func)
        counted += seconds
        rows.append(f"| {label} | {100 * seconds / total:.0f}% |")
    rows.append(f"| everything else (minihop's tracer, ctx, rewiring, guards; Python) | "
                f"{100 * (total - counted) / total:.0f}% |")
    return "\n".join(["| work | share of capture time |", "|---|---|", *rows]) + "\n"


def profile_capture(case: Case, reps: int = 10, top: int = 15) -> Profile:
    """Profile ``reps`` warm captures of ``case``."""
    minihop.capture(Warmup, torch.randn(4, requires_grad=True))
    args = case.make_args()

    def run() -> None:
        for _ in range(reps):
            minihop.capture(case.function, *args)

    return profile(f"{reps} warm `minihop.capture` of {case.name}", run, top=top, shares=_capture_shares)
