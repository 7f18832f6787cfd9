"""``python -m bench [question]``: see ``bench.run``. Guarded: the fuzzer's spawned workers
re-import the main module, and must not rerun it."""

if __name__ == "__main__":
    from .run import main

    raise SystemExit(main())
