"""State an object keeps where its attributes do not show it: a C base class, or a builtin's.

Two kinds of user object were keyed and watched by what they do not hold. A user's class over
a library class written in C (``class Buf(io.BytesIO)``, a ctypes ``Structure`` or array, a
``queue.SimpleQueue``, an ``Exception``'s ``args``) keeps its state in that C part: it was
keyed by identity, so a changed buffer was read as the captured one, and a write forward made
to it was not seen. Now such an object is keyed and watched as a library object is
(``library_state.native_state``: what it hands ``pickle``; refused where pickle cannot show
it). And a user's subclass of a builtin value (``class Knob(int)``, ``class Pair(tuple)``,
``class Stack(list)``) carries attributes beside its value or items (``k.extra``): they were
left out of its key and of the heap watch (``library_state.subclass_attributes``). Each case
against eager in strict, apply and fallback mode.
"""

from __future__ import annotations

import array
import collections
import ctypes
import enum
import io
import queue

import pytest
import torch

import minihop
from eager_modes import matches_eager


def _x(i: int) -> torch.Tensor:
    return (torch.linspace(-1, 1, 4) + i).requires_grad_()


class _Buf(io.BytesIO):
    """A buffer of the user's (its bytes live in BytesIO's C part)."""


class _Text(io.StringIO):
    pass


class _Point(ctypes.Structure):
    _fields_ = [("k", ctypes.c_double)]


class _Counter(ctypes.Structure):
    _fields_ = [("n", ctypes.c_int)]


class _Queue(queue.SimpleQueue):
    """(pickle cannot show a SimpleQueue's items: unknown, so refused)"""


class _Config(Exception):
    pass


class _Knob(int):
    pass


class _Pair(tuple):
    pass


class _Tag(str):
    pass


class _Stack(list):
    pass


def test_a_bytes_buffer_of_the_users_class_passed_in():
    b = _Buf(b"\x02")

    class Scale(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, b):
            return x * b.getvalue()[0]

        @staticmethod
        def backward(ctx, g):
            return g, None

    def write(i):
        b.seek(0)
        b.write(bytes([2 + i]))
    matches_eager(Scale, lambda i: (_x(i), b), between=write, reset=lambda: write(0))


def test_a_text_buffer_of_the_users_class_read_as_a_global():
    t = _Text("2")

    class Scale(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * int(t.getvalue())

        @staticmethod
        def backward(ctx, g):
            return g

    def write(i):
        t.seek(0)
        t.write(str(2 + i % 7))
    matches_eager(Scale, lambda i: (_x(i),), between=write, reset=lambda: write(0))


def test_a_ctypes_structure_passed_in():
    p = _Point(2.0)

    class Scale(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, p):
            return x * p.k

        @staticmethod
        def backward(ctx, g):
            return g, None
    matches_eager(Scale, lambda i: (_x(i), p), between=lambda i: setattr(p, "k", 2.0 + i),
                  reset=lambda: setattr(p, "k", 2.0))


def test_a_ctypes_array_passed_in_and_in_a_list():
    c = (ctypes.c_float * 2)(2.0, 3.0)

    class Scale(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, c, held):
            return x * c[0] * held[0][1]

        @staticmethod
        def backward(ctx, g):
            return g, None, None
    matches_eager(Scale, lambda i: (_x(i), c, [c]),
                  between=lambda i: (c.__setitem__(0, 2.0 + i), c.__setitem__(1, 3.0 - i)),
                  reset=lambda: (c.__setitem__(0, 2.0), c.__setitem__(1, 3.0)))


def test_a_buffer_of_the_users_class_written_in_forward():
    b = _Buf()

    class Logged(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, b):
            b.write(b"f")
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g, None
    matches_eager(Logged, lambda i: (_x(i), b), reset=lambda: (b.seek(0), b.truncate()), state=lambda: b.getvalue())


def test_a_ctypes_counter_bumped_in_forward_and_read_in_backward():
    # (refused, then put back: fallback="eager" counts once per call, as eager does)
    c = _Counter(0)

    class Counted(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            c.n += 1
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g * c.n
    matches_eager(Counted, lambda i: (_x(i),), reset=lambda: setattr(c, "n", 0), state=lambda: c.n)


def test_a_simple_queue_of_the_users_class():
    q = _Queue()

    class Take(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, q):
            return x * q.get_nowait()

        @staticmethod
        def backward(ctx, g):
            return g, None

    def fill():
        while not q.empty():
            q.get_nowait()
        for v in (2.0, 3.0, 4.0, 5.0, 6.0):
            q.put(v)
    matches_eager(Take, lambda i: (_x(i), q), reset=fill, state=lambda: q.qsize())


def test_a_simple_queue_of_the_users_class_only_asked_if_empty():
    q = _Queue()

    class Branch(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * (1.0 if q.empty() else 2.0)

        @staticmethod
        def backward(ctx, g):
            return g

    def empty():
        while not q.empty():
            q.get_nowait()
    matches_eager(Branch, lambda i: (_x(i),), between=lambda i: q.put(1) if i == 2 else None, reset=empty)


def test_an_exceptions_args_replaced():
    e = _Config(2.0)

    class Scale(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, e):
            return x * e.args[0]

        @staticmethod
        def backward(ctx, g):
            return g, None
    matches_eager(Scale, lambda i: (_x(i), e), between=lambda i: setattr(e, "args", (2.0 + i,)),
                  reset=lambda: setattr(e, "args", (2.0,)))


def test_an_int_of_the_users_class_with_an_attribute():
    k = _Knob(2)
    k.extra = 1.0

    class Scale(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, k):
            return x * (k + k.extra)

        @staticmethod
        def backward(ctx, g):
            return g, None
    matches_eager(Scale, lambda i: (_x(i), k), between=lambda i: setattr(k, "extra", 1.0 + i),
                  reset=lambda: setattr(k, "extra", 1.0))


def test_a_tuple_and_a_list_of_the_users_class_with_an_attribute():
    p, s = _Pair((1.0, 2.0)), _Stack([1.0])
    p.w = s.w = 2.0

    class Scale(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, p, s):
            return x * p[0] * p.w * s[0] * s.w

        @staticmethod
        def backward(ctx, g):
            return g, None, None
    matches_eager(Scale, lambda i: (_x(i), p, s),
                  between=lambda i: (setattr(p, "w", 2.0 + i), setattr(s, "w", 2.0 + i % 2)),
                  reset=lambda: (setattr(p, "w", 2.0), setattr(s, "w", 2.0)))


def test_attributes_of_builtin_subclasses_written_in_forward_and_backward():
    k, p, t = _Knob(2), _Pair((1.0, 2.0)), _Tag("a")
    k.calls = p.seen = t.n = 0

    class Counted(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, k):
            k.calls += 1
            t.n += 1
            return x * k * (t.n % 3)

        @staticmethod
        def backward(ctx, g):
            p.seen += 1
            return g, None

    def reset():
        k.calls = p.seen = t.n = 0
    matches_eager(Counted, lambda i: (_x(i), k), reset=reset, state=lambda: (k.calls, p.seen, t.n))


def test_a_direct_capture_names_the_changed_buffer():
    b = _Buf(b"\x02")

    class Scale(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, b):
            return x * b.getvalue()[0]

        @staticmethod
        def backward(ctx, g):
            return g, None
    x = _x(0)
    cap = minihop.capture(Scale, x, b)
    torch.testing.assert_close(cap(x, b), x * 2)
    b.seek(0)
    b.write(b"\x03")
    with pytest.raises(minihop.GuardMismatchError, match=r"\(b\), its own state[^\n]*\n  captured: b'\\x02'\n  found:    b'\\x03'"):
        cap(x, b)


def test_a_direct_capture_names_the_changed_attribute_of_an_int():
    k = _Knob(2)
    k.extra = 1.0

    class Scale(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, k):
            return x * (k + k.extra)

        @staticmethod
        def backward(ctx, g):
            return g, None
    x = _x(0)
    cap = minihop.capture(Scale, x, k)
    k.extra = 2.0
    with pytest.raises(minihop.GuardMismatchError, match=r"\(k\), attributes, extra:\n  captured: 1.0\n  found:    2.0"):
        cap(x, k)


def test_an_int_of_the_users_class_kept_on_ctx_its_attribute_changed_before_backward():
    # (ctx.k.extra is a read of the argument's attribute, checked again when backward runs)
    k = _Knob(2)
    k.extra = 1.0

    class Kept(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, k):
            ctx.k = k
            return x * k

        @staticmethod
        def backward(ctx, g):
            return g * ctx.k.extra, None
    matches_eager(Kept, lambda i: (_x(i), k), mid=lambda i: setattr(k, "extra", 3.0 + i),
                  reset=lambda: setattr(k, "extra", 1.0))


class _Mode(enum.Enum):
    SUM = 1


class _Level(enum.IntEnum):
    LOW = 1


@pytest.mark.parametrize("member", [_Mode.SUM, _Level.LOW], ids=["Enum", "IntEnum"])
def test_an_enum_member_passed_in_with_a_setting_kept_on_it(member):
    # (Mode.A.scale = 2.0: an enum's member holds what the user sets on it, besides its value)
    member.scale = 2.0

    class Scale(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, m):
            return x * m.scale

        @staticmethod
        def backward(ctx, g):
            return g, None
    try:
        matches_eager(Scale, lambda i: (_x(i), member), between=lambda i: setattr(member, "scale", 2.0 + i),
                      reset=lambda: setattr(member, "scale", 2.0))
    finally:
        del member.scale


class _Ring(collections.deque):
    pass


class _Doubles(array.array):
    pass


class _Settings(collections.UserDict):
    pass


@pytest.mark.parametrize("make", [lambda: _Ring([2.0]), lambda: _Doubles("d", [2.0]), lambda: _Settings({0: 2.0})],
                         ids=["deque", "array", "UserDict"])
def test_a_container_of_the_users_class_passed_in_with_an_attribute(make):
    held = make()
    held.w = 2.0

    class Scale(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, held):
            return x * held[0] * held.w

        @staticmethod
        def backward(ctx, g):
            return g, None
    matches_eager(Scale, lambda i: (_x(i), held), between=lambda i: setattr(held, "w", 2.0 + i),
                  reset=lambda: setattr(held, "w", 2.0))


@pytest.mark.parametrize("make", [lambda: _Ring([2.0]), lambda: _Settings({0: 2.0})], ids=["deque", "UserDict"])
def test_a_container_of_the_users_class_its_attribute_and_items_written_in_forward(make):
    held = make()
    held.n = 0

    class Counted(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            held.n += 1
            held[0] = held[0] + 1.0
            return x * held[0]

        @staticmethod
        def backward(ctx, g):
            return g

    def reset():
        held.n = 0
        held[0] = 2.0
    matches_eager(Counted, lambda i: (_x(i),), reset=reset, state=lambda: (held.n, held[0]))
