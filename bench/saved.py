"""(c) Bytes saved for backward per call, measured with ``saved_tensors_hooks``.

Place: bench/. One forward call of each variant runs under a pack hook that records every
packed tensor's storage; the sum of the unique storages' sizes is the bytes that call keeps
alive for backward. minihop's runtime also keeps, as eager does for tensors a user stores on
ctx as attributes, values the hooks never see (``ctx.minihop_stash``); they are counted here
separately and included in the comparison.

The residual bytes are what the call's autograd graph keeps alive that the caller does not
already hold: the packed and stashed storages less those that are the call's own arguments or
outputs (saving an input or an output for backward stores a reference, not a copy).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

import minihop

from .functions import CASES, Case, compiled
from .timing import Table

__all__ = ["Saved", "measure_saved", "saved_bytes"]


def _storage_bytes(tensors: Any) -> dict[int, int]:
    found: dict[int, int] = {}
    for t in tensors:
        if isinstance(t, torch.Tensor):
            s = t.untyped_storage()
            found[s.data_ptr()] = max(found.get(s.data_ptr(), 0), s.nbytes())
    return found


def saved_bytes(call: Any, args: tuple[Any, ...] = ()) -> tuple[int, int, int, int]:
    """Of one call: (bytes packed for backward, of those the bytes that are storages of
    ``args`` or of the outputs, bytes minihop stashed on ctx that the hooks did not see,
    residual bytes: packed and stashed storages that are neither args nor outputs)."""
    packed: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        for ptr, n in _storage_bytes((t,)).items():
            packed[ptr] = max(packed.get(ptr, 0), n)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = call()
    outs = out if isinstance(out, tuple) else (out,)
    visible = set(_storage_bytes((*args, *outs)))
    stash = getattr(outs[0].grad_fn, "minihop_stash", ()) if outs[0].grad_fn is not None else ()
    stashed = {p: n for p, n in _storage_bytes(stash).items() if p not in packed}
    residual = sum(n for p, n in (*packed.items(), *stashed.items()) if p not in visible)
    return (sum(packed.values()), sum(n for p, n in packed.items() if p in visible),
            sum(stashed.values()), residual)


@dataclasses.dataclass(frozen=True)
class Saved:
    """``bytes[case][who] = (packed, of which args/outputs, stashed, residual)`` for who in
    eager, minihop and aot_eager (see ``saved_bytes``)."""

    table: Table
    bytes: dict[str, dict[str, tuple[int, int, int, int]]]


def _size(n: int) -> str:
    if n == 0:
        return "0"
    return f"{n / 2**10:.2f} KiB" if n < 2**20 else f"{n / 2**20:.2f} MiB"


def measure_saved(cases: tuple[Case, ...] = CASES, *, with_compile: bool = True) -> Saved:
    """Saved bytes of one call of eager, minihop and (optionally) torch.compile aot_eager."""
    found: dict[str, dict[str, tuple[int, int, int, int]]] = {}
    for case in cases:
        args = case.make_args()
        F = case.function
        cap = minihop.capture(F, *args)
        calls = {"eager": lambda: F.apply(*args), "minihop": lambda: cap(*args)}
        if with_compile:
            aot = compiled(F, "aot_eager", f"saved {case.name}")
            aot(*args)  # compile outside the measurement
            calls["aot_eager"] = lambda: aot(*args)
        found[case.name] = {who: saved_bytes(call, args) for who, call in calls.items()}
    whos = ("eager", "minihop", *(("aot_eager",) if with_compile else ()))
    rows = []
    for case in cases:
        b = found[case.name]
        eager = b["eager"][0] + b["eager"][2]
        mine = b["minihop"][0] + b["minihop"][2]
        rows.append((case.name, *(_size(b[w][0]) for w in whos), _size(b["minihop"][2]),
                     f"{mine / eager:.2f}x" if eager else "n/a",
                     _size(b["eager"][1]), _size(b["minihop"][1]),
                     _size(b["eager"][3]), _size(b["minihop"][3])))
    columns = ("case", *(f"{w} packed" for w in whos), "minihop on ctx (unhooked)",
               "minihop / eager", "eager: of which args/outputs", "minihop: of which args/outputs",
               "eager residual (beyond args/outputs)", "minihop residual (beyond args/outputs)")
    notes = ("Sum of the unique storages packed by `saved_tensors_hooks` during one forward "
             "call (an input saved for backward counts: its storage is kept alive).",
             "'of which args/outputs': packed storages that are the call's own arguments or "
             "outputs. In PyTorch, saving an input or an output for backward stores a reference "
             "to its storage, not a copy: 0 extra bytes while the caller holds it. That is the "
             "memory JAX's pruning of input/output residuals saves; minihop keeps them on ctx "
             "all the same, so that version-counter checks and `saved_tensors_hooks` (e.g. CPU "
             "offloading) see what they see in eager.",
             "'residual (beyond args/outputs)': packed plus unhooked storages less the call's "
             "args and outputs, i.e. what the autograd graph keeps alive that the caller does "
             "not already hold. minihop keeps every value the user saved except an intermediate "
             "its backward never reads (SavesUnused: the saved sigmoid), which it does not keep "
             "at all; that is where its bytes are below eager's.")
    return Saved(Table("(c) Bytes saved for backward per call", columns, tuple(rows), notes), found)
