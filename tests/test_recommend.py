"""The recommendation rule: the fastest recipe, at the size its speed was measured, that passes parity at the
largest size judged with three seeds; recipes without a verdict are never 'passes'; faster ones that fail are
listed with their verdicts; a recipe is one across te and te-layer, with or without compile or CUDA graphs."""

import pytest

from fp8bench.analysis.recommend import (
    ParityResult,
    Recipe,
    SeedVerdict,
    Size,
    SpeedResult,
    model_params,
    pool_parity,
    recommend,
)

SMALL, MID, BIG = Size(params=85e6, model="gpt-125m"), Size(params=3.0e8, model="llama-350m"), \
    Size(params=6.5e9, model="llama2-7b")
TE_E4M3_DELAYED = Recipe.of("e4m3", "delayed", "te-layer")
TE_HYBRID_DELAYED = Recipe.of("hybrid", "delayed", "te")
TE_HYBRID_CURRENT = Recipe.of("hybrid", "current", "te")
TORCHAO = Recipe.of("hybrid", "current", "torchao", "compile")


def _speed(recipe, speedup, size=BIG, bare=False, **kw):
    """A speed with a 2% interval unless given one, or `bare` (no interval: withdrawn)."""
    if not bare:
        kw = {"lo": speedup / 1.02, "hi": speedup * 1.02, **kw}
    return SpeedResult(recipe=recipe, size=size, speedup=speedup, **kw)


def _parity(recipe, size, passes, seeds, rules=()):
    return ParityResult(recipe=recipe, size=size, seeds=seeds, passes=passes, failed_rules=rules)


def test_a_recipe_is_one_across_the_te_paths_and_the_launch_variants():
    assert Recipe.of("e4m3", "delayed", "te-layer") == Recipe.of("e4m3", "delayed", "te")
    assert Recipe.of("e4m3", "blockwise", "te", "cuda_graph") == Recipe.of("e4m3", "blockwise", "te")
    assert Recipe.of("hybrid", "current", "torchao", "compile").label() == "hybrid/current · torchao"
    # an integration that wraps another library keeps its own name and what it wraps
    assert Recipe.of("hybrid", "current", "accelerate", "torchao+compile").label() == \
        "hybrid/current · accelerate+torchao"
    assert Recipe.of("e4m3", "delayed", "accelerate") != TE_E4M3_DELAYED


def test_a_scaling_knob_away_from_the_defaults_makes_another_recipe():
    """Delayed scaling with a 16-step amax history passes where TE's defaults fail: neither lends the other
    its verdict, and neither is credited with the other's speed."""
    short = Recipe.of("e4m3", "delayed", "te-layer", knobs="amax history len 16")
    assert short != TE_E4M3_DELAYED and short.label() == "e4m3/delayed · te · amax history len 16"
    pooled = {p.recipe: p for p in pool_parity(
        [SeedVerdict(recipe=TE_E4M3_DELAYED, size=MID, seed=s, passed=False, failed_rules=("x",)) for s in range(3)]
        + [SeedVerdict(recipe=short, size=MID, seed=s, passed=True) for s in range(3)])}
    assert (pooled[short].passed, pooled[TE_E4M3_DELAYED].passed) == (True, False)
    rec = recommend([_speed(TE_E4M3_DELAYED, 1.5)], pooled.values())
    assert rec.chosen is None and rec.faster[0].status == "FAIL"


def test_the_fastest_recipe_that_passes_is_named_with_both_sizes():
    rec = recommend(
        [_speed(TE_E4M3_DELAYED, 1.50, mem_change_pct=14.0), _speed(TE_HYBRID_DELAYED, 1.43, lo=1.40, hi=1.46,
                                                                   mem_change_pct=14.2),
         _speed(TE_HYBRID_CURRENT, 1.40), _speed(TORCHAO, 1.31)],
        [_parity(TE_E4M3_DELAYED, MID, 0, 3, ("final-loss prediction interval",)),
         _parity(TE_HYBRID_DELAYED, SMALL, 3, 3), _parity(TE_HYBRID_DELAYED, MID, 3, 3),
         _parity(TORCHAO, MID, 3, 3)])
    assert rec.chosen.recipe == TE_HYBRID_DELAYED
    assert rec.chosen.text() == ("hybrid/delayed · te: 1.43x (1.40-1.46) at llama2-7b, peak memory +14% vs BF16; "
                                 "passes 3/3 at llama-350m")
    assert [c.recipe for c in rec.faster] == [TE_E4M3_DELAYED]
    assert rec.faster[0].status == "FAIL" and "0/3 pass at llama-350m (final-loss prediction interval)" in \
        rec.faster[0].text()
    assert rec.text().splitlines()[1].startswith("  faster, FAIL: e4m3/delayed · te: 1.50x (1.47-1.53)")
    # the slower recipes that beat BF16 follow, with their verdicts: an alternative, and a run worth doing
    assert [(c.recipe, c.status) for c in rec.slower] == [(TE_HYBRID_CURRENT, "not judged"), (TORCHAO, "passes")]
    assert rec.text().splitlines()[2].startswith("  slower, not judged: hybrid/current · te: 1.40x")


def test_no_verdict_is_not_judged_and_too_few_seeds_is_not_passes():
    rec = recommend([_speed(TE_HYBRID_CURRENT, 1.40), _speed(TE_HYBRID_DELAYED, 1.43), _speed(TORCHAO, 1.31)],
                    [_parity(TE_HYBRID_DELAYED, MID, 1, 1), _parity(TORCHAO, SMALL, 3, 3)])
    assert rec.chosen.recipe == TORCHAO
    assert [(c.recipe, c.status) for c in rec.faster] == [(TE_HYBRID_DELAYED, "too few seeds"),
                                                         (TE_HYBRID_CURRENT, "not judged")]
    assert rec.faster[1].text().endswith("; not judged")


def test_the_largest_size_judged_on_three_seeds_decides_and_a_failure_anywhere_disqualifies():
    # judged on three seeds at 125m (pass) and on one at 350m (pass): the three-seed size decides
    chosen = recommend([_speed(TORCHAO, 1.3)], [_parity(TORCHAO, SMALL, 3, 3), _parity(TORCHAO, MID, 1, 1)]).chosen
    assert chosen.parity.size == SMALL and chosen.status == "passes"
    # passing on three seeds at 125m does not hide a failing seed at 350m
    failed = recommend([_speed(TORCHAO, 1.3)], [_parity(TORCHAO, SMALL, 3, 3), _parity(TORCHAO, MID, 0, 1, ("x",))])
    assert failed.chosen is None and failed.faster[0].status == "FAIL"
    # a larger three-seed verdict overrides a smaller one
    bigger = recommend([_speed(TORCHAO, 1.3)], [_parity(TORCHAO, SMALL, 3, 3), _parity(TORCHAO, MID, 2, 3, ("y",))])
    assert bigger.chosen is None and bigger.faster[0].parity.size == MID


def test_a_passing_recipe_slower_than_bf16_is_no_recommendation():
    rec = recommend([_speed(TORCHAO, 0.94, size=SMALL)], [_parity(TORCHAO, SMALL, 3, 3)])
    assert rec.chosen is None and rec.faster == ()
    assert rec.text() == "no FP8 recipe faster than BF16 (its 95% interval above 1) passes loss parity with at least 3 seeds"


def test_a_speed_without_an_interval_ranks_nothing_and_prints_no_figure():
    """E4M3 delayed's withdrawn 1.50x neither outranks a recipe whose speed has an interval nor appears as a
    figure; a recipe whose interval reaches 1 is not faster than BF16."""
    rec = recommend([_speed(TE_E4M3_DELAYED, 1.50, bare=True), _speed(TE_HYBRID_DELAYED, 1.30),
                     _speed(TE_HYBRID_CURRENT, 1.02, lo=0.99, hi=1.05)],
                    [_parity(TE_E4M3_DELAYED, MID, 0, 3, ("curve area",)), _parity(TE_HYBRID_DELAYED, MID, 3, 3),
                     _parity(TE_HYBRID_CURRENT, MID, 3, 3)])
    assert rec.chosen.recipe == TE_HYBRID_DELAYED and rec.faster == ()
    assert [c.recipe for c in rec.unestablished] == [TE_E4M3_DELAYED]
    line = rec.text().splitlines()[-1]
    assert line.startswith("  speed not established, FAIL: e4m3/delayed · te: speed withdrawn (no interval)")
    assert "1.50" not in rec.text() and "hybrid/current" not in rec.text()
    # with no speed established anywhere there is no recommendation, whatever passes
    none = recommend([_speed(TE_HYBRID_DELAYED, 1.30, bare=True)], [_parity(TE_HYBRID_DELAYED, MID, 3, 3)])
    assert none.chosen is None and none.faster == () and len(none.unestablished) == 1


def test_the_speed_with_an_interval_at_the_largest_size_decides():
    rec = recommend([_speed(TORCHAO, 1.2, size=MID), _speed(TORCHAO, 1.6, bare=True)], [_parity(TORCHAO, SMALL, 3, 3)])
    assert rec.chosen.speed.speedup == 1.2 and rec.chosen.speed.size == MID


def test_speed_is_taken_at_the_largest_size_measured():
    rec = recommend([_speed(TORCHAO, 0.8, size=SMALL), _speed(TORCHAO, 1.2), _speed(TORCHAO, 1.3),
                     _speed(TORCHAO, 1.25)], [_parity(TORCHAO, SMALL, 3, 3)])
    assert rec.chosen.speed.speedup == 1.25 and rec.chosen.speed.size == BIG


def test_verdicts_pool_over_runs_by_seed():
    """A seed judged in two runs passes only if both passed; seeds, not runs, are counted."""
    runs = [SeedVerdict(recipe=TORCHAO, size=SMALL, seed=0, passed=True),
            SeedVerdict(recipe=TORCHAO, size=SMALL, seed=0, passed=False, failed_rules=("curve-area",)),
            SeedVerdict(recipe=TORCHAO, size=SMALL, seed=1, passed=True),
            SeedVerdict(recipe=TORCHAO, size=SMALL, seed=2, passed=True)]
    [pooled] = pool_parity(runs)
    assert (pooled.seeds, pooled.passes, pooled.failed_rules, pooled.passed) == (3, 2, ("curve-area",), False)
    assert pooled.text() == "FAIL: 2/3 pass at gpt-125m (curve-area)"


def test_sizes_are_ordered_by_the_parameters_of_their_blocks():
    gpt = {"hidden": 768, "ffn": 3072, "heads": 12, "kv_heads": 12, "layers": 12, "mlp": "gelu"}
    llama = {"hidden": 4096, "ffn": 11008, "heads": 32, "kv_heads": 32, "layers": 32, "mlp": "swiglu"}
    assert model_params(gpt) == pytest.approx(85e6, rel=0.01)
    assert model_params(llama) == pytest.approx(6.48e9, rel=0.01)
