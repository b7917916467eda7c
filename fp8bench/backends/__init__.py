"""The backend registry: every adapter of this package, found by its module, plus any registered at run time.

An adapter is one module here holding one `Backend` subclass with a `name` (third-party imports inside its
methods, so listing adapters imports no TE, torchao or triton). `names()` lists them, `get_backend(name)`
builds one, `available(name)` says whether its software imports here (once per process), and
`capability(name, fmt, scaling, device)` reads its declared rules: the planner, `fp8bench doctor` and the
report all ask here, so what a backend runs is stated in one place, its own module.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil

from fp8bench.backends.base import Backend, GemmOp, LinearOp, QuantizeOp, Recipe, TrainSetup
from fp8bench.config.schema import ConfigError
from fp8bench.core.hardware import DeviceInfo

_NOT_ADAPTERS = frozenset({"base", "emulator"})
_registered: dict[str, type[Backend]] = {}


@functools.cache
def _builtin() -> dict[str, type[Backend]]:
    found: dict[str, type[Backend]] = {}
    for info in pkgutil.iter_modules(__path__):
        if info.name in _NOT_ADAPTERS:
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        for obj in vars(module).values():
            if isinstance(obj, type) and issubclass(obj, Backend) and obj.name and obj.__module__ == module.__name__:
                found[obj.name] = obj
    return found


def _adapters() -> dict[str, type[Backend]]:
    return {**_builtin(), **_registered}


def register(cls: type[Backend]) -> type[Backend]:
    """Add an adapter defined outside this package (a plugin, a test); usable as a class decorator."""
    if not cls.name:
        raise ValueError(f"{cls.__name__} has no `name`")
    _registered[cls.name] = cls
    available.cache_clear()
    return cls


def unregister(name: str) -> None:
    _registered.pop(name, None)
    available.cache_clear()


def names() -> list[str]:
    """Every backend, built-in ones in a fixed order first (the emulator, torch, then alphabetical)."""
    first = [n for n in ("emulated", "torch", "te", "torchao", "triton") if n in _builtin()]
    return first + sorted(n for n in _builtin() if n not in first) + [n for n in _registered if n not in _builtin()]


def get_backend(name: str) -> Backend:
    cls = _adapters().get(name)
    if cls is None:
        raise ConfigError(f"backend={name!r} is unknown; choose one of {names()}")
    return cls()


@functools.cache
def available(name: str) -> tuple[bool, str]:
    """Does the backend's software import here? Asked once per process (probes import heavy libraries)."""
    return get_backend(name).available()


def capability(name: str, fmt: str, scaling: str, device: DeviceInfo) -> tuple[bool, str]:
    return get_backend(name).capability(fmt, scaling, device)


__all__ = ["Backend", "GemmOp", "LinearOp", "QuantizeOp", "Recipe", "TrainSetup", "available", "capability",
           "get_backend", "names", "register", "unregister"]
