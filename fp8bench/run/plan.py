"""Sweep points → cases, each marked runnable or skipped with a reason a user can act on."""

from __future__ import annotations

from dataclasses import dataclass

from fp8bench import backends
from fp8bench.backends import Recipe, get_backend
from fp8bench.config.schema import Config, ConfigError
from fp8bench.core.hardware import DeviceInfo, detect_device
from fp8bench.core.types import Format, Scaling
from fp8bench.models import shapes


@dataclass(frozen=True)
class Case:
    """One measurement: a sweep point narrowed to one shape."""

    config: Config
    shape_name: str
    shape: dict
    runnable: bool
    reason: str

    @property
    def recipe(self) -> Recipe:
        c = self.config
        return Recipe(format=Format(c.format.name), scaling=Scaling(c.scaling.name), scaling_cfg=c.scaling,
                      backend_cfg=c.backend)

    @property
    def case_id(self) -> str:
        return shapes.case_id(self.config, self.shape_name)

    @property
    def params(self) -> dict:
        c = self.config
        p = {"tokens": c.workload.tokens, **{k: v for k, v in vars(c.backend).items() if k != "name"}}
        if c.scaling.name == "delayed":
            p.update(amax_history_len=c.scaling.amax_history_len, amax_compute_algo=c.scaling.amax_compute_algo,
                     margin=c.scaling.margin)
        if c.scaling.pow2_scales:
            p["pow2_scales"] = True
        if c.workload.name == "train":  # what a whole-step figure depends on beyond the case id
            p.update(layers=c.model.layers, master_weights=c.workload.train.master_weights)
        return p


def resolve_device(config: Config) -> DeviceInfo:
    dev = detect_device()
    if config.device == "cuda" and not dev.is_cuda:
        raise ConfigError("device='cuda' but no CUDA device is visible; choose one of ['auto', 'cpu']")
    if config.device == "cpu" and dev.is_cuda:
        return DeviceInfo("cpu", "cpu (forced)", None, None)
    return dev


def verdict(config: Config, device: DeviceInfo) -> tuple[bool, str]:
    """Runnable here? Installation first, then the adapter's own verdict (TE answers with its own probes, so
    its reason is the one recorded), then the device capability matrix."""
    if config.device == "cuda" and not device.is_cuda:
        return False, "this point asks for device=cuda; no CUDA device is visible here"
    b = config.backend.name
    ok, why = backends.available(b)
    if not ok:
        return False, why
    fmt, sc = config.format.name, config.scaling.name
    if config.workload.name == "quantize" and fmt == "bf16":
        return False, "quantize measures casts to a low-precision format; BF16 inputs need none"
    recipe = Case(config, "", {}, True, "").recipe
    ok, why = get_backend(b).supports(config.workload.name, recipe, device.torch_device)
    if not ok:
        return False, why
    t = config.workload.train
    if config.workload.name == "train" and "cuda_graph" in config.backend.variant() and t.nproc > 1:  # (read by a backend)
        return False, ("backend.cuda_graph captures a step of fp8bench's own loop in one process; set "
                       "workload.train.nproc=1")
    if config.workload.name == "train" and (t.nproc > 1 or t.fp8_all_gather):
        from fp8bench.workloads.train.distributed import distributed_verdict

        ok, why = distributed_verdict(config, device)
        if not ok:
            return False, why
    return backends.capability(b, fmt, sc, device)


def check_names(point: Config) -> None:
    """Backend names are the registry's (fp8bench.backends): an unknown one is a ConfigError listing them."""
    get_backend(point.backend.name)
    slowed = point.slowdown.partition(":")[0] if point.slowdown else None
    if slowed and slowed not in backends.names():
        raise ConfigError(f"slowdown={point.slowdown!r} names backend {slowed!r}; choose one of "
                          f"{backends.names()}")


def plan(points: list[Config], device: DeviceInfo | None = None) -> list[Case]:
    device = device or detect_device()
    cases: dict[str, Case] = {}
    for point in points:
        check_names(point)
        ok, why = verdict(point, device)
        for shape_name, shape in shapes.shapes(point):
            shape_ok, shape_why = (get_backend(point.backend.name).supports_shape(
                point.workload.name, shape, Case(point, shape_name, shape, True, "").recipe) if ok else (ok, why))
            case = Case(point, shape_name, shape, shape_ok, "" if shape_ok else shape_why)
            cases.setdefault(case.case_id, case)
    return list(cases.values())


def execution_order(cases: list[Case]) -> list[Case]:
    """Group a shape's cases together (BF16 first): its baseline and recipes then run back to back."""
    def key(c: Case):
        cfg = c.config
        return (cfg.workload.name, cfg.model.name, c.shape_name, cfg.backend.name, cfg.format.name != "bf16")
    return sorted(cases, key=key)

