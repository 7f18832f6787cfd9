"""The forward and backward generated per capture (``minihop.runtime.bodies``): each capture's
code holds exactly the steps its layout needs, with no branch on the layout, and runs as eager.

The golden texts are written by hand from what eager's ctx does for each Function (save what the
user saved, mark what the user marked, unpack once per read), not pasted from minihop's output.
"""

from __future__ import annotations

import re
from typing import Any

import torch
from torch.autograd import Function

import minihop
from minihop.testing import assert_matches_eager


def source_of(fn: type, *args: Any) -> str:
    return minihop.capture(fn, *args)._function.source


def leaf(*shape: int) -> torch.Tensor:
    return torch.randn(*shape).requires_grad_()


class MySin(Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.sin()

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * x.cos()


def test_plain_capture_has_one_branch() -> None:
    """A Function that saves its input and marks nothing: forward runs fwd and saves, with no
    branch; backward, while the class's backward and vjp are the ones it was traced from (eager's
    autograd loads them when backward runs: rebound since forward, it runs the new one), runs bwd
    on the grad and the saved tensors directly (else the general path, which traces it again)."""
    forward, backward = source_of(MySin, leaf(3)).split("\n\n")
    assert forward == (
        "def forward(ctx, i0, ):\n"
        "    outs, to_save = fwd_body(i0)\n"
        "    ctx.save_for_backward(*to_save)\n"
        "    return outs[0]")
    assert backward.splitlines()[:3] == [
        "def backward(ctx, g0, ):",
        "    if F.backward is user_backward and F.vjp is user_vjp and F.boxed_grads_call is user_boxed:",
        "        return bwd_body(g0, *ctx.saved_tensors)"]


class Add(Function):
    @staticmethod
    def forward(ctx, x, y):
        return x + y

    @staticmethod
    def backward(ctx, g):
        return g, g


def test_nothing_saved_nothing_unpacked() -> None:
    """Nothing saved and saved_tensors never read: no save_for_backward call, no unpack (eager's
    backward then runs again after autograd freed its graph)."""
    source = source_of(Add, leaf(2), leaf(2))
    assert "save_for_backward" not in source and "saved_tensors" not in source
    assert re.search(r"^\s+return bwd_body\(g0\)$", source, re.M), source
    assert_matches_eager(Add, leaf(2), leaf(2))


class MarksAndOptions(Function):
    @staticmethod
    def forward(ctx, x):
        ctx.set_materialize_grads(False)
        idx = x.argmax()
        ctx.mark_non_differentiable(idx)
        ctx.save_for_backward(x)
        return x.exp(), idx

    @staticmethod
    def backward(ctx, g, _g_idx):
        (x,) = ctx.saved_tensors
        if g is None:
            return None
        return g * x.exp()


def test_each_ctx_call_is_one_line() -> None:
    """set_materialize_grads(False) and mark_non_differentiable are lines of forward (no flag
    tested at run time); backward, which must check which grads are None, goes through the
    variant picker."""
    source = source_of(MarksAndOptions, leaf(4))
    forward, backward = source.split("\n\n")
    assert "    ctx.set_materialize_grads(False)\n" in forward
    assert "    ctx.mark_non_differentiable(outs[1])\n" in forward
    assert " if " not in forward
    assert "call_bwd(" in backward and "key_of(" in backward
    assert_matches_eager(MarksAndOptions, leaf(4))


class Nested(Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2, {"aux": x.detach() + 1}

    @staticmethod
    def backward(ctx, g, _aux):
        return g * 2


def test_nested_outputs_go_to_the_sink() -> None:
    """A tensor nested in a returned dict travels through the sink: forward takes ``sink`` and
    extends it; backward gives the sink no gradient."""
    source = source_of(Nested, leaf(3))
    assert source.startswith("def forward(ctx, sink, i0, ):\n")
    assert "    sink.extend((outs[1], ))\n" in source
    assert "return (None, *grads)" in source
    assert_matches_eager(Nested, leaf(3))


SCALE = 2.0


class ReadsScale(Function):
    @staticmethod
    def forward(ctx, x):
        return x * SCALE

    @staticmethod
    def backward(ctx, g):
        return g * SCALE


def test_backward_reading_python_state_checks_once() -> None:
    """A backward whose only reason for a case key is a Python value it reads: one compiled
    check, then the traced bwd; the general path only when the value changed."""
    source = source_of(ReadsScale, leaf(2))
    backward = source.split("\n\n")[1]
    assert backward.splitlines()[1:3] == [
        "    if state_ok(()) and F.backward is user_backward and F.vjp is user_vjp and F.boxed_grads_call is user_boxed:", "        return bwd_body(g0)"]


def test_source_is_readable_in_tracebacks() -> None:
    """The generated functions' code is registered with linecache under their own file name, so
    a traceback through them shows their lines."""
    import linecache

    fn = minihop.capture(MySin, leaf(2))._function
    forward, backward = fn.source.split("\n\n")
    for code, text in ((fn.forward.__code__, forward), (fn.backward.__code__, backward)):
        assert "".join(linecache.getlines(code.co_filename)) == text + ("" if text.endswith("\n") else "\n")


W = torch.tensor([1.0, 2.0])


class ReadsGlobalInBackward(Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * W


def test_tensor_read_when_backward_runs() -> None:
    """A tensor backward reads from a global is fetched when backward runs and checked against
    the traced properties in one call; then the traced bwd runs on it."""
    backward = source_of(ReadsGlobalInBackward, leaf(2)).split("\n\n")[1]
    assert backward.splitlines()[1:4] == ["    late0 = fetch0(())",
                                          "    if traced0(late0) and F.backward is user_backward and F.vjp is user_vjp and F.boxed_grads_call is user_boxed:",
                                          "        return bwd_body(g0, late0)"]
