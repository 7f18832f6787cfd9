"""minihop's benchmarks: ``python -m bench [question]`` (``bench.run``); results in ``bench/RESULTS.md``.

Not part of minihop (nothing in ``minihop/`` imports it); a consumer of its public API, timed
against eager ``F.apply`` and ``torch.compile`` in the same process. One module per question:

  capture      (a) warm and cold capture, (d) capture time vs size and its plot, a capture's profile
  per_call     (b) steady-state fwd+bwd per call, its breakdown and profile
  saved        (c) bytes saved for backward
  guard_cost   (e) per-call cost of value guards (a marked section of RESULTS.md)
  sizes        (f) the 20-size loop: automatic dynamic shapes vs torch.compile
  floor        (g) capture against fake-tensor propagation alone, and Dynamo; cold start (a marked
               section of RESULTS.md)
  fuzz         the differential fuzzer's long budget (marked sections)
  parity_data  docs/parity.md's data-dependent parity rows: eager, Dynamo, minihop (no timing)
  gpu          minihop on CUDA against eager, streams included

and under them: ``functions`` (the benchmark Functions, cases, and the step every variant runs),
``timing`` (``Table``, interleaved timing, profiles, machine facts), ``report`` (the targets
and RESULTS.md), ``run`` (the command line).
"""

from .functions import CASES, Case
from .timing import Table

__all__ = ["CASES", "Case", "Table"]
