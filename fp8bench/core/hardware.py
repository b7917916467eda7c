"""What machine this is: device detection, spec-sheet peaks (with sources), environment fingerprint.

The environment is recorded, never read into defaults: `environment()` snapshots versions and variables once
and the snapshot travels with every result (run manifest → DuckDB `environments`).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import os
import platform
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass

import torch


@dataclass(frozen=True)
class DeviceInfo:
    """The device cases run on."""

    kind: str
    """'cuda' or 'cpu'."""
    name: str
    capability: tuple[int, int] | None
    """CUDA compute capability, None on CPU."""
    cuda_version: str | None
    """CUDA runtime torch was built with, None on CPU."""

    @property
    def is_cuda(self) -> bool:
        return self.kind == "cuda"

    @property
    def torch_device(self) -> torch.device:
        return torch.device("cuda" if self.is_cuda else "cpu")

    def sm(self) -> str:
        return f"sm_{self.capability[0]}{self.capability[1]}" if self.capability else "cpu"

    def has_capability(self, major: int, minor: int = 0) -> bool:
        return self.capability is not None and self.capability >= (major, minor)

    def cuda_at_least(self, major: int, minor: int) -> bool:
        if not self.cuda_version:
            return False
        parts = tuple(int(p) for p in self.cuda_version.split(".")[:2])
        return parts >= (major, minor)


DESCRIBED_DEVICES: dict[str, DeviceInfo] = {
    "h200": DeviceInfo("cuda", "NVIDIA H200", (9, 0), "12.9"),
    "h100": DeviceInfo("cuda", "NVIDIA H100 80GB HBM3", (9, 0), "12.9"),
    "b200": DeviceInfo("cuda", "NVIDIA B200", (10, 0), "12.9"),
    "cpu": DeviceInfo("cpu", "cpu (described)", None, None),
}
"""Devices `fp8bench plan --on NAME` plans for without being on them (as the GPU boxes run: CUDA 12.9)."""


@functools.lru_cache(maxsize=1)
def detect_device() -> DeviceInfo:
    """The first CUDA device if there is one, else the CPU (its model name from /proc/cpuinfo)."""
    if torch.cuda.is_available():
        return DeviceInfo("cuda", torch.cuda.get_device_name(0), torch.cuda.get_device_capability(0),
                          torch.version.cuda)
    return DeviceInfo("cpu", _cpu_name(), None, None)


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@dataclass(frozen=True)
class SpecSheet:
    """Vendor peak rates of one GPU model (dense, no sparsity)."""

    bf16_tflops: float
    fp8_tflops: float
    hbm_tbps: float
    source: str


# Keyed by a substring of torch.cuda.get_device_name(). Dense figures; the datasheets print 2x with sparsity.
SPEC_SHEETS: dict[str, SpecSheet] = {
    "H200": SpecSheet(989.0, 1979.0, 4.8, "NVIDIA H200 Tensor Core GPU datasheet (SXM), 2024: BF16 1,979 / FP8 3,958 TFLOPS with sparsity"),
    "H100 80GB HBM3": SpecSheet(989.0, 1979.0, 3.35, "NVIDIA H100 Tensor Core GPU datasheet (SXM5), 2023"),
    "H100 PCIe": SpecSheet(756.0, 1513.0, 2.0, "NVIDIA H100 Tensor Core GPU datasheet (PCIe), 2023"),
    "L40S": SpecSheet(362.0, 733.0, 0.864, "NVIDIA L40S datasheet, 2023"),
    "B200": SpecSheet(2250.0, 4500.0, 8.0, "NVIDIA DGX B200 datasheet (per GPU), 2024"),
}


def spec_sheet(device: DeviceInfo) -> SpecSheet | None:
    if not device.is_cuda:
        return None
    for key, sheet in SPEC_SHEETS.items():
        if key in device.name:
            return sheet
    return None


# --------------------------------------------------------------------------- environment fingerprint

_PACKAGES = ("torch", "triton", "transformer-engine", "torchao", "hydra-core", "omegaconf", "duckdb", "numpy")
_ENV_VARS = ("CUDA_VISIBLE_DEVICES", "NVTE_FLASH_ATTN", "NVTE_FUSED_ATTN", "TORCH_CUDNN_V8_API_ENABLED",
             "PYTORCH_CUDA_ALLOC_CONF", "TRITON_INTERPRET", "OMP_NUM_THREADS")


def _version(pkg: str) -> str | None:
    try:
        return importlib.metadata.version(pkg)
    except importlib.metadata.PackageNotFoundError:
        return None


def _gpu_uuid() -> str | None:
    """The physical GPU of device 0 (after CUDA_VISIBLE_DEVICES): two GPUs of one model settle at their own
    clock and power levels, so a run-to-run history must not mix them (fp8bench.analysis.compare keys it by env_id)."""
    try:
        return str(torch.cuda.get_device_properties(0).uuid)
    except (AttributeError, RuntimeError):
        return None


def _driver_version() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
    except (OSError, subprocess.SubprocessError):
        return None


@functools.lru_cache(maxsize=1)
def environment() -> dict:
    """A snapshot of everything that can change a result: device, versions, selected variables.

    `env_id` is a hash of the comparability-relevant part, so equal environments share one row in DuckDB. It
    includes the physical GPU (its UUID): each GPU has its own noise history.
    """
    dev = detect_device()
    versions = {pkg.replace("-", "_"): _version(pkg) for pkg in _PACKAGES}
    env = {
        "device_kind": dev.kind,
        "device_name": dev.name,
        "capability": dev.sm(),
        "cuda": dev.cuda_version,
        "driver": _driver_version() if dev.is_cuda else None,
        "gpu_uuid": _gpu_uuid() if dev.is_cuda else None,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        **{f"{k}_version": v for k, v in versions.items()},
        "env_vars": {k: os.environ[k] for k in _ENV_VARS if k in os.environ},
    }
    env["env_id"] = hashlib.sha256(json.dumps(env, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return env


def cpu_model() -> str:
    """The host CPU's model name: what launches the kernels, and so part of every host-bound figure."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def git_state(cwd: str | None = None) -> tuple[str | None, bool | None]:
    """(commit, dirty) of the repository at `cwd`, or (None, None) outside git. FP8BENCH_GIT_COMMIT (and
    FP8BENCH_GIT_DIRTY=0|1) override it: a GPU box that receives a copy of the working tree can hold stale git
    metadata, and would report the first commit it was sent, dirty, for every later tree."""
    if os.environ.get("FP8BENCH_GIT_COMMIT"):
        return os.environ["FP8BENCH_GIT_COMMIT"], os.environ.get("FP8BENCH_GIT_DIRTY", "0") == "1"
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=cwd,
                                timeout=10)
        if commit.returncode != 0:
            return None, None
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True, cwd=cwd, timeout=10)
        return commit.stdout.strip(), bool(status.stdout.strip())
    except (OSError, subprocess.SubprocessError):
        return None, None


def describe() -> dict:
    """Device and spec sheet for `fp8bench doctor`."""
    dev = detect_device()
    sheet = spec_sheet(dev)
    return {"device": asdict(dev), "spec_sheet": asdict(sheet) if sheet else None,
            "python": sys.version.split()[0]}


# --------------------------------------------------------------------------- capability matrix

@dataclass(frozen=True)
class Rule:
    """One fact about what a backend runs where, with where it comes from (each adapter declares its own:
    fp8bench.backends)."""

    formats: frozenset[str]
    scalings: frozenset[str]
    min_capability: tuple[int, int] | None
    """None: the rule also holds on CPU; else CUDA at least this capability is needed."""
    min_cuda: tuple[int, int] | None
    cpu: bool
    """Runs on CPU too."""
    source: str
    unsupported: bool = False
    """A pair the backend has no path for on any device, with `source` saying why (more specific than "no
    recipe")."""


def rule_verdict(backend: str, rules: tuple[Rule, ...], fmt: str, scaling: str, device: DeviceInfo) -> tuple[bool, str]:
    """Can `backend`, whose capability rules are `rules`, run (fmt, scaling) on `device`? (ok, a reason a user
    can act on). BF16 always runs; a pair no rule names has no recipe."""
    if fmt == "bf16":
        return True, "BF16 baseline"
    matching = [r for r in rules if fmt in r.formats and scaling in r.scalings]
    if not matching:
        return False, f"backend {backend!r} has no {fmt}/{scaling} recipe"
    rule = matching[0]
    if rule.unsupported:
        return False, rule.source
    if not device.is_cuda:
        if rule.cpu:
            return True, rule.source
        need = f"compute capability {rule.min_capability[0]}.{rule.min_capability[1]}" if rule.min_capability else "a CUDA GPU"
        return False, f"{fmt}/{scaling} on {backend} needs a CUDA GPU with {need}; this device is a CPU ({rule.source})"
    if rule.min_capability and not device.has_capability(*rule.min_capability):
        have = f"{device.capability[0]}.{device.capability[1]}"
        want = f"{rule.min_capability[0]}.{rule.min_capability[1]}"
        return False, f"{fmt}/{scaling} on {backend} needs compute capability {want}; this device is {have} ({rule.source})"
    if rule.min_cuda and not device.cuda_at_least(*rule.min_cuda):
        return False, (f"{fmt}/{scaling} on {backend} needs CUDA >= {rule.min_cuda[0]}.{rule.min_cuda[1]}; "
                       f"torch was built with {device.cuda_version} ({rule.source})")
    return True, rule.source


FP8 = frozenset({"e4m3", "hybrid"})
TENSORWISE = frozenset({"current", "delayed"})


def visible_gpus() -> list[str]:
    """GPU ids this process may use, without initialising CUDA (CUDA_VISIBLE_DEVICES, else nvidia-smi)."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [g for g in env.split(",") if g.strip() and g.strip() != "-1"]
    if shutil.which("nvidia-smi") is None:
        return []
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    n = sum(line.startswith("GPU ") for line in out.splitlines())  # MIG lines are indented, not GPUs
    return [str(i) for i in range(n)]


def gpu_count() -> int:
    """Parallel jobs for the local-gpus launcher: one per GPU (1 on a machine without any)."""
    return max(1, len(visible_gpus()))
