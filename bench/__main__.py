"""``python -m bench``: run every benchmark (see ``bench.run``)."""

from .run import main

raise SystemExit(main())
