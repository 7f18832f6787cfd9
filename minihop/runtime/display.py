"""How a capture reads to a person: its printed graphs and its one-line ``repr``.

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

from .guards import show_value_key

__all__ = ["MAX_REPR", "readable", "show_key", "summary"]

MAX_REPR = 200
_ARG = 40  # the most one argument's summary takes; longer ones end in "..."
_DTYPES = {torch.float32: "f32", torch.float64: "f64", torch.float16: "f16", torch.bfloat16: "bf16",
           torch.int64: "i64", torch.int32: "i32", torch.int16: "i16", torch.int8: "i8",
           torch.uint8: "u8", torch.bool: "b8", torch.complex64: "c64", torch.complex128: "c128"}


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
    if isinstance(key, tuple) and key and key[0] == "T":
        shape = ", ".join("?" if n is None else str(n) for n in key[2])
        dtype = _DTYPES.get(key[3], str(key[3]).removeprefix("torch."))
        device = "" if getattr(key[4], "type", "cpu") == "cpu" else f" {key[4]}"
        return f"{dtype}[{shape}]{device}{' grad' if key[6] else ''}"
    if isinstance(key, tuple) and len(key) == 3 and key[0] == "V":
        return "int" if key[2] is None else repr(key[2])  # None: a symbolic int
    if isinstance(key, tuple) and len(key) >= 2 and key[0] == "O" and isinstance(key[1], type):
        return key[1].__name__  # an object: its class (its tensors are lifted)
    if isinstance(key, tuple) and len(key) == 2 and isinstance(key[0], type):
        return f"{key[0].__name__}({', '.join(_describe_arg(k) for k in key[1])})"  # a container
    return "object"


def summary(name: str, argnames: tuple[str, ...], key: tuple[Any, ...],
            dynamic_dims: dict[int, tuple[int, ...]]) -> str:
    """``Capture(MySin, x: f32[8] grad; dynamic x[0])``: one line, at most ``MAX_REPR`` chars."""
    arg_keys = key[1] if len(key) > 1 and isinstance(key[1], tuple) else ()
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
    if isinstance(key, tuple) and key and key[0] == "T":
        _, cls, shape, dtype, device, _layout, rg, attrs = key
        dims = ", ".join("*" if d is None else str(d) for d in shape)
        extra = "".join(f", .{name} {show_key(v)}" for name, v in attrs)
        return f"{cls.__name__}[{dims}] {dtype} on {device}, requires_grad={rg}{extra}"
    if isinstance(key, tuple) and key and key[0] == "V":
        return "any int (a SymInt: see dynamic sizes)" if key[1] is int and key[2] is None else f"== {key[2]!r}"
    if isinstance(key, tuple) and key and key[0] == "M":
        params = ", ".join(f"{name} {show_key(k)}" for name, k in key[3])
        return (f"the same {key[1].__name__} object, its training flags and attributes "
                f"{show_value_key(key)}; its tensors: {params or 'none'}")
    if isinstance(key, tuple) and key and key[0] in ("F", "C"):
        return f"== {show_value_key(key)}"
    return f"same structure and values ({type(key).__name__})"
