"""A case's identity: every setting that can change what it measures, and the id derived from it.

The identity is a flat mapping of dotted keys (`model.hidden`, `shape.m`, `scaling.margin`, `backend.compile`,
`workload.train.lr`, ...) to values. What is left out is declared here, with why: keys that only move or name
the output (`PRESENTATION`), the timer's settings, which say how precisely a case is timed and travel with every
record in its `measurement` (`TIMER`), the test-only fault injections (`INJECTION`), and the keys that choose
which shapes a point expands to, whose result, the shape itself, is in the identity (`EXPANSION`).

The id keeps a readable prefix, `workload.model.shape.format.scaling.backend[+knobs]` (the knobs a case sets
on its backend, by name), and adds `~` and eight hex digits of a hash of whatever else differs from the
*reference* of that prefix: what `fp8bench run workload=W model=M format=F scaling=S backend=B` composes with
nothing more (the presets in conf/ as they are). So the cases of the presets keep short ids, and two cases
that differ in anything that can change a measurement never share one. Every record stores its identity in
full (`params`), so a reader can see what a hash stands for.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json

from fp8bench.backends import get_backend
from fp8bench.config.compose import preset_values, root_values
from fp8bench.config.schema import (
    Config,
    ConfigError,
    MeasureConfig,
    ModelConfig,
    ScalingConfig,
    TrainConfig,
    WorkloadConfig,
)
from fp8bench.core.types import Scaling
from fp8bench.models import shapes as shapes_module

PRESENTATION = ("results_dir", "run_id", "resume", "sweep_name", "job_group", "store", "device", "model.source")
"""Keys that only say where output goes and what it is called. `device` too: the device a case ran on is a
fact of its run (the environment travels with every run) and is stated in the record's `ran`."""
TIMER = tuple(f"measure.{f.name}" for f in dataclasses.fields(MeasureConfig) if f.name not in ("flush_l2", "cuda_graph"))
"""The timer's settings (warm-up, iterations, rounds, ...): how precisely a case is timed, not what it times.
`measure.flush_l2` (a cold or a warm L2) and `measure.cuda_graph` (graph replays or launches) change what is
timed and belong to the identity."""
INJECTION = ("fail_on", "slowdown", "diverge_at_step")
"""Test-only faults (a raised error, a planted slowdown): a slowed case must keep its id, or a comparison could
not see the slowdown."""
OPERATIONAL = ("workload.train.ckpt_every",)
"""How a run is kept, not what it measures: checkpoints are written outside the timed steps, and a run resumed
from one continues the same curve bit for bit."""
EXPANSION = ("workload.linears", "workload.roles", "workload.shapes", "workload.tensors", "workload.train.bf16_seeds",
             "workload.train.fp8_seeds")
"""Keys that choose the shapes (or the seeds) a point expands to; each case's shape is in its identity."""
MODEL_KEYS = tuple(f.name for f in dataclasses.fields(ModelConfig) if f.name not in ("name", "source"))
TRAIN_KEYS = tuple(f.name for f in dataclasses.fields(TrainConfig)
                   if f"workload.train.{f.name}" not in EXPANSION + OPERATIONAL)
SCALING_KEYS = tuple(f.name for f in dataclasses.fields(ScalingConfig) if f.name != "name")
PREFIX_KEYS = ("workload", "model", "shape", "format", "scaling", "backend")
HASH_CHARS = 8


def identity(config: Config, knobs: dict[str, object], shape_name: str, shape: dict) -> dict[str, object]:
    """The case's identity (see the module docstring). `knobs`: the backend's knobs, every one it declares,
    typed (`Knobs.values()`), and any knob of another backend the point sets (one this backend does not
    honour: its case is skipped, under an id of its own)."""
    c = config
    out: dict[str, object] = {"workload": c.workload.name, "model": c.model.name, "shape": shape_name,
                              "format": c.format.name, "scaling": c.scaling.name, "backend": c.backend_name}
    out |= {f"model.{k}": getattr(c.model, k) for k in MODEL_KEYS}
    out |= {f"shape.{k}": v for k, v in shape.items()}
    if c.format.name != "bf16":  # BF16 has no scales: its knobs would only split one twin into several
        out |= {f"scaling.{k}": getattr(c.scaling, k) for k in SCALING_KEYS}
    out |= {f"backend.{k}": v for k, v in knobs.items()}
    out |= {"measure.flush_l2": c.measure.flush_l2, "measure.cuda_graph": c.measure.cuda_graph}
    if c.workload.name == "train":  # the seed is the shape's (one case per seed)
        out |= {f"workload.train.{k}": _plain(getattr(c.workload.train, k)) for k in TRAIN_KEYS}
        out |= _unhonoured_operational(c)
    else:
        out["seed"] = c.seed
    return out


def _unhonoured_operational(c: Config) -> dict[str, object]:
    """The OPERATIONAL settings a point sets that its backend's training loop does not honour: what was asked
    (its case is skipped), so part of the id, where an honoured one is not."""
    train, defaults = c.workload.train, type(c.workload.train)()
    return {key: getattr(train, name) for key in _refused_operational(c.backend_name)
            if getattr(train, name := key.removeprefix("workload.train.")) != getattr(defaults, name)}


def _refused_operational(backend: str) -> tuple[str, ...]:
    """The OPERATIONAL keys `backend`'s training loop does not honour (none for a backend this checkout
    does not have: its committed records are read, never planned)."""
    try:
        unsupported = get_backend(backend).unsupported_train
    except ConfigError:
        return ()
    return tuple(key for key in OPERATIONAL if key.removeprefix("workload.train.") in unsupported)


def _plain(value: object) -> object:
    return list(value) if isinstance(value, (list, tuple)) else value


def prefix(ident: dict[str, object], variant: str) -> str:
    """`workload.model.shape.format.scaling.backend[+variant]`: the readable part of an id and the label."""
    base = ".".join(str(ident[k]) for k in PREFIX_KEYS)
    return f"{base}+{variant}" if variant else base


def case_id(ident: dict[str, object], variant: str) -> str:
    """The readable prefix, plus `~hash` of what differs from the prefix's reference (module docstring)."""
    ref = reference(ident)
    delta = {k: v for k, v in ident.items() if not k.startswith("backend.") and ref.get(k, _MISSING) != v}
    head = prefix(ident, variant)
    return f"{head}~{digest(delta)}" if delta else head


def digest(values: dict[str, object]) -> str:
    text = json.dumps(values, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:HASH_CHARS]


_MISSING = object()


def reference(ident: dict[str, object]) -> dict[str, object]:
    """The identity the same prefix has under the presets alone (the workload's and the model's presets in conf/, the scaling's
    defaults, conf/config.yaml's measure and seed), for the same shape name; where the presets do not make that
    shape (an explicit `workload.shapes` entry, a training run's own batch and steps), the shape is what its
    name says and is its own reference."""
    ref = dict(ident)
    workload, model = str(ident["workload"]), str(ident["model"])
    dims = preset_values("model", model)
    if dims is not None:
        ref |= {f"model.{k}": v for k, v in _model(model).items()}
    ref_shape = _reference_shapes(workload, model, str(ident["backend"])).get(str(ident["shape"]))
    if ref_shape is not None:
        ref = {k: v for k, v in ref.items() if not k.startswith("shape.")} | {f"shape.{k}": v for k, v in ref_shape.items()}
    if ident["format"] != "bf16":
        ref |= {f"scaling.{k}": v for k, v in _scaling_defaults(str(ident["scaling"])).items()}
    measure = root_values().get("measure", {})
    ref |= {"measure.flush_l2": measure.get("flush_l2", True), "measure.cuda_graph": measure.get("cuda_graph", False)}
    if workload == "train":
        train = _workload(workload).train
        ref |= {f"workload.train.{k}": _plain(getattr(train, k)) for k in TRAIN_KEYS}
        for key in _refused_operational(str(ident["backend"])):  # refused where set: the reference is unset
            ref[key] = getattr(TrainConfig(), key.removeprefix("workload.train."))
    else:
        ref["seed"] = root_values().get("seed", 0)
    return ref


def scaling_changes(scaling: str, params: dict) -> dict[str, object]:
    """The scaling knobs a case's identity (`params`, its stored form) sets away from the defaults of its
    scaling (conf/scaling/): what tells apart two cases of one recipe label, e.g. {'amax_history_len': 16}."""
    defaults = _scaling_defaults(scaling)
    return {k: v for k, v in ((k, params.get(f"scaling.{k}")) for k in SCALING_KEYS)
            if v is not None and v != defaults.get(k)}


def knob_text(scaling: str, params: dict | str | None) -> str:
    """scaling_changes as the pages name them, 'amax history len 16, margin 2' ('' at the defaults); `params`
    is the stored identity, as a mapping or its JSON text. A recipe label carries it (`e4m3/delayed · te-layer ·
    amax history len 16`): a knob away from the defaults makes another recipe, with its own speed and verdict."""
    if scaling not in _SCALING_NAMES:  # 'none' (BF16), or a record of a scaling this checkout no longer has
        return ""
    values = json.loads(params) if isinstance(params, str) else params if isinstance(params, dict) else {}
    return ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in scaling_changes(scaling, values).items())


_SCALING_NAMES = frozenset(s.value for s in Scaling if s is not Scaling.NONE)


@functools.cache
def _model(name: str) -> dict:
    return {k: getattr(ModelConfig(**preset_values("model", name)), k) for k in MODEL_KEYS}


@functools.cache
def _workload(name: str) -> WorkloadConfig:
    values = dict(preset_values("workload", name) or {"name": name})
    if isinstance(values.get("train"), dict):
        values["train"] = TrainConfig(**values["train"])
    return WorkloadConfig(**values)


@functools.cache
def _scaling_defaults(name: str) -> dict:
    sc = ScalingConfig(**(preset_values("scaling", name) or {"name": name}))
    return {k: getattr(sc, k) for k in SCALING_KEYS}


@functools.cache
def _reference_shapes(workload: str, model: str, backend: str) -> dict[str, dict]:
    if preset_values("model", model) is None:
        return {}
    config = Config(workload=_workload(workload), model=ModelConfig(**preset_values("model", model)),
                    format=_format_bf16(), scaling=ScalingConfig(name="none"), backend={"name": backend})
    return dict(shapes_module.shapes(config))


def _format_bf16():
    from fp8bench.config.schema import FormatConfig

    return FormatConfig(name="bf16")
