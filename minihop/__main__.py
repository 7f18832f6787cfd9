"""``python -m minihop``: the command line.

Not part of the pipeline; a consumer of the public API. Subcommands are data: each row of
``SUBCOMMANDS`` names a module with ``add_arguments(parser)`` and ``run(options) -> int``.
With no subcommand it prints the help.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

__all__ = ["SUBCOMMANDS", "main", "make_parser"]

# name -> (module under minihop, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("demo", "capture four example Functions, print their graphs, check them against eager"),
    "show": ("show", "capture one Function on random arguments and print its graphs (--check: against eager)"),
    "bench": ("bench_command", "run minihop's benchmarks (python -m bench) from any directory of a source checkout"),
}


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m minihop",
        description="minihop: capture a torch.autograd.Function into consistent forward/backward "
                    "torch.fx graphs, without Dynamo.")
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        module = importlib.import_module(f"minihop.{module_name}")
        p = sub.add_parser(name, help=help_text, description=help_text)
        module.add_arguments(p)
        p.set_defaults(run=module.run)
    return parser


def _version() -> str:
    import torch

    import minihop

    return f"minihop {minihop.__version__} (torch {torch.__version__})"


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["bench"]:  # every later word is bench's own (its --help, --quick, ...)
        from .bench_command import run_bench

        return run_bench(argv[1:])
    parser = make_parser()
    options = parser.parse_args(argv)
    if options.command is None:
        parser.print_help()
        return 0
    return int(options.run(options))


if __name__ == "__main__":
    sys.exit(main())
