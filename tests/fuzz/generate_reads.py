"""Random ``autograd.Function``s that READ Python state along many paths, as source text.

The read half of issue 28's adversarial generator (the effects half writes state). A case
composes, at random: a *holder* of a value (a user nn.Module argument, global or closure cell
read through its training flag and attributes; a library module whose own code reads its
attribute; a user object's attribute; a class attribute of a user class passed as an argument
or held in a global; a bound method passed as an argument; a dict item or list item of a
global; a closure cell; a global holding a library function; a global tensor; a tensor class
attribute; a float whose sign is the value, ``-0.0`` included (and a NaN's sign and payload,
round 24); an attribute named by a
variable; and paths the analysis was not written for: a module nested in a ModuleDict and
a Sequential, a callable object whose ``__call__`` reads its own attribute, a classmethod, a
property, a closure over a closure, a helper module made at run time with
``types.ModuleType``, an attribute changed through its ``__dict__`` held elsewhere, a list
inside a list inside a dict changed through the inner list, a list of modules passed as an
argument, a ``__slots__`` object, a module's private attribute, a value twelve containers
below a global, a tensor argument's own attribute, a tensor argument that is also a global's
(``w is PICK[0]``), a table keyed by tensors, ``id()`` of an object argument, a global
tensor's shape or stride and a global parameter's ``.grad`` read in no op; a class's dunder
method, a user module's class method, a library module's function and a method set on
``torch.Tensor``, each rebound; a callback run by ``functools.reduce`` (code not analysed); library objects read through their own methods and changed
through theirs: a queue's size, a buffer's text, an ``array`` item, a ``bytearray``'s length, a
``Counter``, an ``OrderedDict``'s first entry, an ``Event``, a ``deque``, a ``UserDict``), an *access form* (directly in forward or backward, through a helper function,
through a lambda, through a method of a user object, through another Function's ``apply``,
through ``getattr`` with a constant or a variable name, through a helper calling a helper,
through ``functools.partial``, through an inner Function's *backward* run by
``torch.autograd.grad`` inside the phase), and *where* it is read (forward,
backward or both). ``set_value(v)`` changes every holder to ``v``'s state; the oracle
(``oracle_state.run_state_case``) sets a value before each call and another before
``.backward()`` (``STEPS``), and compares outputs and grads with eager's through
``minihop.apply`` and ``minihop.function(F, fallback="eager")``.

None of the paths is special-cased by minihop's analysis by name: they are combinations, and
a new holder or access form added here is tried against the mechanism as it is.

Invariant: a case's source depends only on the choices made (a seed reproduces it).
"""

from __future__ import annotations

from generate import Case, Chooser

__all__ = ["HOLDERS", "ACCESS", "generate_reads_case"]

# holder -> (module-level setup, how set_value(v) changes it, an expression of the value as a
#            float or tensor usable in ``x * (...)``, whether it goes through make_args)
HOLDERS = ("user_module_arg", "user_module_global", "user_module_closure", "library_module_global",
           "library_module_arg", "object_global", "class_arg", "class_global", "bound_method_arg",
           "dict_global", "list_global", "cell", "library_function_global", "tensor_global",
           "tensor_class_attribute", "signed_zero_global", "signed_zero_arg", "named_attribute",
           # Paths the analysis was not written for (issue 28's "what your analysis does not
           # know"): judged by the eager comparison only.
           "nested_module_container", "callable_object", "classmethod_read", "property_read",
           "closure_of_closure", "runtime_module", "dict_alias", "nested_list_alias",
           "module_in_list_arg", "slots_object",
           # Library objects read through their own methods or items, changed by the caller
           # through theirs (a queue's size, a buffer's text, an array item, a Counter's count,
           # an OrderedDict's first entry, an Event's flag, a deque's last item, a UserDict item).
           "queue_size", "buffer_text", "array_item", "bytearray_size", "counter_count",
           "ordered_first", "event_flag", "deque_last", "user_dict_item",
           # Found from outside in round 6: a module's private attribute (as an argument and as
           # a global), a value twelve containers below a global, a tensor argument's attribute.
           "module_private_arg", "module_private_global", "deep_global", "tensor_attribute_arg",
           # Round 7: which object a value is (a tensor argument that is also a global's, a
           # table keyed by tensors, id() of an object keyed by its contents), and what the
           # code reads of a tensor it does not get as an argument (a global's shape, layout,
           # a parameter's .grad), used in no op.
           "tensor_identity_global", "tensor_keyed_table", "id_keyed_object_arg", "global_tensor_shape",
           "global_tensor_layout", "global_param_grad",
           # Round 8: code rebound where a key did not look: a class's dunder method (``__call__``
           # of an object passed in or held, ``__getitem__``), a user module's class method, a
           # library module's function (``F.softsign = torch.tanh``), a user function set on
           # ``torch.Tensor``.
           "dunder_call_global", "dunder_call_arg", "dunder_getitem_global", "module_class_forward_arg",
           "library_binding", "tensor_method_patch",
           # ... and code minihop does not analyse (a callback ``functools.reduce`` calls) reading
           # a value that changes before ``.backward()``.
           "unanalysed_callback",
           # Round 9: what the call key did not hold (the default dtype a factory op reads, a
           # tensor argument's storage offset) and names torch's own code resolves (a library
           # module's method rebound, ``F.softsign`` rebound under ``nn.Softsign``).
           "default_dtype", "storage_offset_arg", "library_class_method", "library_binding_under_module",
           # ... and a hook registered for every module, run by a module the code builds.
           "global_hook_built_module",
           # Round 10: a C method bound to a dict (held in a global, or in a list of handlers),
           # a read-only view of a dict passed in, a Function class's own attribute (passed in;
           # a module kept on it and called through it), a builtin shadowed by a global.
           "c_method_global", "c_method_in_list", "mapping_proxy_arg", "dict_values_arg",
           "function_class_attr_arg", "function_class_module", "builtin_shadowed",
           # Round 11: objects whose state their attributes do not show: a user's class over a C
           # one (a StringIO passed in, a ctypes Structure in a global), a builtin's subclass
           # with attributes (a float passed in, a tuple in a global).
           "native_text_arg", "ctypes_struct_global", "float_subclass_attr_arg", "tuple_subclass_attr_global",
           # ... and what a key or a read left out: a function's attribute and name (passed in),
           # a library's list (``sys.argv``), a torch getter, a flag through a library's object
           # (``logging.root.level``), an enum's member's attribute (passed in), a deque's and a
           # UserDict's of the user's class.
           "function_attribute_arg", "function_name_arg", "sys_argv", "torch_getter", "logging_root_level",
           "enum_member_attr_arg", "deque_subclass_attr_arg", "userdict_subclass_attr_global",
           # Round 12: a class attribute that lives on the class's metaclass (passed in), and a
           # tensor argument's attribute that is not there at first (read with a default).
           "metaclass_attr_arg", "tensor_attribute_late_arg",
           # Round 13: a set passed in, equal on every call but built in another order (it
           # iterates in another order), and a tensor argument made under inference mode on
           # some calls (``is_inference()``, a flag no key held).
           "set_order_arg", "inference_flag_arg",
           # Round 14: a value of the user's subclass of a plain type whose own method reads a
           # global (a dict's ``__missing__`` passed in, a float's ``__mul__`` passed in, a
           # list's ``__getitem__`` in a global).
           "dict_subclass_missing_arg", "float_subclass_mul_arg", "list_subclass_getitem_global",
           # Round 15: an object passed in whose class answers every attribute by its own
           # ``__getattribute__``, reading a global; a ``cached_property`` of a global object
           # whose cached value the caller drops on some calls.
           "getattribute_arg", "cached_property_global",
           # Round 16: a config object passed in whose ``__getattr__`` answers from its own dict
           # (``self._d[name]``: KeyError, not AttributeError, for what it lacks), a module with a
           # ``__getattr__`` (PEP 562), a tuple subclass of tensors whose class the code checks,
           # and a ``defaultdict`` passed in whose key is missing on some calls.
           "dict_config_arg", "lazy_module_global", "tuple_subclass_tensor_arg", "defaultdict_missing_arg",
           # Round 17: a forwarding proxy (wrapt / LazyObject style: its ``__class__`` is what it
           # wraps, and counts) of a dict, passed in or held in a global, and an object whose
           # ``__class__`` counts, held in a global.
           "proxy_dict_arg", "proxy_dict_global", "class_counted_global",
           # Round 18: a Python attribute of a global parameter (a per-parameter setting: not
           # there on some calls), read with a default, by hasattr, through a list, off a global
           # module's weight, by a name chosen at run time.
           "param_attr_global", "param_hasattr_global", "param_attr_list_global", "weight_attr_global",
           "param_attr_computed_global",
           # Round 19: where a value lies farther than the analysis walked: a tensor four
           # containers below a global, one on objects in a list, a deque's last tensor, a list
           # read at two positions that grows at the front, a tensor seven lists deep in an
           # argument, and a config dict a ``functools.cache`` helper hands out.
           "deep_tensor_global", "object_list_tensor_global", "deque_tensor_global", "list_front_insert_global",
           "nested_list_tensor_arg", "cached_config_global",
           # Round 20: what an lru_cache helper hands back, changed by the caller: its table
           # written in place, a tensor of a cached tuple written in place, a plain value of a
           # cached dict entry rebound.
           "cached_table_global", "cached_tuple_global", "cached_dict_entry_global",
           # Round 21: a tensor argument whose memory format changes between calls, read by
           # ``dim_order()`` (listed as held by the key: it was not), and one that is autograd's
           # efficient zeros on some calls (``_is_zerotensor()``: a fake copy has no such flag).
           "dim_order_arg", "zerotensor_arg",
           # Round 22: a tensor argument in shared memory on some calls (``is_shared()``: a fake
           # copy lives in none), and a library's constant its code reads (json's encoder's
           # separator, read by its method).
           "shared_memory_arg", "library_flag_global",
           # Round 24: NaNs of another sign or payload (one value to ``float.hex``), read back by
           # ``struct.pack`` and ``math.copysign``, in a global and passed in.
           "nan_payload_global", "nan_payload_arg")
ACCESS = ("direct", "helper", "lambda", "method", "inner_apply", "getattr_const", "nested_helper",
          "partial", "inner_apply_backward",
          # Round 13: a lambda forward makes and keeps on ctx, called by backward (the read
          # happens when backward runs).
          "deferred")
WHERE = ("forward", "backward", "both")
_VALUES = (2.0, 3.0, 0.5, -1.5, 0.0)
# Read anywhere: a tensor held in a global or a class attribute that backward reads is read
# when backward runs (tracer/backward_reads.py), also after a rebinding before ``.backward()``.
_FORWARD_ONLY: tuple[str, ...] = ()

_PRELUDE = '''import array
import collections
import ctypes
import enum
import functools
import io
import logging
import math
import queue
import struct
import sys
import threading
import types
import torch
from torch.autograd import Function


class UserScale(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.k = 2.0
        self.inner = torch.nn.Identity()

    def forward(self, t):
        return self.inner(t) * (self.k if self.training else 1.0 - self.k)


class PrivateScale(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self._k = 2.0

    def _scaled(self):
        return self._k * 1.0


class Holder:
    def __init__(self):
        self.k = 2.0

    def value(self):
        return self.k


class Settings:
    k = 2.0
    j = 5.0


class Scaler:
    def __init__(self):
        self.k = 2.0

    def __call__(self):
        return self.k


class ClassRead:
    k = 2.0

    @classmethod
    def get(cls):
        return cls.k


class PropRead:
    def __init__(self):
        self._k = 2.0

    @property
    def k(self):
        return self._k * 1.0


class Slotted:
    __slots__ = ("k",)

    def __init__(self):
        self.k = 2.0


def _answers(v):
    # One function per value (a closure each: another object, the same code), as a caller
    # rebinds a method to another implementation.
    def answer(self, *rest):
        return v
    return answer


class Act:
    def __call__(self):
        return 2.0


class Lookup:
    def __getitem__(self, key):
        return 2.0


class Forward(torch.nn.Module):
    def forward(self, t):
        return t * 2.0


CB_K = [2.0]


def cb_scale():
    return CB_K[0]


CALLBACKS = [cb_scale]


# Library bindings and process settings a case changes are put back before each case's run
# (another case's must not leak into this one's eager run) and after it (``restore_process``,
# called by the harness: nor into the tests that run after the fuzz slice).
_SOFTSIGN = getattr(torch.nn.functional, "_fuzz_softsign", torch.nn.functional.softsign)
torch.nn.functional._fuzz_softsign = _SOFTSIGN
_HARDSHRINK = getattr(torch.nn.Hardshrink, "_fuzz_forward", torch.nn.Hardshrink.forward)
torch.nn.Hardshrink._fuzz_forward = _HARDSHRINK
_WARN_ALWAYS = getattr(torch, "_fuzz_warn_always", torch.is_warn_always_enabled())
torch._fuzz_warn_always = _WARN_ALWAYS
_ROOT_LEVEL = getattr(logging, "_fuzz_root_level", logging.root.level)
logging._fuzz_root_level = _ROOT_LEVEL


def restore_process():
    torch.nn.functional.softsign = _SOFTSIGN
    Act.__call__ = _answers(2.0)
    Lookup.__getitem__ = _answers(2.0)
    if "fuzz_scale" in vars(torch.Tensor):
        del torch.Tensor.fuzz_scale
    torch.nn.Hardshrink.forward = _HARDSHRINK
    torch.set_default_dtype(torch.float32)
    for hook in getattr(torch.nn.modules.module, "_fuzz_hooks", []):
        hook.remove()
    torch.nn.modules.module._fuzz_hooks = []
    torch.set_warn_always(_WARN_ALWAYS)
    logging.root.setLevel(_ROOT_LEVEL)
    sys.argv[:] = [a for a in sys.argv if a != "--fuzz-flag"]


restore_process()


def _outer_reader():
    box = [2.0]

    def middle():
        def inner():
            return box[0]
        return inner
    return middle(), box


NESTED_READ, NESTED_BOX = _outer_reader()


def _setup_value(v):
    return v
'''


def _holder(c: Chooser, holder: str) -> tuple[list[str], list[str], str, list[str], str]:
    """(module setup lines, set_value body lines, the read expression inside the Function,
    extra make_args expressions, extra forward parameters)."""
    if holder == "user_module_arg":
        return (["MOD = UserScale()"], ["MOD.k = v", "MOD.train(v > 1)",
                                         "MOD.inner = torch.nn.Tanh() if v < 0 else torch.nn.Identity()"],
                "m(torch.ones(()))", ["MOD"], "m")
    if holder == "user_module_global":
        return (["GMOD = UserScale()"], ["GMOD.k = v", "GMOD.train(v != 3.0)"], "GMOD(torch.ones(()))", [], "")
    if holder == "user_module_closure":
        return (["CMOD = UserScale()"], ["CMOD.k = v", "CMOD.train(v > 0)"], "cmod(torch.ones(()))", [], "")
    if holder == "library_module_global":
        return (["ACT_MOD = torch.nn.LeakyReLU(0.1)"], ["ACT_MOD.negative_slope = v / 4"],
                "ACT_MOD(-torch.ones(()))", [], "")
    if holder == "library_module_arg":
        return (["HT = torch.nn.Hardtanh(-1.0, 1.0)"], ["HT.max_val = abs(v) + 0.25", "HT.train(v > 1)"],
                "ht(torch.full((), 10.0))", ["HT"], "ht")
    if holder == "object_global":
        return (["OBJ = Holder()"], ["OBJ.k = v"], "OBJ.k", [], "")
    if holder == "class_arg":
        return ([], ["Settings.k = v"], "cls.k", ["Settings"], "cls")
    if holder == "class_global":
        return (["class Cfg(Settings):", "    pass"], ["Settings.k = v"], "Cfg.k", [], "")
    if holder == "bound_method_arg":
        return (["BOUND = Holder()"], ["BOUND.k = v"], "getk()", ["BOUND.value"], "getk")
    if holder == "dict_global":
        return (["TABLE = {'k': 2.0}"], ["TABLE['k'] = v"], "TABLE['k']", [], "")
    if holder == "list_global":
        return (["SEQ = [2.0]"], ["SEQ[0] = v"], "SEQ[0]", [], "")
    if holder == "cell":
        return ([], ["CELL[0] = v"], "cell_value", [], "")
    if holder == "library_function_global":
        return (["FN = torch.sin"], ["global FN", "FN = (torch.sin, torch.cos, torch.tanh, torch.sigmoid, torch.exp)"
                                     "[int(abs(v) * 2) % 5]"], "FN(torch.ones(()))", [], "")
    if holder == "tensor_global":
        return (["TG = torch.full((), 2.0)"], ["global TG", "TG = torch.full((), v)"], "TG", [], "")
    if holder == "tensor_class_attribute":
        return ([], ["Fuzz.W = torch.full((), v)"], "Fuzz.W", [], "")
    if holder == "signed_zero_global":
        return (["ZERO = 0.0"], ["global ZERO", "ZERO = 0.0 if v > 0 else -0.0"],
                "math.copysign(2.0, ZERO)", [], "")
    if holder in ("nan_payload_global", "nan_payload_arg"):
        made = "struct.unpack('<d', bytes([int(v * 2) % 5 + 1, 0, 0, 0, 0, 0, 0xF8, 0x7F if v > 1 else 0xFF]))[0]"
        bits = "(float(struct.pack('<d', {0})[0]) + (10.0 if math.copysign(1.0, {0}) < 0 else 0.0))"
        if holder == "nan_payload_global":
            return (["NANG = [float('nan')]"], [f"NANG[0] = {made}"], bits.format("NANG[0]"), [], "")
        return (["NANA = [float('nan')]"], [f"NANA[0] = {made}"], bits.format("nz"), ["NANA[0]"], "nz")
    if holder == "signed_zero_arg":
        return (["ZARG = [0.0]"], ["ZARG[0] = 0.0 if v > 1 else -0.0"], "math.copysign(2.0, z)", ["ZARG[0]"], "z")
    if holder == "nested_module_container":
        return (["NEST = torch.nn.ModuleDict({'a': torch.nn.Sequential(UserScale())})"],
                ["NEST['a'][0].k = v", "NEST['a'][0].train(v > 1)"], "NEST['a'][0](torch.ones(()))", [], "")
    if holder == "callable_object":
        return (["SCALER = Scaler()"], ["SCALER.k = v"], "SCALER()", [], "")
    if holder == "classmethod_read":
        return ([], ["ClassRead.k = v"], "ClassRead.get()", [], "")
    if holder == "property_read":
        return (["PROP = PropRead()"], ["PROP._k = v"], "PROP.k", [], "")
    if holder == "closure_of_closure":
        return ([], ["NESTED_BOX[0] = v"], "NESTED_READ()", [], "")
    if holder == "runtime_module":
        # A helper module made at run time, its function reading the module's global.
        return (["RTMOD = types.ModuleType('fuzz_runtime_helpers')",
                 "exec('K = 2.0\\ndef scale():\\n    return K * 1.0\\n', RTMOD.__dict__)"],
                ["RTMOD.K = v"], "RTMOD.scale()", [], "")
    if holder == "dict_alias":
        # The object's attribute changed through its __dict__ held elsewhere.
        return (["ALIASED = Holder()", "ALIAS = vars(ALIASED)"], ["ALIAS['k'] = v"], "ALIASED.k", [], "")
    if holder == "nested_list_alias":
        return (["INNER_LIST = [2.0]", "OUTER = {'l': [INNER_LIST]}"], ["INNER_LIST[0] = v"],
                "OUTER['l'][0][0]", [], "")
    if holder == "module_in_list_arg":
        return (["MODS = [UserScale()]"], ["MODS[0].k = v", "MODS[0].train(v > 0)"],
                "mods[0](torch.ones(()))", ["MODS"], "mods")
    if holder == "slots_object":
        return (["SLOT = Slotted()"], ["SLOT.k = v"], "SLOT.k", [], "")
    if holder == "queue_size":
        return (["QSIZE = queue.Queue()", "QSIZE.put(0)"],
                ["QSIZE.queue.clear()", "[QSIZE.put(0) for _ in range(int(abs(v) * 2) % 4 + 1)]"],
                "float(QSIZE.qsize())", [], "")
    if holder == "buffer_text":
        return (["TEXT = io.StringIO('ab')"], ["TEXT.seek(0)", "TEXT.truncate()", "TEXT.write('a' * (int(abs(v) * 2) % 5 + 1))"],
                "float(len(TEXT.getvalue()))", [], "")
    if holder == "array_item":
        return (["ARRAY = array.array('d', [2.0])"], ["ARRAY[0] = v"], "ARRAY[0]", [], "")
    if holder == "bytearray_size":
        return (["RAW = bytearray(b'ab')"], ["RAW[:] = b'a' * (int(abs(v) * 2) % 5 + 1)"], "float(len(RAW))", [], "")
    if holder == "counter_count":
        return (["COUNTS = collections.Counter(k=2)"], ["COUNTS['k'] = int(v * 2)"], "float(COUNTS['k'])", [], "")
    if holder == "ordered_first":
        return (["ORDER = collections.OrderedDict(a=2.0, b=3.0)"], ["ORDER.move_to_end('a' if v > 1 else 'b')"],
                "next(iter(ORDER.values()))", [], "")
    if holder == "event_flag":
        return (["FLAG = threading.Event()"], ["FLAG.set() if v > 1 else FLAG.clear()"],
                "(2.0 if FLAG.is_set() else 3.0)", [], "")
    if holder == "deque_last":
        return (["RING = collections.deque([2.0], maxlen=3)"], ["RING.append(v)"], "RING[-1]", [], "")
    if holder == "user_dict_item":
        return (["UDICT = collections.UserDict(k=2.0)"], ["UDICT['k'] = v"], "UDICT['k']", [], "")
    if holder == "module_private_arg":
        return (["PMOD = PrivateScale()"], ["PMOD._k = v"], "pm._k", ["PMOD"], "pm")
    if holder == "module_private_global":
        return (["GPMOD = PrivateScale()"], ["GPMOD._k = v"], "GPMOD._scaled()", [], "")
    if holder == "deep_global":
        return (["DEEP = {'n': [{'n': {'n': [{'n': {'n': [{'n': {'k': 2.0}}]}}]}}]}"],
                ["DEEP['n'][0]['n']['n'][0]['n']['n'][0]['n']['k'] = v"],
                "DEEP['n'][0]['n']['n'][0]['n']['n'][0]['n']['k']", [], "")
    if holder == "tensor_identity_global":
        return (["PICK = [torch.ones(()), torch.ones(())]", "ARGT = [PICK[0]]"],
                ["ARGT[0] = PICK[0] if v > 1 else PICK[1]"], "(2.0 if tw is PICK[0] else 3.0)", ["ARGT[0]"], "tw")
    if holder == "tensor_keyed_table":
        return (["TKEYS = [torch.ones(()), torch.ones(())]", "TTABLE = {TKEYS[0]: 2.0}", "TPICK = [TKEYS[0]]"],
                ["TPICK[0] = TKEYS[0] if v > 1 else TKEYS[1]", "TTABLE[TKEYS[0]] = v"], "TTABLE.get(tk, 3.0)",
                ["TPICK[0]"], "tk")
    if holder == "id_keyed_object_arg":
        return (["IDOBJ = [Holder(), Holder()]", "IDPICK = [IDOBJ[0]]",
                 "IDSLOT = {id(IDOBJ[0]): 2.0, id(IDOBJ[1]): 3.0}"],
                ["IDPICK[0] = IDOBJ[0] if v > 1 else IDOBJ[1]"], "IDSLOT[id(io)]", ["IDPICK[0]"], "io")
    if holder == "global_tensor_shape":
        return (["TSHAPE = [torch.ones(2)]"], ["TSHAPE[0] = torch.ones(int(abs(v) * 2) % 4 + 1)"],
                "float(TSHAPE[0].shape[0])", [], "")
    if holder == "global_tensor_layout":
        return (["TLAY = [torch.ones(2)]"], ["TLAY[0] = torch.ones(2) if v > 1 else torch.ones(4)[::2]"],
                "float(TLAY[0].stride(0))", [], "")
    if holder == "global_param_grad":
        return (["GP = torch.nn.Parameter(torch.ones(()))"], ["GP.grad = None if v > 1 else torch.full((), v, dtype=GP.dtype)"],
                "(2.0 if GP.grad is None else 3.0)", [], "")
    if holder == "dunder_call_global":
        return (["DACT = Act()"], ["Act.__call__ = _answers(v)"], "DACT()", [], "")
    if holder == "dunder_call_arg":
        return (["AACT = Act()"], ["Act.__call__ = _answers(v)"], "act()", ["AACT"], "act")
    if holder == "dunder_getitem_global":
        return (["LOOK = Lookup()"], ["Lookup.__getitem__ = _answers(v)"], "LOOK['k']", [], "")
    if holder == "module_class_forward_arg":
        return (["FWDMOD = Forward()"], ["Forward.forward = lambda self, t, v=v: t * v"],
                "fm(torch.ones(()))", ["FWDMOD"], "fm")
    if holder == "library_binding":
        return ([], ["torch.nn.functional.softsign = (_SOFTSIGN, torch.sin, torch.cos, torch.tanh, torch.exp)"
                     "[int(abs(v) * 2) % 5]"], "torch.nn.functional.softsign(torch.ones(()))", [], "")
    if holder == "tensor_method_patch":
        return ([], ["torch.Tensor.fuzz_scale = lambda self, v=v: self * v"],
                "torch.ones(()).fuzz_scale()", [], "")
    if holder == "unanalysed_callback":
        return ([], ["CB_K[0] = v"], "functools.reduce(lambda acc, f: acc * f(), CALLBACKS, 1.0)", [], "")
    if holder == "default_dtype":
        return ([], ["torch.set_default_dtype(torch.float64 if v > 1 else torch.float32)"],
                "float(torch.ones(()).element_size())", [], "")
    if holder == "storage_offset_arg":
        return (["OFFS = [torch.ones(4)[1:3]]"], ["OFFS[0] = torch.ones(6)[int(abs(v) * 2) % 3:][:2]"],
                "float(so.storage_offset() + 1)", ["OFFS[0]"], "so")
    if holder == "library_class_method":
        return (["HSMOD = torch.nn.Hardshrink(0.5)"],
                ["torch.nn.Hardshrink.forward = _HARDSHRINK if v > 1 else (lambda self, t, v=v: t * v)"],
                "HSMOD(torch.ones(()))", [], "")
    if holder == "library_binding_under_module":
        return (["SSMOD = torch.nn.Softsign()"],
                ["torch.nn.functional.softsign = (_SOFTSIGN, torch.sin, torch.cos, torch.tanh, torch.exp)"
                 "[int(abs(v) * 2) % 5]"], "SSMOD(torch.ones(()))", [], "")
    if holder == "global_hook_built_module":
        return ([], ["for h in torch.nn.modules.module._fuzz_hooks:", "    h.remove()",
                     "torch.nn.modules.module._fuzz_hooks[:] = [] if v > 1 else [torch.nn.modules.module."
                     "register_module_forward_hook(lambda m, i, o, v=v: o * v)]"],
                "torch.nn.Hardtanh(-5.0, 5.0)(torch.ones(()))", [], "")
    if holder == "c_method_global":
        return (["KTAB = {'k': 2.0}", "GETK = KTAB.get"], ["KTAB['k'] = v"], "GETK('k')", [], "")
    if holder == "c_method_in_list":
        return (["KTAB2 = {'k': 2.0}", "GETTERS = [KTAB2.get]"], ["KTAB2['k'] = v"], "GETTERS[0]('k')", [], "")
    if holder == "mapping_proxy_arg":
        return (["MPD = {'k': 2.0}", "MPV = types.MappingProxyType(MPD)"], ["MPD['k'] = v"], "mp['k']", ["MPV"], "mp")
    if holder == "dict_values_arg":
        return (["DVD = {'k': 2.0}"], ["DVD['k'] = v"], "sum(dv)", ["DVD.values()"], "dv")
    if holder in ("function_class_attr_arg", "function_class_module"):
        kept = "ImplFn" if holder == "function_class_attr_arg" else "KeptFn"
        return ([f"class {kept}(Function):", "    SCALE = 2.0", "    m = UserScale()", "",
                 "    @staticmethod", "    def forward(ctx, t):", "        return t", "",
                 "    @staticmethod", "    def backward(ctx, g):", "        return g"],
                [f"{kept}.SCALE = v"] if kept == "ImplFn" else [f"{kept}.m.k = v", f"{kept}.m.train(v > 1)"],
                "impl.SCALE" if kept == "ImplFn" else "KeptFn.m(torch.ones(()))", [kept] if kept == "ImplFn" else [],
                "impl" if kept == "ImplFn" else "")
    if holder == "builtin_shadowed":
        return ([], ["globals().pop('pow', None) if v > 1 else globals().__setitem__('pow', lambda a, b, v=v: v)"],
                "pow(2.0, 1)", [], "")
    if holder == "native_text_arg":
        return (["class KText(io.StringIO):", "    pass", "", "", "KTXT = KText('2.0')"],
                ["KTXT.seek(0)", "KTXT.truncate()", "KTXT.write(repr(v))"], "float(kt.getvalue())", ["KTXT"], "kt")
    if holder == "ctypes_struct_global":
        return (["class KPoint(ctypes.Structure):", "    _fields_ = [('k', ctypes.c_double)]", "", "",
                 "KPT = KPoint(2.0)"], ["KPT.k = v"], "KPT.k", [], "")
    if holder == "float_subclass_attr_arg":
        return (["class KFloat(float):", "    pass", "", "", "KFL = KFloat(1.0)", "KFL.extra = 2.0"],
                ["KFL.extra = v"], "kf.extra * kf", ["KFL"], "kf")
    if holder == "tuple_subclass_attr_global":
        return (["class KPair(tuple):", "    pass", "", "", "KPR = KPair((1.0,))", "KPR.w = 2.0"],
                ["KPR.w = v"], "KPR.w * KPR[0]", [], "")
    if holder == "function_attribute_arg":
        return (["def KFN(t):", "    return t", "", "", "KFN.scale = 2.0"], ["KFN.scale = v"], "kfn.scale", ["KFN"], "kfn")
    if holder == "function_name_arg":
        return (["def KNAMED(t):", "    return t"], ["KNAMED.__name__ = 'KNAMED' if v > 1 else 'other'"],
                "(2.0 if kn.__name__ == 'KNAMED' else 3.0)", ["KNAMED"], "kn")
    if holder == "sys_argv":
        return ([], ["sys.argv[:] = [a for a in sys.argv if a != '--fuzz-flag'] + (['--fuzz-flag'] if v > 1 else [])"],
                "(3.0 if '--fuzz-flag' in sys.argv else 2.0)", [], "")
    if holder == "torch_getter":
        return ([], ["torch.set_warn_always(v > 1)"], "(3.0 if torch.is_warn_always_enabled() else 2.0)", [], "")
    if holder == "logging_root_level":
        return ([], ["logging.root.setLevel(logging.DEBUG if v > 1 else logging.WARNING)"],
                "(3.0 if logging.root.level <= logging.DEBUG else 2.0)", [], "")
    if holder == "dict_subclass_missing_arg":
        return (["MISSV = {'v': 2.0}", "", "", "class KMiss(dict):", "    def __missing__(self, k):",
                 "        return MISSV['v']", "", "", "KMISS = KMiss()"],
                ["MISSV['v'] = v"], "kmiss['s']", ["KMISS"], "kmiss")
    if holder == "float_subclass_mul_arg":
        return (["MULV = {'v': 2.0}", "", "", "class KMul(float):", "    def __mul__(self, o):",
                 "        return float(self) * MULV['v'] * o", "", "", "KMUL = KMul(1.0)"],
                ["MULV['v'] = v"], "float(kmul * 1.0)", ["KMUL"], "kmul")
    if holder == "list_subclass_getitem_global":
        return (["GETV = {'v': 2.0}", "", "", "class KList(list):", "    def __getitem__(self, i):",
                 "        return list.__getitem__(self, i) * GETV['v']", "", "", "KLIST = KList([1.0])"],
                ["GETV['v'] = v"], "KLIST[0]", [], "")
    if holder == "cached_property_global":
        return (["LAZYV = {'v': 2.0}", "", "", "class KLazy:", "    @functools.cached_property",
                 "    def scale(self):", "        return LAZYV['v']", "", "", "KLAZY = KLazy()"],
                ["LAZYV['v'] = v", "KLAZY.__dict__.pop('scale', None) if v != 3.0 else None"],
                "KLAZY.scale", [], "")
    if holder == "dict_config_arg":
        return (["class KDictCfg:", "    def __init__(self, **kw):", "        self.__dict__['_d'] = dict(kw)", "",
                 "    def __getattr__(self, name):", "        return self._d[name]", "", "",
                 "KDC = KDictCfg(scale=2.0)"], ["KDC._d['scale'] = v"], "kdc.scale", ["KDC"], "kdc")
    if holder == "lazy_module_global":
        return (["KLAZYM = types.ModuleType('fuzz_reads_lazy')", "KLAZYM.BASE = [2.0]",
                 "exec('def __getattr__(name):\\n    if name != \\'SCALE\\':\\n        raise AttributeError(name)\\n'",
                 "     '    return BASE[0]\\n', KLAZYM.__dict__)"], ["KLAZYM.BASE[0] = v"], "KLAZYM.SCALE", [], "")
    if holder == "tuple_subclass_tensor_arg":
        return (["KTUPV = [2.0]", "", "", "class KTup(tuple):", "    pass", "", "",
                 "def _ktup():", "    return KTup((torch.ones(()),))"], ["KTUPV[0] = v"],
                "(ktup[0] * (KTUPV[0] if isinstance(ktup, KTup) else -7.0))", ["_ktup()"], "ktup")
    if holder == "defaultdict_missing_arg":
        return (["KDDV = [2.0]", "KDD = collections.defaultdict(lambda: KDDV[0])"],
                ["KDD.pop('s', None) if v > 1 else KDD.__setitem__('s', v)", "KDDV[0] = v + 1"],
                "kdd['s']", ["KDD"], "kdd")
    if holder in ("proxy_dict_arg", "proxy_dict_global"):
        lines = ["PXN = [0]", "", "", "class KProxy:", "    def __init__(self, w):",
                 "        object.__setattr__(self, '_w', w)", "", "    @property", "    def __class__(self):",
                 "        PXN[0] += 1", "        return type(object.__getattribute__(self, '_w'))", "",
                 "    def __getitem__(self, k):", "        return object.__getattribute__(self, '_w')[k]", "", "",
                 "KPXD = {'s': 2.0}", "KPX = KProxy(KPXD)"]
        if holder == "proxy_dict_arg":
            return (lines, ["KPXD['s'] = v"], "(kpx['s'] + 0.25 * PXN[0])", ["KPX"], "kpx")
        return (lines, ["KPXD['s'] = v"], "(KPX['s'] + 0.25 * PXN[0])", [], "")
    if holder in ("param_attr_global", "param_hasattr_global", "param_attr_list_global", "weight_attr_global",
                  "param_attr_computed_global"):
        setup = ["KPARAM = torch.nn.Parameter(torch.ones(()))", "KPARAMS = [KPARAM]", "KLAYER = torch.nn.Linear(1, 1)",
                 "KPNAME = ['lr_scale']"]
        change = ["KPARAM.__dict__.pop('lr_scale', None) if v > 1 else setattr(KPARAM, 'lr_scale', v)",
                  "KLAYER.weight.__dict__.pop('lr_scale', None) if v > 1 else setattr(KLAYER.weight, 'lr_scale', v)"]
        read = {"param_attr_global": "getattr(KPARAM, 'lr_scale', 2.0)",
                "param_hasattr_global": "(KPARAM.lr_scale if hasattr(KPARAM, 'lr_scale') else 2.0)",
                "param_attr_list_global": "getattr(KPARAMS[0], 'lr_scale', 2.0)",
                "weight_attr_global": "getattr(KLAYER.weight, 'lr_scale', 2.0)",
                "param_attr_computed_global": "getattr(KPARAM, KPNAME[0], 2.0)"}[holder]
        return (setup, change, read, [], "")
    if holder == "deep_tensor_global":
        return (["KDT = {'a': {'b': {'c': [torch.ones(())]}}}"], ["KDT['a']['b']['c'][0] = torch.full((), v)"],
                "KDT['a']['b']['c'][0]", [], "")
    if holder == "object_list_tensor_global":
        return (["KOL = types.SimpleNamespace(layers=[types.SimpleNamespace(sub=types.SimpleNamespace(w=torch.ones(())))"
                 " for _ in range(3)])"], ["KOL.layers[2].sub.w = torch.full((), v)"], "KOL.layers[2].sub.w", [], "")
    if holder == "deque_tensor_global":
        return (["KDQ = collections.deque([torch.ones(())], maxlen=3)"], ["KDQ.append(torch.full((), v))"],
                "KDQ[-1]", [], "")
    if holder == "list_front_insert_global":
        return (["KFRONT = [torch.ones(()), torch.ones(())]"], ["KFRONT.insert(0, torch.full((), v))"],
                "(KFRONT[0] + 0.5 * KFRONT[-1])", [], "")
    if holder == "nested_list_tensor_arg":
        return (["KNEST = [[[[[[[torch.ones(())]]]]]]]"], ["KNEST[0][0][0][0][0][0][0] = torch.full((), v)"],
                "knest[0][0][0][0][0][0][0]", ["KNEST"], "knest")
    if holder == "cached_config_global":
        return (["@functools.cache", "def kget_config():", "    return {'s': 2.0}", ""],
                ["kget_config()['s'] = v"], "kget_config()['s']", [], "")
    if holder == "cached_table_global":
        return (["@functools.lru_cache(maxsize=4)", "def ktable(n):", "    return torch.ones(())", ""],
                ["ktable(1).fill_(v)"], "ktable(1)", [], "")
    if holder == "cached_tuple_global":
        return (["@functools.cache", "def kpair(n):", "    return (torch.ones(()), torch.ones(()))", ""],
                ["kpair(1)[1].fill_(v)"], "(kpair(1)[0] * kpair(1)[1])", [], "")
    if holder == "cached_dict_entry_global":
        return (["@functools.lru_cache(maxsize=None)", "def kentry(n):", "    return {'w': torch.ones(()), 's': 2.0}", ""],
                ["kentry(1)['s'] = v"], "(kentry(1)['w'] * kentry(1)['s'])", [], "")
    if holder == "class_counted_global":
        return (["CCN = [0]", "", "", "class KCounted:", "    def __init__(self):", "        self.s = 2.0", "",
                 "    @property", "    def __class__(self):", "        CCN[0] += 1", "        return KCounted", "", "",
                 "KCC = KCounted()"], ["KCC.s = v"], "(KCC.s + 0.25 * CCN[0])", [], "")
    if holder == "getattribute_arg":
        return (["GAV = {'v': 2.0}", "", "", "class KGa:", "    def __getattribute__(self, name):",
                 "        return GAV['v']", "", "", "KGA = KGa()"],
                ["GAV['v'] = v"], "kga.scale", ["KGA"], "kga")
    if holder == "deque_subclass_attr_arg":
        return (["class KRing(collections.deque):", "    pass", "", "", "KRING = KRing([1.0])", "KRING.w = 2.0"],
                ["KRING.w = v"], "kr.w * kr[0]", ["KRING"], "kr")
    if holder == "userdict_subclass_attr_global":
        return (["class KCfg(collections.UserDict):", "    pass", "", "", "KCFG = KCfg(a=1.0)", "KCFG.w = 2.0"],
                ["KCFG.w = v"], "KCFG.w * KCFG['a']", [], "")
    if holder == "enum_member_attr_arg":
        return (["class KMode(enum.Enum):", "    A = 1", "", "", "KMode.A.scale = 2.0"], ["KMode.A.scale = v"],
                "km.scale", ["KMode.A"], "km")
    if holder == "metaclass_attr_arg":
        return (["class KMeta(type):", "    pass", "", "", "class KKnobs(metaclass=KMeta):", "    pass", "", "",
                 "KMeta.k = 2.0"], ["KMeta.k = v"], "kk.k", ["KKnobs"], "kk")
    if holder == "tensor_attribute_late_arg":
        return (["TLATE = torch.ones(())"],
                ["TLATE.__dict__.pop('gain', None) if v == 2.0 else setattr(TLATE, 'gain', v)"],
                "getattr(tl, 'gain', 2.0)", ["TLATE"], "tl")
    if holder == "set_order_arg":
        return (["KORDER = [9, 1]", "", "", "def _kset():", "    s = set()", "    for u in KORDER:", "        s.add(u)",
                 "    return s"], ["KORDER[:] = (9, 1) if v > 1 else (1, 9)"],
                "[u for u in ks][0]", ["_kset()"], "ks")
    if holder == "dim_order_arg":
        return (["TDO = torch.ones(1, 2, 2, 2)"],
                ["globals()['TDO'] = TDO.contiguous(memory_format=torch.channels_last if v > 1 else torch.contiguous_format)"],
                "float(td.dim_order()[1] + 1)", ["TDO"], "td")
    if holder == "zerotensor_arg":
        return (["TZT = torch.zeros(())"], ["globals()['TZT'] = torch._efficientzerotensor(()) if v > 1 else torch.zeros(())"],
                "(3.0 if tz._is_zerotensor() else 2.0)", ["TZT"], "tz")
    if holder == "shared_memory_arg":
        return (["def _maybe_shared(flag):", "    t = torch.ones(())", "    return t.share_memory_() if flag else t",
                 "", "", "TSH = torch.ones(())"], ["globals()['TSH'] = _maybe_shared(v > 1)"],
                "(3.0 if tsh.is_shared() else 2.0)", ["TSH"], "tsh")
    if holder == "library_flag_global":
        # (json's encoder's methods read ``self.item_separator``, a class attribute: set on the
        # user's subclass, so json's own default stays as the other cases find it)
        return (["import json", "", "", "class LEnc(json.JSONEncoder):", "    pass"],
                ["LEnc.item_separator = ',' if v > 1 else ', '"],
                "float(len(LEnc().encode([1, 2, 3])))", [], "")
    if holder == "inference_flag_arg":
        return (["def _maybe_inference(flag):", "    with torch.inference_mode(flag):", "        return torch.ones(())",
                 "", "", "TINF = torch.ones(())"], ["globals()['TINF'] = _maybe_inference(v > 1)"],
                "(3.0 if ti.is_inference() else 2.0)", ["TINF"], "ti")
    if holder == "tensor_attribute_arg":
        return (["TATTR = torch.ones(())", "TATTR.scale = 2.0"], ["TATTR.scale = v"], "ta.scale", ["TATTR"], "ta")
    # named_attribute: getattr with a name chosen by the value
    return (["NAME = ['k']"], ["NAME[0] = 'k' if v > 1 else 'j'", "Settings.j = v + 1"],
            "getattr(Settings, NAME[0])", [], "")


def _wrap(access: str, expr: str, params: str, n: int) -> tuple[list[str], str]:
    """Module-level definitions and the expression forward/backward evaluates."""
    args = f"({params})" if params else "()"
    call_args = params
    if access == "helper":
        return ([f"def helper_{n}({params}):", f"    return {expr}"], f"helper_{n}({call_args})")
    if access == "lambda":
        return ([], f"(lambda: {expr})()")
    if access == "method":
        return ([f"class Reader_{n}:", f"    def read(self{', ' + params if params else ''}):",
                 f"        return {expr}", f"READER_{n} = Reader_{n}()"], f"READER_{n}.read({call_args})")
    if access == "inner_apply" and not params:
        # Another Function whose forward reads the value (as a tensor), applied inside.
        return ([f"class Inner_{n}(Function):", "    @staticmethod", "    def forward(ctx, t):",
                 f"        return t * {expr}", "    @staticmethod", "    def backward(ctx, g):",
                 f"        return g * {expr}"], f"Inner_{n}.apply(torch.ones(()))")
    if access == "nested_helper":
        return ([f"def leaf_{n}({params}):", f"    return {expr}", f"def helper_{n}({params}):",
                 f"    return leaf_{n}({call_args})"], f"helper_{n}({call_args})")
    if access == "partial":
        return ([f"def _part_{n}(scale, {params}):" if params else f"def _part_{n}(scale):",
                 f"    return scale * ({expr})", f"PART_{n} = functools.partial(_part_{n}, 1.0)"],
                f"PART_{n}({call_args})")
    if access == "inner_apply_backward" and not params:
        # An inner Function whose BACKWARD reads the value; applied and differentiated inside
        # forward/backward's own autograd (enable_grad): the read happens in the inner backward.
        return ([f"class InnerB_{n}(Function):", "    @staticmethod", "    def forward(ctx, t):",
                 "        return t * 1.0", "    @staticmethod", "    def backward(ctx, g):",
                 f"        return g * {expr}",
                 f"def inner_grad_{n}():",
                 "    with torch.enable_grad():",
                 "        t = torch.ones((), requires_grad=True)",
                 f"        (d,) = torch.autograd.grad(InnerB_{n}.apply(t), t)",
                 "    return d"], f"inner_grad_{n}()")
    if access == "getattr_const" and expr.startswith(("OBJ.", "Cfg.", "cls.")):
        owner, name = expr.split(".", 1)
        return ([], f"getattr({owner}, {name!r})")
    del args
    return ([], expr)


def generate_reads_case(c: Chooser) -> Case:
    holders = [c.choice(HOLDERS) for _ in range(c.integer(1, 3))]
    setup: list[str] = []
    setters: list[str] = []
    make_args = ["torch.linspace(-1.0, 1.5, 3, requires_grad=True)"]
    params: list[str] = []
    fwd_terms: list[str] = []
    bwd_terms: list[str] = []
    features: list[str] = []
    uses_cell = uses_cmod = False
    for n, holder in enumerate(dict.fromkeys(holders)):
        lines, sets, expr, extra_args, param = _holder(c, holder)
        setup += lines
        setters += sets
        make_args += extra_args
        if param:
            params.append(param)
        uses_cell |= holder == "cell"
        uses_cmod |= holder == "user_module_closure"
        # A closure cell is read by code inside the closure: directly or by a lambda there.
        access = c.choice(ACCESS if holder not in ("cell", "user_module_closure") else ("direct", "lambda"))
        where = c.choice(WHERE) if not param else c.choice(("forward", "both"))
        if holder in _FORWARD_ONLY:
            where = "forward"
        if access == "deferred" and param:
            access = "direct"
        defs, read = _wrap(access, expr, param, n)
        setup += defs
        features.append(f"read-{holder}-{access}-{where}")
        if access == "deferred":
            # a lambda forward makes, or a module-level helper it hands on without calling it
            if c.choice(("lambda", "helper")) == "helper":
                setup += [f"def later_helper_{n}():", f"    return {expr}"]
                fwd_terms.append(f"_defer(ctx, {n}, later_helper_{n})")
            else:
                fwd_terms.append(f"_defer(ctx, {n}, lambda: {expr})")
            bwd_terms.append(f"ctx.later_{n}()")
            continue
        if where in ("forward", "both"):
            fwd_terms.append(read)
        if where in ("backward", "both") and not param:
            bwd_terms.append(read)
        elif where == "both":
            bwd_terms.append(f"ctx.saved_value_{n}")
            fwd_terms[-1] = f"_keep(ctx, {n}, {read})"
    # Round 13: a term read by the user's own decorator around forward or backward (a
    # ``functools.wraps`` wrapper), not by the method's body.
    decorated = c.choice(("none", "none", "forward", "backward"))
    terms = fwd_terms if decorated == "forward" else bwd_terms if decorated == "backward" and not params else []
    movable = [t for t in terms if not any(p in t for p in (*params, "ctx", "cell", "cmod"))]
    wrapper_term = movable[-1] if movable else None
    decorator: dict[str, list[str]] = {"forward": [], "backward": []}
    if wrapper_term is not None:
        terms.remove(wrapper_term)
        setup += ["def _user_deco(fn):", "    @functools.wraps(fn)", "    def wrapper(*a, **k):",
                  f"        return fn(*a, **k) * {wrapper_term}", "    return wrapper"]
        decorator[decorated] = ["    @_user_deco"]
        features.append(f"decorated-{decorated}")
    fwd_terms = fwd_terms or ["1.0"]
    sig = ", ".join(["x", *params])
    nones = ", None" * len(params)
    fwd_body = ["y = x", *[f"y = y * {t}" for t in fwd_terms], "return y"]
    bwd_body = ["out = g", *[f"out = out * {t}" for t in bwd_terms], f"return out{nones}"]
    # Round 13: the methods as no functions: a functools.partial of a module-level function, or
    # a callable object (the code is its ``__call__``).
    form = c.choice(("def", "def", "partial", "object"))
    if form != "def" and not (uses_cell or uses_cmod or any(decorator.values())):
        features.append(f"methods-{form}")
        impl = [f"def _forward_impl(ctx, {sig}, k=1.0):", *["    " + b for b in fwd_body], "", "",
                "def _backward_impl(ctx, g, k=1.0):", *["    " + b for b in bwd_body]]
        if form == "object":
            impl = ["class _Impl:", "    def __init__(self, fn):", "        self.fn = fn", "",
                    "    def __call__(self, *a):", "        return self.fn(*a)", "", "", *impl]
        wrap = "functools.partial({}, k=1.0)" if form == "partial" else "_Impl({})"
        body = [*impl, "", "", "class Fuzz(Function):", "    W = torch.full((), 2.0)",
                f"    forward = staticmethod({wrap.format('_forward_impl')})",
                f"    backward = staticmethod({wrap.format('_backward_impl')})"]
    else:
        body = [
            "class Fuzz(Function):",
            "    W = torch.full((), 2.0)",
            "",
            "    @staticmethod",
            *decorator["forward"],
            f"    def forward(ctx, {sig}):",
            *["        " + b for b in fwd_body],
            "",
            "    @staticmethod",
            *decorator["backward"],
            "    def backward(ctx, g):",
            *["        " + b for b in bwd_body],
        ]
    if uses_cell or uses_cmod:
        closure = ["def make_function():"]
        if uses_cell:
            closure.append("    cell = CELL")
        if uses_cmod:
            closure.append("    cmod = CMOD")
        # The cell's value is read where it is used, as a closure reads it.
        fixed = [line.replace("cell_value", "cell[0]") for line in body]
        closure += ["    " + line if line else "" for line in fixed] + ["    return Fuzz", "", "", "Fuzz = make_function()"]
        body = closure
    source = "\n".join([
        _PRELUDE,
        "CELL = [2.0]",
        *setup,
        "",
        "",
        "def _keep(ctx, n, value):",
        "    setattr(ctx, f'saved_value_{n}', value)",
        "    return value",
        "",
        "",
        "def _defer(ctx, n, fn):",
        "    setattr(ctx, f'later_{n}', fn)",
        "    return 1.0",
        "",
        "",
        *body,
        "",
        "",
        "def set_value(v):",
        *["    " + line for line in setters],
        "    return None",
        "",
        "",
        "def make_args():",
        f"    return ({', '.join(make_args)},)",
        "",
        "",
        "def read_state():",
        "    return {}",
        "",
        "",
        f"STEPS = {[(c.choice(_VALUES), c.choice(_VALUES)) for _ in range(c.integer(2, 4))]!r}",
        "",
    ])
    return Case(source, tuple(features))
