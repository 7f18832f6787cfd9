"""Hostile spellings, round 11 (issue #28, round 16): the issue's classes written in ways the
suite had not seen, tried from outside against eager in strict, apply and fallback mode
(``eager_modes.matches_eager``).

Silent differences from eager before this round (values equal, the user's own counters off):

- a module with a module-level ``__getattr__`` (PEP 562: a lazy settings module), read as
  ``settings.SCALE`` from a global or an argument: minihop's analysis and every check read
  the name, so the user's ``__getattr__`` ran two to three extra times a call, in every mode.
  A module's ``__getattr__`` is now user code serving the name, like a property
  (``library_state.served_by_user_code``): never run outside the user's own read;
- an item read from a ``dict`` or ``list`` subclass with its own ``__getitem__`` or
  ``__missing__``, or a dict lookup whose key's class defines ``__hash__``/``__eq__``, or a
  ``defaultdict``'s missing key (whose factory also inserts it): the analysis and the checks
  indexed the container themselves. Such a step is now code minihop does not run
  (``library_state.item_served_by_code``, in the analysis's ``roots.walk`` and in
  ``place.walk_plain``), and the capture is single-use;
- the heap watch copied a ``list``/``dict``/``set`` subclass with ``list(v)``/``dict(v)`` (the
  user's ``__len__``, ``__iter__``, ``keys``) and put it back with its ``clear``/``extend``; it
  copies through the builtin's own iterator and methods now, and keeps a dict whose keys hash
  with the user's code as pairs compared by identity (``holders.contents_of``, kind ``pairs``;
  any change to one is refused).

- an argument of a builtin's subclass with methods of its own (``class Mode(str)`` with
  ``__eq__``, a ``float`` subclass, a ``tuple`` subclass with ``__iter__``): a call's key
  compared it with its ``__eq__``, and the walks over a call's arguments (its leaves, the
  tensors it shares, the iterators in it, the heap watch) iterated it with its ``__iter__``,
  up to twelve extra runs a call. Keys hold the builtin's value now
  (``user_code.plain_atom``) and every walk iterates as the builtin does
  (``user_code.plain_items``/``plain_pairs``);
- a ``tuple`` or ``list`` subclass holding tensors (``class Pair(tuple)``): the trace was
  handed a plain tuple or list of fakes, so ``isinstance(p, Pair)`` answered False while
  traced and True in eager, a silently different graph in every mode. The trace's copy keeps
  the class and its attributes now (``structure._same_class``, made by the builtin: the
  class's own ``__new__``/``__init__`` are not run);
- a ``dict`` subclass holding tensors: the trace's copy was made by ``copy.copy``, which ran
  the class's own ``__setitem__`` for each entry; it is made by the library base now, keeping
  the class, its attributes and a ``defaultdict``'s factory;
- a module argument's parameter or buffer registered or replaced by forward
  (``m.register_buffer(...)``, ``m.double()``): the capture set it again with ``setattr``, so
  the buffer became a plain attribute (silently), and ``m.double()``'s new parameter, which
  eager never makes (it swaps the data in place), failed on every call. Refused now (MH106,
  ``tracer.outside._refuse_registration``);
- ``Tensor.apply_``/``map_`` (a Python callable run on each value of a CPU tensor) or
  ``__dlpack__`` inside forward: called on a fake tensor's missing data, they crashed the
  process (a segmentation fault, no error at all). Refused now as the value reads they are
  (MH103, ``tracer.special_calls.VALUE_READS``);
- a dict keyed by objects whose ``__hash__`` is the user's, read by forward, in a Function
  refused later in its trace (its backward calls ``apply_``): putting back what the failed
  trace might have changed rebuilt the dict, hashing every key once more, so
  ``fallback="eager"`` counted one call too many (``call_watch._refill`` leaves an unchanged
  dict alone now; ``opaque._plain`` looks at a dict's keys too). Found by the effects
  generator's new ``user_dunder_read`` kind;
- ``warnings.warn(..., stacklevel=3)`` in forward (a library's idiom for "the caller of
  ``apply``"), under ``fallback="eager"``: eager names the user's call line; the fallback's
  run named minihop's own ``cache.py``, and the ``default`` filter's memory was minihop's
  module's. An eager run is now called from stand-ins of the caller's frames
  (``runtime.located.as_called``);
- a ``list`` or ``dict`` subclass (an ``OrderedDict``, a ``defaultdict``, the user's) or a
  nested ``tuple`` subclass that forward returns: eager hands back the object forward made;
  the capture rebuilt a plain ``list``/``dict``/``tuple`` (an ``OrderedDict`` came back a
  ``dict``, a ``defaultdict`` lost its factory). The output's spec keeps an empty one of the
  class as its template now (``structure._rebuilt``; an artifact refuses to save it, as it
  refuses objects);
- an argument object whose class answers missing attributes from its own dict
  (``def __getattr__(self, name): return self._d[name]``, a common config class): the trace's
  copy of it (to hold fake tensors) was made by ``copy.copy``, which asked the new, empty
  object for ``__setstate__``, and its ``__getattr__`` recursed forever (a ``RecursionError``
  inside minihop); and a check of whether an object kept on ctx is a library's setter asked it
  for ``__name__`` (one extra call of the user's ``__getattr__``, a ``KeyError`` where it
  raises one). The copy is made by ``object.__new__`` and the object's ``__dict__``
  (``structure._shallow``); the setter check asks nothing the user's code answers;
- an object of the user's class that forward makes and returns beside its tensor (an
  ``Info``): eager makes a new one each call with the user's ``__init__``; the capture handed
  back a ``copy.deepcopy`` of the traced one, running the class's ``__deepcopy__`` (or
  ``__reduce_ex__``, ``__getattr__``) each call, and a tuple or list subclass among the
  constants came back a plain one. Copied without the user's code now, classes kept
  (``returned._deep``, ``returned.fresh``; what forward returned moved out of ``structure``
  into ``returned``, which was over 450 lines). A list that holds itself, returned beside the
  tensor, made minihop recurse without end (a ``RecursionError`` inside minihop): it is a
  constant now, copied per call with its cycle; one holding tensors is refused (MH102);
- ``torch.load`` (or ``torch.save``, ``torch.from_file``) inside forward or backward: torch is
  library code minihop lets a capture run, but these answer from files. While traced the
  loaded tensor was fake and became a meta-device constant of the graph, so every call
  raised a device error eager never raises, ``fallback="eager"`` included. Refused now
  (MH104-torch-io, ``tracer.library.TORCH_IO``); a file read with ``open`` or ``pathlib``
  was already single-use.

The rest are spellings that matched already and stay as cases: a ``ContextVar``, the default
dtype, a ``singledispatch`` registration, an ABC's ``register``, a global module hook, a dict's
or a set's iteration order, a data-dependent ``LinAlgError`` caught.
"""

from __future__ import annotations

import abc
import collections
import contextvars
import functools
import os
import sys
import tempfile
import logging
import uuid
import warnings

import pytest
import torch
import torch.nn as nn

import minihop

import lazy_settings_module as settings
from eager_modes import matches_eager


def x_(i):
    return (torch.linspace(-1, 1, 4) + i).requires_grad_()


def _settings_reset():
    settings.BASE[0] = 2.0
    settings.READS[0] = 0


def _settings_between(i):
    settings.BASE[0] = 2.0 + i


def test_module_getattr_read_from_a_global():
    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x): return x * settings.SCALE
        @staticmethod
        def backward(ctx, g): return g * 2
    matches_eager(F, lambda i: (x_(i),), between=_settings_between, reset=_settings_reset,
                  state=lambda: settings.READS[0])


def test_module_getattr_read_from_an_argument():
    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, m): return x * m.SCALE
        @staticmethod
        def backward(ctx, g): return g * 2, None
    matches_eager(F, lambda i: (x_(i), settings), between=_settings_between, reset=_settings_reset,
                  state=lambda: settings.READS[0])


def test_module_getattr_read_in_backward():
    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x): return x * 2
        @staticmethod
        def backward(ctx, g): return g * settings.SCALE
    matches_eager(F, lambda i: (x_(i),), between=_settings_between, mid=lambda i: _settings_between(i + 5),
                  reset=_settings_reset, state=lambda: settings.READS[0])


CALLS = [0]


def _calls():
    return CALLS[0]


class CountingDict(dict):
    def __getitem__(self, k):
        CALLS[0] += 1
        return dict.__getitem__(self, k)


class WithMissing(dict):
    def __missing__(self, k):
        CALLS[0] += 1
        return 3.0


class CountingList(list):
    def __getitem__(self, k):
        CALLS[0] += 1
        return list.__getitem__(self, k)


class CountingLen(list):
    def __len__(self):
        CALLS[0] += 1
        return list.__len__(self)


class Key:
    def __init__(self, n): self.n = n
    def __hash__(self):
        CALLS[0] += 1
        return hash(self.n)
    def __eq__(self, other): return isinstance(other, Key) and other.n == self.n


def test_dict_subclass_getitem_argument():
    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, c): return x * c["k"]
        @staticmethod
        def backward(ctx, g): return g * 2, None
    box = [CountingDict(k=2.0)]
    def reset(): CALLS[0] = 0; box[0] = CountingDict(k=2.0)
    matches_eager(F, lambda i: (x_(i), box[0]), between=lambda i: dict.__setitem__(box[0], "k", 2.0 + i),
                  reset=reset, state=_calls)


def test_dict_subclass_getitem_global():
    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x): return x * TABLE["k"]
        @staticmethod
        def backward(ctx, g): return g * TABLE["k"]
    def reset(): CALLS[0] = 0; globals()["TABLE"] = CountingDict(k=2.0)
    matches_eager(F, lambda i: (x_(i),), between=lambda i: dict.__setitem__(TABLE, "k", 2.0 + i),
                  reset=reset, state=_calls)


def test_dict_subclass_missing():
    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, c): return x * c["k"]
        @staticmethod
        def backward(ctx, g): return g * 2, None
    box = [WithMissing()]
    def between(i):
        if i % 2:
            box[0]["k"] = 5.0
        else:
            box[0].pop("k", None)
    def reset(): CALLS[0] = 0; box[0] = WithMissing()
    matches_eager(F, lambda i: (x_(i), box[0]), between=between, reset=reset, state=_calls)


def test_defaultdict_missing_key_is_inserted_each_call():
    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, c): return x * (c["k"] + 1)
        @staticmethod
        def backward(ctx, g): return g * 2, None
    box = [collections.defaultdict(float)]
    def between(i):
        if i % 2:
            box[0].pop("k", None)
        else:
            box[0]["k"] = 2.0 + i
    matches_eager(F, lambda i: (x_(i), box[0]), between=between,
                  reset=lambda: box.__setitem__(0, collections.defaultdict(float)), state=lambda: dict(box[0]))


def test_list_subclass_getitem():
    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, c): return x * c[0]
        @staticmethod
        def backward(ctx, g): return g * 2, None
    box = [CountingList([2.0])]
    def reset(): CALLS[0] = 0; box[0] = CountingList([2.0])
    matches_eager(F, lambda i: (x_(i), box[0]), between=lambda i: list.__setitem__(box[0], 0, 2.0 + i),
                  reset=reset, state=_calls)


def test_list_subclass_len():
    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, c): return x * len(c)
        @staticmethod
        def backward(ctx, g): return g * 2, None
    box = [CountingLen([2.0])]
    def reset(): CALLS[0] = 0; box[0] = CountingLen([2.0])
    matches_eager(F, lambda i: (x_(i), box[0]), between=lambda i: list.append(box[0], 1.0),
                  reset=reset, state=_calls)


def test_list_subclass_len_appended_by_forward():
    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, c):
            c.append(1.0)
            return x * 2
        @staticmethod
        def backward(ctx, g): return g * 2, None
    box = [CountingLen([2.0])]
    def reset(): CALLS[0] = 0; box[0] = CountingLen([2.0])
    matches_eager(F, lambda i: (x_(i), box[0]), reset=reset, state=lambda: (CALLS[0], list.copy(box[0])))


class Recent(collections.OrderedDict):
    def __iter__(self):
        CALLS[0] += 1
        return collections.OrderedDict.__iter__(self)


def test_ordered_dict_subclass_reordered_by_forward():
    # (watched through OrderedDict's own methods, which keep its order; dict's do not)
    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            RECENT.move_to_end(next(iter(RECENT)))
            return x * RECENT[next(iter(RECENT))]
        @staticmethod
        def backward(ctx, g): return g * 2
    def reset(): CALLS[0] = 0; globals()["RECENT"] = Recent(a=1.0, b=2.0, c=3.0)
    matches_eager(F, lambda i: (x_(i),), reset=reset, state=lambda: (CALLS[0], list(RECENT.items())))


def test_lookup_by_a_key_with_its_own_hash():
    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, k): return x * WEIGHTS[k]
        @staticmethod
        def backward(ctx, g): return g * 2, None
    key = Key(1)
    def reset(): CALLS[0] = 0; globals()["WEIGHTS"] = {Key(1): 2.0}
    matches_eager(F, lambda i: (x_(i), key), between=lambda i: WEIGHTS.__setitem__(Key(1), 2.0 + i),
                  reset=reset, state=_calls)


def test_forward_writes_a_dict_keyed_by_hashable_objects():
    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, k):
            SEEN[k] = SEEN.get(k, 0) + 1
            return x * 2
        @staticmethod
        def backward(ctx, g): return g * 2, None
    key = Key(1)
    def reset(): CALLS[0] = 0; globals()["SEEN"] = {}
    matches_eager(F, lambda i: (x_(i), key), reset=reset, state=lambda: (CALLS[0], list(SEEN.values())))


# --- Spellings that matched already -------------------------------------------------------

SCALE_VAR = contextvars.ContextVar("scale", default=2.0)


def test_context_variable_read_in_forward_and_backward():
    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x): return x * SCALE_VAR.get()
        @staticmethod
        def backward(ctx, g): return g * SCALE_VAR.get()
    matches_eager(F, lambda i: (x_(i),), between=lambda i: SCALE_VAR.set(2.0 + i),
                  mid=lambda i: SCALE_VAR.set(7.0 + i), reset=lambda: SCALE_VAR.set(2.0))


def test_default_dtype_changed_between_calls():
    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x): return x * torch.tensor(1.0).dtype.itemsize
        @staticmethod
        def backward(ctx, g): return g * 2
    try:
        matches_eager(F, lambda i: (x_(i),),
                      between=lambda i: torch.set_default_dtype(torch.float64 if i % 2 else torch.float32),
                      reset=lambda: torch.set_default_dtype(torch.float32))
    finally:
        torch.set_default_dtype(torch.float32)


class Cfg:
    pass


def test_singledispatch_registration_between_calls():
    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, c): return x * scale_of(c)
        @staticmethod
        def backward(ctx, g): return g * 2, None
    def reset(): globals()["scale_of"] = functools.singledispatch(lambda o: 2.0)
    def between(i):
        if i == 2:
            scale_of.register(Cfg, lambda o: 5.0)
    matches_eager(F, lambda i: (x_(i), Cfg()), between=between, reset=reset)


def test_abc_register_between_calls():
    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, o): return x * (3 if isinstance(o, Registered) else 2)
        @staticmethod
        def backward(ctx, g): return g * 2, None
    def reset():
        class Registered(abc.ABC):
            pass
        globals()["Registered"] = Registered
    def between(i):
        if i == 2:
            Registered.register(Cfg)
    matches_eager(F, lambda i: (x_(i), Cfg()), between=between, reset=reset)


def test_global_module_forward_hook_registered_between_calls():
    torch.manual_seed(0)
    lin = nn.Linear(4, 4)
    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x): return lin(x)
        @staticmethod
        def backward(ctx, g): return g * 2
    handles = []
    def between(i):
        if i == 2:
            handles.append(nn.modules.module.register_module_forward_hook(lambda m, a, out: out * 10))
    def reset():
        for h in handles:
            h.remove()
        handles.clear()
    try:
        matches_eager(F, lambda i: (x_(i),), between=between, reset=reset)
    finally:
        reset()


def test_dict_iteration_order_changes_between_calls():
    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x): return torch.cat([x * v for v in ORDER.values()])
        @staticmethod
        def backward(ctx, g): return g[:4] + g[4:]
    def between(i):
        ORDER["a"] = ORDER.pop("a")
    matches_eager(F, lambda i: (x_(i),), between=between,
                  reset=lambda: globals().__setitem__("ORDER", {"a": 1.0, "b": 2.0}))


def test_set_iteration_order_of_colliding_items():
    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, s): return torch.cat([x * v for v in s])
        @staticmethod
        def backward(ctx, g): return g[:4] + g[4:], None
    def make(i):
        s = set()
        for v in ((1, 9) if i % 2 else (9, 1)):  # (1 and 9 share a slot: insertion order shows)
            s.add(v)
        return (x_(i), s)
    matches_eager(F, make)


def test_linalg_error_caught_on_some_inputs():
    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a):
            try:
                return torch.linalg.cholesky(a)
            except torch.linalg.LinAlgError:
                return torch.zeros_like(a)
        @staticmethod
        def backward(ctx, g): return g
    matches_eager(F, lambda i: ((torch.eye(3) * (1.0 if i % 2 == 0 else -1.0)).requires_grad_(),))


# --- Files: torch's readers and writers, and Python's -------------------------------------

def _weights_file():
    path = os.path.join(tempfile.mkdtemp(), "w.pt")
    torch.save(torch.full((4,), 2.0), path)
    return path


def test_torch_load_in_forward():
    path = _weights_file()
    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x): return x * torch.load(path)
        @staticmethod
        def backward(ctx, g): return g * 2
    matches_eager(F, lambda i: (x_(i),), between=lambda i: torch.save(torch.full((4,), 2.0 + i), path))


def _load_scale(path):
    return torch.load(path, weights_only=True)


def test_torch_load_in_a_helper_in_backward():
    path = _weights_file()
    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x): return x * 2
        @staticmethod
        def backward(ctx, g): return g * _load_scale(path)
    matches_eager(F, lambda i: (x_(i),), between=lambda i: torch.save(torch.full((4,), 2.0 + i), path))


def test_torch_save_in_forward():
    path = os.path.join(tempfile.mkdtemp(), "out.pt")
    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            torch.save(x.detach() * 2, path)
            return x * 2
        @staticmethod
        def backward(ctx, g): return g * 2
    matches_eager(F, lambda i: (x_(i),), reset=lambda: os.path.exists(path) and os.remove(path),
                  state=lambda: torch.load(path).tolist() if os.path.exists(path) else None)


def test_from_file_in_forward():
    path = os.path.join(tempfile.mkdtemp(), "raw.bin")
    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x): return x * torch.from_file(path, size=4, dtype=torch.float32)
        @staticmethod
        def backward(ctx, g): return g * 2
    def between(i):
        with open(path, "wb") as f:
            f.write(torch.full((4,), 2.0 + i).numpy().tobytes())
    matches_eager(F, lambda i: (x_(i),), between=between)


def test_scale_read_from_a_text_file():
    path = os.path.join(tempfile.mkdtemp(), "scale.txt")
    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            with open(path) as f:
                return x * float(f.read())
        @staticmethod
        def backward(ctx, g): return g * 2
    def between(i):
        with open(path, "w") as f:
            f.write(str(2.0 + i))
    matches_eager(F, lambda i: (x_(i),), between=between)


def test_flag_file_exists_toggled():
    flag = os.path.join(tempfile.mkdtemp(), "flag")
    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x): return x * (3 if os.path.exists(flag) else 2)
        @staticmethod
        def backward(ctx, g): return g * 2
    def between(i):
        if i % 2:
            open(flag, "w").close()
        elif os.path.exists(flag):
            os.remove(flag)
    matches_eager(F, lambda i: (x_(i),), between=between,
                  reset=lambda: os.path.exists(flag) and os.remove(flag))


RUN_IDS: list = []


def test_uuid_logged_each_call():
    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            RUN_IDS.append(uuid.uuid4().hex)
            return x * 2
        @staticmethod
        def backward(ctx, g): return g * 2
    matches_eager(F, lambda i: (x_(i),), reset=RUN_IDS.clear, state=lambda: len(set(RUN_IDS)))


# --- Arguments of a builtin's subclass with methods of its own -----------------------------

class Scale(float):
    def __eq__(self, other):
        CALLS[0] += 1
        return float.__eq__(self, other)
    __hash__ = float.__hash__


class Mode(str):
    def __eq__(self, other):
        CALLS[0] += 1
        return str.__eq__(self, other)
    __hash__ = str.__hash__


class Pair(tuple):
    def __iter__(self):
        CALLS[0] += 1
        return tuple.__iter__(self)


def _calls_reset():
    CALLS[0] = 0


def test_float_subclass_argument():
    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, k): return x * k
        @staticmethod
        def backward(ctx, g): return g * 2, None
    matches_eager(F, lambda i: (x_(i), Scale(2.0)), reset=_calls_reset, state=_calls)


def test_str_subclass_mode_argument():
    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, mode): return x * (2 if mode == "a" else 3)
        @staticmethod
        def backward(ctx, g): return g * 2, None
    matches_eager(F, lambda i: (x_(i), Mode("ab"[i % 2])), reset=_calls_reset, state=_calls)


def test_tuple_subclass_unpacked_by_forward():
    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, p):
            a, b = p
            return x * a + b
        @staticmethod
        def backward(ctx, g): return g * 2, None
    matches_eager(F, lambda i: (x_(i), Pair((2.0, 1.0 + i % 2))), reset=_calls_reset, state=_calls)


def test_tuple_subclass_of_tensors():
    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, p): return x * p[0]
        @staticmethod
        def backward(ctx, g): return g * 2, None
    matches_eager(F, lambda i: (x_(i), Pair((torch.full((4,), 2.0 + i),))), reset=_calls_reset, state=_calls)


class Batch(list):
    pass


def test_tuple_subclass_of_tensors_keeps_its_class_while_traced():
    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, p): return x * p[0] * (2 if isinstance(p, Pair) else 3)
        @staticmethod
        def backward(ctx, g): return g * 2, None
    matches_eager(F, lambda i: (x_(i), Pair((torch.full((4,), 2.0 + i),))), reset=_calls_reset)


def test_list_subclass_of_tensors_keeps_its_class_and_attributes_while_traced():
    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, b): return x * b[0] * (b.scale if isinstance(b, Batch) else 3)
        @staticmethod
        def backward(ctx, g): return g * 2, None
    def make(i):
        b = Batch([torch.full((4,), 2.0 + i)])
        b.scale = 5.0
        return (x_(i), b)
    matches_eager(F, make)


class Weights(dict):
    def __setitem__(self, k, v):
        CALLS[0] += 1
        dict.__setitem__(self, k, v)


class OrderedWeights(collections.OrderedDict):
    pass


class DefaultWeights(collections.defaultdict):
    pass


def _dict_case(make_dict):
    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, d):
            same = type(d) is type(make_dict(0)) and getattr(d, "tag", None) == "w"
            return x * d["w"] * (2 if same else 3)
        @staticmethod
        def backward(ctx, g): return g * 2, None
    matches_eager(F, lambda i: (x_(i), make_dict(i)), reset=_calls_reset, state=_calls)


def _filled(d, i):
    dict.__setitem__(d, "w", torch.full((4,), 2.0 + i))
    d.tag = "w"
    return d


def test_dict_subclass_of_tensors_with_its_own_setitem():
    _dict_case(lambda i: _filled(Weights(), i))


def test_ordered_dict_subclass_of_tensors():
    _dict_case(lambda i: _filled(OrderedWeights(), i))


def test_defaultdict_subclass_of_tensors_keeps_its_factory():
    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, d): return x * d["w"] * (d["missing"] + 2)
        @staticmethod
        def backward(ctx, g): return g * 2, None
    matches_eager(F, lambda i: (x_(i), _filled(DefaultWeights(float), i)))


# --- A module argument changed by forward ---------------------------------------------------

def _linear():
    torch.manual_seed(0)
    return nn.Linear(4, 4)


def test_register_buffer_inside_forward():
    box = [None]
    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, m):
            m.register_buffer(f"b{len(m._buffers)}", x.detach() * 2)
            return x * len(m._buffers)
        @staticmethod
        def backward(ctx, g): return g * 2, None
    matches_eager(F, lambda i: (x_(i), box[0]), reset=lambda: box.__setitem__(0, nn.Module()),
                  state=lambda: sorted(box[0]._buffers))


def test_module_double_inside_forward():
    box = [None]
    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, m):
            m.double()
            return m(x.double()).float()
        @staticmethod
        def backward(ctx, g): return g * 2, None
    matches_eager(F, lambda i: (x_(i), box[0]), reset=lambda: box.__setitem__(0, _linear()),
                  state=lambda: box[0].weight.dtype)


def test_optimizer_step_inside_forward():
    box = [None, None]
    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            w, opt = box
            with torch.enable_grad():
                opt.zero_grad()
                (w * x.detach()).sum().backward()
                opt.step()
            return x * w.detach()
        @staticmethod
        def backward(ctx, g): return g * 2
    def reset():
        w = nn.Parameter(torch.linspace(0, 1, 4))
        box[:] = [w, torch.optim.SGD([w], lr=0.1, momentum=0.9)]
    matches_eager(F, lambda i: (x_(i),), reset=reset, state=lambda: box[0].detach().clone())


def test_running_statistic_in_a_global_tensor():
    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            RUNNING.mul_(0.9).add_(x.detach().mean() * 0.1)
            return x - RUNNING
        @staticmethod
        def backward(ctx, g): return g
    matches_eager(F, lambda i: (x_(i),), reset=lambda: globals().__setitem__("RUNNING", torch.zeros(())),
                  state=lambda: RUNNING.clone())


# --- Tensor methods that touch the data directly ----------------------------------------------

FACTOR = [2.0]


def test_apply_underscore_with_a_python_callable():
    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            y = x.detach().clone()
            y.apply_(lambda v: v * FACTOR[0])
            return y
        @staticmethod
        def backward(ctx, g): return g * FACTOR[0]
    matches_eager(F, lambda i: (x_(i),), between=lambda i: FACTOR.__setitem__(0, 2.0 + i),
                  reset=lambda: FACTOR.__setitem__(0, 2.0))


def test_map_underscore_with_a_python_callable():
    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            y = x.detach().clone()
            y.map_(x.detach(), lambda a, b: a * b)
            return y
        @staticmethod
        def backward(ctx, g): return g * 2
    matches_eager(F, lambda i: (x_(i),))


def test_dlpack_round_trip_in_forward():
    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x): return x * torch.from_dlpack(x.detach().clone().__dlpack__())
        @staticmethod
        def backward(ctx, g): return g * 2
    matches_eager(F, lambda i: (x_(i),))


def test_user_hash_key_lookup_in_a_function_refused_later():
    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x): return x * WEIGHTS[Key(1)]
        @staticmethod
        def backward(ctx, g):
            y = g.detach().clone()
            y.apply_(lambda v: v * 2)
            return y
    def reset(): CALLS[0] = 0; globals()["WEIGHTS"] = {Key(1): 2.0}
    matches_eager(F, lambda i: (x_(i),), reset=reset, state=_calls)


# --- Where a warning with a stacklevel points, under fallback="eager" ------------------------

class CallerWarns(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        warnings.warn("deprecated spelling", stacklevel=STACKLEVEL[0])
        return x * 2

    @staticmethod
    def backward(ctx, g): return g * 2


STACKLEVEL = [3]


def _warned_at(call, action):
    for module in list(sys.modules.values()):
        registry = getattr(module, "__warningregistry__", None)
        if isinstance(registry, dict):
            registry.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.resetwarnings()
        warnings.simplefilter(action)
        for _ in range(3):
            call(x_(0)).sum().backward()  # (one line: the call every warning names)
    return [(w.filename, w.lineno) for w in caught if str(w.message) == "deprecated spelling"]


@pytest.mark.parametrize("level", [2, 3, 4])
@pytest.mark.parametrize("action", ["always", "default"])
def test_warning_stacklevel_names_eager_frame_under_fallback(level, action):
    STACKLEVEL[0] = level
    minihop.reset()
    try:  # (both from one line: a stacklevel of 4 names this frame)
        eager, fallback = [_warned_at(c, action) for c in (CallerWarns.apply, minihop.function(CallerWarns, fallback="eager"))]
    finally:
        STACKLEVEL[0] = 3
    assert fallback == eager and eager


def test_log_record_stacklevel_names_eager_frame_under_fallback():
    records = []
    class Heard(logging.Handler):
        def emit(self, record): records.append((record.getMessage(), record.filename, record.lineno, record.funcName))
    log = logging.getLogger("minihop.tests.stacklevel")
    log.handlers[:] = [Heard()]
    log.setLevel(logging.INFO)
    log.propagate = False
    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            log.info("caller", stacklevel=3)
            return x * 2
        @staticmethod
        def backward(ctx, g): return g * 2
    minihop.reset()
    for call in (F.apply, minihop.function(F, fallback="eager")):  # (one line: the record names it)
        call(x_(0))
    assert records[0] == records[1] and records[0][3] == "test_log_record_stacklevel_names_eager_frame_under_fallback"


# --- Containers forward returns, of a subclass ------------------------------------------------

class Outs(list):
    pass


class Named(collections.OrderedDict):
    pass


OUTPUTS = {
    "list subclass": lambda y: (y, Outs([y * 3])),
    "OrderedDict subclass with an attribute": lambda y: (y, _tagged(Named(a=y * 3))),
    "defaultdict": lambda y: (y, collections.defaultdict(int, a=y * 3)),
    "nested tuple subclass": lambda y: (y, Pair((y * 3, 1))),
    "OrderedDict alone": lambda y: collections.OrderedDict(a=y, b=y * 3),
}


def _tagged(d):
    d.tag = "named"
    return d


def _shape_of(out):
    if isinstance(out, torch.Tensor):
        return "T"
    kind = type(out).__name__
    if isinstance(out, dict):
        return (kind, getattr(out, "tag", None), getattr(out, "default_factory", None),
                [(k, _shape_of(v)) for k, v in out.items()])
    if isinstance(out, (list, tuple)):
        return (kind, [_shape_of(v) for v in out])
    return out


@pytest.mark.parametrize("name", sorted(OUTPUTS))
def test_returned_container_keeps_its_class(name):
    make = OUTPUTS[name]
    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x): return make(x * 2)
        @staticmethod
        def backward(ctx, *gs): return gs[0] * 2
    eager = _shape_of(F.apply(x_(0)))
    minihop.reset()
    call = minihop.function(F)
    for i in range(3):  # (the first call traces, the next reuse the capture)
        assert _shape_of(call(x_(i))) == eager


# --- An object whose class answers missing attributes from its own dict ----------------------

ASKED: list = []


class DictConfig:
    def __init__(self, **values):
        self.__dict__["_d"] = dict(values)

    def __getattr__(self, name):
        ASKED.append(name)
        return self._d[name]  # (KeyError, not AttributeError, for a name it lacks)


def test_dict_config_holding_a_tensor():
    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, c): return x * c.w
        @staticmethod
        def backward(ctx, g): return g * 2, None
    matches_eager(F, lambda i: (x_(i), DictConfig(w=torch.full((4,), 2.0 + i))), reset=ASKED.clear,
                  state=lambda: list(ASKED))


def test_dict_config_kept_on_ctx():
    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, c):
            ctx.c = c
            return x * 2
        @staticmethod
        def backward(ctx, g): return g * ctx.c.scale, None
    matches_eager(F, lambda i: (x_(i), DictConfig(scale=2.0 + i)), reset=ASKED.clear, state=lambda: list(ASKED))


def test_dict_config_read_in_forward():
    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, c): return x * c.scale
        @staticmethod
        def backward(ctx, g): return g * 2, None
    matches_eager(F, lambda i: (x_(i), DictConfig(scale=2.0 + i)), reset=ASKED.clear, state=lambda: list(ASKED))


class Info:
    def __init__(self, n):
        self.n = n
        self.parts = Pair((n, n + 1))

    def __deepcopy__(self, memo):
        ASKED.append("deepcopy")
        return Info(self.n)

    def __reduce_ex__(self, protocol):
        ASKED.append("reduce")
        return object.__reduce_ex__(self, protocol)


def test_object_made_and_returned_is_copied_without_its_code():
    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x): return x * 2, Info(3)
        @staticmethod
        def backward(ctx, g, _): return g * 2
    minihop.reset()
    ASKED.clear()
    call = minihop.function(F)
    outs = [call(x_(i))[1] for i in range(3)]
    assert ASKED == [] and len({id(o) for o in outs}) == 3
    assert all(type(o) is Info and o.n == 3 and type(o.parts) is Pair and o.parts == (3, 4) for o in outs)


def test_constant_containers_returned_keep_their_class_and_cycles():
    def make():
        loop = Outs([1])
        loop.append(loop)
        return {"pair": Pair((1, 2)), "loop": loop, "named": Named(a=1)}
    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x): return x * 2, make()
        @staticmethod
        def backward(ctx, g, _): return g * 2
    minihop.reset()
    call = minihop.function(F)
    for i in range(3):
        out = call(x_(i))[1]
        assert type(out["pair"]) is Pair and type(out["loop"]) is Outs and out["loop"][1] is out["loop"]
        assert type(out["named"]) is Named


def test_returned_list_holding_itself_and_a_tensor():
    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            loop = [x * 3]
            loop.append(loop)
            return x * 2, loop
        @staticmethod
        def backward(ctx, g, _): return g * 2
    eager = F.apply(x_(0))
    assert eager[1][1] is eager[1]
    with pytest.raises(minihop.UnsupportedOutputError, match="contains itself"):
        minihop.function(F)(x_(0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", minihop.MinihopWarning)
        out = minihop.function(F, fallback="eager")(x_(0))
    assert out[1][1] is out[1] and torch.equal(out[1][0], eager[1][0])


def test_fallback_traceback_shows_the_users_frames_once():
    import traceback
    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            print("refused: a capture would print once")
            raise ValueError("boom")
        @staticmethod
        def backward(ctx, g): return g
    def user_call():
        minihop.function(F, fallback="eager")(x_(0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", minihop.MinihopWarning)
        with pytest.raises(ValueError, match="boom") as info:
            user_call()
    names = [frame.name for frame in traceback.extract_tb(info.value.__traceback__)]
    assert names.count("user_call") == 1 and names[-1] == "forward"
