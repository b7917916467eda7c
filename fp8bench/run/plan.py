"""Sweep points → cases, each decided runnable or skipped once, here, with a reason a user can act on.

`verdict` is the one place a case's runnability is decided: what `fp8bench plan` lists is what `fp8bench run`
runs, case by case. `plan` builds every case of a request, refuses two requests that would make one case,
and adds the BF16 twin a timed recipe divides by where the request did not name it.
"""

from __future__ import annotations

import dataclasses
import json
from collections import defaultdict

import torch

from fp8bench import backends
from fp8bench.backends import get_backend
from fp8bench.cases import Case, cases_of, twin_case
from fp8bench.config.schema import Config, ConfigError
from fp8bench.core.hardware import DeviceInfo, detect_device
from fp8bench.core.types import Format

INTERLEAVED = frozenset({"gemm", "linear", "mlp", "layer"})
"""Workloads whose recipes are timed side by side with their BF16 twin (fp8bench.run.groups)."""


def resolve_device(config: Config) -> DeviceInfo:
    dev = detect_device()
    if config.device == "cuda" and not dev.is_cuda:
        raise ConfigError("device='cuda' but no CUDA device is visible; choose one of ['auto', 'cpu']")
    if config.device == "cpu" and dev.is_cuda:
        return DeviceInfo("cpu", "cpu (forced)", None, None)
    return dev


def verdict(case: Case, device: DeviceInfo, installed: bool = True) -> tuple[bool, str]:
    """Can `case` run on `device`? The request's own limits first (a device it asks for, knobs its backend
    does not honour), then the backend's declaration (workloads, its training loop, shapes, the capability
    rules), then, where `installed`, whether the backend's software imports here and the library's own
    verdict. `installed=False` plans for a described device as if every backend were installed there."""
    c, r = case.config, case.recipe
    name, workload = c.backend_name, c.workload.name
    be = get_backend(name)
    if c.device == "cuda" and not device.is_cuda:
        return False, "this point asks for device=cuda; no CUDA device is visible here"
    ok, why = knob_verdict(case)
    if not ok:
        return ok, why
    if c.measure.cuda_graph and workload != "gemm":
        return False, "measure.cuda_graph times graph replays of the gemm workload only; set it for gemm points"
    if c.measure.cuda_graph and not device.is_cuda:
        return False, "measure.cuda_graph replays CUDA graphs: it needs a CUDA device"
    if workload == "quantize" and r.format is Format.BF16:
        return False, "quantize measures casts to a low-precision format; BF16 inputs need none"
    torch_device = torch.device("cuda" if device.is_cuda else "cpu")
    checks = [lambda: be.supports(workload, r, torch_device)]
    if workload == "train":
        checks += [lambda: be.supports_train(c.workload.train, r, torch_device), lambda: _distributed(c, device)]
    checks += [lambda: be.capability(c.format.name, c.scaling.name, device),
               lambda: be.supports_shape(workload, case.shape, r)]
    if installed:
        checks = [lambda: backends.available(name), *checks, lambda: be.probe(workload, r)]
    for check in checks:
        ok, why = check()
        if not ok:
            return False, why
    return True, ""


def knob_verdict(case: Case) -> tuple[bool, str]:
    """Does the backend honour every knob the case sets? `backend.*` knobs it does not declare, `scaling.*`
    knobs it does not take under this scaling: the case is skipped with the first one named."""
    name, r = case.config.backend_name, case.recipe
    for key, value in case.unhonoured.items():
        return False, f"{name} does not support backend.{key}={_shown(value)}"
    for key, value in case.config.scaling.set_knobs().items():
        if r.format is not Format.BF16 and key not in get_backend(name).scaling_knobs(r.scaling):
            return False, f"{name} does not support scaling.{key}={_shown(value)} with scaling={r.scaling.value}"
    return True, ""


def _shown(value: object) -> str:
    """A value as the user types it in an override (true, not True)."""
    return json.dumps(value) if isinstance(value, (bool, int, float)) or value is None else str(value)


def _distributed(config: Config, device: DeviceInfo) -> tuple[bool, str]:
    t = config.workload.train
    if t.nproc == 1 and not t.fp8_all_gather:
        return True, ""
    from fp8bench.workloads.train.distributed import distributed_verdict

    return distributed_verdict(config, device)


def check_names(point: Config) -> None:
    """Backend names are the registry's (fp8bench.backends): an unknown one is a ConfigError listing them."""
    get_backend(point.backend_name)
    slowed = point.slowdown.partition(":")[0] if point.slowdown else None
    if slowed and slowed not in backends.names():
        raise ConfigError(f"slowdown={point.slowdown!r} names backend {slowed!r}; choose one of "
                          f"{backends.names()}")


def plan(points: list[Config], device: DeviceInfo | None = None, *, installed: bool = True,
         add_twins: bool = True, strict: bool = False) -> list[Case]:
    """Every case of `points`, each with its verdict, in request order; BF16 twins the request did not name
    added after the recipe that needs them (`Case.added`). Two points that would make one case are refused
    (ConfigError naming the keys they differ in); with `strict` (a single point), so is a knob its backend does
    not honour."""
    device = device or detect_device()
    cases: dict[str, Case] = {}
    for point in points:
        check_names(point)
        for case in cases_of(point):
            ok, why = knob_verdict(case)
            if strict and not ok:
                raise ConfigError(f"{why}; it honours {_knobs_of(case)}")
            kept = cases.get(case.case_id)
            if kept is None:
                cases[case.case_id] = case
            elif kept.config != point:
                _check_same(kept, case)
    if add_twins:
        _add_twins(cases, device, installed)
    return [c.with_verdict(*verdict(c, device, installed)) for c in cases.values()]


def _knobs_of(case: Case) -> str:
    knobs = sorted(f"backend.{k}" for k in case.recipe.knobs.values())
    knobs += sorted(f"scaling.{k}" for k in get_backend(case.config.backend_name).scaling_knobs(case.recipe.scaling))
    return str(knobs) if knobs else "no knobs"


def _check_same(kept: Case, case: Case) -> None:
    """Two points made one case: harmless where they differ only in what the case ignores (a BF16 case's
    scaling knobs), otherwise a request fp8bench would silently merge, so it is refused."""
    differ = _differing_keys(dataclasses.asdict(kept.config), dataclasses.asdict(case.config))
    if kept.recipe.format is Format.BF16 and all(k.startswith("scaling.") for k in differ):
        return
    shown = ", ".join(f"{k} ({a!r} vs {b!r})" for k, (a, b) in sorted(differ.items())) or "nothing (asked twice)"
    raise ConfigError(f"two requested points make one case {case.case_id!r}: they differ only in {shown}, which "
                      "does not change what is measured; request one of them, or run them as separate runs")


def _differing_keys(a: dict, b: dict, prefix: str = "") -> dict[str, tuple]:
    out = {}
    for key in sorted(set(a) | set(b)):
        x, y = a.get(key), b.get(key)
        if isinstance(x, dict) and isinstance(y, dict):
            out |= _differing_keys(x, y, f"{prefix}{key}.")
        elif x != y:
            out[f"{prefix}{key}"] = (x, y)
    return out


def needs_twin(case: Case) -> bool:
    """A recipe timed side by side with its BF16 twin (its speedup divides by that twin's time)."""
    return (case.config.workload.name in INTERLEAVED and case.recipe.format is not Format.BF16
            and get_backend(case.config.backend_name).timed)


def _add_twins(cases: dict[str, Case], device: DeviceInfo, installed: bool) -> None:
    for case in list(cases.values()):
        if not needs_twin(case) or not case.twin_id or case.twin_id in cases:
            continue
        if not verdict(case, device, installed)[0]:
            continue  # a recipe that will not run needs no twin
        twin = twin_case(case)  # a case with a twin id has a twin shape
        cases[twin.case_id] = dataclasses.replace(twin, added=True)


def job_groups(cases: list[Case]) -> list[list[Case]]:
    """The cases as units of scheduling (a Hydra job, a Slurm job, a process): every case of a group shares
    one BF16 twin point, so a recipe and the twin it divides by always run in the same process. In request
    order, a group where its first case was."""
    groups: dict[str, list[Case]] = defaultdict(list)
    for case in cases:
        groups[case.group].append(case)
    return list(groups.values())


def execution_order(cases: list[Case]) -> list[Case]:
    """Group a shape's cases together (BF16 first): its baseline and recipes then run back to back."""
    def key(c: Case):
        cfg = c.config
        return (cfg.workload.name, cfg.model.name, c.twin_id or c.case_id, cfg.format.name != "bf16")
    return sorted(cases, key=key)
