"""``python -m bench gpu``: minihop on CUDA, checked against eager, and its per-call cost.

Place: bench/, a separate run for a machine with a GPU (under 5 minutes). On a CPU-only
machine it prints "no CUDA device; skipped" and exits 0 (``--device cpu`` runs the same checks
on the CPU, without the stream cases, to try the script itself).

Checks, for a few benchmark Functions at a small and a large size, outputs and every grad of
``cap(*args)`` and ``minihop.apply`` against eager ``F.apply`` (``torch.testing.assert_close``):
  default      on the default stream;
  side stream  forward and backward with a non-default ``torch.cuda.Stream`` current;
  cross        forward on a side stream, backward called from the default stream after it
               (autograd runs each backward op on its forward op's stream);
  stream=      minihop's own ``stream=`` path (``cap.on_stream(s)``, ``minihop.function(F,
               stream=s)``), called from the default stream with no waits around it.
Then the per-call fwd+bwd time (synchronised per call) of eager, ``cap(*args)``,
``cap.run(args)`` and the ``minihop.apply`` hit, as ratios to eager. Exit status 1 if any
check fails.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

import minihop

from .functions import CASES, Case, fwd_bwd, grad_leaves, loss_of
from .timing import Table, time_interleaved

__all__ = ["check_case", "main", "overhead_table"]

CHECKED = ("MySin", "Add", "LayerNorm", "MLP")


def _on(args: tuple[Any, ...], device: str) -> tuple[Any, ...]:
    return tuple(a.detach().to(device).requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor)
                 else a for a in args)


def _outputs_and_grads(call: Callable[..., Any], args: tuple[Any, ...],
                       fwd_stream: Any, bwd_stream: Any) -> tuple[tuple[torch.Tensor, ...], tuple[Any, ...]]:
    fresh = tuple(a.detach().clone().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor)
                  else a for a in args)
    if fwd_stream is not None:
        fwd_stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(fwd_stream):
            out = call(*fresh)
            loss = loss_of(out)
    else:
        out = call(*fresh)
        loss = loss_of(out)
    if bwd_stream is not None:
        bwd_stream.wait_stream(fwd_stream if fwd_stream is not None else torch.cuda.current_stream())
        with torch.cuda.stream(bwd_stream):
            loss.backward()
    else:
        if fwd_stream is not None:
            torch.cuda.current_stream().wait_stream(fwd_stream)
        loss.backward()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    outs = out if isinstance(out, tuple) else (out,)
    return tuple(o.detach() for o in outs), tuple(t.grad for t in grad_leaves(fresh))


def check_case(case: Case, device: str) -> list[tuple[str, str, str]]:
    """(case, setting, "ok" or the mismatch) for each stream setting on ``device``."""
    args = _on(case.make_args(), device)
    cap = minihop.capture(case.function, *args)
    settings: list[tuple[str, Any, Any]] = [("default stream", None, None)]
    if device.startswith("cuda"):
        side = torch.cuda.Stream()
        settings += [("side stream current", side, side), ("fwd on side, bwd from default", side, None)]
    results = []
    if device.startswith("cuda"):
        # minihop's own stream= path, called from the default stream: it must synchronise by
        # itself (no waits written around it here).
        settings += [("minihop stream=side", "own", None)]
    for label, fwd_stream, bwd_stream in settings:
        own = fwd_stream == "own"
        fwd_stream = None if own else fwd_stream
        expected = _outputs_and_grads(case.function.apply, args, fwd_stream, bwd_stream)
        callers = (("cap(*args)", cap), ("minihop.apply", lambda *a: minihop.apply(case.function, *a)))
        if own:
            callers = (("cap.on_stream(side)", cap.on_stream(side)),
                       ("minihop.function(F, stream=side)", minihop.function(case.function, stream=side)))
        for who, call in callers:
            try:
                got = _outputs_and_grads(call, args, fwd_stream, bwd_stream)
                torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
                verdict = "ok"
            except Exception as e:  # noqa: BLE001 - report every failure, then exit 1
                verdict = f"FAIL: {type(e).__name__}: {str(e).strip().splitlines()[0][:160]}"
            results.append((case.name, f"{who}, {label}", verdict))
    return results


def overhead_table(cases: tuple[Case, ...], device: str, budget_s: float) -> Table:
    """Per-call fwd+bwd (synchronised) of eager and minihop on ``device``, as ratios to eager."""
    sync = torch.cuda.synchronize if device.startswith("cuda") else None
    rows = []
    for case in cases:
        args = _on(case.make_args(), device)
        F = case.function
        cap = minihop.capture(F, *args)
        t = time_interleaved({
            "eager": fwd_bwd(lambda: F.apply(*args), args, sync),
            "cap": fwd_bwd(lambda: cap(*args), args, sync),
            "run": fwd_bwd(lambda: cap.run(args), args, sync),
            "apply": fwd_bwd(lambda: minihop.apply(F, *args), args, sync),
        }, budget_s=budget_s)
        rows.append((case.name, f"{t['eager'].median_ns / 1e3:.1f}",
                     *(f"{t[v].ratio_to(t['eager']):.2f}x" for v in ("cap", "run", "apply"))))
    return Table(f"Per-call fwd+bwd on {device} (synchronised each call)",
                 ("case", "eager µs", "cap(*args) x eager", "cap.run(args) x eager", "minihop.apply hit x eager"),
                 tuple(rows), ("Paired medians over interleaved rounds, as in bench (b).",))


def main(device: str = "cuda", budget_s: float = 0.3) -> int:
    """The checks and the overhead table on ``device``; 1 if any check fails."""
    if device.startswith("cuda") and not torch.cuda.is_available():
        print("no CUDA device; skipped")
        return 0
    start = time.perf_counter()
    torch.set_num_threads(1)
    if device.startswith("cuda"):
        print(f"device: {torch.cuda.get_device_name()}; torch {torch.__version__}; CUDA {torch.version.cuda}")
    cases = tuple(c for c in CASES if c.name.split()[0] in CHECKED)
    results = [r for case in cases for r in check_case(case, device)]
    checks = Table(f"minihop vs eager on {device}: outputs and grads", ("case", "what", "result"), tuple(results))
    print(checks.to_text())
    print(overhead_table(cases, device, budget_s).to_text())
    failed = [r for r in results if r[2] != "ok"]
    print(f"bench gpu: {len(results) - len(failed)}/{len(results)} checks ok in {time.perf_counter() - start:.0f} s")
    return 1 if failed else 0
