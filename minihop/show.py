"""``python -m minihop show module:Function --args "f32[8,8], f32[8,8]"``: look at a capture.

Not part of the pipeline; a consumer of the public API. It imports the user's Function,
makes random arguments from the ``--args`` spec, prints the capture (``--explain`` adds the
report of ``minihop.explain``), and with ``--check`` runs it against eager.

Argument spec: comma-separated items, each a tensor ``DTYPE[d0,d1,...]`` (``f32``, ``f64``,
``f16``, ``bf16``, ``i64``, ``i32``, ``bool``; a trailing ``!`` means requires_grad=False) or a
Python literal (``2.0``, ``3``, ``'mode'``, ``None``).
"""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
import re
import sys
from typing import Any

import torch

__all__ = ["add_arguments", "run", "parse_args_spec", "load_function"]

_DTYPES = {"f32": torch.float32, "f64": torch.float64, "f16": torch.float16, "bf16": torch.bfloat16,
           "i64": torch.int64, "i32": torch.int32, "bool": torch.bool}
_MODULE = "_minihop_show_target"  # the name a FILE.py target is loaded under
_TENSOR = re.compile(r"^(?P<dtype>[a-z0-9]+)\[(?P<dims>[\d,\s]*)\](?P<nograd>!?)$")


def parse_args_spec(spec: str, seed: int = 0) -> tuple[Any, ...]:
    """``"f32[8,8], 2.0"`` -> (a random 8x8 float tensor requiring grad, 2.0)."""
    gen = torch.Generator().manual_seed(seed)
    items = [s.strip() for s in re.split(r",(?![^\[]*\])", spec) if s.strip()]
    args: list[Any] = []
    for item in items:
        match = _TENSOR.match(item)
        if match is None:
            try:
                args.append(ast.literal_eval(item))
            except (ValueError, SyntaxError) as e:
                raise SystemExit(f"--args: cannot read {item!r}: a tensor is DTYPE[dims] "
                                 f"(DTYPE one of {', '.join(_DTYPES)}), else a Python literal") from e
            continue
        dtype = _DTYPES.get(match["dtype"])
        if dtype is None:
            raise SystemExit(f"--args: unknown dtype {match['dtype']!r} in {item!r}; use one of {', '.join(_DTYPES)}")
        shape = [int(d) for d in match["dims"].split(",") if d.strip()]
        if dtype.is_floating_point:
            t = torch.randn(shape, generator=gen).to(dtype)
            t.requires_grad_(not match["nograd"])
        elif dtype == torch.bool:
            t = torch.randint(0, 2, shape, generator=gen).bool()
        else:
            t = torch.randint(-5, 5, shape, generator=gen).to(dtype)
        args.append(t)
    return tuple(args)


def load_function(target: str) -> type:
    """``package.module:Name`` (or ``path/to/file.py:Name``) -> the class."""
    module_name, _, name = target.partition(":")
    if not name:
        raise SystemExit(f"show: expected MODULE:FUNCTION, got {target!r}")
    if module_name.endswith(".py"):
        spec = importlib.util.spec_from_file_location(_MODULE, module_name)
        if spec is None or spec.loader is None:
            raise SystemExit(f"show: cannot load {module_name}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(module_name)
    obj: Any = module
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("function", help="MODULE:FUNCTION or FILE.py:FUNCTION (an autograd.Function)")
    parser.add_argument("--args", required=True, help='argument spec, e.g. "f32[8,8], f32[8,8], 2.0"')
    parser.add_argument("--check", action="store_true", help="run the capture against eager on these arguments")
    parser.add_argument("--explain", action="store_true", help="also print minihop.explain's report")
    parser.add_argument("--dynamic", action="store_true", help="capture with dynamic shapes")
    parser.add_argument("--seed", type=int, default=0, help="seed for the random arguments")


def _fail(message: str) -> int:
    """A ``show`` error: one line on stderr, exit status 2."""
    print(f"minihop show: {' '.join(message.split())}", file=sys.stderr)
    return 2


def _plain(error: BaseException, target: str) -> str:
    """An error's message with the name ``show`` loads a file under replaced by the file's."""
    return str(error).replace(f"module '{_MODULE}'", f"'{target.partition(':')[0]}'").replace(_MODULE, "the file")


def run(options: argparse.Namespace) -> int:
    import minihop
    from minihop.testing import assert_matches_eager

    sys.path.insert(0, ".")
    try:
        fn_cls = load_function(options.function)
    except SystemExit:
        raise
    except Exception as e:  # the user's file or module: one line, never minihop's internals
        return _fail(f"cannot load {options.function}: {type(e).__name__}: {_plain(e, options.function)}")
    args = parse_args_spec(options.args, options.seed)
    try:
        cap = minihop.capture(fn_cls, *args, dynamic=options.dynamic)
    except minihop.MinihopError as e:
        # The coded first line (what was found); the full message is minihop.explain's.
        return _fail(f"{str(e).splitlines()[0]} (why, and what to do: minihop.explain, docs/unsupported.md)")
    if options.explain:
        minihop.explain(fn_cls, *args, dynamic=options.dynamic)  # its report holds the graphs
    else:
        print(cap)
    if options.check:
        try:
            assert_matches_eager(fn_cls, *args)
        except AssertionError as e:
            print(f"MISMATCH {fn_cls.__qualname__}: {e}")
            return 1
        print(f"ok {fn_cls.__qualname__}: outputs and every grad match eager")
    return 0
