"""Which modules, functions and classes are the user's and which a library's.

Place in the pipeline: tracer, asked by the read analysis (``roots``), the heap watch
(``heap``), ``pystate`` and ``routes``. A library's module state (torch, the standard library,
minihop, installed packages, the test runner) is not the user's to change: chains through it
are neither guarded nor watched, and its functions are not analysed.

Invariant: the answer depends only on a module's name and where its file is installed.
"""

from __future__ import annotations

import random
import re
import types
from typing import Any

from ..library_state import LIBRARY_PACKAGES, library_module, own_attr, own_dict

__all__ = ["BOUNDED", "LIBRARY_PACKAGES", "NEVER_DRAW", "TORCH_AUTOGRAD_STATE", "TORCH_IO", "TORCH_PROCESS", "autograd_state", "bounded", "torch_io", "is_exec_class",
           "is_library", "is_user_function", "library_module", "reads_trace_modes"]


def is_library(value: Any) -> bool:
    """Whether ``value`` (a module, function or class) belongs to torch, the standard library,
    minihop or the test runner: its module state is not the user's to change, so chains
    through it are neither guarded nor watched. (Functions the user's code reaches through
    its own globals are analysed wherever they are defined.)"""
    if issubclass(type(value), types.ModuleType):
        name = value.__name__
    elif is_exec_class(value):
        return False
    else:
        name = own_attr(value, "__module__") or _owner_module(value)
    return library_module(name) if issubclass(type(name), str) else False


def _owner_module(fn: Any) -> str:
    """The module of what a builtin method is bound to (``datetime.datetime.now`` has no
    ``__module__`` of its own: its class's is ``datetime``)."""
    owner = getattr(fn, "__self__", None)
    if owner is None:
        return ""
    if issubclass(type(owner), types.ModuleType):
        return owner.__name__
    return getattr(owner if issubclass(type(owner), type) else type(owner), "__module__", None) or ""


def is_exec_class(value: Any) -> bool:
    """Whether ``value`` is a class made by ``exec`` in a namespace without ``__name__`` (code
    generated at run time, a notebook cell runner): Python names its module "builtins", yet
    its methods are Python functions, never a builtin class's. It is the user's."""
    return issubclass(type(value), type) and own_attr(value, "__module__") == "builtins" and any(
        issubclass(type(getattr(v, "__func__", v)), types.FunctionType) for v in own_dict(value).values())


def is_user_function(value: Any) -> bool:
    return issubclass(type(value), types.FunctionType) and not is_library(value)


# Library packages whose functions never draw from Python's random generator.
NEVER_DRAW = frozenset({"torch", "math", "operator", "builtins", "functools", "itertools", "typing",
                        "minihop", "numbers", "cmath", "_operator"})


def is_user_module(value: Any) -> bool:
    """The user's module (``import cfg``) or a ModuleType made as a namespace: its attributes
    are state like an object's (a library module's are not the user's to change)."""
    return type(value) is types.ModuleType and not is_library(value)


def module_data(module: types.ModuleType) -> dict[str, Any]:
    """A user module's data attributes: not its dunders, functions, classes or modules."""
    return {k: v for k, v in vars(module).items()
            if not (k.startswith("__") and k.endswith("__"))
            and not issubclass(type(v), (types.ModuleType, types.FunctionType, type, types.BuiltinFunctionType))}

# Libraries whose functions answer from their arguments and from state minihop models: torch
# (its process-wide reads are guarded or watched: settings, hidden), Python's pure modules, and
# those whose objects the heap watch sees (collections, queue, io, array). A library function
# from elsewhere (``os.listdir``, ``secrets.token_hex``, ``socket``, ``datetime.now``) may
# answer from files, the system or the network: unknown, so the capture is single-use.
# (``decimal`` is not among them: its arithmetic answers from the thread's context.)
BOUNDED = frozenset({*NEVER_DRAW, "random", "numpy", "sympy", "typing_extensions", "functorch", "math", "cmath",
                     "statistics", "fractions", "heapq", "bisect", "collections", "copy", "types",
                     "abc", "enum", "dataclasses", "string", "re", "json", "struct", "array", "queue", "io",
                     "contextlib", "contextvars", "weakref", "threading", "warnings", "logging", "inspect",
                     "textwrap", "pprint", "reprlib", "keyword", "_collections_abc", "collections.abc",
                     "_functools", "_heapq", "_bisect", "_struct", "_json", "_string", "_weakref",
                     "_thread", "_io", "_contextvars", "_warnings", "_random", "time",
                     # pytest's assertion rewriting, in an ``assert`` inside forward under pytest
                     "_pytest", "pytest"})

# Modules of BOUNDED that also answer from files, the interpreter or the running thread: only
# these of their names are bounded (``open``, ``eval``, ``input``, ``io.FileIO``,
# ``threading.current_thread`` are not). An allowlist, as BOUNDED is.
ONLY: dict[str, frozenset[str]] = {
    "builtins": frozenset({
        "abs", "all", "any", "ascii", "bin", "bool", "bytearray", "bytes", "callable", "chr", "classmethod",
        "complex", "delattr", "dict", "divmod", "enumerate", "filter", "float", "format", "frozenset",
        "getattr", "hasattr", "hash", "hex", "id", "int", "isinstance", "issubclass", "iter", "len", "list",
        "map", "max", "min", "next", "object", "oct", "ord", "pow", "print", "property", "range", "repr",
        "reversed", "round", "set", "setattr", "slice", "sorted", "staticmethod", "str", "sum", "super",
        "tuple", "type", "vars", "zip", "memoryview", "globals", "locals", "aiter", "anext",
        "__import__", "__build_class__"}),
    "io": frozenset({"StringIO", "BytesIO"}),
    "_io": frozenset({"StringIO", "BytesIO"}),
    "threading": frozenset({"Event", "Lock", "RLock", "Condition", "Semaphore", "BoundedSemaphore", "Barrier",
                            "local", "Timer", "Thread"}),
    "_thread": frozenset({"allocate_lock", "RLock", "LockType", "_local"}),
}


# torch's own readers and writers of files and processes (``torch.load``, ``torch.save``,
# ``torch.from_file``, ``torch.hub``): what they read becomes tensors no trace holds (fake while
# traced), what they write would be written once. Never bounded, and refused where the code
# names them (``pystate``); the rest of torch answers from its arguments and guarded state.
TORCH_IO = ("torch.serialization", "torch.hub", "torch.package", "torch.jit._serialization",
            "torch.utils.tensorboard", "torch.utils.cpp_extension", "torch.onnx",
            "torch.distributed.checkpoint", "torch.profiler", "torch.autograd.profiler", "torch.multiprocessing")


# torch's autograd engine state outside any op: forward-mode AD's levels and dual tensors
# (``dual_level``, ``make_dual``), the saved-tensor hooks stack (``saved_tensors_hooks``,
# ``save_on_cpu``), a tensor's version counter bumped by hand (``increment_version``), a
# tensor's gradient edge. A graph records ops: the trace would set these up on fake tensors
# once, and the graph's run would neither enter the level (its dual ops then raise) nor run the
# hooks. Refused where the code names them (``kinds.refuse_torch_io``); the classes code only
# asks about (``isinstance(ctx, Node)``) are not.
TORCH_AUTOGRAD_STATE = ("torch.autograd.forward_ad", "torch.autograd.graph")
_AUTOGRAD_TYPES = frozenset({"Node", "GradientEdge"})


def autograd_state(fn: Any) -> bool:
    """Whether ``fn`` sets up or reads autograd engine state no op holds (``TORCH_AUTOGRAD_STATE``)."""
    module = getattr(fn, "__module__", None)
    return issubclass(type(module), str) and module.startswith(TORCH_AUTOGRAD_STATE) \
        and getattr(fn, "__name__", None) not in _AUTOGRAD_TYPES


def torch_io(fn: Any) -> bool:
    """Whether ``fn`` is one of torch's file or process readers and writers (``TORCH_IO``)."""
    module = getattr(fn, "__module__", None) or ""
    if not issubclass(type(module), str):
        return False
    return module.startswith(TORCH_IO) or getattr(fn, "__name__", None) == "from_file" \
        and (module or "torch").split(".")[0] == "torch"


# torch's modules of process and device state: their functions answer from settings and devices
# (``torch.backends.cuda.flash_sdp_enabled()``, ``torch.cuda.memory_allocated()``,
# ``torch._C._get_cudnn_enabled()``), not from their arguments. Only the getters ``settings``
# names (and guards) and the setters ``hidden`` refuses are known; any other is unknown. Their
# classes (``torch.cpu.amp.autocast``, ``torch.cuda.Stream``) answer through their objects.
# (``torch._C`` itself, not its op namespaces: ``torch._C._nn.gelu`` is an op.)
TORCH_PROCESS = ("torch.backends", "torch.cuda", "torch.cpu", "torch.mps", "torch.xpu", "torch.mtia",
                 "torch.accelerator")
# What tells whether torch's function or dispatch modes are on, or whether a tensor is fake:
# while minihop traces, its recorder and FakeTensorMode are, and the tensors are fake, so the
# code would read there what eager never does (``has_torch_function((x,))``: True, eager False).
# And whether a torch.func transform is on or a tensor is wrapped by one (``torch._C._functorch``'s
# probes): minihop traces outside transforms, so a capture made for a vmap call would answer False.
_TRACE_MACHINERY = ("torch._subclasses", "torch.utils._python_dispatch", "torch._guards",
                    "torch.fx.experimental.proxy_tensor", "torch._C._functorch")
_MODE_PROBE = re.compile(r"^_?(has_torch_function|is_torch_function_mode_enabled|len_torch_(function|dispatch)_stack"
                         r"|get_(function|dispatch)_stack_at|get_dispatch_mode|get_current_function_mode|dispatch_keys"
                         r"|are_functorch_transforms_active|dispatch_tls|meta_in_tls|dispatch_key_set|is_key_in_tls)")


def _module_of(fn: Any) -> str:
    module = getattr(fn, "__module__", None) or _owner_module(fn)
    return module if issubclass(type(module), str) else ""


def reads_trace_modes(fn: Any) -> bool:
    """Whether calling or naming ``fn`` reads what only minihop's trace sets: torch's mode
    stacks, a tensor's fakeness (``_TRACE_MACHINERY``, ``_MODE_PROBE``), the interpreter's tracer."""
    module = _module_of(fn)
    if module == "sys" and getattr(fn, "__name__", None) == "gettrace":
        return True  # (the trace's own code watch, ``call_watch``, is the tracer while it runs)
    return module.startswith(_TRACE_MACHINERY) or module in ("torch._C", "torch.overrides") \
        and _MODE_PROBE.match(str(getattr(fn, "__name__", ""))) is not None


def _torch_process(fn: Any) -> bool:
    module = _module_of(fn)
    return module == "torch._C" or any(module == name or module.startswith(name + ".") for name in TORCH_PROCESS)


def bounded(fn: Any) -> bool:
    """Whether calling the library function or class ``fn`` answers from what minihop bounds
    (``BOUNDED``, ``ONLY``; ``time``'s clocks are watched where the code names them:
    ``hidden``). A class answers through its objects' methods, which no chain follows: it is
    bounded where its module is (``pathlib.Path`` is not), and exceptions are, unless its
    objects answer from the system (``random.SystemRandom``). A method answers from its
    object or class: bounded where that class is (``secrets.randbits``: a SystemRandom's)."""
    if torch_io(fn):
        return False
    if issubclass(type(fn), type):
        return fn is not random.SystemRandom and (issubclass(fn, BaseException) or _in_bounded(fn))
    owner = getattr(fn, "__self__", None)
    if issubclass(type(owner), type) and getattr(fn, "__module__", None):
        return _in_bounded(fn)  # a classmethod answers from its own code (torch's ``Function.apply``)
    if owner is not None and not issubclass(type(owner), types.ModuleType):
        return bounded(owner if issubclass(type(owner), type) else type(owner))
    return _in_bounded(fn) and not _torch_process(fn)


def _in_bounded(fn: Any) -> bool:
    module = getattr(fn, "__module__", None) or _owner_module(fn)
    if not issubclass(type(module), str):
        return False
    top = module.split(".")[0]
    names = ONLY.get(top)
    return top in BOUNDED and (names is None or getattr(fn, "__name__", None) in names)
