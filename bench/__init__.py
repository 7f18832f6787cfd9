"""minihop's benchmarks: capture latency, per-call fwd+bwd, saved bytes, capture scaling.

Not part of minihop (nothing in ``minihop/`` imports it); a consumer of its public API, timed
against eager ``F.apply`` and ``torch.compile`` in the same process. ``python -m bench`` runs
everything and writes ``bench/RESULTS.md``. One module per measurement:

  functions        the benchmark Functions and cases (small and large sizes)
  timing           interleaved ``perf_counter_ns`` timing; the machine's facts
  steps            what one call of each variant is (fwd, backward, clear grads)
  capture_latency  (a) warm and cold capture, minihop vs Dynamo
  per_call         (b) steady-state fwd+bwd per call
  saved            (c) bytes saved for backward
  scaling          (d) capture time vs Function size, and its plot
  guard_cost       (e) per-call cost of value guards (a marked section of RESULTS.md)
  sizes            (f) the 20-size loop: automatic dynamic shapes vs torch.compile
  targets          the issue's targets, PASS/MISS
  profiling        cProfile excerpts for the misses
  report, run      RESULTS.md and the entry point
  gpu_check        a separate script for a CUDA machine
  before_after     a separate script: the hot path at an older commit vs now, in one run
  parity_data      README's data-dependent parity rows: eager, Dynamo, minihop (no timing)
"""

from .functions import CASES, Case
from .table import Table

__all__ = ["CASES", "Case", "Table"]
