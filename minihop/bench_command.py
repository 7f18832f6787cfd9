"""``python -m minihop bench [ARGS]``: minihop's benchmarks (``python -m bench``) from any directory.

Not part of the pipeline; a command-line consumer. ``bench/`` ships with minihop's source
checkout, beside the ``minihop`` package, not with an installed wheel: this finds it there and
runs ``bench.run.main`` with the arguments as given (its results still go to ``bench/``), or
says in one line where to run it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

__all__ = ["add_arguments", "bench_root", "run", "run_bench"]


def bench_root() -> Path | None:
    """The source checkout holding ``bench/`` next to this ``minihop`` package, if there is one."""
    root = Path(__file__).resolve().parents[1]
    return root if (root / "bench" / "run.py").is_file() else None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("bench_args", nargs=argparse.REMAINDER,
                        help="arguments for python -m bench (e.g. --quick, floor, --help)")


def run(options: argparse.Namespace) -> int:
    return run_bench(list(options.bench_args))


def run_bench(argv: list[str]) -> int:
    """``python -m bench`` with ``argv``, found beside this package; 2 (and one line) if absent."""
    root = bench_root()
    if root is None:
        print("minihop bench: bench/ is part of minihop's source checkout, not of the installed package; "
              "clone the repository and run `python -m bench` in it", file=sys.stderr)
        return 2
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))  # spawned fuzz workers inherit it
    from bench.run import main

    return int(main(argv))
