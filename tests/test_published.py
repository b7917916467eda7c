"""How the generated pages show a speedup (fp8bench.report.published): with its interval, over a training recipe's
seeds where one run trained several (fp8bench.analysis.seeds), or withdrawn with the reason."""

import math

import numpy as np
import pandas as pd
import pytest

from fp8bench.analysis.seeds import over_seeds
from fp8bench.core.intervals import process_interval
from fp8bench.core.records import seedless
from fp8bench.report import published
from fp8bench.report.published import NO_INTERVAL, Shown


def test_the_cells_the_generators_write():
    cells = [Shown(1.4567, 1.441, 1.502).text(), Shown(0.9412, 0.93, 0.951, seeds=3).text(),
             Shown(1.5, 1.4, 1.6).text(at="llama2-7b"), Shown(withdrawn=NO_INTERVAL).text(at="llama2-7b"),
             Shown(withdrawn="its record names no BF16 twin").text(), Shown().text()]
    assert cells == ["1.46x (1.44–1.50)", "0.94x (0.93–0.95 over 3 seeds)", "1.50x (1.40–1.60) at llama2-7b",
                     f"withdrawn: {NO_INTERVAL} (at llama2-7b)", "withdrawn: its record names no BF16 twin", ""]


# --------------------------------------------------------------------------- a training recipe over its seeds

def test_seeds_each_against_their_own_twin_give_a_t_interval_of_their_log_speedups():
    speedups = [0.9426, 0.9395, 0.9447]
    iv = over_seeds(speedups, ["bf16.seed0", "bf16.seed1", "bf16.seed2"])
    ref = process_interval(np.log(speedups))
    assert (iv.value, iv.lo, iv.hi) == (ref.value, ref.lo, ref.hi) and iv.unit == "seeds" and iv.processes == 3
    assert iv.lo < math.exp(np.mean(np.log(speedups))) < iv.hi


@pytest.mark.parametrize("speedups,twins", [([0.94], ["t0"]), ([0.7, 0.8], ["t0", "t1"]),
                                            ([0.94, 0.95, 0.96], ["t0", "t0", "t1"]),
                                            ([0.94, 0.95, 0.96], ["t0", "", "t1"])])
def test_too_few_seeds_or_seeds_sharing_a_twin_give_no_interval(speedups, twins):
    """One seed is one measurement; two give a t-interval of one degree of freedom (0.7x and 0.8x would span
    0.02x-30x); seeds divided by one BF16 timing are not independent repeats."""
    assert over_seeds(speedups, twins) is None


def test_seedless_takes_the_seed_out_of_a_case_id():
    assert seedless("train.gpt-125m.b8s512n1000.seed2.e4m3.blockwise.triton~2e9f") == \
        "train.gpt-125m.b8s512n1000.e4m3.blockwise.triton~2e9f"


def _case(run, case_id, speedup, twin, workload="train", lo=np.nan, hi=np.nan, withdrawn=""):
    return {"run_id": run, "case_id": case_id, "workload": workload, "twin_id": twin, "speedup": speedup,
            "speedup_lo": lo, "speedup_hi": hi, "speedup_box_lo": np.nan, "speedup_box_hi": np.nan,
            "withdrawn": withdrawn}


def test_the_pages_show_an_interval_where_the_data_give_one_and_withdraw_the_rest():
    df = pd.DataFrame([
        _case("r", "layer.m.e4m3", 1.46, "layer.m.bf16", "layer", 1.44, 1.50),
        _case("r", "train.m.seed0.e4m3", 0.94, "train.m.seed0.bf16"),
        _case("r", "train.m.seed1.e4m3", 0.95, "train.m.seed1.bf16"),
        _case("r", "train.m.seed2.e4m3", 0.93, "train.m.seed2.bf16"),
        _case("r", "train.m2.seed0.e4m3", 1.50, "train.m2.seed0.bf16"),
        _case("r", "layer.m.hybrid", np.nan, "layer.m.bf16", "layer", withdrawn="its record names no BF16 twin"),
        _case("r", "train.m.seed0.bf16", np.nan, "train.m.seed0.bf16")])
    s = published.shown(df)
    assert s[0] == Shown(1.46, 1.44, 1.50)
    assert s[1] == s[2] == s[3] and s[1].seeds == 3 and s[1].lo < s[1].value < s[1].hi
    assert s[4] == Shown(withdrawn=NO_INTERVAL)
    assert s[5] == Shown(withdrawn="its record names no BF16 twin")
    assert s[6] == Shown() and s[6].text() == ""

