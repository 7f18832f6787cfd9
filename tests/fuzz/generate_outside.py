"""Random ``autograd.Function``s reading Python state in the spellings outside code uses.

The red team's generator (issues 28/29: "the same classes, written differently, will be tried
again from outside"). ``generate_reads.py`` composes the holders the suite was built around;
this one composes the spellings that found differences from outside, each a holder whose
value ``set_value(v)`` changes: a staticmethod rebound on a class argument, a classmethod
reading a class attribute, a ``property`` and a counting descriptor, an object whose
``__getattr__`` serves the value, ``-0.0`` in a ``frozenset`` and as a dict key of an
argument, a ``ContextVar``, a ``functools.singledispatch`` table re-registered, the last
tensor of a growing global list, and an iterator held in a global. Access forms and where
the value is read (forward, backward, both) are ``generate_reads``'s; the oracle is
``oracle_state.run_state_case`` (a value set before each call and another before
``.backward()``, strict and fallback against eager).

Invariant: a case's source depends only on the choices made (a seed reproduces it).
"""

from __future__ import annotations

from generate import Case, Chooser
from generate_reads import ACCESS, WHERE, _wrap

__all__ = ["OUTSIDE_HOLDERS", "generate_outside_case"]

OUTSIDE_HOLDERS = ("staticmethod_class_arg", "classmethod_global", "property_global", "counting_descriptor",
                   "getattr_object", "frozenset_zero_arg", "dict_key_zero_arg", "context_var",
                   "singledispatch_table", "last_tensor_of_list", "iterator_global",
                   "arg_dict_on_ctx", "arg_object_on_ctx", "arg_list_on_ctx", "flag_branch",
                   "arg_list_grown_on_ctx", "arg_dict_key_on_ctx", "cached_global", "cached_pure", "helper_rebound")
# An argument container forward keeps whole on ctx (``ctx.kept_n = pd``); backward reads its
# tensor from there, after the caller put another one in (set_value before ``.backward()``).
# Or the caller grows or shrinks it (a list appended to, a dict gaining or losing a key), and
# backward takes its last item or a key's.
_KEPT_ON_CTX = ("arg_dict_on_ctx", "arg_object_on_ctx", "arg_list_on_ctx", "arg_list_grown_on_ctx",
                "arg_dict_key_on_ctx")
_VALUES = (2.0, 3.0, 0.5, -1.5, 0.0)
# Read in forward only: a tensor rebound between forward and backward is issue 28's open item
# (docs/reads.md, "Open"); an iterator is refused wherever it is read.
_FORWARD_ONLY = ("iterator_global", "counting_descriptor")

_PRELUDE = '''import contextvars
import functools
import itertools
import math
import torch
from torch.autograd import Function

SCALERS = (torch.sin, torch.cos, torch.tanh)


class Ops:
    @staticmethod
    def act(t):
        return torch.sin(t)


class ClassScale:
    k = 2.0

    @classmethod
    def get(cls):
        return cls.k


class PropHolder:
    def __init__(self):
        self._k = 2.0

    @property
    def k(self):
        return self._k


class Ticker:
    def __get__(self, obj, objtype=None):
        TICKS[0] += 1
        return float(TICKS[0])


class Ticking:
    tick = Ticker()


class Lazy:
    def __init__(self):
        self.vals = {"k": 2.0}

    def __getattr__(self, name):
        return self.__dict__["vals"][name]


class Box:
    pass


@functools.singledispatch
def scale_of(obj):
    return 2.0


def one(obj):
    return 1.0


def three(obj):
    return 3.0


TICKS = [0]
ONE = torch.ones(())
CS = [2.0]
WA = torch.full((), 2.0)
WB = torch.full((), 3.0)


@functools.lru_cache(maxsize=None)
def cached_ramp(n):
    return torch.arange(float(n)).sum() * CS[0]


@functools.lru_cache(maxsize=None)
def cached_tri(n):
    return torch.ones(n).cumsum(0)[-1] * 0.5


def via_a():
    return WA


def via_b():
    return WB


HELPER = via_a
'''


def _holder(holder: str) -> tuple[list[str], list[str], str, list[str], str]:
    """(module setup lines, set_value body lines, the read expression, extra make_args
    expressions, the extra forward parameter)."""
    if holder == "staticmethod_class_arg":
        return ([], ["Ops.act = staticmethod(SCALERS[int(abs(v) * 2) % 3])"], "ops.act(torch.ones(()))",
                ["Ops"], "ops")
    if holder == "classmethod_global":
        return ([], ["ClassScale.k = v"], "ClassScale.get()", [], "")
    if holder == "property_global":
        return (["PROP = PropHolder()"], ["PROP._k = v"], "PROP.k", [], "")
    if holder == "counting_descriptor":
        return (["TICKING = Ticking()"], [], "TICKING.tick", [], "")
    if holder == "getattr_object":
        return (["LAZY = Lazy()"], ["LAZY.vals['k'] = v"], "LAZY.k", [], "")
    if holder == "frozenset_zero_arg":
        return (["ZSET = [frozenset([0.0])]"], ["ZSET[0] = frozenset([0.0 if v > 1 else -0.0])"],
                "math.copysign(2.0, min(zs))", ["ZSET[0]"], "zs")
    if holder == "dict_key_zero_arg":
        return (["ZKEY = [{0.0: 1}]"], ["ZKEY[0] = {(0.0 if v > 1 else -0.0): 1}"],
                "math.copysign(2.0, next(iter(zk)))", ["ZKEY[0]"], "zk")
    if holder == "context_var":
        return (["CV = contextvars.ContextVar('cv', default=2.0)"], ["CV.set(v)"], "CV.get()", [], "")
    if holder == "singledispatch_table":
        return (["BOX = Box()"], ["scale_of.register(Box, one if v > 1 else three)"],
                "scale_of(BOX)", [], "")
    if holder == "last_tensor_of_list":
        return (["TL = [torch.full((), 2.0)]"], ["TL.append(torch.full((), v))"], "TL[-1]", [], "")
    if holder == "arg_dict_on_ctx":
        return (["PD = [{'w': torch.full((), 2.0)}]"], ["PD[0]['w'] = torch.full((), v)"], "['w']", ["PD[0]"], "pd")
    if holder == "arg_object_on_ctx":
        return (["PO = [Box()]", "PO[0].w = torch.full((), 2.0)"], ["PO[0].w = torch.full((), v)"], ".w",
                ["PO[0]"], "po")
    if holder == "arg_list_on_ctx":
        return (["PL = [[torch.full((), 2.0)]]"], ["PL[0][0] = torch.full((), v)"], "[0]", ["PL[0]"], "pl")
    if holder == "arg_list_grown_on_ctx":
        return (["PG = [[torch.full((), 2.0)]]"],
                ["if v > 1:", "    PG[0].append(torch.full((), v))", "else:", "    del PG[0][1:]"], "[-1]", ["PG[0]"], "pg")
    if holder == "arg_dict_key_on_ctx":
        return (["PK = [{'a': torch.full((), 2.0)}]"],
                ["if v > 1:", "    PK[0]['b'] = torch.full((), v)", "else:", "    PK[0].pop('b', None)"],
                ".get('b', ONE)", ["PK[0]"], "pk")
    if holder == "cached_global":
        # An lru_cache helper returning a tensor computed from a global (eager: its cache's).
        return ([], ["CS[0] = v"], "cached_ramp(3)", [], "")
    if holder == "cached_pure":
        return ([], [], "cached_tri(3)", [], "")
    if holder == "helper_rebound":
        # The helper rebound (between calls, before backward) reads another global tensor.
        return ([], ["global HELPER", "HELPER = via_a if v > 1 else via_b"], "HELPER()", [], "")
    if holder == "flag_branch":
        # Backward's path depends on a flag flipped before ``.backward()``: the other path reads
        # a forward value the first did not.
        return (["FLAG = [True]"], ["FLAG[0] = v > 1"], "", [], "")
    # iterator_global
    return (["IT = [itertools.count(1)]"], [], "next(IT[0])", [], "")


def generate_outside_case(c: Chooser) -> Case:
    holders = [c.choice(OUTSIDE_HOLDERS) for _ in range(c.integer(1, 3))]
    setup: list[str] = []
    setters: list[str] = []
    make_args = ["torch.linspace(-1.0, 1.5, 3, requires_grad=True)"]
    params: list[str] = []
    fwd_terms: list[str] = []
    bwd_terms: list[str] = []
    features: list[str] = []
    for n, holder in enumerate(dict.fromkeys(holders)):
        lines, sets, expr, extra_args, param = _holder(holder)
        setup += lines
        setters += sets
        make_args += extra_args
        if param:
            params.append(param)
        if holder in _KEPT_ON_CTX:
            where = c.choice(WHERE)
            features.append(f"outside-{holder}-{where}")
            fwd_terms.append(f"_stash(ctx, 'kept_{n}', {param}){expr}" if where != "forward" else f"{param}{expr}")
            if where != "forward":
                bwd_terms.append(f"ctx.kept_{n}{expr}")
            continue
        if holder == "flag_branch":
            features.append("outside-flag_branch")
            fwd_terms.append(f"_stash(ctx, 'sin_{n}', x.sin(), 1.0)")
            bwd_terms.append(f"(ctx.sin_{n} if FLAG[0] else 1.0)")
            continue
        access = c.choice(ACCESS)
        where = "forward" if holder in _FORWARD_ONLY else c.choice(WHERE) if not param else \
            c.choice(("forward", "both"))
        defs, read = _wrap(access, expr, param, n)
        setup += defs
        features.append(f"outside-{holder}-{access}-{where}")
        if where in ("forward", "both"):
            fwd_terms.append(read)
        if where in ("backward", "both") and not param:
            bwd_terms.append(read)
        elif where == "both":
            bwd_terms.append(f"ctx.saved_value_{n}")
            fwd_terms[-1] = f"_keep(ctx, {n}, {read})"
    fwd_terms = fwd_terms or ["1.0"]
    sig = ", ".join(["x", *params])
    nones = ", None" * len(params)
    source = "\n".join([
        _PRELUDE,
        *setup,
        "",
        "",
        "def _stash(ctx, name, value, result=None):",
        "    setattr(ctx, name, value)",
        "    return value if result is None else result",
        "",
        "",
        "def _keep(ctx, n, value):",
        "    setattr(ctx, f'saved_value_{n}', value)",
        "    return value",
        "",
        "",
        "class Fuzz(Function):",
        "    @staticmethod",
        f"    def forward(ctx, {sig}):",
        "        y = x",
        *[f"        y = y * {t}" for t in fwd_terms],
        "        return y",
        "",
        "    @staticmethod",
        "    def backward(ctx, g):",
        "        out = g",
        *[f"        out = out * {t}" for t in bwd_terms],
        f"        return out{nones}",
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
        "    return {'ticks': TICKS[0]}",
        "",
        "",
        f"STEPS = {[(c.choice(_VALUES), c.choice(_VALUES)) for _ in range(c.integer(2, 4))]!r}",
        "",
    ])
    return Case(source, tuple(features))
