"""A write at an index read out of a tensor: ``y[t[0].long()] = 1.0``.

PyTorch turns a 0-dim integer tensor index into a Python int, a value read, which fake tensors
cannot answer. The trace took it as a value read of the whole ``__setitem__`` (its result is
None) and recorded no write: the capture's ``y`` stayed as it was, in forward and in backward,
silently in every mode (round 8, found writing snntorch's first-spike-time loss as a user does:
a backward that scatters ones at the time steps forward found). Now the write is recorded as
the user wrote it and lands where the graphs find it when they run
(``tracer/recorder.RecordingMode``). A boolean mask or an index tensor of several elements was
not affected (fake tensors take those); they stay here beside it.

Each runs against eager in strict, apply and fallback mode (``eager_modes.matches_eager``),
the index's values changing between calls.
"""

from __future__ import annotations

import pytest
import torch

from eager_modes import matches_eager


def x_(i):
    return (torch.tensor([2.0, 0.0, 1.0, 3.0]) + torch.tensor([0.0, 1.0, 1.0, 0.0]) * (i % 2)).requires_grad_()


def _function(forward: str, backward: str) -> type:
    namespace = {"torch": torch}
    exec(f"""
class Writes(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
{forward}

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
{backward}
""", namespace)
    return namespace["Writes"]


WRITES = {
    "scalar index, forward": ("        y = torch.zeros_like(x)\n        y[x[0].long()] = 1.0\n        return y * x",
                              "        return g"),
    "scalar index, backward": ("        return x * 2",
                               "        grad = torch.zeros_like(x)\n        grad[x[0].long()] = 1.0\n        return g * grad"),
    "scalar index beside ints": ("        y = torch.zeros(4, 4)\n        y[x[0].long(), 1] = 5.0\n        return x * y.sum(0)",
                                 "        return g"),
    "a tensor written at a scalar index": ("        y = torch.zeros_like(x)\n        y[x[3].long()] = x[0]\n        return y + x",
                                           "        return g"),
    "a branch on what was written": ("        y = torch.zeros_like(x)\n        y[x[0].long()] = 1.0\n"
                                     "        return x * 2 if y[1] > 0.5 else x * 3", "        return g"),
    "boolean mask": ("        y = x.clone()\n        y[x > 1.5] = 0.0\n        return y", "        return g * (x <= 1.5)"),
    "index tensor": ("        y = torch.zeros_like(x)\n        y[x.long() % 4] = 1.0\n        return y * x", "        return g"),
}


@pytest.mark.parametrize("name", sorted(WRITES))
def test_write_at_a_data_index_matches_eager(name) -> None:
    matches_eager(_function(*WRITES[name]), lambda i: (x_(i),))


class FirstSpikeTime(torch.autograd.Function):
    """Spike records [T, B, N] of 0/1 -> the first spike's time step [B, N]; backward puts -1
    at that step (the time steps' loops and the scatter as the package writes them)."""

    @staticmethod
    def forward(ctx, spikes, device="cpu"):
        steps = (spikes.transpose(0, -1) * (torch.arange(0, spikes.size(0)).detach().to(device) + 1)).transpose(0, -1)
        first = torch.zeros_like(steps[0])
        for t in range(steps.size(0)):
            first += steps[t] * ~first.bool()
        first += ~first.bool() * steps.size(0)
        first -= 1
        ctx.save_for_backward(first, spikes)
        return first

    @staticmethod
    def backward(ctx, g):
        first, spikes = ctx.saved_tensors
        grad = torch.zeros_like(spikes)
        for i in range(first.size(0)):
            for j in range(first.size(1)):
                grad[first[i, j].long(), i, j] = 1.0
        return -g * grad, None


def test_first_spike_time_loss() -> None:
    def spikes(i):
        generator = torch.Generator().manual_seed(i)
        return ((torch.rand(4, 2, 3, generator=generator) > 0.5).float().requires_grad_(),)

    matches_eager(FirstSpikeTime, spikes)
