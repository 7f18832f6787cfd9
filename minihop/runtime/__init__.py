"""runtime: run a consistent pair as one differentiable op.

Last stage of the pipeline (tracer -> rewire -> runtime), run by ``minihop.pipeline``. Imports
no other stage: its input, ``spec.Pair``, is defined in ``spec``.
"""

from .capture import Capture, make_capture
from .function import make_function
from .guards import call_key

__all__ = ["Capture", "call_key", "make_capture", "make_function"]
