"""The one boundary with Hydra/OmegaConf: compose `conf/` into validated `Config` dataclasses.

Everything below this module takes plain dataclasses. Hydra's own failures (unknown preset, misspelt key,
wrong type, bad override syntax) are translated into `ConfigError` with the field, the value and the choices.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
import sys
import typing
from dataclasses import dataclass
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from fp8bench.config.schema import Config, ConfigError
from fp8bench.core.types import VALID_SCALINGS, Format, Scaling


def _expose_launcher_plugins() -> None:
    """Hydra finds launchers only in the `hydra_plugins` namespace package, scanned once per process: put
    fp8bench's portion of it (fp8bench/hydra_search/hydra_plugins/) on the path before anything asks."""
    path = str(Path(__file__).resolve().parents[1] / "hydra_search")
    if path not in sys.path:
        sys.path.append(path)


_expose_launcher_plugins()

SCHEMA_NAME = "fp8bench_schema"
GROUPS = ("workload", "model", "format", "scaling", "backend", "sweep")


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
    # schema node only. Types and keys are still enforced; to_object still builds the frozen dataclasses.
    node = OmegaConf.structured(Config)
    _writable(node)
    ConfigStore.instance().store(name=SCHEMA_NAME, node=node)
    if not OmegaConf.has_resolver("fp8bench_gpus"):  # conf/hydra/launcher/local-gpus.yaml: one job per GPU
        from fp8bench.core.hardware import gpu_count

        OmegaConf.register_new_resolver("fp8bench_gpus", gpu_count)


def group_options(group: str) -> list[str]:
    return sorted(p.stem for p in (conf_dir() / group).glob("*.yaml"))


def model_preset(name: str) -> dict | None:
    """conf/model/<name>.yaml as a dict (the dimensions a recorded case's model name stands for), or None
    where no preset has that name (a model a plugin or an older checkout defined)."""
    path = conf_dir() / "model" / f"{name}.yaml"
    return OmegaConf.to_container(OmegaConf.load(path)) if path.is_file() else None


_KEY_RE = re.compile(r"^[~+]*([\w.\-/@]+?)(@[\w.]+)?=(.*)$", re.S)


def _check_override(override: str) -> None:
    """Catch the common mistakes before Hydra, with messages that list the valid choices."""
    m = _KEY_RE.match(override)
    if not m:
        if override.startswith("-"):
            raise ConfigError(f"option {override!r} is not known here; pass Hydra overrides as key=value")
        raise ConfigError(f"override {override!r} is not key=value (e.g. model=llama2-7b)")
    key, value = m.group(1), m.group(3)
    if key.startswith("hydra/"):  # Hydra's own groups (hydra/launcher=...): Hydra checks them
        return
    if key in GROUPS:
        opts = group_options(key)
        for v in _split_values(value):
            if v not in opts and v not in ("null",):
                raise ConfigError(f"{key}={v!r} is not a preset; choose one of {opts}")
        return
    if key.split(".")[0] == "hydra":
        return
    _check_value(key, value, _field_type(key, value))


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
    """Scalar type check of an override value (Hydra's own message for this is unhelpful)."""
    if value in ("null", "") or "(" in value:
        return
    for v in _split_values(value):
        for want, ok in ((int, _is_int), (float, _is_float), (bool, _is_bool)):
            if typ is want or typ == want | None:
                if not ok(v):
                    raise ConfigError(f"{key}={v!r} must be of type {want.__name__}")


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


def _split_values(value: str) -> list[str]:
    """Values of a sweep-style override: a,b,c or glob(...) kept as one."""
    if "(" in value or "[" in value:
        return []
    return [v.strip() for v in value.split(",")]


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
    assert isinstance(obj, Config)  # to_object on the registered schema always yields Config
    return obj


def check_combination(cfg: Config) -> None:
    """A single point must be a meaningful recipe (sweeps drop impossible pairs instead)."""
    fmt, sc = Format(cfg.format.name), Scaling(cfg.scaling.name)
    if sc not in VALID_SCALINGS[fmt]:
        ok = sorted(s.value for s in VALID_SCALINGS[fmt])
        raise ConfigError(f"scaling={sc.value!r} is impossible with format={fmt.value!r}; choose one of {ok}")


def to_config(cfg: DictConfig) -> Config:
    """A composed DictConfig (from compose or @hydra.main) → validated Config."""
    if "hydra" in cfg:
        cfg = cfg.copy()
        with open_dict(cfg):
            del cfg["hydra"]
    return _instantiate(cfg)


@dataclass(frozen=True)
class Composition:
    """A composed config and the sweep axes its preset declares."""

    config: Config
    sweep_params: dict[str, str]
    overrides: tuple[str, ...]


def _compose_raw(overrides: list[str]) -> DictConfig:
    register_schema()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
            return compose(config_name="config", overrides=overrides, return_hydra_config=True)
    except ConfigError:
        raise
    except (HydraException, OmegaConfBaseException) as exc:
        raise _translate(exc) from None
    finally:
        GlobalHydra.instance().clear()


def load(overrides: list[str] | tuple[str, ...] = ()) -> Composition:
    """Compose one point; the sweep preset's axes come back unexpanded in `sweep_params`."""
    overrides = list(overrides)
    for o in overrides:
        _check_override(o)
    raw = _compose_raw(overrides)
    params = OmegaConf.to_container(raw.hydra.sweeper.params, resolve=True) if raw.hydra.sweeper.get("params") else {}
    return Composition(to_config(raw), {str(k): str(v) for k, v in (params or {}).items()}, tuple(overrides))


def _is_sweep_value(value: str) -> bool:
    """a,b,c outside brackets and quotes (Hydra's sweep syntax); [a,b] is one list value."""
    depth = 0
    for ch in value:
        depth += ch in "[({"
        depth -= ch in "])}"
        if ch == "," and depth == 0:
            return True
    return False


def expand(overrides: list[str] | tuple[str, ...] = (), multirun: bool = False) -> tuple[list[Config], int]:
    """All points of the sweep preset named in `overrides` (one point when there is none).

    An axis the user overrode on the command line replaces the preset's values (Hydra's own rule); with
    `multirun`, a command-line value a,b,c is an axis too (as `fp8bench run -m` passes it to Hydra).
    Impossible format×scaling pairs are dropped; their count comes back second.
    """
    cli_axes: dict[str, list[str]] = {}
    if multirun:
        single = []
        for o in overrides:
            m = _KEY_RE.match(o)
            if m and _is_sweep_value(m.group(3)):
                cli_axes[m.group(1)] = _split_values(m.group(3))
                single.append(f"{m.group(1)}={cli_axes[m.group(1)][0]}")
            else:
                single.append(o)
        overrides = single
    base = load(overrides)
    if not base.sweep_params and not cli_axes:
        check_combination(base.config)
        return [base.config], 0
    user_keys = {_KEY_RE.match(o).group(1) for o in overrides if _KEY_RE.match(o)}
    axes = {k: _split_values(v) for k, v in base.sweep_params.items() if k not in user_keys}
    axes.update(cli_axes)
    overrides = [o for o in overrides if not (_KEY_RE.match(o) and _KEY_RE.match(o).group(1) in cli_axes)]
    for key, values in axes.items():
        for v in values:
            _check_override(f"{key}={v}")
    # Group axes: compose each option once and swap it into the base point (a compose costs ~60 ms).
    # Any other axis (a dotted key) falls back to one compose per combination.
    per_group = all(k in GROUPS for k in axes)
    nodes = {(k, v): getattr(load(overrides + [f"{k}={v}"]).config, k)
             for k, values in axes.items() for v in values} if per_group else {}
    points, dropped = [], 0
    for vals in itertools.product(*axes.values()):
        combo = dict(zip(axes, vals, strict=False))
        fmt = combo.get("format", base.config.format.name)
        sc = combo.get("scaling", base.config.scaling.name)
        if Scaling(sc) not in VALID_SCALINGS[Format(fmt)]:
            dropped += 1
            continue
        if per_group:
            points.append(dataclasses.replace(base.config, **{k: nodes[(k, v)] for k, v in combo.items()}))
        else:
            points.append(load(overrides + [f"{k}={v}" for k, v in combo.items()]).config)
    return points, dropped


def multirun(overrides: list[str], task: typing.Callable[[Config, str], None]) -> int:
    """Run `task(point, job_num)` for every point of a Hydra multirun (`fp8bench run -m ...`).

    Hydra's configured sweeper and launcher decide how jobs run (the basic launcher: one process, in order).
    Returns the exit code (Hydra reports its own errors and exits non-zero).
    """
    import hydra
    from hydra.core.hydra_config import HydraConfig

    register_schema()

    @hydra.main(version_base="1.3", config_path=str(conf_dir()), config_name="config")
    def _job(cfg: DictConfig) -> None:
        task(to_config(cfg), str(HydraConfig.get().job.num))

    saved = sys.argv
    sys.argv = ["fp8bench", "--multirun", *overrides]
    try:
        _job()
        return 0
    except SystemExit as exc:
        return int(exc.code or 0)
    finally:
        sys.argv = saved
        GlobalHydra.instance().clear()
