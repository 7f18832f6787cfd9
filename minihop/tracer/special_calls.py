"""The calls the recording mode handles itself, as a table: ``BEFORE_RUN[func]`` is the handler.

Place in the pipeline: tracer, read by ``recorder.RecordingMode.__torch_function__`` before it
runs a call. Each handler is ``(mode, recorder, func, args, kwargs) -> result`` and replaces
running and recording the call the ordinary way: autocast's switches become graph nodes, the
user's own grad-mode switches are recorded where they switch, and ``backward()`` is recorded as
a grad node and a ``.grad`` accumulation (``recompute``).
The other calls special to the recorder are keyed by name (``recorder._VALUE_READS``: values
read out of tensors) or are ``Tensor.__setitem__`` (recorded as ``operator.setitem`` after it
runs, since it returns None). A new special call is a handler and a row here.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.amp.autocast_mode import _enter_autocast, _exit_autocast

from . import grad_modes, recompute

# The handlers' ``mode`` is a ``recorder.RecordingMode`` and ``recorder`` its ``GraphRecorder``
# (typed Any: recorder imports this module).
RecordingMode = GraphRecorder = Any

__all__ = ["AUTOCAST_SWITCHES", "BEFORE_RUN"]


def _enter_autocast_node(mode: RecordingMode, recorder: GraphRecorder, func: Any,
                         args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    # Called by autocast.__enter__ after it switched autocast (the fake ops that follow see
    # the switch); the node makes the graph switch it the same way.
    mode.autocast_nodes.append(recorder.record(func, args, kwargs, None))


def _exit_autocast_node(mode: RecordingMode, recorder: GraphRecorder, func: Any,
                        args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    recorder.record(func, (mode.autocast_nodes.pop(),), {}, None)


def _backward(mode: RecordingMode, recorder: GraphRecorder, func: Any,
              args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    # Checkpoint-style backwards: a grad node and a .grad accumulation (see recompute).
    return recompute.backward(recorder, func, args, kwargs, mode.describe(), mode.where(),
                              getattr(mode, "sources", {}))


AUTOCAST_SWITCHES = (_enter_autocast_node, _exit_autocast_node)  # outside a recording: nothing
BEFORE_RUN: dict[Any, Any] = {
    _enter_autocast: _enter_autocast_node,
    _exit_autocast: _exit_autocast_node,
    # The user's own enable_grad()/no_grad(): as eager's in either backward mode (grad_modes).
    torch._C._set_grad_enabled: grad_modes.switch,
    torch.Tensor.backward: _backward,
    torch.autograd.backward: _backward,
}
