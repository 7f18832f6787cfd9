"""Run a capture on a given CUDA stream, keeping every tensor valid across streams.

Place in the pipeline: runtime; the only module that knows about streams. The default needs
nothing from here: a capture's ops run on the caller's current stream, as eager's would, and
autograd runs each backward op on the stream its forward op ran on (and synchronises the
streams gradients cross), exactly as for eager's Function.

With ``stream=`` (``Capture.on_stream(s)``, ``minihop.function(F, stream=s)``), a call does
what a careful user would write around eager code:

1. ``s.wait_stream(caller)``: the inputs, produced on the caller's stream, are ready on ``s``;
2. forward runs under ``torch.cuda.stream(s)`` (so backward later runs on ``s`` too);
3. ``t.record_stream(s)`` for each CUDA input: the caching allocator must not hand their
   memory to someone else while ``s`` may still read it, even if the caller drops them;
4. ``caller.wait_stream(s)``: the outputs are ready when the caller's next op runs;
5. ``t.record_stream(caller)`` for each CUDA output: they were allocated on ``s`` and are used
   on the caller's stream.

Saved tensors need nothing more: they are produced on ``s`` and read by backward on ``s``,
and autograd keeps them alive until then. Inputs saved for backward are kept alive by autograd
too. On CPU, or with ``stream=None``, or when ``s`` is already current, the call is the plain
call (the same code path without steps 1-5).

The stream operations go through a small ``StreamOps`` object so that the order of steps is
testable without a GPU.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import torch

from ..structure import iter_leaves

__all__ = ["CUDA_OPS", "StreamOps", "run_on_stream"]


@dataclasses.dataclass(frozen=True)
class StreamOps:
    """The stream primitives a stream-correct call uses (CUDA's, or a recorder in tests)."""

    current_stream: Callable[[torch.device], Any]
    use_stream: Callable[[Any], contextlib.AbstractContextManager[Any]]
    wait_stream: Callable[[Any, Any], None]  # (waiting, waited_on)
    record_stream: Callable[[torch.Tensor, Any], None]


CUDA_OPS = StreamOps(
    current_stream=lambda device: torch.cuda.current_stream(device),
    use_stream=lambda stream: torch.cuda.stream(stream),
    wait_stream=lambda waiting, waited_on: waiting.wait_stream(waited_on),
    record_stream=lambda tensor, stream: tensor.record_stream(stream),
)


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    for _, leaf in iter_leaves(value):
        if issubclass(type(leaf), torch.Tensor):
            yield leaf


def run_on_stream(call: Callable[[], Any], args: tuple[Any, ...], stream: Any,
                  ops: StreamOps = CUDA_OPS, device_type: str = "cuda") -> Any:
    """``call()`` (a capture's run on ``args``) on ``stream``, stream-correctly (see the
    module docstring). The plain call when there is nothing to synchronise."""
    inputs = [t for t in _tensors(args) if t.device.type == device_type]
    if stream is None or not inputs:
        return call()
    device = inputs[0].device
    caller = ops.current_stream(device)
    if stream == caller:
        return call()
    ops.wait_stream(stream, caller)
    with ops.use_stream(stream):
        result = call()
    for tensor in inputs:
        ops.record_stream(tensor, stream)
    ops.wait_stream(caller, stream)
    for tensor in _tensors(result):
        if tensor.device.type == device_type:
            ops.record_stream(tensor, caller)
    return result
