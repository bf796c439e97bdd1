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


def test_the_secagg_benchmark_unmasks_what_its_graphs_say():
    """SecAgg+'s neighbours are a regular graph of the degree asked; SecAgg's are everyone; the
    benchmark's JSON carries the issue's keys (a tiny cohort, for speed)."""
    import json
    import subprocess

    import bench_secagg

    assert bench_secagg.neighbours(0, 10, 4) == [1, 2, 8, 9] and bench_secagg.neighbours(3, 10, None) == [0, 1, 2, 4, 5, 6, 7, 8, 9]
    assert all(len(bench_secagg.neighbours(u, 30, 6)) == 6 for u in range(30))
    res = subprocess.run([sys.executable, str(REPO / "tools" / "bench_secagg.py"), "--params", "2000", "--cohort", "12",
                          "--degree", "4", "--json"], capture_output=True, text=True, timeout=120)
    out = json.loads(res.stdout)
    assert {"mask_mb_s", "unmask_s_secagg", "unmask_s_secaggplus"} <= set(out) and out["sum_bits"] == 8 + 4


def test_the_scale_benchmarks_traced_links_make_a_valid_scenario():
    """bench_scale.py --links traced: every link mix of population_100k.yaml on a synthetic trace at
    its profile's rates, which the schema takes (with the incremental solver the scenario uses)."""
    import bench_scale
    import yaml

    from emulator.scenario import load_scenario

    links = bench_scale.traced_links()
    sc, _ = load_scenario(bench_scale.SCENARIO, [f"population.links={links}", "population.clients=1000"])
    mixes = sc.population.links
    assert [m.name for m in mixes] == [m["profile"] for m in yaml.safe_load(bench_scale.SCENARIO.read_text())["population"]["links"]]
    assert all(m.traced and m.up_trace.synthetic and m.down_trace.synthetic for m in mixes)
    assert {m.name: (m.up_trace.synthetic.mean_mbps, m.down_trace.synthetic.mean_mbps) for m in mixes}["lte"] == (8, 30)
    assert sc.network.flow_solver == "incremental"
