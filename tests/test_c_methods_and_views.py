"""Values read through a C method bound to an object, or through a read-only view of a dict.

``GET = CFG.get`` or ``pop = DQ.popleft`` computes with the object it is bound to, as a
Python bound method does with ``self``; ``MappingProxyType(d)``, ``d.keys()`` show ``d``'s
items as they are now. A capture that keyed them by identity alone hit while the object
behind them had changed (a stale value, or a ``popleft`` made once while tracing), with no
error. Each case is the way a user writes it, against eager in strict, apply and fallback
mode; ``refusable=False`` where it must be captured, not refused.
"""

from __future__ import annotations

import collections
import math
import random
import types

import torch

import minihop
from eager_modes import matches_eager


def _x(i: int) -> torch.Tensor:
    return (torch.linspace(-1, 1, 4) + i).requires_grad_()


def _scaled_by(read):  # a Function whose forward multiplies by what ``read(arg)`` gives
    class Scaled(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, held):
            return x * read(held)

        @staticmethod
        def backward(ctx, g):
            return g, None
    return Scaled


def test_mapping_proxy_argument_follows_its_dict():
    cfg = {"scale": 2.0}
    view = types.MappingProxyType(cfg)
    matches_eager(_scaled_by(lambda m: m["scale"]), lambda i: (_x(i), view),
                  between=lambda i: cfg.__setitem__("scale", 2.0 + i),
                  reset=lambda: cfg.__setitem__("scale", 2.0), refusable=False)


def test_mapping_proxy_global_follows_its_dict():
    cfg = {"scale": 2.0}
    SETTINGS = types.MappingProxyType(cfg)

    class Scaled(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * SETTINGS["scale"]

        @staticmethod
        def backward(ctx, g):
            return g * SETTINGS["scale"]
    matches_eager(Scaled, lambda i: (_x(i),), between=lambda i: cfg.__setitem__("scale", 2.0 + i),
                  mid=lambda i: cfg.__setitem__("scale", 7.0 - i),
                  reset=lambda: cfg.__setitem__("scale", 2.0))


def test_dict_views_passed_in_are_captured_and_follow_their_dict():
    counts = {"a": 1.0}
    for view, read in ((counts.keys(), len), (counts.values(), sum),
                       (counts.items(), lambda items: sum(v for _, v in items))):
        minihop.reset()
        matches_eager(_scaled_by(read), lambda i, view=view: (_x(i), view),
                      between=lambda i: counts.__setitem__(f"k{i}", float(i)),
                      reset=lambda: (counts.clear(), counts.update(a=1.0)), refusable=False)


def test_bound_dict_get_in_a_global():
    cfg = {"scale": 2.0}
    GET = cfg.get

    class Scaled(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * GET("scale", 1.0)

        @staticmethod
        def backward(ctx, g):
            return g
    matches_eager(Scaled, lambda i: (_x(i),), between=lambda i: cfg.__setitem__("scale", 2.0 + i),
                  reset=lambda: cfg.__setitem__("scale", 2.0), refusable=False)


def test_the_same_bound_get_passed_on_every_call():
    cfg = {"scale": 2.0}
    get = cfg.get  # one object, kept by the caller: its identity never changes
    matches_eager(_scaled_by(lambda g: g("scale")), lambda i: (_x(i), get),
                  between=lambda i: cfg.__setitem__("scale", 2.0 + i),
                  reset=lambda: cfg.__setitem__("scale", 2.0), refusable=False)


def test_bound_list_getitem_in_a_global():
    table = [2.0, 3.0]
    AT = table.__getitem__

    class Picked(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, k):
            return x * AT(k)

        @staticmethod
        def backward(ctx, g):
            return g, None
    matches_eager(Picked, lambda i: (_x(i), i % 2), between=lambda i: table.__setitem__(0, 2.0 + i),
                  reset=lambda: table.__setitem__(0, 2.0), refusable=False)


def test_popleft_kept_in_a_list_of_handlers():
    # (a write through the bound C method: eager takes one item per call)
    queue = collections.deque([1.0, 2.0, 3.0, 4.0, 5.0])
    HANDLERS = [queue.popleft]

    class Take(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * HANDLERS[0]()

        @staticmethod
        def backward(ctx, g):
            return g

    def reset():
        queue.clear()
        queue.extend([1.0, 2.0, 3.0, 4.0, 5.0])
    matches_eager(Take, lambda i: (_x(i),), reset=reset, state=lambda: list(queue))


def test_setdefault_cache_through_a_bound_method():
    CACHE: dict[str, float] = {}
    REMEMBER = {"fn": CACHE.setdefault}

    class Cached(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * REMEMBER["fn"]("scale", 2.0)

        @staticmethod
        def backward(ctx, g):
            return g
    matches_eager(Cached, lambda i: (_x(i),), between=lambda i: CACHE.__setitem__("scale", 5.0) if i == 2 else None,
                  reset=CACHE.clear, state=lambda: dict(CACHE))


def test_a_method_of_a_users_object_kept_in_a_dict():
    class Knob:
        def __init__(self) -> None:
            self.value = 2.0

        def read(self) -> float:
            return self.value
    knob = Knob()
    READERS = {"knob": knob.read}

    class Scaled(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * READERS["knob"]()

        @staticmethod
        def backward(ctx, g):
            return g
    matches_eager(Scaled, lambda i: (_x(i),), between=lambda i: setattr(knob, "value", 2.0 + i),
                  reset=lambda: setattr(knob, "value", 2.0))


def test_module_functions_and_random_draws_are_not_keyed_by_an_owner():
    # math.sin's __self__ is the math module, random.random's the hidden generator: neither
    # is a value the capture computes with (the draw is modelled on its own).
    SIN, DRAW = math.sin, random.random

    class Both(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * SIN(0.5) + DRAW()

        @staticmethod
        def backward(ctx, g):
            return g
    matches_eager(Both, lambda i: (_x(i),))
