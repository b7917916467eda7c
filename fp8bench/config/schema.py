"""Frozen, keyword-only dataclass schemas of every config group.

Values live in `conf/*.yaml`; these classes say what keys exist, their types and what each means, and
`__post_init__` rejects bad values with a message that names the field, the value and the valid choices.
No hydra/omegaconf import here: `fp8bench.config.compose` is the only module that touches Hydra.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fp8bench.core.types import Format, GemmRole, Scaling, WorkloadName, choices


class ConfigError(ValueError):
    """Bad user input in a config: always names the field, the bad value and the valid choices."""


def _one_of(field_name: str, value: object, valid: list[str]) -> None:
    if value not in valid:
        raise ConfigError(f"{field_name}={value!r} is not valid; choose one of {valid}")


def _positive(field_name: str, value: float, allow_zero: bool = False) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0 or (value == 0 and not allow_zero):
        raise ConfigError(f"{field_name}={value!r} must be a {'non-negative' if allow_zero else 'positive'} number")


LINEARS = ("qkv", "o", "gate_up", "down")
"""The distinct linears of a transformer block (gate/up fused as one GEMM, as TE's LayerNormMLP does)."""


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Shape preset of a Llama/GPT-style decoder."""

    name: str
    hidden: int
    """Model width d_model."""
    ffn: int
    """MLP inner width (per branch for SwiGLU)."""
    heads: int
    kv_heads: int
    """Key/value heads (grouped-query attention when < heads)."""
    layers: int
    vocab: int
    seq: int
    """Context length of the preset."""
    mlp: str = "swiglu"
    """'swiglu' (gate and up projections) or 'gelu' (one up projection)."""
    source: str = ""
    """Where the dimensions come from."""

    def __post_init__(self) -> None:
        for f in ("hidden", "ffn", "heads", "kv_heads", "layers", "vocab", "seq"):
            _positive(f"model.{f}", getattr(self, f))
        _one_of("model.mlp", self.mlp, ["swiglu", "gelu"])
        check_name("model.name", self.name)
        if self.hidden % self.heads or self.heads % self.kv_heads:
            raise ConfigError(f"model.heads={self.heads} must divide model.hidden={self.hidden} and be a "
                              f"multiple of model.kv_heads={self.kv_heads}")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def linear_dims(self, linear: str) -> tuple[int, int]:
        """(in_features, out_features) of one of LINEARS."""
        kv = self.kv_heads * self.head_dim
        mlp_branches = 2 if self.mlp == "swiglu" else 1
        dims = {"qkv": (self.hidden, self.hidden + 2 * kv), "o": (self.hidden, self.hidden),
                "gate_up": (self.hidden, mlp_branches * self.ffn), "down": (self.ffn, self.hidden)}
        return dims[linear]


@dataclass(kw_only=True)  # not frozen: OmegaConf makes a frozen dataclass nested in a group read-only
class TrainConfig:
    """`train` workload: optimiser, schedule, data and checkpoint settings (the stability knobs the FP8
    guides insist on are all here: warm-up, clipping, loss scaling, master-weight precision)."""

    steps: int = 200
    lr: float = 1e-3
    """Peak learning rate (AdamW)."""
    min_lr_ratio: float = 0.1
    """Cosine decay ends at lr * min_lr_ratio."""
    warmup_steps: int = 20
    weight_decay: float = 0.1
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    grad_clip: float = 1.0
    """Max global gradient norm (0: no clipping)."""
    loss_scale: float = 1.0
    """Static loss scale (the loss is multiplied, the gradients divided back before clipping)."""
    dynamic_loss_scale: bool = False
    """Use torch.amp.GradScaler (skips steps with inf/NaN gradients and adapts the scale)."""
    master_weights: str = "fp32"
    """'fp32': FP32 parameters and optimiser state, compute under torch.autocast(bf16) (mixed precision);
    'bf16': BF16 parameters and optimiser state."""
    bf16_seeds: int = 3
    """BF16 points train this many seeds (seed, seed+1, ...): the band FP8 runs are judged against."""
    fp8_seeds: int = 1
    """Low-precision points train this many seeds (the same seeds as the band's first ones): loss parity is a
    pass rate over them (conf/workload/train.yaml: 3)."""
    schedule_steps: int = 0
    """The learning-rate schedule's length in steps (warm-up, then cosine decay to its end); 0: `steps`. Set it
    above `steps` to train the first steps of a longer run's schedule (a plateau past some step)."""
    eval_every: int = 50
    eval_batches: int = 8
    ckpt_every: int = 0
    """Checkpoint every N steps (0: never); a resumed run continues from the latest one."""
    corpus: str = "stdlib"
    """'stdlib' (the Python standard library's source files, present on every machine) or a text file or
    folder (its *.py, *.txt, *.md and *.rst files)."""
    val_percent: int = 5
    """Share of the corpus's files held out for validation (chosen by a hash of each file's path)."""
    nproc: int = 1
    """Processes (one GPU each) of one run; above 1 the run is launched with torchrun and the global batch
    (`workload.batch`) is split across ranks, so each step sees the same tokens as a one-GPU run."""
    strategy: str = "fsdp2"
    """With nproc > 1: 'fsdp2' (fully_shard per block and root, BF16 params, FP32 reduce) or 'ddp'."""
    fp8_all_gather: bool = False
    """FSDP2 + torchao tensorwise float8: all-gather the sharded weights already cast to FP8."""

    def __post_init__(self) -> None:
        _positive("workload.train.nproc", self.nproc)
        _one_of("workload.train.strategy", self.strategy, ["fsdp2", "ddp"])
        for f in ("steps", "eval_every", "eval_batches", "bf16_seeds", "fp8_seeds", "lr", "loss_scale"):
            _positive(f"workload.train.{f}", getattr(self, f))
        for f in ("warmup_steps", "weight_decay", "grad_clip", "ckpt_every", "min_lr_ratio", "schedule_steps"):
            _positive(f"workload.train.{f}", getattr(self, f), allow_zero=True)
        _one_of("workload.train.master_weights", self.master_weights, ["fp32", "bf16"])
        if self.corpus != "stdlib" and not Path(self.corpus).expanduser().exists():
            raise ConfigError(f"workload.train.corpus={self.corpus!r} is neither 'stdlib' nor an existing file or "
                              "folder of text")
        if not 0 < self.val_percent < 100:
            raise ConfigError(f"workload.train.val_percent={self.val_percent!r} must be in 1..99")
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise ConfigError(f"workload.train.betas={list(self.betas)!r} must be two numbers in [0, 1)")


@dataclass(frozen=True, kw_only=True)
class WorkloadConfig:
    """What is measured for a model preset."""

    name: str
    tokens: int = 8192
    """Tokens per step (batch x sequence): the M of fprop/dgrad, the K of wgrad."""
    linears: list[str] = field(default_factory=lambda: list(LINEARS))
    """gemm/linear: which of the block's linears."""
    roles: list[str] = field(default_factory=lambda: ["fprop", "dgrad", "wgrad"])
    """gemm: which GEMMs of each linear."""
    shapes: list[list[int]] = field(default_factory=list)
    """gemm: explicit (M, N, K) shapes measured in addition to the model's."""
    tensors: list[str] = field(default_factory=lambda: ["activation", "weight"])
    """quantize: the activation (tokens x hidden) and/or the largest weight (ffn x hidden)."""
    batch: int = 2
    """mlp, layer, train: sequences per step."""
    seq: int = 4096
    """mlp, layer, train: tokens per sequence."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """train: optimiser, schedule, data, checkpoints."""

    def __post_init__(self) -> None:
        _one_of("workload.name", self.name, choices(WorkloadName))
        _positive("workload.tokens", self.tokens)
        _positive("workload.batch", self.batch)
        _positive("workload.seq", self.seq)
        for lin in self.linears:
            _one_of("workload.linears", lin, list(LINEARS))
        for role in self.roles:
            _one_of("workload.roles", role, choices(GemmRole))
        for t in self.tensors:
            _one_of("workload.tensors", t, ["activation", "weight"])
        for shape in self.shapes:
            if len(shape) != 3:
                raise ConfigError(f"workload.shapes entry {list(shape)!r} must be [M, N, K]")
            for d in shape:
                _positive("workload.shapes", d)


@dataclass(frozen=True, kw_only=True)
class FormatConfig:
    name: str

    def __post_init__(self) -> None:
        _one_of("format", self.name, choices(Format))

    @property
    def format(self) -> Format:
        return Format(self.name)


SCALING_KNOBS: dict[str, tuple[str, ...]] = {
    "delayed": ("amax_history_len", "amax_compute_algo", "margin", "pow2_scales"),
    "current": ("margin", "pow2_scales"),
    "rowwise": ("pow2_scales",),
    "blockwise": ("pow2_scales",),
}
"""The `scaling.*` knobs each scaling mode's numerics read (fp8bench.core.numerics: `amax_to_scale` backs every
per-tensor scale off by the margin); a backend may honour fewer (`Backend.scaling_knobs`)."""


@dataclass(frozen=True, kw_only=True)
class ScalingConfig:
    name: str
    amax_history_len: int = 1024
    """delayed: amax history length (TE DelayedScaling default 1024)."""
    amax_compute_algo: str = "max"
    """delayed: 'max' or 'most_recent'."""
    margin: int = 0
    """delayed (and current): the scale backs off by 2**margin."""
    pow2_scales: bool = False
    """Round scales down to powers of two."""

    def __post_init__(self) -> None:
        _one_of("scaling", self.name, choices(Scaling))
        _positive("scaling.amax_history_len", self.amax_history_len)
        _one_of("scaling.amax_compute_algo", self.amax_compute_algo, ["max", "most_recent"])
        _positive("scaling.margin", self.margin, allow_zero=True)

    @property
    def scaling(self) -> Scaling:
        return Scaling(self.name)

    def knobs(self) -> dict[str, object]:
        """Every knob's value, by name (without `name`)."""
        return {k: getattr(self, k) for k in KNOB_DEFAULTS}

    def set_knobs(self) -> dict[str, object]:
        """The knobs whose value differs from the default: what a case asks of its scaling beyond the mode."""
        return {k: v for k, v in self.knobs().items() if v != KNOB_DEFAULTS[k]}


KNOB_DEFAULTS: dict[str, object] = {"amax_history_len": 1024, "amax_compute_algo": "max", "margin": 0,
                                    "pow2_scales": False}
"""ScalingConfig's knob defaults (the values TE's DelayedScaling starts from)."""


@dataclass(frozen=True, kw_only=True)
class MeasureConfig:
    """How every case is timed (fp8bench.core.measure). gemm, linear, mlp and layer cases are timed beside their BF16
    twin in `rounds` rounds (measure.time_interleaved); the others (and a BF16 case with no recipe beside it)
    sample alone, up to `iters` samples or `max_time_s`."""

    warmup: int = 3
    """Untimed iterations first (compilation, autotuning, allocator warm-up)."""
    iters: int = 50
    """Timed iterations (samples) at most, for a case timed alone."""
    min_samples: int = 3
    max_time_s: float = 2.0
    """A case timed alone stops sampling after this much time, once min_samples exist."""
    rounds: int = 10
    """Side-by-side timing: rounds of every op of a group; each round gives one ratio per recipe, and the
    speedup's 95% interval needs at least 6 (fp8bench.core.speedup)."""
    block_ms: float = 1.0
    """Side-by-side timing: each op runs enough back-to-back iterations per round to last this long (at least
    one; a microsecond-scale op's round median then rests on many samples)."""
    flush_l2: bool = True
    """CUDA: overwrite a buffer larger than L2 between iterations (outside the timed region)."""
    cuda_graph: bool = False
    """CUDA: time replays of a captured graph (for launch-bound shapes)."""
    processes: int = 1
    """Side-by-side timing: how many processes time each recipe with its twin (the first the run's own, the
    others fresh interpreters: fp8bench.run.replica); a speedup's interval covers the variance between them.
    3 in the GPU study presets, 1 on the CPU and in tests."""
    sandwich_blocks: int = 5
    """Training: after a recipe's run, blocks of steps of its BF16 twin and of the recipe alternate (A B A B A for
    5; the twin first and last), in each of `processes` processes, and its `speedup_vs_bf16` with its interval
    and the twin's drift come from them (fp8bench.run.train_sandwich). Odd, at least 3; 0: no sandwich (the
    speedup is then a ratio of two runs' medians, timed apart, and published as withdrawn)."""
    sandwich_steps: int = 10
    """Training: timed steps per block of the sandwich (after `warmup` untimed steps whenever a side is built)."""
    settle_ms: float = 200.0
    """CUDA: untimed back-to-back iterations for this long before sampling, so a power-limited GPU's clocks
    have stepped down to their sustained level (fp8bench.core.measure._time_cuda; 0 times from a cold start)."""

    def __post_init__(self) -> None:
        _positive("measure.warmup", self.warmup, allow_zero=True)
        _positive("measure.settle_ms", self.settle_ms, allow_zero=True)
        _positive("measure.iters", self.iters)
        _positive("measure.min_samples", self.min_samples)
        _positive("measure.max_time_s", self.max_time_s)
        _positive("measure.block_ms", self.block_ms)
        if not isinstance(self.processes, int) or isinstance(self.processes, bool) or self.processes < 1:
            raise ConfigError(f"measure.processes={self.processes!r} must be an integer >= 1")
        if not isinstance(self.rounds, int) or self.rounds < 6:
            raise ConfigError(f"measure.rounds={self.rounds!r} must be an integer >= 6 (fewer rounds give no 95% "
                              "interval for a speedup)")
        if not isinstance(self.sandwich_blocks, int) or self.sandwich_blocks < 0 or (
                self.sandwich_blocks and (self.sandwich_blocks < 3 or self.sandwich_blocks % 2 == 0)):
            raise ConfigError(f"measure.sandwich_blocks={self.sandwich_blocks!r} must be 0 (no sandwich) or an odd "
                              "integer >= 3 (the BF16 twin's blocks first and last: 3, 5, 7, ...)")
        if not isinstance(self.sandwich_steps, int) or self.sandwich_steps < 3:
            raise ConfigError(f"measure.sandwich_steps={self.sandwich_steps!r} must be an integer >= 3 (a block's "
                              "median and its variance need three steps)")
        if self.min_samples > self.iters:
            raise ConfigError(f"measure.min_samples={self.min_samples} exceeds measure.iters={self.iters}")


@dataclass(frozen=True, kw_only=True)
class StoreConfig:
    ingest: bool = True
    """Ingest into DuckDB at the end of `run` (when duckdb is importable)."""
    db: str | None = None
    """DuckDB path; default <results_dir>/fp8bench.duckdb."""


@dataclass(frozen=True, kw_only=True)
class Config:
    """One point of a sweep: what `fp8bench run` executes, as composed from `conf/` (the typed case, its id
    and its backend's own knobs are built from it by fp8bench.cases)."""

    workload: WorkloadConfig
    model: ModelConfig
    format: FormatConfig
    scaling: ScalingConfig
    backend: dict[str, Any] = field(default_factory=dict)
    """The backend's `name` and its knobs as given (conf/backend/<preset>.yaml, conf/config.yaml's default
    preset, and `backend.<knob>=` overrides).
    Which knobs exist, their types and defaults is each backend's own declaration (its `Knobs` dataclass, in
    its module under fp8bench/backends/): a knob the named backend does not honour makes the case skipped."""
    measure: MeasureConfig = field(default_factory=MeasureConfig)
    store: StoreConfig = field(default_factory=StoreConfig)
    results_dir: str = "results"
    """Where runs/, the DuckDB file and the site go."""
    run_id: str | None = None
    """Name of this run (a folder under results_dir/runs); default a UTC timestamp."""
    resume: str | None = None
    """Run id to continue: cases already recorded there are skipped."""
    seed: int = 0
    device: str = "auto"
    """'auto' (CUDA if present), 'cpu' or 'cuda'."""
    sweep_name: str | None = None
    """Name of the sweep preset this point belongs to (set by conf/sweep/*.yaml)."""
    job_group: int | None = None
    """Set by `fp8bench run -m` for each job it launches: the index of the twin group the job runs (a job is
    every case that shares one BF16 twin, run in one process)."""
    fail_on: str | None = None
    """Test-only: a case id substring whose cases raise at run time (exercises failure isolation)."""
    diverge_at_step: int | None = None
    """Test-only: every training case's loss is made NaN from this step on (exercises how a diverged run is
    recorded, on any machine, without relying on a learning rate large enough to blow up)."""
    slowdown: str | None = None
    """Test-only: 'BACKEND:FRACTION' (e.g. 'torch:0.05') makes every timed iteration of that backend take
    FRACTION longer, inside the timed region, to check that regression detection catches a known change."""

    def __post_init__(self) -> None:
        _one_of("device", self.device, ["auto", "cpu", "cuda"])
        self.slowdown_for("")  # validates the format
        if self.seed < 0:
            raise ConfigError(f"seed={self.seed!r} must be >= 0")
        for name in ("run_id", "resume", "sweep_name"):
            if getattr(self, name) is not None:
                check_name(name, getattr(self, name))
        if not isinstance(self.backend, dict) or not isinstance(self.backend.get("name"), str) or not self.backend["name"]:
            raise ConfigError(f"backend={self.backend!r} names no backend; give backend=<preset> "
                              "(fp8bench doctor lists the backends)")
        check_name("backend.name", self.backend["name"])

    @property
    def backend_name(self) -> str:
        return self.backend["name"]

    def slowdown_for(self, backend: str) -> float:
        """The injected slowdown fraction for `backend` (0 when none)."""
        if not self.slowdown:
            return 0.0
        name, _, frac = self.slowdown.partition(":")
        try:
            fraction = float(frac)
        except ValueError:
            fraction = -1.0
        if not name or not 0.0 < fraction < 10.0:
            raise ConfigError(f"slowdown={self.slowdown!r} must be BACKEND:FRACTION with 0 < FRACTION < 10 "
                              "(e.g. torch:0.05)")
        return fraction if name == backend else 0.0


NAME_RE = re.compile(r"[A-Za-z0-9_.\-]+")
"""What a name that becomes part of a path may hold: letters, digits, '-', '_' and '.'."""


def check_name(field_name: str, value: object) -> None:
    """A value that becomes part of a path (run ids, resume ids, sweep and model names): letters, digits,
    '-', '_', '.', never '..' and never absolute, so nothing is written outside results_dir (nor `.` alone,
    which names the folder it would be made in)."""
    if not isinstance(value, str) or not NAME_RE.fullmatch(value) or ".." in value or value == ".":
        raise ConfigError(f"{field_name}={value!r} is not a valid name: use letters, digits, '-', '_' and '.' "
                          "(no '/', no '..'), e.g. run_id=my-run.1")


def _fields_of(cls: type, values: dict) -> dict:
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in values.items() if k in names}


def config_from_values(values: dict) -> Config:
    """A Config from its `dataclasses.asdict` form (a run's manifest, a plan file), validated; keys this schema
    does not have are left out and missing ones take their defaults."""
    workload = dict(values.get("workload") or {})
    if isinstance(workload.get("train"), dict):
        workload["train"] = TrainConfig(**_fields_of(TrainConfig, workload["train"]))
    try:
        return Config(**_fields_of(Config, {
            **values,
            "workload": WorkloadConfig(**_fields_of(WorkloadConfig, workload)),
            "model": ModelConfig(**_fields_of(ModelConfig, values.get("model") or {})),
            "format": FormatConfig(**_fields_of(FormatConfig, values.get("format") or {})),
            "scaling": ScalingConfig(**_fields_of(ScalingConfig, values.get("scaling") or {})),
            "measure": MeasureConfig(**_fields_of(MeasureConfig, values.get("measure") or {})),
            "store": StoreConfig(**_fields_of(StoreConfig, values.get("store") or {})),
        }))
    except TypeError as exc:
        raise ConfigError(f"a stored config does not fit this schema: {exc}") from None
