"""Which FP8 recipe to train with: the fastest one whose loss parity is established (no duckdb).

`recommend` returns the fastest recipe, at the size its speed was measured, that passes parity at the largest
size where it was judged with at least MIN_SEEDS seeds and failed nowhere; the recipes faster than it are
listed below it with their verdicts, then the slower ones that still beat BF16. Only a speed with a 95%
interval ranks a recipe, and "faster than BF16" means that interval lies above 1: a recipe whose speed was
withdrawn is listed apart, with no figure. A recipe with no verdict is "not judged", one judged on fewer seeds
"too few seeds": neither is ever "passes". A recipe is the same recipe across sizes when `Recipe.of` says so.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from fp8bench.analysis.parity import MIN_SEEDS, PAIRED_RULE, Criterion, paired_area_test

UNESTABLISHED = "speed not established"
"""How a recipe whose whole-step speed has no interval is listed: neither faster nor slower than BF16."""

SCHEDULING_ONLY = frozenset({"compile", "cuda_graph"})
"""Variant tags that change how the kernels are launched (compiled and fused, or replayed from a CUDA graph),
not which operands are quantized, how they are scaled or rounded: a verdict holds with or without them."""


def quantizes_as(backend: str) -> str:
    """The backend whose quantization `backend` shares (its declaration, `Backend.quantizes_as`: TE's
    TransformerLayer path and te.Linear quantize the same GEMM operands with the same recipe, so a recipe's
    loss behaviour is one fact for both), else `backend` itself. An integration that wraps a library keeps its
    own name: it chooses its own recipe defaults and which modules it converts. Reading a declaration imports
    the backends' registry, and torch with it."""
    from fp8bench import backends

    return str(backends.declared(backend, "quantizes_as", "") or backend)


@dataclass(frozen=True, order=True)
class Recipe:
    """A recipe's identity across sizes and runs: number format, scaling, the numerics path (the backend
    whose quantization it shares, `quantizes_as`, with SCHEDULING_ONLY variant tags dropped), and the scaling
    knobs set away from that scaling's defaults (fp8bench.cases.identity.knob_text): delayed scaling with a
    16-step amax history is not TE's defaults, and neither lends the other its speed or its verdict."""

    format: str
    scaling: str
    path: str
    knobs: str = ""

    @classmethod
    def of(cls, format: str, scaling: str, backend: str, variant: str = "", knobs: str = "") -> Recipe:
        tags = [t for t in variant.split("+") if t and t not in SCHEDULING_ONLY]
        return cls(format, scaling, "+".join([quantizes_as(backend), *tags]), knobs)

    def label(self) -> str:
        return f"{self.format}/{self.scaling} · {self.path}" + (f" · {self.knobs}" if self.knobs else "")


@dataclass(frozen=True, order=True)
class Size:
    """A model size: `params` orders sizes (model_params of its preset), `model` names it."""

    params: float
    model: str


def model_params(preset: Mapping) -> float:
    """Parameters in a preset's transformer blocks (attention and MLP weights; the byte-level embedding and
    head that training uses are negligible): what orders sizes from gpt-125m to Llama-2-7B."""
    h, layers = preset["hidden"], preset["layers"]
    kv = h * preset.get("kv_heads", preset["heads"]) // preset["heads"]
    mlp = (3 if preset.get("mlp", "swiglu") == "swiglu" else 2) * h * preset["ffn"]
    return float(layers * (2 * h * h + 2 * h * kv + mlp))


@dataclass(frozen=True, kw_only=True)
class SpeedResult:
    """One recipe's whole-step speedup over BF16 at one size."""

    recipe: Recipe
    size: Size
    speedup: float
    lo: float | None = None
    hi: float | None = None
    """95% interval of the speedup (None where not measured)."""
    seeds: int = 0
    """Seeds the speedup and its interval are over (fp8bench.analysis.seeds; 0: one case's own)."""
    mem_change_pct: float | None = None
    """Peak memory against the BF16 step's, in percent (positive: FP8 used more)."""
    run_id: str = ""
    """The run that timed it ('' where not known)."""
    measurement_version: int | None = None
    """That run's measurement version (None where not known)."""

    @property
    def established(self) -> bool:
        """Whether it has a 95% interval: a speed without one (each side timed once, apart) is withdrawn, and
        neither ranks a recipe nor is printed."""
        return self.lo is not None and self.hi is not None

    def text(self) -> str:
        mem = "" if self.mem_change_pct is None else f", peak memory {self.mem_change_pct:+.0f}% vs BF16"
        if not self.established:
            return f"speed withdrawn (no interval) at {self.size.model}{mem}"
        over = f" over {self.seeds} seeds" if self.seeds else ""
        return f"{self.speedup:.2f}x ({self.lo:.2f}-{self.hi:.2f}{over}) at {self.size.model}{mem}"


@dataclass(frozen=True, kw_only=True)
class SeedVerdict:
    """One run's parity verdict on one seed of a recipe (parity_pass and the rules it failed)."""

    recipe: Recipe
    size: Size
    seed: int
    passed: bool
    failed_rules: tuple[str, ...] = ()
    same_seed_area_gap_pct: float | None = None
    """The run's curve area against that of the BF16 run of its seed in its run (loss_area_gap_same_seed_pct)."""


@dataclass(frozen=True, kw_only=True)
class ParityResult:
    """A recipe's parity at one size over every seed judged there: a seed passes when every run of it did."""

    recipe: Recipe
    size: Size
    seeds: int
    passes: int
    failed_rules: tuple[str, ...] = ()
    paired: Criterion | None = None
    """The paired test over every run's same-seed area gap at this size (reruns of a seed included: under
    parity each gap is one more BF16-against-BF16 difference)."""

    @property
    def passed(self) -> bool | None:
        """True: MIN_SEEDS or more seeds, all passing, the paired test not failing; False: a seed or the
        paired test failed; None: too few seeds to say."""
        if self.passes < self.seeds or (self.paired is not None and not self.paired.passed):
            return False
        return True if self.seeds >= MIN_SEEDS else None

    def text(self) -> str:
        rate, where = f"{self.passes}/{self.seeds}", f"at {self.size.model}"
        if self.passed is None:
            return f"too few seeds: {rate} pass {where} (a verdict needs {MIN_SEEDS})"
        if self.passed:
            return f"passes {rate} {where}"
        rules = [self.paired.text() if rule == PAIRED_RULE and self.paired else rule for rule in self.failed_rules]
        return f"FAIL: {rate} pass {where} ({'; '.join(rules)})"


def _pooled(recipe: Recipe, size: Size, seeds: dict[int, list[SeedVerdict]]) -> ParityResult:
    runs = [v for vs in seeds.values() for v in vs]
    gaps = [v.same_seed_area_gap_pct for v in runs if v.same_seed_area_gap_pct is not None]
    paired = paired_area_test(gaps)
    rules = [rule for v in runs for rule in v.failed_rules] + ([PAIRED_RULE] if paired and not paired.passed else [])
    return ParityResult(recipe=recipe, size=size, seeds=len(seeds),
                        passes=sum(all(v.passed for v in vs) for vs in seeds.values()),
                        failed_rules=tuple(dict.fromkeys(rules)), paired=paired)


def pool_parity(verdicts: Iterable[SeedVerdict]) -> list[ParityResult]:
    """Every run's verdicts pooled per recipe and size: seeds counted once however many runs judged them."""
    by: dict[tuple[Recipe, Size], dict[int, list[SeedVerdict]]] = {}
    for v in verdicts:
        by.setdefault((v.recipe, v.size), {}).setdefault(v.seed, []).append(v)
    return [_pooled(recipe, size, seeds) for (recipe, size), seeds in sorted(by.items())]


@dataclass(frozen=True, kw_only=True)
class Candidate:
    """A recipe with its speed at the largest size measured and the parity verdict that decides it."""

    recipe: Recipe
    speed: SpeedResult
    parity: ParityResult | None
    """At the largest size judged with MIN_SEEDS seeds; else the largest judged at all (None: never judged)."""
    failed_elsewhere: tuple[ParityResult, ...] = ()
    """Failing verdicts at other sizes: any one keeps the recipe from being recommended."""

    @property
    def status(self) -> str:
        if self.parity is None:
            return "not judged"
        if self.failed_elsewhere or self.parity.passed is False:
            return "FAIL"
        return "passes" if self.parity.passed else "too few seeds"

    def text(self) -> str:
        verdicts = [self.parity.text()] if self.parity else ["not judged"]
        verdicts += [p.text() for p in self.failed_elsewhere]
        return f"{self.recipe.label()}: {self.speed.text()}; {'; '.join(verdicts)}"


@dataclass(frozen=True, kw_only=True)
class Recommendation:
    chosen: Candidate | None
    faster: tuple[Candidate, ...]
    """Recipes faster than the chosen one (every recipe faster than BF16 when none is chosen), fastest first."""
    slower: tuple[Candidate, ...] = ()
    """Recipes faster than BF16 but slower than the chosen one, fastest first: the alternatives, with their
    verdicts (one that passes is a fallback; one not judged is a parity run worth doing)."""
    unestablished: tuple[Candidate, ...] = ()
    """Recipes whose whole-step speed has no interval anywhere: not ranked, listed with their verdicts."""

    def text(self) -> str:
        head = (f"use {self.chosen.text()}" if self.chosen else
                f"no FP8 recipe faster than BF16 (its 95% interval above 1) passes loss parity with at least {MIN_SEEDS} seeds")
        return "\n".join([head, *(f"  faster, {c.status}: {c.text()}" for c in self.faster),
                          *(f"  slower, {c.status}: {c.text()}" for c in self.slower),
                          *(f"  {UNESTABLISHED}, {c.status}: {c.text()}" for c in self.unestablished)])


def _largest_speed(speeds: list[SpeedResult]) -> SpeedResult:
    """The speed at the largest size measured with an interval (else at the largest size measured at all; the
    median where several runs measured it, the upper of the two middle ones for an even count)."""
    speeds = [s for s in speeds if s.established] or speeds
    top = max(s.size for s in speeds)
    at = sorted((s for s in speeds if s.size == top), key=lambda s: s.speedup)
    return at[len(at) // 2]


def _deciding(parity: list[ParityResult]) -> tuple[ParityResult | None, tuple[ParityResult, ...]]:
    enough = [p for p in parity if p.seeds >= MIN_SEEDS]
    decide = max(enough or parity, key=lambda p: p.size, default=None)
    return decide, tuple(p for p in parity if p is not decide and p.passed is False)


def recommend(speeds: Iterable[SpeedResult], parity: Iterable[ParityResult]) -> Recommendation:
    """The fastest recipe faster than BF16 that passes parity (Candidate.status == 'passes'), and the recipes
    faster than it. Faster than BF16 means its interval's low end above 1; recipes ranked by their speed at the
    largest size timed with an interval; those with none anywhere are listed apart, unranked."""
    by_speed: dict[Recipe, list[SpeedResult]] = {}
    for s in speeds:
        by_speed.setdefault(s.recipe, []).append(s)
    by_parity: dict[Recipe, list[ParityResult]] = {}
    for p in parity:
        by_parity.setdefault(p.recipe, []).append(p)
    candidates = []
    for recipe, ss in by_speed.items():
        decide, failed = _deciding(by_parity.get(recipe, []))
        candidates.append(Candidate(recipe=recipe, speed=_largest_speed(ss), parity=decide, failed_elsewhere=failed))
    ranked = sorted((c for c in candidates if c.speed.established and c.speed.lo > 1.0),
                    key=lambda c: (-c.speed.speedup, c.recipe))
    chosen = next((c for c in ranked if c.status == "passes"), None)
    at = ranked.index(chosen) if chosen else len(ranked)
    unestablished = sorted((c for c in candidates if not c.speed.established), key=lambda c: c.recipe)
    return Recommendation(chosen=chosen, faster=tuple(ranked[:at]), slower=tuple(ranked[at + 1:]),
                          unestablished=tuple(unestablished))
