"""Records written before case ids were derived from the whole identity (record version 1), re-keyed to
today's ids, so that runs and exports recorded then still ingest, pair with their twins and compare with runs
recorded now.

A version-1 record holds its workload, model, format, scaling, backend and shape, and in `params` its backend
knobs, its delayed-scaling knobs and, for training, its depth and master weights; the rest of its point is its
run's manifest (`config.base`, the run's first point: a sweep varies the groups its records name). From these
the point is rebuilt and its case built as today (fp8bench.cases.build): the id, the label and the twin's id
follow. A record whose point cannot be rebuilt (a backend or model this checkout does not have) keeps its id.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from fp8bench import backends
from fp8bench.cases import build
from fp8bench.cases.identity import MODEL_KEYS
from fp8bench.config.compose import preset_values
from fp8bench.config.schema import ConfigError, config_from_values
from fp8bench.core.records import CaseRecord

SCALING_PARAMS = ("amax_history_len", "amax_compute_algo", "margin", "pow2_scales")
KERNEL_PARAMS = ("gemm_kernel", "wgrad_kernel")


def is_legacy(record: CaseRecord) -> bool:
    return record.record_version < 2


def upgrade(record: CaseRecord, base: dict | None) -> CaseRecord:
    """`record` with today's id, label, twin id, identity (`params`) and what ran, as far as it tells."""
    try:
        config = legacy_config(record, base or {})
        case = build(config, record.shape_name, record.shape)
    except (ConfigError, KeyError, TypeError, ValueError):
        return dataclasses.replace(record, label=record.label or record.case_id, record_version=2)
    measurement = dict(record.measurement)
    timed = backends.get_backend(record.backend).timed
    if not timed and "method" not in measurement:
        measurement["method"] = "once"
    return dataclasses.replace(record, case_id=case.case_id, label=case.label, twin_id=case.twin_id,
                               params=case.params, ran=legacy_ran(record) if record.status != "skipped" else {},
                               measurement=measurement, record_version=2)


def legacy_ran(record: CaseRecord) -> dict:
    """What a version-1 record says ran: the kernels it named, graphs where its id, params or measurement said
    so; compilation as its knob asked (version 1 recorded no more)."""
    p = record.params
    graphs = bool(record.measurement.get("cuda_graph")) or "step" in p or "+cuda_graph" in record.case_id
    return {"graphs": graphs, "compiled": bool(p.get("compile")), **{k: p[k] for k in KERNEL_PARAMS if k in p},
            "stated_by": "a version-1 record"}


def legacy_config(record: CaseRecord, base: dict):
    """The point a version-1 record was a case of, rebuilt (see the module docstring)."""
    values: dict[str, Any] = {k: v for k, v in base.items() if k not in ("workload", "model", "format", "scaling",
                                                                         "backend")}
    values["workload"] = _workload(record, base.get("workload") or {})
    values["model"] = _model(record, base.get("model") or {})
    values["format"] = {"name": record.format}
    p = record.params
    scaling = {"name": record.scaling}
    if record.format != "bf16":
        scaling |= {k: p[k] for k in SCALING_PARAMS if k in p}
    values["scaling"] = scaling
    knobs = {f.name for f in dataclasses.fields(backends.get_backend(record.backend).knobs)}
    values["backend"] = {"name": record.backend, **{k: p[k] for k in knobs if k in p}}
    for key in ("run_id", "resume"):  # names of their time may not be names today; they do not identify a case
        values.pop(key, None)
    return config_from_values(values)


def _workload(record: CaseRecord, base: dict) -> dict:
    workload = dict(base) if base.get("name") == record.workload else dict(preset_values("workload", record.workload) or {})
    workload["name"] = record.workload
    if record.workload == "train":
        train = dict(workload.get("train") or (preset_values("workload", "train") or {}).get("train") or {})
        if "master_weights" in record.params:
            train["master_weights"] = record.params["master_weights"]
        workload["train"] = train
    return workload


def _model(record: CaseRecord, base: dict) -> dict:
    if base.get("name") == record.model:
        model = dict(base)
    else:
        model = dict(preset_values("model", record.model) or {**base, "name": record.model})
    if "layers" in record.params:
        model["layers"] = record.params["layers"]
    return {k: model[k] for k in ("name", "source", *MODEL_KEYS) if k in model}
