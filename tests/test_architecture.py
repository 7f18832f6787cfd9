"""The package's shape, read from its source: the import table of docs/ARCHITECTURE.md holds for
the code (stages import no other stage, only the pipeline entry imports the tracer), there are
no import cycles, and the public face (``minihop.__all__``) is pinned and documented."""

from __future__ import annotations

import ast
import re
from pathlib import Path


import minihop

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "minihop"
ARCHITECTURE = ROOT / "docs" / "ARCHITECTURE.md"

# The public face: what a user calls. Adding a name is a decision (document it, then add it here).
PUBLIC = [
    "BackwardOutputError", "CacheStats", "Capture", "CapturedFunction", "CtxArgumentError",
    "DataDependentError", "Explanation", "GuardMismatchError", "InconsistentGraphsError",
    "InplaceInputError", "MinihopError", "MinihopWarning", "PairShape", "SideEffectError", "UnsupportedArgumentError",
    "UnsupportedOperationError", "UnsupportedOutputError", "apply", "capture", "captured",
    "check_consistent", "clear_cache", "counters", "explain", "function", "load", "ops", "reset",
    "testing", "trace", "with_graphs",
]
STAGES_AND_HELPERS = ("api", "cache", "pipeline", "program", "rewire", "runtime", "spec", "structure", "tracer")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """The minihop modules ``path`` imports (anywhere in it, function bodies included)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("minihop"):
                continue
            for alias in node.names:  # ``from . import ops`` imports the module minihop.ops
                sub = f"{target}.{alias.name}"
                found.add(sub if (PACKAGE.parent / (sub.replace(".", "/") + ".py")).exists()
                          or (PACKAGE.parent / sub.replace(".", "/")).is_dir() else target)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("minihop")}
    return found - {name}


GRAPH = {module_name(p): imports_of(p) for p in sorted(PACKAGE.rglob("*.py"))}


def layer_table() -> dict[str, tuple[set[str], set[str]]]:
    """docs/ARCHITECTURE.md's table: layer -> (its modules, the layers it imports)."""
    rows = re.findall(r"^\| (\w+) \| (.+?) \| (.+?) \|$", ARCHITECTURE.read_text(), re.M)
    table = {}
    for layer, modules, imported in rows:
        if layer == "layer":
            continue
        mods = set(re.findall(r"`([\w/*]+)`", modules))
        table[layer] = (mods, set() if imported.strip() == "—" else {s.strip() for s in imported.split(",")})
    return table


def layer_of(module: str, table: dict[str, tuple[set[str], set[str]]]) -> str:
    short = module.removeprefix("minihop").lstrip(".") or "__init__"
    hits = [layer for layer, (mods, _) in table.items()
            if short in mods or f"{short.split('.')[0]}/*" in mods]
    assert len(hits) == 1, f"{module} is in {hits or 'no layer'} of docs/ARCHITECTURE.md's table"
    return hits[0]


def test_architecture_page_is_one_page() -> None:
    assert len(ARCHITECTURE.read_text().splitlines()) <= 60


def test_import_table_matches_the_code() -> None:
    """Each layer imports exactly the layers its row names: no more (a stage reaching into
    another), no fewer (a stale row)."""
    table = layer_table()
    assert set(table) == {"above", "pipeline", "tracer", "rewire", "runtime", "spec", "structure", "errors"}
    actual: dict[str, set[str]] = {layer: set() for layer in table}
    for module, deps in GRAPH.items():
        actual[layer_of(module, table)] |= {layer_of(d, table) for d in deps}
    for layer, (_, allowed) in table.items():
        assert actual[layer] == allowed, f"{layer} imports {sorted(actual[layer])}; the table says {sorted(allowed)}"


def test_only_the_pipeline_entry_runs_the_stages() -> None:
    """No module outside ``minihop.pipeline`` (and the stage itself) imports a stage."""
    for stage in ("tracer", "rewire", "runtime"):
        for module, deps in GRAPH.items():
            if module == "minihop.pipeline" or module.startswith(f"minihop.{stage}"):
                continue
            reached = sorted(d for d in deps if d.startswith(f"minihop.{stage}"))
            assert not reached, f"{module} imports {reached}"


def test_no_import_cycles() -> None:
    state: dict[str, int] = {}

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for dep in GRAPH.get(module, ()):
            if dep not in GRAPH:
                continue
            assert state.get(dep) != 1, "import cycle: " + " -> ".join([*path, module, dep])
            if dep not in state:
                visit(dep, [*path, module])
        state[module] = 2

    for module in GRAPH:
        if module not in state:
            visit(module, [])


def test_public_names_are_pinned() -> None:
    assert minihop.__all__ == sorted(PUBLIC, key=lambda n: (n[0].islower(), n))
    for name in PUBLIC:
        assert hasattr(minihop, name), name


def test_each_public_name_is_documented() -> None:
    """Each name in ``__all__`` has a docstring and is named in the README."""
    readme = (ROOT / "README.md").read_text()
    for name in PUBLIC:
        value = getattr(minihop, name)
        assert (value.__doc__ or "").strip(), f"minihop.{name} has no docstring"
        assert re.search(rf"\bminihop\.{name}\b|`{name}`", readme), f"README never names minihop.{name}"


def test_stages_are_not_presented_as_public() -> None:
    """The stages and helpers are not in ``__all__``, nor offered to users as ``minihop.<stage>``
    in the README or the public docstrings."""
    readme = (ROOT / "README.md").read_text()
    for name in STAGES_AND_HELPERS:
        assert name not in minihop.__all__
        assert not re.search(rf"\bminihop\.{name}\b", readme), f"README presents minihop.{name}"
        for public in PUBLIC:
            doc = getattr(minihop, public).__doc__ or ""
            assert not re.search(rf"\bminihop\.{name}\b", doc), f"minihop.{public}'s docstring names minihop.{name}"


def test_no_module_imports_dynamo() -> None:
    """Nothing in minihop/ imports torch._dynamo, at module level or inside a function (the
    design card: minihop does what Dynamo does without it; tests may use torch.compile)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            found += [f"{path.relative_to(ROOT)}:{node.lineno} {n}" for n in names
                      if n == "torch._dynamo" or n.startswith("torch._dynamo.")]
            if isinstance(node, ast.ImportFrom) and node.module == "torch":
                found += [f"{path.relative_to(ROOT)}:{node.lineno} torch._dynamo"
                          for a in node.names if a.name == "_dynamo"]
    assert not found, found


# Where minihop calls ``isinstance`` itself: only to answer the user's own question as eager
# does (``identity.ISINSTANCE`` and ``TYPE``, stand-ins bound in the user's code while traced).
ASKS_AS_EAGER = {("minihop/tracer/identity.py", "ISINSTANCE"), ("minihop/tracer/identity.py", "__instancecheck__")}


def test_minihop_asks_a_value_its_type_never_its_class() -> None:
    """minihop's own code classifies a value by ``type(v)`` (``issubclass(type(v), C)``), never
    by ``isinstance(v, C)``: that asks ``v.__class__`` whenever ``type(v)`` is not a ``C``,
    running a forwarding proxy's or a counting object's own code (issue 28, round 17;
    ``tests/test_outside_spellings_12.py``)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        where = str(path.relative_to(ROOT))
        tree = ast.parse(path.read_text())
        allowed = {id(node) for fn in ast.walk(tree) if isinstance(fn, ast.FunctionDef) and (where, fn.name) in ASKS_AS_EAGER
                   for node in ast.walk(fn)}
        found += [f"{where}:{node.lineno}" for node in ast.walk(tree) if isinstance(node, ast.Call)
                  and isinstance(node.func, ast.Name) and node.func.id == "isinstance" and id(node) not in allowed]
    assert not found, found


MAX_MODULE_LINES = 450
# Modules still over the limit (issue 28, "shape of the code"). Remove a module from this list
# when it is split; when the list is empty, remove the xfail mark below (strict: it fails then).
STILL_OVER: list[str] = []


def module_sizes() -> dict[str, int]:
    return {str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in sorted(PACKAGE.rglob("*.py"))}


def test_no_other_module_grows_over_the_size_limit() -> None:
    """No module but those still being split is over 450 lines (house style)."""
    over = {path: n for path, n in module_sizes().items() if n > MAX_MODULE_LINES and path not in STILL_OVER}
    assert not over, f"over {MAX_MODULE_LINES} lines: {over}; split them (docs/ARCHITECTURE.md)"


def test_no_module_is_over_the_size_limit() -> None:
    """Every module in minihop/ reads in one sitting: at most 450 lines (house style)."""
    over = {path: n for path, n in module_sizes().items() if n > MAX_MODULE_LINES}
    assert not over, over


def test_recorder_special_calls_are_table_rows() -> None:
    """The recording mode finds every call it handles itself in special_calls' table (issue 33
    item 7): no ``func is ...`` chain for the numpy bridge or collectives in recorder.py, and
    the table has their rows."""
    import torch
    import torch.distributed as dist

    from minihop.tracer import special_calls

    recorder = PACKAGE / "tracer" / "recorder.py"
    reached = {d.rsplit(".", 1)[-1] for d in GRAPH[module_name(recorder)]}
    assert not reached & {"numpy_bridge", "collectives"}, sorted(reached)
    compared = [ast.unparse(node) for node in ast.walk(ast.parse(recorder.read_text()))
                if isinstance(node, ast.Compare) and isinstance(node.left, ast.Name) and node.left.id == "func"]
    assert compared == ["func is torch.Tensor.__setitem__"], compared
    for func in (torch.from_numpy, torch.as_tensor, torch.Tensor.numpy, dist.all_reduce, dist.broadcast,
                 torch.Tensor.backward, torch._C._set_grad_enabled):
        assert special_calls.special_call(func) is not None, func
    for func in (torch.add, torch.Tensor.add, torch.Tensor.item):
        assert special_calls.special_call(func) is None, func
