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
