"""cProfile excerpts that say where minihop's time goes, for the rows whose target is missed.

Place: bench/. ``profile_per_call``: 2000 fwd+bwd steps of the small MySin through
``cap(*args)`` (or the ``minihop.apply`` hit); ``profile_capture``: repeated warm captures of
one case. Each gives the top rows by cumulative time and by own time (directories stripped),
and minihop's own functions by own time (paths from the repository root).
"""

from __future__ import annotations

import cProfile
import dataclasses
import io
import pstats
from pathlib import Path

import torch

import minihop

from .functions import Case, MySin, Warmup
from .steps import fwd_bwd

__all__ = ["Profile", "profile_capture", "profile_per_call"]

_MINIHOP_ROOT = str(Path(minihop.__file__).resolve().parent.parent) + "/"


@dataclasses.dataclass(frozen=True)
class Profile:
    """A profile's headline: what ran; top rows by cumulative time, by own time, and
    minihop's own functions by own time."""

    what: str
    cumulative: str
    own: str
    minihop_own: str
    shares: str = ""  # for captures: the time by kind of work (see ``_capture_shares``)


def _table_part(text: str) -> str:
    start = text.find("   ncalls")
    return text[start:].rstrip() + "\n" if start >= 0 else text


def _excerpt(profiler: cProfile.Profile, sort: str, top: int) -> str:
    stream = io.StringIO()
    pstats.Stats(profiler, stream=stream).strip_dirs().sort_stats(sort).print_stats(top)
    return _table_part(stream.getvalue())


def _minihop_excerpt(profiler: cProfile.Profile, top: int) -> str:
    stream = io.StringIO()
    pstats.Stats(profiler, stream=stream).sort_stats("tottime").print_stats(r"/minihop/", top)
    return _table_part(stream.getvalue()).replace(_MINIHOP_ROOT, "")


def _profile(what: str, run: object, top: int, shares: bool = False) -> Profile:
    profiler = cProfile.Profile()
    profiler.enable()
    run()  # type: ignore[operator]
    profiler.disable()
    return Profile(what, _excerpt(profiler, "cumulative", top), _excerpt(profiler, "tottime", top),
                   _minihop_excerpt(profiler, top), _capture_shares(profiler) if shares else "")


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


def _capture_shares(profiler: cProfile.Profile) -> str:
    """Where a capture's time goes, by kind of work, as a share of ``minihop.capture``."""
    stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
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



def profile_per_call(calls: int = 2000, top: int = 15, shape: tuple[int, ...] = (8, 8),
                     via: str = "cap") -> Profile:
    """Profile ``calls`` fwd+bwd steps of MySin through ``cap(*args)`` (``via="cap"``) or
    the ``minihop.apply`` cache hit (``via="apply"``)."""
    x = torch.randn(*shape, requires_grad=True)
    cap = minihop.capture(MySin, x)
    if via == "cap":
        step, label = fwd_bwd(lambda: cap(x), (x,)), "`cap(*args)`"
    elif via == "apply":
        step, label = fwd_bwd(lambda: minihop.apply(MySin, x), (x,)), "the `minihop.apply` hit"
    else:
        raise ValueError(f"via must be 'cap' or 'apply', got {via!r}")
    for _ in range(50):
        step()

    def run() -> None:
        for _ in range(calls):
            step()

    return _profile(f"{calls} fwd+bwd steps of MySin {'x'.join(map(str, shape))} through {label}",
                    run, top)


def profile_capture(case: Case, reps: int = 10, top: int = 15) -> Profile:
    """Profile ``reps`` warm captures of ``case``."""
    minihop.capture(Warmup, torch.randn(4, requires_grad=True))
    args = case.make_args()

    def run() -> None:
        for _ in range(reps):
            minihop.capture(case.function, *args)

    return _profile(f"{reps} warm `minihop.capture` of {case.name}", run, top, shares=True)
