"""Suite-wide plugins: the Dynamo sweep (``dynamo_sweep.py``; ``-p no:dynamo_sweep`` turns it off),
and a check that each test leaves the process settings every capture depends on as it found them
(and no stand-in of minihop's in a module's globals) and makes minihop fail inside its own code
nowhere (``cache.INTERNAL_ERRORS``)."""

from __future__ import annotations

import sys

import pytest
import torch

from dynamo_sweep import SweepPlugin
from minihop.cache import INTERNAL_ERRORS
from minihop.library_state import global_module_hooks
from minihop.tracer.identity import stand_in


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(SweepPlugin(), "dynamo_sweep")


@pytest.fixture(autouse=True)
def _process_left_as_found():
    """The default dtype and the hooks registered for every module are in what a capture
    depends on: one a test leaks changes what every later test captures (a fuzz case's hook
    once made the code-watch run in the tests after it). Put back, and the test fails."""
    dtype, hooks, internal = torch.get_default_dtype(), global_module_hooks(), len(INTERNAL_ERRORS)
    yield
    leaked = []
    if torch.get_default_dtype() is not dtype:
        leaked.append(f"the default dtype {torch.get_default_dtype()}")
        torch.set_default_dtype(dtype)
    registries = torch.nn.modules.module
    for registry, kept in zip((registries._global_forward_pre_hooks, registries._global_forward_hooks), hooks):
        for handle_id in [k for k in registry if k not in kept]:
            leaked.append(f"a hook for every module ({registry[handle_id]!r})")
            del registry[handle_id]
    for name, module in list(sys.modules.items()):
        namespace = getattr(module, "__dict__", None)
        for bound in ("type", "isinstance") if isinstance(namespace, dict) else ():
            if stand_in(namespace.get(bound)):
                # (minihop's stand-ins live in the user's globals only while a trace runs)
                leaked.append(f"minihop's {bound} stand-in in {name}'s globals")
                del namespace[bound]
    if leaked:
        pytest.fail("the test left " + ", ".join(leaked) + " behind", pytrace=False)
    if len(INTERNAL_ERRORS) > internal:
        # (eager ran instead, so values matched: a capture that fails in minihop's own code
        # is a bug all the same, never a pass)
        pytest.fail("tracing failed inside minihop: " + "; ".join(INTERNAL_ERRORS[internal:]), pytrace=False)
