"""The per-call checks a capture's assumptions compile to: generated once, run on every call.

Place in the pipeline: runtime, beside ``guards`` (which says what a key *is*; this says how a
call is checked against one cheaply). ``compile_guard`` checks the arguments' key without
building key tuples; ``compile_live_check`` checks the values a capture read outside its
arguments (globals, cells, attributes, another Function's class). Each generated check has a
fast test (identity, plain values) and falls back on comparing the full key, so a fast test
that fails only costs time: it never accepts what the full key would refuse.
"""

from __future__ import annotations

import abc
import functools
import io
import operator
import tokenize
import types
from collections.abc import Callable
from typing import Any

import torch

from ..arguments import STRICT_MARKS
from .function_keys import same_function
from .guards import (CODE, FN_METHODS, FN_OWN, PLAIN, _any_autocast, _default_dtype, autocast_key,
                     class_attributes, code_key, function_class_state, masked_key, python_attributes,
                     user_bases, user_metaclass, value_key)

__all__ = ["compile_guard", "compile_live_check", "merge_checks"]

EMPTY_TUPLE = (tuple, ())  # ``value_key(())``


@functools.lru_cache(maxsize=1024)
def _compiled(source: str) -> types.CodeType:
    """A guard's source compiled once: the captures of one Function (other shapes, the same
    values) write the same guard code; the values it compares come from its namespace."""
    return compile(source, "<minihop guard>", "exec")


def _generated(lines: list[str], consts: dict[str, Any]) -> Callable[[tuple[Any, ...]], bool]:
    """``args -> bool``: ``lines`` (its body, each failed test returning False) over ``consts``.
    The function keeps its body (``_PARTS``), so that ``merge_checks`` can join several."""
    namespace = dict(consts)
    exec(_compiled("\n".join(("def check(args):", *lines, "    return True"))), namespace)
    check: Callable[[tuple[Any, ...]], bool] = namespace["check"]
    setattr(check, _PARTS, (tuple(lines), consts))
    return check


_PARTS = "_minihop_check_parts"


def merge_checks(checks: list[Callable[[tuple[Any, ...]], bool]]) -> Callable[[tuple[Any, ...]], bool] | None:
    """One generated function equal to ``all(c(args) for c in checks)``: their bodies one after
    the other, each one's names renamed apart (``k0`` of the second is ``k0_1``), so a hit runs
    one frame instead of one per check. None unless every check is a generated one."""
    parts = [getattr(c, _PARTS, None) for c in checks]
    if any(p is None for p in parts):
        return None
    lines: list[str] = []
    consts: dict[str, Any] = {}
    for j, (body, names) in enumerate(parts):  # type: ignore[misc]
        consts.update((f"{n}_{j}", v) for n, v in names.items())
        renamed = _renamed_body(body, tuple(names), j)
        if renamed is None:
            return None
        lines += renamed
    return _generated(lines, consts)


@functools.lru_cache(maxsize=1024)
def _renamed_body(body: tuple[str, ...], names: tuple[str, ...], j: int) -> tuple[str, ...] | None:
    """``body`` with each of ``names`` renamed ``name_j`` (once per distinct body: the captures
    of one Function write the same), or None for a line that is not whole on its own."""
    renamed = {n: f"{n}_{j}" for n in names}
    try:
        return tuple(_renamed(line, renamed) for line in body)
    except (tokenize.TokenError, SyntaxError):
        return None


def _renamed(line: str, names: dict[str, str]) -> str:
    """``line`` with each name in ``names`` renamed: a name token, not an attribute
    (``args[0].dtype`` keeps its ``dtype``) nor text inside a string."""
    out: list[str] = []
    tokens = list(tokenize.generate_tokens(io.StringIO(line).readline))
    end = 0
    for k, tok in enumerate(tokens):
        if tok.type == tokenize.NAME and tok.string in names and not (k and tokens[k - 1].string == "."):
            out += [line[end:tok.start[1]], names[tok.string]]
            end = tok.end[1]
    return "".join(out) + line[end:]


def compile_guard(key: tuple[Any, ...], masks: dict[int, frozenset[str]] | None = None) -> Callable[[tuple[Any, ...]], bool]:
    """A function ``args -> bool`` equal to ``call_key(args, dynamic) == key``, generated once.

    Tensors and plain values get direct attribute checks (no key tuples built per call);
    anything else falls back to comparing its key. Dynamic dimensions (``None`` in the key's
    shape) are not checked here: the capture's shape guards check them.
    """
    grad_mode, arg_keys = key[:2]
    autocast = key[2] if len(key) > 2 else None
    lines = [f"    if len(args) != {len(arg_keys)} or is_grad() is not {grad_mode} or default_dtype() is not dtype:",
             "        return False"]
    if autocast is None:
        lines += ["    if any_autocast():", "        return False"]
    else:
        lines += ["    if autocast_key() != autocast:", "        return False"]
    consts: dict[str, Any] = {"is_grad": torch.is_grad_enabled, "key_of": value_key, "autocast": autocast,
                              "default_dtype": _default_dtype, "dtype": key[3] if len(key) > 3 else torch.float32,
                              "no_marks": frozenset(), "any_autocast": _any_autocast,
                              "autocast_key": autocast_key, "masked_key": masked_key}
    for i, k in enumerate(arg_keys):
        a = f"args[{i}]"
        consts[f"k{i}"] = k
        if issubclass(type(k), tuple) and k and k[0] == "T" and not (masks and i in masks):
            lines.append(f"    arg{i} = {a}")  # (a tensor's checks load it once)
            a = f"arg{i}"
        if masks and i in masks:
            consts[f"m{i}"] = masks[i]
            lines += [f"    if masked_key({a}, m{i}) != k{i}:", "        return False"]
            continue
        if issubclass(type(k), tuple) and k and k[0] == "T":
            _, cls, shape, dtype, device, layout, rg, attrs = k
            consts.update({f"c{i}": cls, f"d{i}": dtype, f"v{i}": device, f"l{i}": layout,
                           f"a{i}": attrs, "attrs_of": python_attributes})
            # Cheapest first; a CPU tensor's device is always plain "cpu", so is_cpu decides it.
            device_check = f"{a}.is_cpu" if device == torch.device("cpu") else f"{a}.device == v{i}"
            checks = [f"type({a}) is c{i}", f"{a}.dtype is d{i}", f"{a}.requires_grad is {rg}",
                      device_check, f"{a}.layout is l{i}"]
            # Dimensions marked with Dynamo's mark_dynamic must be symbolic here.
            consts[f"y{i}"] = frozenset(d for d, n in enumerate(shape) if n is None) | frozenset(
                d - len(shape) for d, n in enumerate(shape) if n is None)
            checks.append(f"getattr({a}, '{STRICT_MARKS}', no_marks) <= y{i}")
            # Python attributes set on the tensor (``x.scale = 2.0``): usually none at all.
            checks.append(f"(not {a}.__dict__ and not a{i} or attrs_of({a}) == a{i})")
            if None in shape:
                checks.append(f"{a}.dim() == {len(shape)}")
                checks += [f"{a}.shape[{d}] == {n}" for d, n in enumerate(shape) if n is not None]
            else:
                consts[f"s{i}"] = torch.Size(shape)
                checks.append(f"{a}.shape == s{i}")
            lines.append(f"    if not ({' and '.join(checks)}):")
        elif issubclass(type(k), tuple) and k and k[0] == "V" and k[1] is int and k[2] is None:
            lines.append(f"    if type({a}) is not int:")  # a dynamic int (shape guards check it)
        elif issubclass(type(k), tuple) and k and k[0] == "V" and k[1] in PLAIN:
            consts[f"t{i}"] = k[1]
            lines.append(f"    if not (type({a}) is t{i} and {a} == k{i}[2]):")
        elif k == EMPTY_TUPLE:  # (what a tensor argument holds of the names backward reads: usually nothing)
            lines.append(f"    if type({a}) is not tuple or {a}:")
        else:
            lines.append(f"    if key_of({a}) != k{i}:")
        lines.append("        return False")
    return _generated(lines, consts)


def compile_live_check(fetchers: tuple[Callable[[tuple[Any, ...]], Any], ...],
                       captured: tuple[Any, ...]) -> Callable[[tuple[Any, ...]], bool]:
    """``args -> bool``: whether each value ``fetchers`` read now has the key it had at capture
    (``captured``, from ``value_key``), generated once. A plain number, string, bool or None
    is compared directly (no key built per call); anything else by its key."""
    lines: list[str] = []
    consts: dict[str, Any] = {"key_of": value_key}
    for i, (fetch, key) in enumerate(zip(fetchers, captured, strict=True)):
        consts[f"f{i}"] = fetch
        consts[f"k{i}"] = key
        if issubclass(type(key), tuple) and len(key) == 3 and key[0] == "V" and key[1] in PLAIN:
            consts[f"t{i}"], consts[f"v{i}"] = key[1], key[2]
            lines += [f"    v = f{i}(args)", f"    if type(v) is not t{i} or v != v{i}:", "        return False"]
        elif key == EMPTY_TUPLE:
            lines += [f"    v = f{i}(args)", "    if type(v) is not tuple or v:", "        return False"]
        elif same_function(key):
            # A function, its code and defaults the very objects keyed (held here): no key built.
            fn = key[2].obj
            consts[f"o{i}"], consts[f"c{i}"], consts[f"d{i}"] = fn, fn.__code__, fn.__defaults__
            consts[f"n{i}"], consts[f"q{i}"] = fn.__name__, fn.__qualname__
            lines += [f"    v = f{i}(args)",
                      f"    if not (v is o{i} and v.__code__ is c{i} and v.__defaults__ is d{i} and v.__kwdefaults__ is None"
                      f" and v.__name__ is n{i} and v.__qualname__ is q{i} and not v.__dict__)"
                      f" and key_of(v) != k{i}:", "        return False"]
        elif issubclass(type(key), tuple) and key[:1] == ("Fn",) and all(same_function(k) for k in key[3:-1]):
            # another Function, its methods the keyed ones, its other attributes the same
            consts[f"o{i}"], consts[f"s{i}"], consts["fn_state"] = key[2].obj, key[-1], function_class_state
            consts[f"w{i}"] = class_watch(key[2].obj, key[-1], FN_OWN) or (lambda cls, s=key[-1]: function_class_state(cls) == s)
            test = [f"v is o{i}", f"w{i}(v)"]
            for m, method_key in zip(FN_METHODS, key[3:-1], strict=True):
                fn = consts[f"m{i}{m}"] = method_key[2].obj
                consts[f"c{i}{m}"], consts[f"d{i}{m}"] = fn.__code__, fn.__defaults__
                consts[f"n{i}{m}"], consts[f"q{i}{m}"] = fn.__name__, fn.__qualname__
                got = f"v.{m}.__func__" if issubclass(type(getattr(key[2].obj, m)), types.MethodType) else f"v.{m}"  # a classmethod
                test.append(f"{got} is m{i}{m} and m{i}{m}.__code__ is c{i}{m} and m{i}{m}.__defaults__ is d{i}{m}"
                            f" and m{i}{m}.__name__ is n{i}{m} and m{i}{m}.__qualname__ is q{i}{m}")
            lines += [f"    v = f{i}(args)", f"    if not ({' and '.join(test)}) and key_of(v) != k{i}:", "        return False"]
        else:
            lines += [f"    if key_of(f{i}(args)) != k{i}:", "        return False"]
    # A fetch that raises (the place's owner replaced by an object without that attribute)
    # is a changed value: the guard fails, and tracing again meets the change as eager does.
    body = ["    try:", *("    " + line for line in lines), "    except Exception:", "        return False"]
    return _generated(body if lines else lines, consts)


def class_watch(cls: type, state: tuple[Any, ...], skip: frozenset[str]) -> Callable[[type], bool] | None:
    """``cls -> bool``: whether ``cls``'s attribute state is still ``state`` (``guards.
    _class_state``'s key), mostly without building it: every attribute of its user classes is
    the very object it was now (so a plain number, string or None is the same value), and only
    what can change in place (a list, a function's code) is keyed again. None where ``state``
    is not the class's state now, or for an ABC or a class of a user metaclass (its registry,
    the metaclass's attributes are part of the key)."""
    if issubclass(type(cls), abc.ABCMeta) or user_metaclass(cls) or function_class_state(cls) != state:
        return None
    inner, mro, name, qualname = frozenset({id(cls)}), cls.__mro__, cls.__name__, cls.__qualname__
    keyed = dict(state)
    # A class's namespace is fixed for its life: the views stay views of the live dicts.
    held = tuple((vars(k), len(vars(k)), tuple(vars(k)), tuple(vars(k).values())) for k in user_bases(cls))
    changeable = tuple((v, keyed[k]) for k, v in class_attributes(cls, skip).items() if type(v) not in PLAIN)
    is_, all_, map_, len_ = operator.is_, all, map, len

    def unchanged(klass: type) -> bool:
        # The same MRO (no base assigned); in each class, the same number of entries, the
        # same key objects and the same value objects: the same entries.
        return klass.__mro__ is mro and klass.__name__ is name and klass.__qualname__ is qualname and all_(
            len_(names) == n and all_(map_(is_, names, ks)) and all_(map_(is_, names.values(), vs))
            for names, n, ks, vs in held) and (not changeable or all_(
                (code_key(v, inner) if issubclass(type(v), CODE) else value_key(v, inner)) == k for v, k in changeable))
    return unchanged
