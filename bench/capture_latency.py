"""(a) Capture latency: minihop ``capture`` vs Dynamo (``torch.compile``, ``fullgraph=True``).

Place: bench/. Warm: in this process, after a first capture (and compile) of another Function
(``Warmup``), so that one-off start-up costs are paid. minihop's time is the wall time of
``minihop.capture(F, *args)``; Dynamo's is the first fwd+bwd step of a freshly compiled caller
(``torch._dynamo.reset()`` before each) minus a normal step of it, i.e. what the compile added.
Backends: a recording backend returning ``gm.forward`` (what ``backend="eager"`` does) and
``"aot_eager"`` (which also traces the joint forward/backward graph).

Cold: a fresh ``python -c`` that imports torch and minihop and captures once (and the same for
Dynamo: import torch, compile, first step), timed inside the process; the process's whole wall
time (interpreter start-up included) is measured from outside.
"""

from __future__ import annotations

import dataclasses
import gc
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

from .functions import CASES, Case, Warmup
from .steps import RecordingBackend, compiled, fwd_bwd
from .table import Table
from .timing import heap_frozen, time_ns

__all__ = ["CaptureLatency", "ColdCapture", "measure_cold", "measure_warm", "dynamo_capture_ns",
           "minihop_capture_ns", "DYNAMO_BACKENDS"]

REPO = Path(__file__).resolve().parent.parent
DYNAMO_BACKENDS = ("eager", "aot_eager")


def _backend(name: str) -> Any:
    return RecordingBackend() if name == "eager" else name


def minihop_capture_ns(case: Case) -> float:
    """One warm ``minihop.capture`` of the case, in ns (garbage collected first)."""
    args = case.make_args()
    gc.collect()
    start = time.perf_counter_ns()
    minihop.capture(case.function, *args)
    return float(time.perf_counter_ns() - start)


def dynamo_capture_ns(fn_cls: type, args: tuple[Any, ...], backend: str, tag: str = "") -> float:
    """What compiling added to the first fwd+bwd step of a fresh ``torch.compile`` caller."""
    import torch._dynamo

    torch._dynamo.reset()
    fn = compiled(fn_cls, _backend(backend), f"{backend} {tag}")
    step = fwd_bwd(lambda: fn(*args), args)
    gc.collect()
    first = time_ns(step)
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
                    samples["minihop"].append(minihop_capture_ns(case))
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


_MINIHOP_COLD = """
import json, sys, time
t0 = time.perf_counter()
import torch, minihop
t1 = time.perf_counter()
torch.set_num_threads(1)
from bench.functions import case_named
case = case_named({name!r})
args = case.make_args()
before = "torch._dynamo" in sys.modules
t2 = time.perf_counter()
minihop.capture(case.function, *args)
t3 = time.perf_counter()
print(json.dumps({{"import": t1 - t0, "capture": t3 - t2,
                  "dynamo": ("torch._dynamo" in sys.modules) and not before}}))
"""

_DYNAMO_COLD = """
import json, time
t0 = time.perf_counter()
import torch
t1 = time.perf_counter()
torch.set_num_threads(1)
from bench.functions import case_named
case = case_named({name!r})
args = case.make_args()
F = case.function
def record(gm, example_inputs):
    return gm.forward
backend = record if {backend!r} == "eager" else {backend!r}
t2 = time.perf_counter()
out = torch.compile(lambda *a: F.apply(*a), fullgraph=True, backend=backend)(*args)
(out[0] if isinstance(out, tuple) else out).sum().backward()
t3 = time.perf_counter()
print(json.dumps({{"import": t1 - t0, "capture": t3 - t2, "dynamo": True}}))
"""


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
    codes = {"minihop": _MINIHOP_COLD.format(name=case_name)}
    for backend in backends:
        codes[f"Dynamo {backend}"] = _DYNAMO_COLD.format(name=case_name, backend=backend)
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
