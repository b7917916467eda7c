"""The one boundary with Hydra/OmegaConf: compose `conf/` into validated `Config` dataclasses.

Overrides are parsed by Hydra's own override parser, and a sweep is expanded as Hydra's basic sweeper expands
it (a sweep preset's `hydra.sweeper.params` first, the command line's overrides after, a key given twice taking
the later values): comma lists, `choice()`, `range()` and `glob()` all work, with `fp8bench run -m` and with a
sweep preset alike. Everything below this module takes plain dataclasses. Hydra's own failures (unknown preset,
misspelt key, wrong type, bad override syntax) are translated into `ConfigError` with the field, the value
and the choices.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import re
import sys
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from fp8bench.config.schema import Config, ConfigError
from fp8bench.core.types import VALID_SCALINGS, Format, Scaling

SCHEMA_NAME = "fp8bench_schema"
GROUPS = ("workload", "model", "format", "scaling", "backend", "sweep", "ablation")
GLOBAL_GROUPS = ("sweep", "ablation")
"""Groups whose presets set keys anywhere (`@package _global_`): a point of a sweep over one is composed whole."""


def conf_dir() -> Path:
    """conf/ beside the package (the repository root of an editable or source install)."""
    here = Path(__file__).resolve().parents[2] / "conf"
    if not (here / "config.yaml").is_file():
        raise ConfigError(f"config directory {str(here)!r} has no config.yaml; run fp8bench from a source checkout")
    return here


def _writable(node: DictConfig) -> None:
    OmegaConf.set_readonly(node, False)
    for key in node.keys():
        child = node._get_node(key)
        if isinstance(child, DictConfig):
            _writable(child)


def register_schema() -> None:
    # Frozen dataclasses make read-only OmegaConf nodes, onto which YAML cannot merge: lift the flag on the
    # schema node only. Types and keys are still enforced; to_object still builds the frozen dataclasses. The
    # `backend` node stays open to any key: which knobs exist is each backend's own declaration, checked when
    # the case is built (a knob the backend does not honour skips the case, with the reason).
    node = OmegaConf.structured(Config)
    _writable(node)
    OmegaConf.set_struct(node.backend, False)
    ConfigStore.instance().store(name=SCHEMA_NAME, node=node)
    if not OmegaConf.has_resolver("fp8bench_gpus"):  # conf/hydra/launcher/local-gpus.yaml: one job per GPU
        from fp8bench.core.hardware import gpu_count

        OmegaConf.register_new_resolver("fp8bench_gpus", gpu_count)


def group_options(group: str) -> list[str]:
    return sorted(p.stem for p in (conf_dir() / group).glob("*.yaml"))


def model_preset(name: str) -> dict | None:
    """conf/model/<name>.yaml as a dict (the dimensions a recorded case's model name stands for), or None
    where no preset has that name (a model a plugin or an older checkout defined)."""
    return preset_values("model", name)


@functools.cache
def preset_values(group: str, name: str) -> dict | None:
    """conf/<group>/<name>.yaml as a plain dict (no Hydra composition: the values the preset itself sets), or
    None where no preset has that name."""
    path = conf_dir() / group / f"{name}.yaml"
    if not path.is_file():
        return None
    values = OmegaConf.to_container(OmegaConf.load(path))
    return values if isinstance(values, dict) else {}


@functools.cache
def root_values() -> dict:
    """The values conf/config.yaml sets itself (its `defaults` and `hydra` sections left out)."""
    values = OmegaConf.to_container(OmegaConf.load(conf_dir() / "config.yaml"))
    return {k: v for k, v in values.items() if k not in ("defaults", "hydra")}


# --------------------------------------------------------------------------- override checks

def _check_override(o: Override) -> None:
    """Catch the common mistakes before Hydra composes, with messages that list the valid choices."""
    key = o.key_or_group
    if o.is_hydra_override() or o.is_delete():
        return
    values = list(o.sweep_string_iterator()) if o.is_sweep_override() else [o.get_value_element_as_str()]
    if key in GROUPS:
        opts = group_options(key)
        for v in values:
            if v not in opts and v != "null":
                raise ConfigError(f"{key}={v!r} is not a preset; choose one of {opts}")
        return
    if key.split(".")[0] == "backend" or o.is_add() or o.is_force_add():
        return  # backend knobs: the backend's own declaration checks them when the case is built
    typ = _field_type(key, ",".join(values))
    for v in values:
        _check_value(key, v, typ)


def _field_type(key: str, value: str) -> object:
    """The annotated type of a dotted key of Config; unknown keys are errors that list the valid ones."""
    cls: object = Config
    parts = key.split(".")
    for i, part in enumerate(parts):
        hints = typing.get_type_hints(cls) if dataclasses.is_dataclass(cls) else {}
        if part not in hints:
            where = ".".join(parts[:i]) or "the top level"
            raise ConfigError(f"{key}={value!r}: {part!r} is not a key of {where}; valid keys are {sorted(hints)}")
        cls = hints[part]
    return cls


def _check_value(key: str, value: str, typ: object) -> None:
    """Scalar type check of one override value (Hydra's own message for this is unhelpful)."""
    if value in ("null", ""):
        return
    for want, ok in ((int, _is_int), (float, _is_float), (bool, _is_bool)):
        if (typ is want or typ == want | None) and not ok(value):
            raise ConfigError(f"{key}={value!r} must be of type {want.__name__}")


def _is_int(v: str) -> bool:
    return re.fullmatch(r"[+-]?\d+", v) is not None


def _is_float(v: str) -> bool:
    try:
        float(v)
        return True
    except ValueError:
        return False


def _is_bool(v: str) -> bool:
    return v.lower() in ("true", "false")


def _translate(exc: Exception) -> ConfigError:
    """Hydra/OmegaConf errors → one clean line that names the field."""
    msg = str(exc).strip()
    m = re.search(r"Could not find '([\w\-]+)/([^']+)'", msg)
    if m:
        group, name = m.groups()
        return ConfigError(f"{group}={name!r} is not a preset; choose one of {group_options(group)}")
    m = re.search(r"Key '([^']+)' not in '(\w+)'", msg) or re.search(r"Key '([^']+)' is not in struct", msg)
    if m:
        full = re.search(r"full_key: ([\w.]+)", msg)
        return ConfigError(f"{full.group(1) if full else m.group(1)!r} is not a config key ({msg.splitlines()[0]})")
    m = re.search(r"Value '([^']*)' (?:of type '\w+' )?could not be converted to (\w+)", msg)
    if m:
        full = re.search(r"full_key: ([\w.]+)", msg)
        return ConfigError(f"{full.group(1) if full else 'value'}={m.group(1)!r} must be of type {m.group(2)}")
    m = re.search(r"Ambiguous value for argument '([^=']+)=([^']*)'", msg)
    if m:  # Hydra reads a,b,c as a sweep only in a multirun
        return ConfigError(f"{m.group(1)}={m.group(2)!r} lists several values; `fp8bench run -m` sweeps them, "
                           "otherwise give one")
    first = msg.splitlines()[0] if msg else type(exc).__name__
    return ConfigError(first)


# --------------------------------------------------------------------------- composing one point

def _instantiate(cfg: DictConfig) -> Config:
    try:
        obj = OmegaConf.to_object(cfg)
    except ConfigError:
        raise
    except (OmegaConfBaseException, HydraException) as exc:
        cause = exc.__cause__
        if isinstance(cause, ConfigError):
            raise cause from None
        raise _translate(exc) from None
    except (TypeError, ValueError) as exc:
        raise ConfigError(str(exc)) from None
    if not isinstance(obj, Config):
        raise ConfigError(f"the composed config is a {type(obj).__name__}, not fp8bench's Config")
    return obj


def check_combination(cfg: Config) -> None:
    """A single point must be a meaningful recipe (sweeps drop impossible pairs instead)."""
    fmt, sc = Format(cfg.format.name), Scaling(cfg.scaling.name)
    if sc not in VALID_SCALINGS[fmt]:
        ok = sorted(s.value for s in VALID_SCALINGS[fmt])
        raise ConfigError(f"scaling={sc.value!r} is impossible with format={fmt.value!r}; choose one of {ok}")


def _possible(cfg: DictConfig) -> bool:
    return Scaling(cfg.scaling.name) in VALID_SCALINGS[Format(cfg.format.name)]


def to_config(cfg: DictConfig) -> Config:
    """A composed DictConfig (from compose or @hydra.main) → validated Config."""
    if "hydra" in cfg:
        cfg = cfg.copy()
        with open_dict(cfg):
            del cfg["hydra"]
    return _instantiate(cfg)


def config_from_dict(values: dict) -> Config:
    """A Config from its `dataclasses.asdict` form (what a run's plan file keeps for its jobs), validated."""
    register_schema()
    node = OmegaConf.structured(Config)
    _writable(node)
    OmegaConf.set_struct(node.backend, False)
    try:
        merged = OmegaConf.merge(node, values)
    except (OmegaConfBaseException, HydraException) as exc:
        raise _translate(exc) from None
    return _instantiate(merged)


@contextlib.contextmanager
def _hydra() -> Iterator[OverridesParser]:
    """Hydra initialised on conf/: yields an override parser that knows the config groups (for glob())."""
    register_schema()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
            yield OverridesParser.create(config_loader=GlobalHydra.instance().config_loader())
    except ConfigError:
        raise
    except (HydraException, OmegaConfBaseException) as exc:
        raise _translate(exc) from None
    finally:
        GlobalHydra.instance().clear()


def _compose(overrides: list[str]) -> DictConfig:
    try:
        return compose(config_name="config", overrides=overrides, return_hydra_config=True)
    except (HydraException, OmegaConfBaseException) as exc:
        raise _translate(exc) from None


def _parse(parser: OverridesParser, overrides: list[str]) -> list[Override]:
    for o in overrides:
        if o.startswith("-"):
            raise ConfigError(f"option {o!r} is not known here; pass Hydra overrides as key=value")
        if "=" not in o and not o.startswith("~"):
            raise ConfigError(f"override {o!r} is not key=value (e.g. model=llama2-7b)")
    try:
        return parser.parse_overrides(list(overrides))
    except HydraException as exc:
        raise ConfigError(f"overrides {' '.join(overrides)!r} do not parse: {str(exc).splitlines()[0]}") from None


@dataclass(frozen=True)
class Composition:
    """A composed config and the sweep axes its preset declares."""

    config: Config
    sweep_params: dict[str, str]
    overrides: tuple[str, ...]


def load(overrides: list[str] | tuple[str, ...] = ()) -> Composition:
    """Compose one point; the sweep preset's axes come back unexpanded in `sweep_params`."""
    overrides = list(overrides)
    with _hydra() as parser:
        for o in _parse(parser, overrides):
            if o.is_sweep_override():
                raise ConfigError(f"{o.key_or_group}={o.get_value_string()!r} lists several values; "
                                  "`fp8bench run -m` sweeps them, otherwise give one")
            _check_override(o)
        raw = _compose(overrides)
    params = raw.hydra.sweeper.get("params") or {}
    return Composition(to_config(raw), {str(k): str(v) for k, v in params.items()}, tuple(overrides))


# --------------------------------------------------------------------------- expanding a sweep

@dataclass(frozen=True)
class Sweep:
    """What one request expands to: its points (each a validated Config and the overrides that compose it on
    its own), the Hydra overrides that choose how jobs run (hydra/launcher=..., hydra.launcher.*), and how
    many impossible format×scaling pairs of the grid were dropped."""

    points: tuple[Config, ...]
    point_overrides: tuple[tuple[str, ...], ...]
    hydra_overrides: tuple[str, ...]
    dropped: int


def _axes(parser: OverridesParser, overrides: list[Override], preset_params: dict[str, str]) -> dict[str, list[str]]:
    """key → the override strings of its values, in Hydra's basic sweeper's order: the preset's params, then
    the command line's overrides (a key given again replaces its values, keeping its place)."""
    params = _parse(parser, [f"{k}={v}" for k, v in preset_params.items()])
    axes: dict[str, list[str]] = {}
    for o in [*params, *overrides]:
        key = o.get_key_element()
        if o.is_delete():
            axes[key] = [o.input_line]
        elif o.is_sweep_override():
            if not o.is_discrete_sweep():
                raise ConfigError(f"{o.input_line!r}: an interval cannot be enumerated; sweep a list, choice(), "
                                  "range() or glob()")
            axes[key] = [f"{key}={v}" for v in o.sweep_string_iterator()]
        else:
            axes[key] = [f"{key}={o.get_value_element_as_str()}"]
    return axes


def expand_request(overrides: list[str] | tuple[str, ...] = (), multirun: bool = False) -> Sweep:
    """Every point of a request: a single point, a sweep preset's grid (`sweep=...`), and with `multirun` the
    command line's own sweeps too (`format=e4m3,hybrid`, `choice(...)`, `range(...)`, `glob(...)`).
    Impossible format×scaling pairs of a grid are dropped (counted); a single point must be possible."""
    with _hydra() as parser:
        parsed = _parse(parser, list(overrides))
        for o in parsed:
            _check_override(o)
            if o.is_sweep_override() and not multirun:
                raise ConfigError(f"{o.key_or_group}={o.get_value_string()!r} lists several values; "
                                  "`fp8bench run -m` sweeps them, otherwise give one")
            if o.key_or_group == "sweep" and o.is_sweep_override():
                raise ConfigError("sweep= names one preset per run; run each preset on its own")
            if o.key_or_group == "hydra/sweeper":
                raise ConfigError(f"{o.input_line!r}: fp8bench expands sweeps itself (Hydra's override grammar, "
                                  "its basic sweeper's order) so that each job is a group of cases sharing one BF16 "
                                  "twin; adaptive sweepers cannot form such groups")
        hydra_overrides = tuple(o.input_line for o in parsed if o.is_hydra_override())
        point_level = [o for o in parsed if not o.is_hydra_override()]
        base = _compose([o.input_line for o in point_level if not o.is_sweep_override()])
        preset = {str(k): str(v) for k, v in (base.hydra.sweeper.get("params") or {}).items()}
        axes = _axes(parser, point_level, preset)
        for values in axes.values():
            for line in values:
                _check_override(_parse(parser, [line])[0])
        points, lines, dropped = _grid(parser, base, axes)
    if not points:
        raise ConfigError("the request expands to no possible format×scaling pair; "
                          f"valid pairs: { {f.value: sorted(s.value for s in VALID_SCALINGS[f]) for f in Format} }")
    return Sweep(tuple(points), tuple(lines), hydra_overrides, dropped)


def _grid(parser: OverridesParser, base: DictConfig, axes: dict[str, list[str]],
          ) -> tuple[list[Config], list[tuple[str, ...]], int]:
    """Compose each point of the cartesian product of `axes`. A config group is composed once per option
    (a compose costs ~60 ms) and swapped into the base point; other keys are applied to each point as Hydra
    applies overrides. A single-valued axis is in the base point."""
    varying = {k: v for k, v in axes.items() if len(v) > 1}
    single = [v[0] for k, v in axes.items() if len(v) == 1]
    base_raw = _compose(single)
    if not varying:
        point = to_config(base_raw)
        check_combination(point)
        return [point], [tuple(single)], 0
    if any(k in GLOBAL_GROUPS for k in varying):  # a preset that sets keys anywhere: each point composed whole
        raw_points = [(_compose([*single, *combo]), combo) for combo in itertools.product(*varying.values())]
        kept = [(cfg, combo) for cfg, combo in raw_points if _possible(cfg)]
        return ([to_config(cfg) for cfg, _ in kept], [tuple(single) + combo for _, combo in kept],
                len(raw_points) - len(kept))
    groups = [k for k in varying if k in GROUPS]
    raw = {line: _compose([*single, line]) for k in groups for line in varying[k]}
    if len(groups) == len(varying):  # the common sweep: groups only, swapped into one validated base
        base_point = to_config(base_raw)
        nodes = {line: getattr(to_config(cfg), line.split("=")[0]) for line, cfg in raw.items()}
        points = [(dataclasses.replace(base_point, **{line.split("=")[0]: nodes[line] for line in combo}), combo)
                  for combo in itertools.product(*varying.values())]
        kept = [(p, combo) for p, combo in points if Scaling(p.scaling.name) in VALID_SCALINGS[Format(p.format.name)]]
        return [p for p, _ in kept], [tuple(single) + combo for _, combo in kept], len(points) - len(kept)
    points, lines, dropped = [], [], 0
    for combo in itertools.product(*varying.values()):
        cfg = base_raw.copy()
        with open_dict(cfg):
            for line in combo:
                if line.split("=")[0] in groups:
                    key = line.split("=")[0]
                    cfg[key] = raw[line][key]
        _apply(parser, [line for line in combo if line.split("=")[0] not in groups], cfg)
        if not _possible(cfg):
            dropped += 1
            continue
        points.append(to_config(cfg))
        lines.append(tuple(single) + combo)
    return points, lines, dropped


def _apply(parser: OverridesParser, lines: list[str], cfg: DictConfig) -> None:
    """Hydra's own application of value overrides (`key=v`, `+key=v`, `++key=v`, `~key`) to a composed config."""
    if not lines:
        return
    from hydra._internal.config_loader_impl import ConfigLoaderImpl

    try:
        ConfigLoaderImpl._apply_overrides_to_config(_parse(parser, lines), cfg)
    except (HydraException, OmegaConfBaseException) as exc:
        raise _translate(exc) from None


def expand(overrides: list[str] | tuple[str, ...] = (), multirun: bool = False) -> tuple[list[Config], int]:
    """The points of a request (see `expand_request`) and the count of impossible pairs dropped."""
    sweep = expand_request(overrides, multirun)
    return list(sweep.points), sweep.dropped


# --------------------------------------------------------------------------- Hydra's launchers

LAUNCHERS = ("hydra_plugins.fp8bench_launchers.local_gpus", "hydra_plugins.fp8bench_launchers.local_processes",
             "hydra_plugins.fp8bench_launchers.slurm")
"""fp8bench's own launcher plugins (hydra_plugins/fp8bench_launchers/), registered with Hydra by class."""


_MISSING_PLUGINS: dict[str, str] = {}
"""fp8bench launcher module → the module its import missed."""


def _register_launchers() -> None:
    """Hydra takes launchers from the `hydra_plugins` namespace package; it finds those of installed wheels by
    scanning, and fp8bench's by this registration (an editable install's path hook is not scanned)."""
    import importlib

    from hydra.core.plugins import Plugins
    from hydra.plugins.launcher import Launcher

    for name in LAUNCHERS:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            # the Hydra plugin it extends (joblib's, submitit's) is not installed here, as on a GPU box given only
            # what a run needs: the sweep may still use any other launcher (chosen_launcher_missing says when not);
            # anything else missing is a broken checkout, and says so
            if not str(exc.name).startswith("hydra_plugins.hydra_"):
                raise
            _MISSING_PLUGINS[name] = str(exc.name)
            continue
        for obj in vars(module).values():
            if isinstance(obj, type) and issubclass(obj, Launcher) and obj.__module__ == name:
                Plugins.instance().register(obj)


def chosen_launcher_missing(hydra_overrides: list[str]) -> None:
    """Raise ConfigError when `hydra/launcher=NAME` chooses one of fp8bench's launchers whose underlying Hydra
    plugin is not installed, naming the package to install and the launchers that do work here."""
    chosen = [value for key, sep, value in (o.partition("=") for o in hydra_overrides)
              if sep and key.lstrip("+~") == "hydra/launcher"]
    if not chosen:
        return
    targets = {path.stem: str(OmegaConf.load(path).get("_target_", ""))
               for path in sorted((conf_dir() / "hydra" / "launcher").glob("*.yaml"))}
    module = targets.get(chosen[-1], "").rpartition(".")[0]
    if module in _MISSING_PLUGINS:
        usable = [n for n, t in targets.items() if t.rpartition(".")[0] not in _MISSING_PLUGINS] + ["basic"]
        package = _MISSING_PLUGINS[module].removeprefix("hydra_plugins.").split(".")[0].replace("_", "-")
        raise ConfigError(f"hydra/launcher={chosen[-1]} needs {package}, which is not installed here (pip install "
                          f"{package}); launchers that run here: {usable}")


def launch_jobs(hydra_overrides: list[str], fixed: list[str], n_jobs: int,
                task: typing.Callable[[Config, int], None]) -> int:
    """Run `task(config, job_group)` for job_group 0..n_jobs-1 through Hydra's configured launcher (the basic
    launcher: one process, in order; `hydra/launcher=...`: joblib workers, Slurm jobs, local processes).
    `fixed` are the overrides every job composes (results_dir, run_id, ...). Returns the exit code."""
    import hydra
    from hydra.core.hydra_config import HydraConfig

    register_schema()
    _register_launchers()
    chosen_launcher_missing(hydra_overrides)

    @hydra.main(version_base="1.3", config_path=str(conf_dir()), config_name="config")
    def _job(cfg: DictConfig) -> None:
        config = to_config(cfg)
        task(config, int(config.job_group if config.job_group is not None else HydraConfig.get().job.num))

    saved = sys.argv
    sys.argv = ["fp8bench", "--multirun", *hydra_overrides, *fixed, f"job_group=range(0,{n_jobs})"]
    try:
        _job()
        return 0
    except SystemExit as exc:
        return int(exc.code or 0)
    finally:
        sys.argv = saved
        GlobalHydra.instance().clear()
