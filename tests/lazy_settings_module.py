"""A user's settings module with a module-level ``__getattr__`` (PEP 562), as lazy config
modules are written: ``SCALE`` is computed on each read, and each read is counted."""

READS = [0]
BASE = [2.0]


def __getattr__(name):
    if name == "SCALE":
        READS[0] += 1
        return BASE[0]
    raise AttributeError(name)
