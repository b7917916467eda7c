"""The backend registry: every adapter of this package, found by its module, plus any registered at run time.

An adapter is one module here holding one `Backend` subclass with a `name` (third-party imports inside its
methods, so listing adapters imports no TE, torchao or triton). `names()` lists them, `get_backend(name)`
builds one, `available(name)` says whether its software imports here (once per process), and
`capability(name, fmt, scaling, device)` reads its declared rules: the planner, `fp8bench doctor` and the
report all ask here, so what a backend runs is stated in one place, its own module.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import pkgutil
from collections.abc import Mapping

from fp8bench.backends.base import (
    Backend,
    GemmOp,
    Knobs,
    LinearOp,
    QuantizeOp,
    Recipe,
    TrainSetup,
    variant_of_knobs,
)
from fp8bench.config.schema import ConfigError, ScalingConfig
from fp8bench.core.hardware import DeviceInfo
from fp8bench.core.types import Format, Scaling

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
    """Every backend: built-in ones first (the numerics reference, then by each adapter's `order`, then
    alphabetically), then those registered at run time."""
    builtin = _builtin()
    ordered = sorted(builtin, key=lambda n: (not builtin[n].reference, builtin[n].order, n))
    return ordered + [n for n in _registered if n not in builtin]


def get_backend(name: str) -> Backend:
    cls = _adapters().get(name)
    if cls is None:
        raise ConfigError(f"backend={name!r} is unknown; choose one of {names()}")
    return cls()


def declared(name: str, attribute: str, default: object = None) -> object:
    """What backend `name` declares as `attribute` (a class attribute of its adapter: `timed`, `eager_casts`,
    `quantizes_as`, ...), read without building it; `default` for a name no adapter here has (a record of a
    backend this checkout does not have)."""
    cls = _adapters().get(name)
    return getattr(cls, attribute, default) if cls is not None else default


def knob_catalog() -> dict[str, tuple[object, list[str]]]:
    """Every knob any backend declares: name → (its default, the backends that declare it). Backends that
    declare one knob give it one default (checked here): that default is what every other backend does."""
    catalog: dict[str, tuple[object, list[str]]] = {}
    for name in names():
        for f in dataclasses.fields(_adapters()[name].knobs):
            default, owners = catalog.get(f.name, (f.default, []))
            if default != f.default:
                raise ValueError(f"backend {name!r} gives knob {f.name!r} the default {f.default!r}, but "
                                 f"{owners} give it {default!r}: one knob, one meaning")
            catalog[f.name] = (default, [*owners, name])
    return catalog


_TYPES = {"bool": bool, "str": str, "int": int, "float": (int, float)}


def build_knobs(backend: str, given: Mapping[str, object]) -> tuple[Knobs, dict[str, object]]:
    """The backend's own `Knobs` from a case's `backend.*` values, and the knobs it does not honour: those it
    does not declare, set to other than the default the backends declaring them give. A knob no backend
    declares, or a value of the wrong type, is bad input (ConfigError naming the field and the choices)."""
    cls = get_backend(backend).knobs
    own = {f.name: f for f in dataclasses.fields(cls)}
    catalog = knob_catalog()
    values, foreign = {}, {}
    for key, value in given.items():
        if key == "name":
            continue
        if key in own:
            annotation = own[key].type  # a string under `from __future__ import annotations`, else the type
            type_name = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "")
            want = _TYPES.get(type_name)
            if want is not None and (not isinstance(value, want) or (want is not bool and isinstance(value, bool))):
                raise ConfigError(f"backend.{key}={value!r} must be of type {type_name} (a knob of {backend!r})")
            values[key] = value
        elif key in catalog:
            if value != catalog[key][0]:
                foreign[key] = value
        else:
            raise ConfigError(f"backend.{key}={value!r}: {key!r} is not a knob of any backend; knobs are "
                              f"{sorted(catalog)}")
    try:
        return cls(**values), foreign
    except (TypeError, ValueError) as exc:
        raise ConfigError(str(exc)) from None


def recorded_knobs(backend: str, params: Mapping[str, object], variant: str) -> Knobs | None:
    """The backend's `Knobs` a record states: from its identity (`params`' `backend.*` keys), or, where the
    record's params carry none (records from before they did), from its id's variant (`Knobs.variant`: a set
    boolean by name, another value by itself, in field order). None where neither reads as this backend's
    knobs (an unknown backend, a knob it no longer declares)."""
    given = {k.removeprefix("backend."): v for k, v in params.items() if k.startswith("backend.")}
    try:
        if given:
            return build_knobs(backend, given)[0]
        cls = get_backend(backend).knobs
        fields = dataclasses.fields(cls)
        flags = {f.name for f in fields if f.type in ("bool", bool)}
        tags = [t for t in variant.split("+") if t]
        values: dict[str, object] = {t: True for t in tags if t in flags}
        others = iter(t for t in tags if t not in flags)
        for f in fields:
            if f.name not in flags and (tag := next(others, None)) is not None:
                values[f.name] = tag
        knobs = cls(**values)
    except (ConfigError, TypeError, ValueError):
        return None
    return knobs if knobs.variant() == variant else None


def make_recipe(backend: str, fmt: str, scaling: str, scaling_cfg: ScalingConfig | None = None, **knobs) -> Recipe:
    """A recipe for `backend` with its own knobs (`**knobs` by name): what a case builds from its point, for
    code that drives an adapter directly (tests, benchmarks)."""
    typed, foreign = build_knobs(backend, knobs)
    if foreign:
        raise ConfigError(f"{backend} does not declare {sorted(foreign)}; it has {sorted(typed.values())}")
    return Recipe(format=Format(fmt), scaling=Scaling(scaling), scaling_cfg=scaling_cfg or ScalingConfig(name=scaling),
                  backend=backend, knobs=typed)


@functools.cache
def available(name: str) -> tuple[bool, str]:
    """Does the backend's software import here? Asked once per process (probes import heavy libraries)."""
    return get_backend(name).available()


def capability(name: str, fmt: str, scaling: str, device: DeviceInfo) -> tuple[bool, str]:
    return get_backend(name).capability(fmt, scaling, device)


__all__ = ["Backend", "GemmOp", "Knobs", "LinearOp", "QuantizeOp", "Recipe", "TrainSetup", "available", "build_knobs",
           "capability", "declared", "get_backend", "knob_catalog", "make_recipe", "names", "recorded_knobs", "register",
           "unregister", "variant_of_knobs"]
