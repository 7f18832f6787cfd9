"""tracer: run a user's autograd.Function on fake values and record two raw fx graphs.

First stage of the pipeline (tracer -> rewire -> runtime), run by ``minihop.pipeline``. See
``trace.trace_function`` (one Function) and ``program.trace_program`` (a whole function).
"""

from .trace import function_parts, trace_function

__all__ = ["function_parts", "trace_function"]
