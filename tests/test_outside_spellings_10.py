"""Hostile spellings, round 10 (issue #28, round 15): the issue's classes written in ways the
suite had not seen, tried from outside against eager in strict, apply and fallback mode
(``eager_modes.matches_eager``).

Silent differences from eager (or failures inside minihop) before this round:

- an object of the user's whose ``__del__`` writes Python state, made and dropped by forward
  (a local, a list's item, inside a helper): the trace held forward's locals past the watches
  (to name graph nodes), so ``__del__`` ran after them and the capture was reused, its write
  made once where eager makes it on every call. Only tensors are held now
  (``tracer.names.capture_locals``): ``__del__`` runs while watched, as code no analysis
  reached, and the capture is single-use;
- the same in backward: backward's trace (run while forward is captured) made the write, and
  backward, traced again when it runs, made it again. What backward's unanalysed code wrote
  while traced with forward is put back (``tracer.opaque.Finder.stop``);
- an argument whose class defines ``__getattribute__``: minihop's own ``isinstance`` against
  an ABC asked it for ``__class__`` and failed inside minihop (``TypeError``) where eager
  raised nothing. Checked by type now, and an object's attributes read past that method.
"""

from __future__ import annotations

import pytest
import torch

from eager_modes import matches_eager


def x_(i):
    return (torch.linspace(-1, 1, 4) + i).requires_grad_()


S = {"k": 2.0}
COUNT = [0]


def _count_state():
    return COUNT[0]


def _count_reset():
    COUNT[0] = 0


class Tracker:
    def __del__(self):
        COUNT[0] += 1


def test_del_of_a_forward_local_writes_a_global():
    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            t = Tracker()  # noqa: F841 (dropped as forward returns)
            return x * 2
        @staticmethod
        def backward(ctx, g): return g * 2
    matches_eager(F, lambda i: (x_(i),), state=_count_state, reset=_count_reset)


def test_del_of_list_items():
    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            items = [Tracker(), Tracker()]
            return x * len(items)
        @staticmethod
        def backward(ctx, g): return g * 2
    matches_eager(F, lambda i: (x_(i),), state=_count_state, reset=_count_reset)


def _made_and_dropped():
    Tracker()
    return 2.0


def test_del_in_a_helper():
    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x): return x * _made_and_dropped()
        @staticmethod
        def backward(ctx, g): return g * 2
    matches_eager(F, lambda i: (x_(i),), state=_count_state, reset=_count_reset)


def test_del_in_backward():
    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x): return x * 2
        @staticmethod
        def backward(ctx, g):
            t = Tracker()  # noqa: F841
            return g * 2
    matches_eager(F, lambda i: (x_(i),), state=_count_state, reset=_count_reset)


def test_del_in_backward_with_a_counter_backward_reads():
    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x): return x * 2
        @staticmethod
        def backward(ctx, g):
            Tracker()
            return g * (1.0 + COUNT[0])
    matches_eager(F, lambda i: (x_(i),), state=_count_state, reset=_count_reset)


class ByGetattribute:
    def __getattribute__(self, name):
        return S["k"]


def test_argument_with_getattribute():
    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, o): return x * o.scale
        @staticmethod
        def backward(ctx, g): return g, None
    def between(i): S["k"] = 2.0 + i
    matches_eager(F, lambda i: (x_(i), ByGetattribute()), between=between, reset=lambda: S.__setitem__("k", 2.0))


def test_argument_with_getattribute_kept_on_ctx():
    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, o):
            ctx.o = o
            return x * 2
        @staticmethod
        def backward(ctx, g): return g * ctx.o.scale, None
    def between(i): S["k"] = 2.0 + i
    matches_eager(F, lambda i: (x_(i), ByGetattribute()), between=between, reset=lambda: S.__setitem__("k", 2.0))
