"""How a capture reads to a person: its printed graphs, its one-line ``repr``, and what differs
between an argument's key at capture and in a call.

Place in the pipeline: runtime, beside ``capture`` (which calls these from ``__str__`` and
``__repr__``). Pure formatting of what a ``Capture`` already holds; nothing here runs a graph.
Invariant: ``summary`` is one line, under ``MAX_REPR`` characters whatever the arguments (a
REPL or a pytest failure shows it whole), and it names the Function, each argument's kind and
the dynamic dimensions, in the Dynamo-style shorthand ``f32[8, 4]`` the printed graphs use.
"""

from __future__ import annotations

import re
from typing import Any

import torch
import torch.fx as fx

from ..library_state import STATE, Same
from ..structure import argname
from .function_keys import show_function_key

__all__ = ["MAX_REPR", "describe_argument", "readable", "show_key", "show_value_key", "summary"]

MAX_REPR = 200
_ARG = 40  # the most one argument's summary takes; longer ones end in "..."
_DTYPES = {torch.float32: "f32", torch.float64: "f64", torch.float16: "f16", torch.bfloat16: "bf16",
           torch.int64: "i64", torch.int32: "i32", torch.int16: "i16", torch.int8: "i8",
           torch.uint8: "u8", torch.bool: "b8", torch.complex64: "c64", torch.complex128: "c128"}


def show_value_key(key: Any) -> str:
    """A value's key as the value it stands for, for a mismatch message (``2.0``, ``-0.0``,
    ``Dropout (training=True, p=0.5)``)."""
    if issubclass(type(key), tuple) and key and key[0] == "V":
        return repr(key[2])
    if issubclass(type(key), tuple) and key and key[0] == "F":
        return repr(float.fromhex(key[2])) if len(key) == 3 else repr(complex(float.fromhex(key[2]), float.fromhex(key[3])))
    if issubclass(type(key), tuple) and key and key[0] == "M":
        name, _, _, training, plain, *_ = key[4][0]
        attrs = "".join(f", {k}={show_value_key(v)}" for k, v in [kv for kv in plain if kv[0] != "training"][:6])
        subs = sum(1 for m in key[4][1:] if m[3] != training)
        return f"{key[1].__name__} (training={training}{attrs}" + (f", {subs} submodules otherwise" if subs else "") + ")"
    if issubclass(type(key), tuple) and key and key[0] == "C":
        return "class with " + ", ".join(f"{k}={show_value_key(v)}" for k, v in key[2][:6])
    if issubclass(type(key), tuple) and key and key[0] in ("fn", "Fn"):
        return show_function_key(key) if key[0] == "fn" else f"Function {key[2].obj.__qualname__} (its methods as keyed" + \
            "".join(f", {k}={show_value_key(v)}" for k, v in key[-1][:6]) + ")"
    if issubclass(type(key), tuple) and key and key[0] == "id":
        return f"the {key[1].__name__} object at {key[2]:#x}"
    if issubclass(type(key), tuple) and key and key[0] == "T":
        return f"a tensor of shape {list(key[2])}, {key[3]}, requires_grad={key[6]}"
    text = repr(key)
    return text if len(text) < 120 else text[:117] + "..."



def readable(gm: fx.GraphModule) -> str:
    """``print_readable`` with source comments removed and blank lines squashed (Dynamo's form)."""
    text = gm.print_readable(print_output=False)
    text = re.sub(r"(?m)^ *#.*\n?", "", text)
    lines = [line.rstrip() for line in text.split("\n")]
    out: list[str] = []
    for line in lines:
        if line == "" and out and out[-1] == "":
            continue
        out.append(line)
    return "\n".join(out)


def _short(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _describe_arg(key: Any) -> str:
    """One argument's guard key (``runtime.guards.value_key``) in shorthand: ``f32[8, ?] grad``."""
    if issubclass(type(key), tuple) and key and key[0] == "T":
        shape = ", ".join("?" if n is None else str(n) for n in key[2])
        dtype = _DTYPES.get(key[3], str(key[3]).removeprefix("torch."))
        device = "" if getattr(key[4], "type", "cpu") == "cpu" else f" {key[4]}"
        return f"{dtype}[{shape}]{device}{' grad' if key[6] else ''}"
    if issubclass(type(key), tuple) and len(key) == 3 and key[0] == "V":
        return "int" if key[2] is None else repr(key[2])  # None: a symbolic int
    if issubclass(type(key), tuple) and len(key) >= 2 and key[0] == "O" and issubclass(type(key[1]), type):
        return key[1].__name__  # an object: its class (its tensors are lifted)
    if issubclass(type(key), tuple) and len(key) == 2 and issubclass(type(key[0]), type):
        return f"{key[0].__name__}({', '.join(_describe_arg(k) for k in key[1])})"  # a container
    return "object"


def summary(name: str, argnames: tuple[str, ...], key: tuple[Any, ...],
            dynamic_dims: dict[int, tuple[int, ...]]) -> str:
    """``Capture(MySin, x: f32[8] grad; dynamic x[0])``: one line, at most ``MAX_REPR`` chars."""
    arg_keys = key[1] if len(key) > 1 and issubclass(type(key[1]), tuple) else ()
    names = [argnames[i] if i < len(argnames) else f"arg{i}" for i in range(len(arg_keys))]
    args = ", ".join(f"{n}: {_short(_describe_arg(k), _ARG)}" for n, k in zip(names, arg_keys, strict=True))
    dims = ", ".join(f"{names[i] if i < len(names) else i}{list(d) if d else ''}"
                     for i, d in sorted(dynamic_dims.items()))
    grad_mode = "" if not key or key[0] else "; no_grad"
    line = f"Capture({name}, {args}{'; dynamic ' + dims if dims else ''}{grad_mode})"
    if len(line) >= MAX_REPR:
        line = line[:MAX_REPR - 5] + "...)"
    return line


def show_key(key: Any) -> str:
    """An argument's or a value's key (``guards.value_key``) as a guard reads to a person:
    ``Tensor[3] torch.float32 on cpu, requires_grad=True``, ``== 2.0``."""
    if issubclass(type(key), tuple) and key and key[0] == "T":
        _, cls, shape, dtype, device, _layout, rg, attrs = key
        dims = ", ".join("*" if d is None else str(d) for d in shape)
        extra = "".join(f", .{name} {show_key(v)}" for name, v in attrs)
        return f"{cls.__name__}[{dims}] {dtype} on {device}, requires_grad={rg}{extra}"
    if issubclass(type(key), tuple) and key and key[0] == "V":
        return "any int (a SymInt: see dynamic sizes)" if key[1] is int and key[2] is None else f"== {key[2]!r}"
    if issubclass(type(key), tuple) and key and key[0] == "M":
        params = ", ".join(f"{name} {show_key(k)}" for name, k in key[3])
        return (f"the same {key[1].__name__} object, its training flags and attributes "
                f"{show_value_key(key)}; its tensors: {params or 'none'}")
    if issubclass(type(key), tuple) and key and key[0] in ("F", "C"):
        return f"== {show_value_key(key)}"
    if issubclass(type(key), tuple) and key[:1] in ((list,), (tuple,), (dict,)) and len(key) == 2:
        return f"== {_leaf(key)}"  # (a plain container: its items, as they read)
    if issubclass(type(key), tuple) and key[:1] == ("fn",):
        return f"the same {show_function_key(key)}, its code and defaults"
    return f"same structure and values ({type(key).__name__})"


# What each position of a key is, by the key's kind (``guards.value_key``; a module's part per
# submodule is ``guards._module_state``).
_PARTS = {"T": {2: "shape", 3: "dtype", 4: "device", 5: "layout", 6: "requires_grad", 7: "attributes"},
          "M": {3: "tensors", 5: "hooks registered for every module"},
          "module": {0: "name", 1: "class", 2: "object", 3: "training", 4: "attributes", 5: "hooks",
                     6: "class's forward", 7: "class"},
          "O": {1: "class", 2: "attributes", 3: "class"}, "C": {2: "class attributes"}, "L": {1: "class", 3: "object"},
          "Fn": {2: "class", 3: "forward", 4: "backward", 5: "setup_context", 6: "class attributes"}}


def describe_argument(i: int, expected: Any, found: Any, argnames: tuple[str, ...]) -> str:
    """Argument ``i``'s key at capture and in a call, for a mismatch message: the first part
    that differs, with its value at capture and now (never the key tuples themselves)."""
    where, old, new = ("", expected, found) if issubclass(type(expected), tuple) and expected[:1] == ("T",) \
        else _difference(expected, found, "")
    shown = [_leaf(old), _leaf(new)]
    values = all(issubclass(type(k), tuple) and k[:1] == ("V",) for k in (old, new))
    if values and (shown[0] == shown[1] or old[1] is not new[1]):
        shown = [f"{text} ({type(key[2]).__name__})" for text, key in zip(shown, (old, new))]
    return f"argument {i} ({argname(i, argnames)}){where}:\n  captured: {shown[0]}\n  found:    {shown[1]}"


def _difference(a: Any, b: Any, where: str, kind: str = "") -> tuple[str, Any, Any]:
    tagged = bool(a) and issubclass(type(a[0]), str) if issubclass(type(a), tuple) else False
    if not (issubclass(type(a), tuple) and issubclass(type(b), tuple) and len(a) == len(b)) or (tagged and a[0] != b[0]) \
            or a[:1] in (("V",), ("F",)) and not (len(a) > 3 and a[:3] == b[:3]):  # (past 3: its attributes)
        return where, a, b
    if a and a[0] in (list, tuple, dict) and a[0] is b[0]:  # a container's items
        if len(a[1]) != len(b[1]):
            return where, a, b
        for n, (x, y) in enumerate(zip(a[1], b[1], strict=True)):
            if x != y:
                if a[0] is dict:
                    return _difference(x[1], y[1], f"{where}[{_leaf(x[0])}]") if x[0] == y[0] else (where, a, b)
                return _difference(x, y, f"{where}[{n}]")
    kind = a[0] if a and issubclass(type(a[0]), str) and a[0] in _PARTS else kind
    for n, (x, y) in enumerate(zip(a, b, strict=True)):
        if x != y:
            if kind == "M" and n == 4:  # per submodule: (name, class, id, training, attributes, ...)
                for p, q in zip(x, y, strict=False):
                    if p != q:
                        return _difference(p, q, f"{where}, submodule {p[0] or '(itself)'!r}", "module")
            if issubclass(type(x), tuple) and issubclass(type(y), tuple) and len(x) == len(y) == 2 and issubclass(type(x[0]), str) \
                    and x[0] == y[0] and not x[0] in _PARTS and not x[0] in ("V", "F"):
                if x[0] == STATE:  # what a library object hands pickle: its innermost values
                    return f"{where}, its own state (as pickle shows it)", *_difference(x[1], y[1], "")[1:]
                return _difference(x[1], y[1], f"{where}, {x[0]}")  # an (attribute name, key) pair
            label = _PARTS.get(kind, {}).get(n)
            if kind == "T" and label is not None:
                return f"{where}, {label}", x, y  # a tensor's shape, dtype, ...: whole
            step = f", {label}" if label else (f"[{n}]" if kind == "" else "")
            return _difference(x, y, where + step, "" if label in ("tensors", "attributes") else kind)
    return where, a, b


def _leaf(key: Any) -> str:
    """One part of a key as the value it stands for."""
    if issubclass(type(key), Same):
        if (obj := key.obj) is None:
            return repr(key)  # (held weakly, since died: ``<dead object at 0x...>``)
        return f"{getattr(obj, '__module__', '')}.{getattr(obj, '__qualname__', repr(obj))}"
    if issubclass(type(key), tuple) and key[:1] == ("T",):
        _, cls, shape, dtype, device, _layout, rg, attrs = key
        extra = "".join(f", .{name}={_leaf(v)}" for name, v in attrs)
        return f"{cls.__name__}(shape={list(shape)}, dtype={dtype}, device={device}, requires_grad={rg}{extra})"
    if issubclass(type(key), tuple) and key[:1] in (("V",), ("F",), ("M",), ("C",), ("fn",), ("Fn",), ("id",)):
        return show_value_key(key)
    if issubclass(type(key), tuple) and key[:1] in ((list,), (tuple,)) and len(key) > 1:
        inner = ", ".join(_leaf(k) for k in key[1])
        return f"[{inner}]" if key[0] is list else f"({inner}{',' if len(key[1]) == 1 else ''})"
    if issubclass(type(key), tuple) and key[:1] == (dict,) and len(key) > 1:
        return "{" + ", ".join(f"{_leaf(k)}: {_leaf(v)}" for k, v in key[1]) + "}"
    if issubclass(type(key), tuple) and key[:1] == ("O",) and len(key) > 2:
        attrs = ", ".join(f"{k}={_leaf(v)}" for k, v in key[2][:4])
        return f"a {key[1].__qualname__} object ({attrs}{', ...' if len(key[2]) > 4 else ''})"
    if issubclass(type(key), type):
        return key.__qualname__
    text = repr(key)
    return text if len(text) < 100 else text[:97] + "..."
