"""Hostile spellings, round 12 (issue #28, round 17): objects that answer for themselves, tried
from outside against eager in strict, apply and fallback mode (``eager_modes.matches_eager``).

Differences from eager before this round, in every mode (``fallback="eager"`` included):

- a forwarding proxy (``wrapt.ObjectProxy``, Django's ``LazyObject``, a ``Mock(spec=...)``)
  reports the class of what it wraps through a ``__class__`` property. minihop asked its values
  ``isinstance(v, dict)`` and the like, which ask ``v.__class__`` when the type does not match:
  a proxy of a dict was taken for a dict and read with ``dict``'s own methods, an
  ``AttributeError`` raised inside minihop where eager raises nothing;
- an object with its own ``__getattribute__`` or ``__class__`` (one that counts what is read
  of it) met anywhere minihop looks (an argument, an item of one, an attribute of one, a global,
  a cell, ctx): every walk, key, snapshot and check asked it its class and its ``__dict__``,
  hundreds to thousands of extra calls of the user's code per call. minihop asks a value's
  real type only (``issubclass(type(v), C)``) and reads an instance dict past the user's
  hook (``library_state.own_dict``);
- such an object passed as an argument, or returned by forward: eager's ``Function.apply`` asks
  each argument and returned value its class on every call (running that code), a capture's run
  never does. Refused now (MH101, MH102: ``user_code.class_answering_refusal``); under
  ``fallback="eager"`` the call runs eagerly without minihop asking anything of it;
- a class whose metaclass has its own ``__getattribute__``, read by forward from a global:
  minihop read its ``__module__`` and ``__dict__`` through that hook while looking for its
  methods and state (``library_state.own_attr``, ``own_dict``);
- ``@minihop.captured`` kept a twin of the class for ``torch.compile`` made as a subclass of
  it, which ran a base class's ``__init_subclass__``: a registry of Functions listed the class
  twice. The twin is made from torch's ``Function`` with the class's namespace now;
- ``weakref.finalize(x, fn)`` in forward: the trace registered ``fn`` on its fake tensor, so
  it ran when the trace's tensor died, not when the caller's did (strict and apply). A call
  registering a callback run later (``weakref.finalize``, ``atexit.register``, any library
  function named ``register``/``register_*``/``add_*hook``) is a setter now: held back and
  refused (MH106, ``tracer.hidden``);
- a backward that reads a property (or any code of the user's minihop did not analyse) which
  counts into a ``collections.Counter``, ``defaultdict``, ``OrderedDict``, ``deque`` or a
  user's ``list``/``set`` subclass: backward is traced once while forward's call is captured
  and runs again at ``.backward()``; what the trace wrote is put back, but the watch kept
  only exact ``list``/``dict``/``set`` objects, so the count went up once more per capture.
  Subclasses are kept and put back through the builtin's own methods now
  (``call_watch._keep_value``).
"""

from __future__ import annotations

import atexit
import collections
import gc
import unittest.mock
import weakref

import pytest
import torch

import minihop

from eager_modes import matches_eager

READS: collections.Counter = collections.Counter()


def x_(i):
    return (torch.linspace(-1, 1, 4) + i).requires_grad_()


def reset():
    READS.clear()


def state():
    return dict(READS)


class Proxy:
    """Forwards everything to what it wraps and reports its class (wrapt / LazyObject style)."""

    def __init__(self, wrapped):
        object.__setattr__(self, "_wrapped", wrapped)

    @property
    def __class__(self):
        return type(object.__getattribute__(self, "_wrapped"))

    def __getattr__(self, name):
        return getattr(object.__getattribute__(self, "_wrapped"), name)

    def __getitem__(self, key):
        return object.__getattribute__(self, "_wrapped")[key]

    def __iter__(self):
        return iter(object.__getattribute__(self, "_wrapped"))

    def __len__(self):
        return len(object.__getattribute__(self, "_wrapped"))

    def __mul__(self, other):
        return object.__getattribute__(self, "_wrapped") * other

    __rmul__ = __mul__


class Counted:
    """Counts every attribute read of it (a debugging wrapper, an access tracker)."""

    def __init__(self, k):
        object.__setattr__(self, "k", k)

    def __getattribute__(self, name):
        READS["getattribute:" + name] += 1
        return object.__getattribute__(self, name)


class ClassCounted:
    """Counts every question of its class."""

    def __init__(self, k):
        self.k = k

    @property
    def __class__(self):
        READS["class"] += 1
        return ClassCounted


class Cfg:
    def __init__(self, k):
        self.k = k


class ItemTimes(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, d):
        return x * d["k"]

    @staticmethod
    def backward(ctx, g):
        return g * 2.0, None


class IndexTimes(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, items):
        return x * items[0] + items[1]

    @staticmethod
    def backward(ctx, g):
        return g * 2.0, None


class AttrTimes(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, cfg):
        return x * cfg.k

    @staticmethod
    def backward(ctx, g):
        return g * 2.0, None


class FirstAttrTimes(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, cfgs):
        return x * cfgs[0].k

    @staticmethod
    def backward(ctx, g):
        return g * 2.0, None


class HeldAttrTimes(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, holder):
        return x * holder.cfg.k

    @staticmethod
    def backward(ctx, g):
        return g * holder_scale(g), None


def holder_scale(g):
    return 2.0


class KeptOnCtx(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, cfg):
        ctx.cfg = cfg
        return x * cfg.k

    @staticmethod
    def backward(ctx, g):
        return g * ctx.cfg.k, None


class KeptInListOnCtx(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, cfgs):
        ctx.cfgs = list(cfgs)
        return x * 2.0

    @staticmethod
    def backward(ctx, g):
        return g * ctx.cfgs[0].k, None


class ScaleBy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, s):
        return x * s

    @staticmethod
    def backward(ctx, g):
        return g * 2.0, None


class Unused(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, anything):
        return x * 2.0

    @staticmethod
    def backward(ctx, g):
        return g * 2.0, None


class Holder:
    def __init__(self, cfg):
        self.cfg = cfg


ARGUMENTS = {
    "proxy of a dict": (ItemTimes, lambda i: (Proxy({"k": float(i + 1)}),)),
    "proxy of a dict of tensors": (ItemTimes, lambda i: (Proxy({"k": torch.full((4,), i + 1.0)}),)),
    "proxy of a list": (IndexTimes, lambda i: (Proxy([float(i + 1), 1.0]),)),
    "proxy of an object": (AttrTimes, lambda i: (Proxy(Cfg(float(i + 1))),)),
    "proxy of a float": (ScaleBy, lambda i: (Proxy(float(i + 1)),)),
    "proxy in a list": (FirstAttrTimes, lambda i: ([Proxy(Cfg(float(i + 1)))],)),
    "proxy held by an object": (HeldAttrTimes, lambda i: (Holder(Proxy(Cfg(float(i + 1)))),)),
    "proxy kept on ctx": (KeptOnCtx, lambda i: (Proxy(Cfg(float(i + 1))),)),
    "mock with a spec": (AttrTimes, lambda i: (unittest.mock.NonCallableMock(spec=Cfg, k=float(i + 1)),)),
    "counted object": (AttrTimes, lambda i: (Counted(float(i + 1)),)),
    "counted object, unused": (Unused, lambda i: (Counted(float(i + 1)),)),
    "counted object in a list": (FirstAttrTimes, lambda i: ([Counted(float(i + 1))],)),
    "counted object in a tuple": (FirstAttrTimes, lambda i: ((Counted(float(i + 1)), 1),)),
    "counted object held by an object": (HeldAttrTimes, lambda i: (Holder(Counted(float(i + 1))),)),
    "counted object kept on ctx": (KeptOnCtx, lambda i: (Counted(float(i + 1)),)),
    "counted object in a list on ctx": (KeptInListOnCtx, lambda i: ([Counted(float(i + 1))],)),
    "class-counted object": (AttrTimes, lambda i: (ClassCounted(float(i + 1)),)),
    "class-counted object, unused": (Unused, lambda i: (ClassCounted(float(i + 1)),)),
    "class-counted object in a list": (FirstAttrTimes, lambda i: ([ClassCounted(float(i + 1))],)),
    "class-counted object held by an object": (HeldAttrTimes, lambda i: (Holder(ClassCounted(float(i + 1))),)),
    "class-counted object kept on ctx": (KeptOnCtx, lambda i: (ClassCounted(float(i + 1)),)),
    "class-counted object in a list on ctx": (KeptInListOnCtx, lambda i: ([ClassCounted(float(i + 1))],)),
    "the same counted object each call": (AttrTimes, (lambda o: lambda i: (o,))(Counted(2.0))),
}


@pytest.mark.parametrize("name", ARGUMENTS)
def test_object_answering_for_itself_as_or_in_an_argument(name):
    fn, make = ARGUMENTS[name]
    matches_eager(fn, lambda i: (x_(i), *make(i)), state=state, reset=reset)


def test_proxy_argument_is_refused_with_its_class_named():
    with pytest.raises(minihop.UnsupportedArgumentError, match=r"Proxy.__class__") as e:
        minihop.apply(ItemTimes, x_(0), Proxy({"k": 2.0}))
    assert e.value.code == "MH101"
    with pytest.raises(minihop.UnsupportedArgumentError, match=r"Counted.__getattribute__"):
        minihop.apply(AttrTimes, x_(0), Counted(2.0))


def test_counted_argument_under_fallback_is_not_asked_anything_by_minihop():
    """Exactly eager's reads: ``Function.apply``'s question of its class and forward's ``.k``."""
    reset()
    AttrTimes.apply(x_(0), Counted(2.0)).sum().backward()
    eager = state()
    reset()
    f = minihop.function(AttrTimes, fallback="eager")
    with pytest.warns(minihop.MinihopWarning):
        f(x_(0), Counted(2.0)).sum().backward()
    assert state() == eager and eager["getattribute:k"] == 1


def test_plain_object_first_then_a_class_counted_one_in_the_same_position():
    """A capture made for a plain object never serves an object that answers for itself."""
    def make(i):
        return (x_(i), Cfg(1.0) if i < 2 else ClassCounted(1.0))
    matches_eager(AttrTimes, make, state=state, reset=reset)
    matches_eager(Unused, make, state=state, reset=reset)


class ReturnsIt(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, o):
        return x * 2.0, o

    @staticmethod
    def backward(ctx, g, unused):
        return g * 2.0, None


class ReturnsNew(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2.0, Proxy(Cfg(1.0))

    @staticmethod
    def backward(ctx, g, unused):
        return g * 2.0


def test_returned_object_answering_for_itself():
    objects = [ClassCounted(1.0) for _ in range(4)]  # (the same ones in every mode: compared by identity)
    matches_eager(ReturnsIt, lambda i: (x_(i), objects[i]), state=state, reset=reset)
    with pytest.raises(minihop.UnsupportedOutputError, match=r"Proxy.__class__") as e:
        minihop.apply(ReturnsNew, x_(0))
    assert e.value.code == "MH102"
    # (a new proxy each call: compared here by what it wraps, not by ``matches_eager``'s identity)
    x, y = x_(0), x_(0)
    eager = ReturnsNew.apply(x)
    with pytest.warns(minihop.MinihopWarning):
        mine = minihop.function(ReturnsNew, fallback="eager")(y)
    assert type(mine[1]) is Proxy and object.__getattribute__(mine[1], "_wrapped").k == 1.0
    torch.testing.assert_close(mine[0], eager[0], rtol=0, atol=0)
    eager[0].sum().backward()
    mine[0].sum().backward()
    torch.testing.assert_close(y.grad, x.grad, rtol=0, atol=0)


GLOBAL_PROXY = Proxy({"k": 2.0})
GLOBAL_COUNTED = Counted(2.0)
GLOBAL_CLASS_COUNTED = ClassCounted(2.0)
GLOBALS = {}


class GlobalProxyItem(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * GLOBAL_PROXY["k"]

    @staticmethod
    def backward(ctx, g):
        return g * 2.0


class GlobalCounted(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * GLOBAL_COUNTED.k

    @staticmethod
    def backward(ctx, g):
        return g * GLOBAL_COUNTED.k


class GlobalClassCounted(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * GLOBAL_CLASS_COUNTED.k

    @staticmethod
    def backward(ctx, g):
        return g * GLOBAL_CLASS_COUNTED.k


class GlobalDictCounted(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * GLOBALS["cfg"].k

    @staticmethod
    def backward(ctx, g):
        return g * GLOBALS["cfg"].k


def test_global_proxy_changed_between_calls():
    def between(i):
        object.__getattribute__(GLOBAL_PROXY, "_wrapped")["k"] = 2.0 + i
    matches_eager(GlobalProxyItem, lambda i: (x_(i),), between=between, state=state, reset=reset)


def test_global_counted_object_changed_between_calls_and_before_backward():
    matches_eager(GlobalCounted, lambda i: (x_(i),),
                  between=lambda i: object.__setattr__(GLOBAL_COUNTED, "k", 2.0 + i),
                  mid=lambda i: object.__setattr__(GLOBAL_COUNTED, "k", 7.0 + i), state=state, reset=reset)


def test_global_class_counted_object_changed_between_calls_and_before_backward():
    matches_eager(GlobalClassCounted, lambda i: (x_(i),),
                  between=lambda i: setattr(GLOBAL_CLASS_COUNTED, "k", 2.0 + i),
                  mid=lambda i: setattr(GLOBAL_CLASS_COUNTED, "k", 7.0 + i), state=state, reset=reset)


@pytest.mark.parametrize("kind", [Counted, ClassCounted, Cfg])
def test_object_in_a_global_dict_rebound_each_call(kind):
    matches_eager(GlobalDictCounted, lambda i: (x_(i),),
                  between=lambda i: GLOBALS.__setitem__("cfg", kind(float(i + 1))), state=state, reset=reset)


def test_closure_over_a_counted_object():
    held = Counted(3.0)

    class Closes(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * held.k

        @staticmethod
        def backward(ctx, g):
            return g * held.k

    matches_eager(Closes, lambda i: (x_(i),), between=lambda i: object.__setattr__(held, "k", 3.0 + i),
                  state=state, reset=reset)


class CountingMeta(type):
    """A metaclass that counts every attribute read of its classes."""

    def __getattribute__(cls, name):
        READS["meta:" + name] += 1
        return type.__getattribute__(cls, name)


class MetaSettings(metaclass=CountingMeta):
    scale = 2.0


class GlobalMetaSettings(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * MetaSettings.scale

    @staticmethod
    def backward(ctx, g):
        return g * MetaSettings.scale


class SettingsArgument(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, settings):
        return x * settings.scale

    @staticmethod
    def backward(ctx, g):
        return g * 2.0, None


def _meta_scale(i):
    type.__setattr__(MetaSettings, "scale", 2.0 + i)


def test_class_of_a_counting_metaclass_read_from_a_global():
    """minihop read such a class's ``__module__`` and ``__dict__`` through the metaclass's
    hook while looking for its methods and state (``library_state.own_attr``/``own_dict``)."""
    matches_eager(GlobalMetaSettings, lambda i: (x_(i),), between=_meta_scale,
                  mid=lambda i: _meta_scale(i + 5), state=state, reset=reset)


def test_class_of_a_counting_metaclass_passed_in():
    matches_eager(SettingsArgument, lambda i: (x_(i), MetaSettings), between=_meta_scale, state=state, reset=reset)


# A backward that reads a property counting into a library or user container subclass.

class ListCount(list):
    pass


class SetSeen(set):
    pass


SINKS = {
    "Counter": lambda: collections.Counter(),
    "defaultdict": lambda: collections.defaultdict(int),
    "OrderedDict": lambda: collections.OrderedDict(reads=0),
    "deque": lambda: collections.deque(),
    "list subclass": lambda: ListCount(),
    "set subclass": lambda: SetSeen(),
}
SINK = {"now": None}


def _count(sink):
    if isinstance(sink, collections.deque) or isinstance(sink, list):
        sink.append(1)
    elif isinstance(sink, set):
        sink.add(len(sink))
    else:
        sink["reads"] += 1


class Scale:
    def __init__(self, k):
        self._k = k

    @property
    def k(self):
        _count(SINK["now"])
        return self._k


SCALE = Scale(2.0)


class BackwardReadsProperty(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2.0

    @staticmethod
    def backward(ctx, g):
        return g * SCALE.k


class BothReadProperty(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * SCALE.k

    @staticmethod
    def backward(ctx, g):
        return g * SCALE.k


def _sink_state():
    sink = SINK["now"]
    return (type(sink).__name__, sorted(sink.items()) if isinstance(sink, dict) else sorted(sink))


@pytest.mark.parametrize("sink", SINKS)
@pytest.mark.parametrize("fn", [BackwardReadsProperty, BothReadProperty])
def test_backward_property_counts_into_a_container_subclass(fn, sink):
    def reset_sink():
        SINK["now"] = SINKS[sink]()
        SCALE._k = 2.0
    matches_eager(fn, lambda i: (x_(i),), between=lambda i: setattr(SCALE, "_k", 2.0 + i),
                  state=_sink_state, reset=reset_sink)


# A registry of Functions kept by a base class's ``__init_subclass__`` (plugin style).

REGISTRY: list[str] = []


class Registered(torch.autograd.Function):
    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        REGISTRY.append(cls.__qualname__)


def test_captured_decorator_makes_no_class_a_base_registers():
    """``@minihop.captured`` keeps a twin of the class for ``torch.compile``; made as a subclass,
    it ran the base's ``__init_subclass__`` and the registry listed the class twice."""
    before = len(REGISTRY)

    @minihop.captured
    class Doubled(Registered):
        @staticmethod
        def forward(ctx, x):
            return x * 2.0

        @staticmethod
        def backward(ctx, g):
            return g * 2.0

    assert REGISTRY[before:] == [Doubled.__qualname__]
    x, y = x_(0), x_(0)
    torch.testing.assert_close(Doubled.apply(x), x * 2.0)
    compiled = torch.compile(lambda t: Doubled.apply(t), backend="eager", fullgraph=True)
    out = compiled(y)
    torch.testing.assert_close(out, y * 2.0)
    out.sum().backward()
    torch.testing.assert_close(y.grad, torch.full_like(y, 2.0))
    assert REGISTRY[before:] == [Doubled.__qualname__]


# Callbacks registered for later: when an object dies, at exit.

DIED: list[str] = []


class FinalizesArgument(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        weakref.finalize(x, DIED.append, "x")
        return x * 2.0

    @staticmethod
    def backward(ctx, g):
        return g * 2.0


class FinalizesLocal(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        y = x * 2.0
        weakref.finalize(y, DIED.append, "y")
        return y + 1.0

    @staticmethod
    def backward(ctx, g):
        return g * 2.0


def _died():
    gc.collect()
    return list(DIED)


@pytest.mark.parametrize("fn", [FinalizesArgument, FinalizesLocal])
def test_weakref_finalize_in_forward(fn):
    """The trace registered the callback on its fake tensor: it ran when the trace's tensor
    died (or never), not when the caller's did. Refused now, as a setter (MH106)."""
    matches_eager(fn, lambda i: (x_(i),), state=_died, reset=lambda: (gc.collect(), DIED.clear()))


class RegistersAtExit(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        atexit.register(DIED.append, "exit")
        return x * 2.0

    @staticmethod
    def backward(ctx, g):
        return g * 2.0


def test_atexit_register_in_forward():
    base = [0]

    def reset_base():
        base[0] = atexit._ncallbacks()

    try:
        matches_eager(RegistersAtExit, lambda i: (x_(i),), state=lambda: atexit._ncallbacks() - base[0],
                      reset=reset_base)
        with pytest.raises(minihop.SideEffectError, match="atexit.register"):
            minihop.apply(RegistersAtExit, x_(0))
    finally:
        atexit.unregister(DIED.append)


SEEN_ORDER = collections.OrderedDict(first=0)


class Tracked:
    @property
    def k(self):
        SEEN_ORDER[f"read{len(SEEN_ORDER)}"] = len(SEEN_ORDER)
        SEEN_ORDER.move_to_end("first")
        return 2.0


TRACKED = Tracked()


class BackwardTracksInOrderedDict(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2.0

    @staticmethod
    def backward(ctx, g):
        return g * TRACKED.k


def test_backward_property_adds_keys_to_an_ordered_dict():
    """The trace's new keys are taken out through ``OrderedDict``'s own methods: put back with
    ``dict``'s, the dict lost them but its order list kept them (iterating it then skipped keys
    or raised)."""
    def reset_order():
        SEEN_ORDER.clear()
        SEEN_ORDER["first"] = 0

    matches_eager(BackwardTracksInOrderedDict, lambda i: (x_(i),),
                  state=lambda: (list(SEEN_ORDER.items()), len(SEEN_ORDER)), reset=reset_order)
