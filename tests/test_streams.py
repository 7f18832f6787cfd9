"""Stream handling (``minihop.runtime.streams``): the order of waits and ``record_stream`` calls,
checked on CPU through a recording ``StreamOps``; the real thing on CUDA when there is a GPU.

A side stream is correct only if: the stream waits for the caller before forward runs; forward
runs with the stream current; every input is recorded on the stream; the caller waits for the
stream before using the outputs; every output is recorded on the caller's stream.
"""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
import torch

import minihop
from shared_functions import MySin
from minihop.runtime.streams import StreamOps, run_on_stream


class TwoOut(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ctx.save_for_backward(x, y)
        return x * y, x + y

    @staticmethod
    def backward(ctx: Any, ga: torch.Tensor, gb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = ctx.saved_tensors
        return ga * y + gb, ga * x + gb


class Recorder:
    """A StreamOps over named fake streams that logs each call (CPU tensors stand in)."""

    def __init__(self, current: str = "caller") -> None:
        self.current = current
        self.log: list[tuple[Any, ...]] = []

    def ops(self) -> StreamOps:
        @contextlib.contextmanager
        def use(stream: str) -> Any:
            previous, self.current = self.current, stream
            self.log.append(("enter", stream))
            try:
                yield
            finally:
                self.current = previous
                self.log.append(("exit", stream))

        return StreamOps(
            current_stream=lambda device: self.current,
            use_stream=use,
            wait_stream=lambda waiting, waited_on: self.log.append(("wait", waiting, waited_on)),
            record_stream=lambda t, stream: self.log.append(("record", id(t), stream)),
        )


def leaf(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, dtype=torch.float64, requires_grad=True)


class TestOrderOnCPU:
    def test_side_stream_order(self) -> None:
        """wait(side, caller) -> forward on side -> inputs recorded on side -> wait(caller, side) -> outputs recorded on caller."""
        rec = Recorder()
        x, y = leaf(3), leaf(3)
        cap = minihop.capture(TwoOut, x, y)
        seen: list[str] = []

        def call() -> Any:
            seen.append(rec.current)
            return cap(x, y)

        a, b = run_on_stream(call, (x, y), "side", rec.ops(), device_type="cpu")
        assert seen == ["side"]  # forward ran with the side stream current
        assert rec.log == [
            ("wait", "side", "caller"),
            ("enter", "side"),
            ("exit", "side"),
            ("record", id(x), "side"),
            ("record", id(y), "side"),
            ("wait", "caller", "side"),
            ("record", id(a), "caller"),
            ("record", id(b), "caller"),
        ]
        ea, eb = TwoOut.apply(x, y)
        torch.testing.assert_close((a, b), (ea, eb))

    @pytest.mark.parametrize("stream", [None, "caller"])
    def test_nothing_to_synchronise(self, stream: Any) -> None:
        """stream=None, or the stream already current: the plain call, no stream operation."""
        rec = Recorder()
        x = leaf(4)
        out = run_on_stream(lambda: minihop.apply(MySin, x), (x,), stream, rec.ops(), device_type="cpu")
        assert rec.log == []
        torch.testing.assert_close(out, MySin.apply(x))

    def test_no_tensor_on_the_device(self) -> None:
        """Arguments with no tensor on the stream's device type: the plain call."""
        rec = Recorder()
        x = leaf(4)
        run_on_stream(lambda: minihop.apply(MySin, x), (x,), "side", rec.ops(), device_type="cuda")
        assert rec.log == []

    def test_cpu_stream_option_is_the_plain_call(self) -> None:
        """minihop.function(F, stream=...) and Capture.on_stream on CPU tensors: same outputs and grads as eager."""
        x = leaf(5)
        cf = minihop.function(MySin, stream=object())
        cap = minihop.capture(MySin, x).on_stream(object())
        for call in (cf, cap):
            xm, xe = x.detach().clone().requires_grad_(), x.detach().clone().requires_grad_()
            out, ref = call(xm), MySin.apply(xe)
            out.sum().backward()
            ref.sum().backward()
            torch.testing.assert_close(out, ref)
            torch.testing.assert_close(xm.grad, xe.grad)
        assert cf.stats.captures == 1


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@cuda
class TestCUDA:
    @pytest.mark.parametrize("fn_cls, shapes", [(MySin, [(256, 256)]), (TwoOut, [(64, 128), (64, 128)])])
    def test_side_stream_matches_eager(self, fn_cls: type, shapes: list[tuple[int, ...]]) -> None:
        """Forward on a side stream (backward follows it), loss and backward from the default stream."""
        args = [torch.randn(*s, device="cuda", requires_grad=True) for s in shapes]
        side = torch.cuda.Stream()
        cf = minihop.function(fn_cls, stream=side)
        mine = [a.detach().clone().requires_grad_() for a in args]
        out = cf(*mine)
        outs = out if isinstance(out, tuple) else (out,)
        sum(o.sum() for o in outs).backward()
        ref = fn_cls.apply(*args)
        refs = ref if isinstance(ref, tuple) else (ref,)
        sum(o.sum() for o in refs).backward()
        torch.cuda.synchronize()
        torch.testing.assert_close(outs, refs)
        torch.testing.assert_close([m.grad for m in mine], [a.grad for a in args])

    def test_capture_on_stream(self) -> None:
        x = torch.randn(1024, device="cuda", requires_grad=True)
        side = torch.cuda.Stream()
        run = minihop.capture(MySin, x).on_stream(side)
        y = run(x)
        y.sum().backward()
        torch.cuda.synchronize()
        torch.testing.assert_close(y, x.detach().sin())
        torch.testing.assert_close(x.grad, x.detach().cos())
