"""The benchmarks' own arithmetic (tools/): what they report must be what they measured."""
import sys

from conftest import REPO

sys.path.insert(0, str(REPO / "tools"))

import bench_training  # noqa: E402


def run(ratio_off: float, ratio_cohort: float) -> dict:
    return {"ratio_off": ratio_off, "ratio_cohort": ratio_cohort, "plain_s": 1.0, "off_s": ratio_off}


def test_repeats_report_the_median_run_with_every_runs_ratios():
    runs = [run(1.22, 2.0), run(0.96, 1.5), run(1.10, 1.8), run(1.05, 2.5), run(1.15, 1.7)]
    f = bench_training.median_run(runs)
    assert f["ratio_off"] == 1.10 and f["ratio_cohort"] == 1.8 and f["off_s"] == 1.10  # one run's figures, whole
    assert f["repeats"] == 5 and f["ratios_off"] == [1.22, 0.96, 1.10, 1.05, 1.15]
    assert f["ratios_cohort"] == [2.0, 1.5, 1.8, 2.5, 1.7]
    assert bench_training.median_run(runs[:4])["ratio_off"] == 1.05  # an even count: the lower middle
    assert bench_training.median_run(runs[:1]) == runs[0]  # one run: as before, no extra keys
