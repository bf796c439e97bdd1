"""RUN_DIR/report.html (emulator/htmlreport.py): the page of a small real run, rendered in headless
Chromium (Debian's `chromium`; .ci/run installs it), shows the run's name, one table row per round
of rounds.csv and one timeline row per client of clients.csv. Skipped only where no Chromium is
installed, and it says so. And the timeline's rows by hand."""
import re
import shutil
import subprocess

import pytest

from conftest import read_csv, run_cli, write_scenario

from emulator.htmlreport import by_profile, timeline

SCENARIO = """
name: tiny
rounds: 3
seed: 4
task: {dataset: synthetic, model: mlp, synthetic: {samples: 400, test_samples: 100}}
population: {clients: 6, hosts: 1, devices: [{ms_per_sample: 1}], links: [{up_mbps: 5, down_mbps: 20, latency_ms: 20}]}
selection: {clients_per_round: 3}
algorithm: {local_epochs: 1, batch_size: 20}
"""


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def test_the_timeline_puts_the_clients_with_most_rounds_first():
    rows = [
        {"round": "0", "client": "b", "outcome": "ok", "download_start": "0", "download_end": "1", "compute_start": "1",
         "compute_end": "3", "upload_start": "3", "upload_end": "4"},
        {"round": "1", "client": "b", "outcome": "late", "download_start": "5", "download_end": "6", "compute_start": "6",
         "compute_end": "", "upload_start": "", "upload_end": ""},
        {"round": "1", "client": "a", "outcome": "dropped_offline", "selected_t": "5", "download_start": "",
         "download_end": ""},
    ]
    out, total = timeline(rows)
    assert total == 2 and [r["client"] for r in out] == ["b", "a"]
    assert out[0]["slices"] == [[0, "download", 0.0, 1.0, "ok"], [0, "compute", 1.0, 3.0, "ok"], [0, "upload", 3.0, 4.0, "ok"],
                                [1, "download", 5.0, 6.0, "late"]]
    assert out[1]["slices"] == [[1, "selected", 5.0, 5.0, "dropped_offline"]]  # selected, nothing began
    assert timeline(rows, most=1)[0][0]["client"] == "b"


def test_outcomes_by_device_and_link_profile():
    population = [{"client": "a", "device": "phone", "link": "lte"}, {"client": "b", "device": "phone", "link": "lte"},
                  {"client": "c", "device": "laptop", "link": "wifi"}]
    clients = [{"client": "a", "outcome": "ok"}, {"client": "a", "outcome": "late"}, {"client": "b", "outcome": "dropped_battery"},
               {"client": "c", "outcome": "ok"}]
    assert by_profile(clients, population) == [
        {"device": "phone", "link": "lte", "clients": 2, "selected": 3, "ok": 1, "late": 1, "dropped": 1, "other": 0},
        {"device": "laptop", "link": "wifi", "clients": 1, "selected": 1, "ok": 1, "late": 0, "dropped": 0, "other": 0}]


def test_the_report_of_a_small_run_renders_in_chromium(tmp_path):
    out = tmp_path / "run"
    res = run_cli("run", str(write_scenario(tmp_path / "s.yaml", SCENARIO)), "--out", str(out), "--quiet", timeout=180)
    assert res.returncode == 0, res.stderr[-3000:]
    page = out / "report.html"
    assert page.exists()
    browser = chromium()
    if browser is None:
        pytest.skip("no Chromium here (Debian: apt-get install chromium; .ci/run installs it)")
    dom = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom", page.as_uri()],
                         capture_output=True, text=True, timeout=120).stdout
    assert 'data-drawn="yes"' in dom  # the script ran to its end
    assert re.search(r'<h1 id="run-name">run</h1>', dom)
    rounds = read_csv(out / "rounds.csv")
    table = dom[dom.index('<table id="rounds">'):]
    table = table[:table.index("</table>")]
    assert table.count('<tr class="row">') == len(rounds) == 3
    clients = {r["client"] for r in read_csv(out / "clients.csv")}
    drawn = set(re.findall(r'<g class="client-row" data-client="([^"]+)">', dom))
    assert drawn == clients and len(drawn) >= 3
    assert '<table id="profiles">' in dom and dom.count('<img src="data:image/png;base64,') == len(list((out / "plots").glob("*.png"))) > 0
    # the bottlenecks' curves: the server's link both ways, and the timeline's page and window controls
    assert set(re.findall(r'<svg class="bottleneck" data-name="([^"]+)"', dom)) == {"server egress (downloads)",
                                                                                   "server ingress (uploads)"}
    assert f"of {len(clients)} (page 1 of 1)" in dom and 'id="timeline-from"' in dom
    assert '<div id="incidents" class="muted">none</div>' in dom


def test_utilisation_spreads_each_transfer_over_its_lifetime_by_hand():
    """Two uploads through a server ingress of 10 Mbit/s: 1 MB over [0, 2] s and 0.5 MB over [1, 2] s,
    in 4 bins of 0.5 s: 4 Mbit/s, then 8 in the second second; a shared link carries its members'."""
    from emulator.utilisation import spread, utilisation

    transfers = [
        {"src": "c0", "dst": "server", "t_start": "0", "t_end": "2", "outcome": "ok", "link_bytes": "1000000"},
        {"src": "c1", "dst": "server", "t_start": "1", "t_end": "2", "outcome": "ok", "link_bytes": "500000"},
        {"src": "server", "dst": "c1", "t_start": "0", "t_end": "0.5", "outcome": "link_down", "wasted_bytes": "62500"},
    ]
    scenario = {"server": {"link": {"up_mbps": 100, "down_mbps": 10}},
                "population": {"shared_links": [{"name": "cell", "up_mbps": 5, "links": ["lte"]}]}}
    population = [{"client": "c0", "link": "wifi"}, {"client": "c1", "link": "lte"}]
    got = {s["name"]: s for s in utilisation(transfers, scenario, population, bins=4)["series"]}
    assert got["server ingress (uploads)"]["mbps"] == pytest.approx([4, 4, 8, 8])
    assert got["server ingress (uploads)"]["peak_share"] == pytest.approx(0.8)
    assert got["server egress (downloads)"]["mbps"] == pytest.approx([1, 0, 0, 0])  # what the aborted one sent
    assert got["cell up"]["mbps"] == pytest.approx([0, 0, 4, 4]) and "cell down" in got
    bins = [0.0] * 3
    spread(bins, 1.0, 0.5, 2.5, 4.0)  # runs past the last bin: the rest lands there
    assert bins == pytest.approx([1.0, 2.0, 1.0]) and sum(bins) == pytest.approx(4.0)


def test_compare_writes_the_runs_side_by_side_and_it_renders(tmp_path):
    runs = []
    for name, codec in (("fp32", "{name: fp32}"), ("int8", "{name: int, bits: 8}")):
        out = tmp_path / name
        text = SCENARIO.replace("algorithm: {local_epochs: 1, batch_size: 20}",
                                f"algorithm: {{local_epochs: 1, batch_size: 20, codec: {{up: {codec}, down: {codec}}}}}")
        res = run_cli("run", str(write_scenario(tmp_path / f"{name}.yaml", text)), "--out", str(out), "--quiet", timeout=180)
        assert res.returncode == 0, res.stderr[-3000:]
        runs.append(out)
    res = run_cli("compare", *map(str, runs), "--out", str(tmp_path / "cmp"))
    assert res.returncode == 0, res.stderr
    page = tmp_path / "cmp" / "compare.html"
    assert page.exists() and "compare.html" in res.stdout
    browser = chromium()
    if browser is None:
        pytest.skip("no Chromium here (Debian: apt-get install chromium; .ci/run installs it)")
    dom = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom", page.as_uri()],
                         capture_output=True, text=True, timeout=120).stdout
    assert 'data-drawn="yes"' in dom
    assert re.findall(r'<tr class="run-row" data-run="([^"]+)"', dom) == ["fp32", "int8"]
    assert dom.count('href="../fp32/report.html"') == 1
    for plot in ("accuracy-time", "accuracy-bytes", "durations", "ingress"):
        svg = dom[dom.index(f'<svg id="{plot}"'):]
        svg = svg[:svg.index("</svg>")]
        assert re.findall(r'data-run="([^"]+)"', svg) == ["fp32", "int8"], plot
