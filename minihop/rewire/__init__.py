"""rewire: pure functions from the raw traces to a consistent (fwd, bwd) pair.

Second stage of the pipeline (tracer -> rewire -> runtime). Graphs in, new graphs out; no
module state, inputs never modified. ``check_consistent`` is the contract for any pair.
"""

from .contract import PairShape, check_consistent
from .outer import make_outer_graph
from .pair import make_pair

__all__ = ["PairShape", "check_consistent", "make_outer_graph", "make_pair"]
