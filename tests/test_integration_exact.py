"""Two clients on known links, real processes: every transfer time is checked against link
arithmetic done by hand here, and the payload bytes against the parameter count."""
import json
import math

import pytest

from conftest import link_bytes, read_csv, run_cli, write_scenario

MLP_PARAMS = 784 * 64 + 64 + 64 * 10 + 10  # 50,890
LINKS = {  # name: (up bit/s, down bit/s, one-way latency s)
    "slow": (1e6, 2e6, 0.050),
    "fast": (4e6, 8e6, 0.020),
}
SERVER_LATENCY = 0.005
MS_PER_SAMPLE = 10.0
SAMPLES_PER_CLIENT = 100

SCENARIO = f"""
name: exact
seed: 3
rounds: 2
task:
  dataset: synthetic
  model: mlp
  synthetic: {{samples: 200, test_samples: 100, shape: [1, 28, 28], classes: 10}}
population:
  clients: 2
  hosts: 2
  devices: [{{ms_per_sample: {MS_PER_SAMPLE}}}]
  links:
    - {{name: slow, share: 0.5, up_mbps: 1, down_mbps: 2, latency_ms: 50}}
    - {{name: fast, share: 0.5, up_mbps: 4, down_mbps: 8, latency_ms: 20}}
server:
  link: {{latency_ms: 5}}
selection: {{clients_per_round: 2}}
algorithm: {{local_epochs: 1, batch_size: 20, lr: 0.1}}
eval: {{every: 1}}
"""


SEG_BITS = 1514 * 8  # a full segment on the link
INITCWND = 10


@pytest.fixture(scope="module", params=["fluid", "tcp"])
def run_dir(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp(f"exact-{request.param}")
    out = tmp / "run"
    text = SCENARIO + f"network: {{transport: {request.param}}}\n"
    res = run_cli("run", str(write_scenario(tmp / "s.yaml", text)), "--out", str(out), timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    return out


def tcp_transfer_time(bits, rate, one_way):
    """Slow start by hand: RTT = 2 x one-way + one segment's serialization. Rounds of 10, 20, 40 ...
    segments go as bursts at the link rate and wait out the RTT, until a round's burst lasts the
    whole RTT; from then on the link is busy. Every transfer here starts on a fresh or idle (more
    than one RTO: the window is back at 10) connection."""
    rtt = 2 * one_way + SEG_BITS / rate
    t, window, left = 0.0, INITCWND, bits
    while window * SEG_BITS / rate < rtt and left > window * SEG_BITS:
        t += rtt
        left -= window * SEG_BITS
        window *= 2
    return t + left / rate + one_way



def test_every_transfer_matches_link_arithmetic(run_dir):
    link_of = {r["client"]: r["link"] for r in read_csv(run_dir / "population.csv")}
    assert sorted(link_of.values()) == ["fast", "slow"]
    transfers = read_csv(run_dir / "transfers.csv")
    assert len(transfers) == 8  # 2 rounds x 2 clients x (task + update)
    for tr in transfers:
        wire = int(tr["wire_bytes"])
        assert int(tr["payload_bytes"]) == MLP_PARAMS * 4
        assert 0 < wire - MLP_PARAMS * 4 < 1024  # envelope + codec header only
        assert int(tr["link_bytes"]) == link_bytes(wire)
        client = tr["dst"] if tr["kind"] == "task" else tr["src"]
        up, down, latency = LINKS[link_of[client]]
        rate = down if tr["kind"] == "task" else up  # the server's link is unlimited
        fluid = link_bytes(wire) * 8 / rate + latency + SERVER_LATENCY
        if "transport: tcp" in (run_dir.parent / "s.yaml").read_text():
            expected = tcp_transfer_time(link_bytes(wire) * 8, rate, latency + SERVER_LATENCY)
            assert expected > fluid + 0.0009  # slow start costs: the fast link's upload pays 2 RTT - 30 segments
        else:
            expected = fluid
        assert float(tr["t_end"]) - float(tr["t_start"]) == pytest.approx(expected, abs=1e-9)


def test_round_times_are_the_critical_path(run_dir):
    transfers = read_csv(run_dir / "transfers.csv")
    rounds = read_csv(run_dir / "rounds.csv")
    assert len(rounds) == 2
    train_s = MS_PER_SAMPLE * SAMPLES_PER_CLIENT / 1000
    t_round_start = 0.0
    for r in rounds:
        mine = [t for t in transfers if int(t["round"]) == int(r["round"])]
        tasks = {t["dst"]: t for t in mine if t["kind"] == "task"}
        updates = {t["src"]: t for t in mine if t["kind"] == "update"}
        for client, task in tasks.items():
            assert float(task["t_start"]) == pytest.approx(t_round_start, abs=1e-9)
            # the upload starts exactly when modelled training ends
            assert float(updates[client]["t_start"]) == pytest.approx(float(task["t_end"]) + train_s, abs=1e-9)
        end = max(float(u["t_end"]) for u in updates.values())
        assert float(r["t_end"]) == pytest.approx(end, abs=1e-9)
        assert float(r["t_start"]) == pytest.approx(t_round_start, abs=1e-9)
        t_round_start = end


def test_payload_bytes_per_round(run_dir):
    for r in read_csv(run_dir / "rounds.csv"):
        assert int(r["selected"]) == int(r["completed"]) == 2
        assert int(r["payload_bytes_down"]) == MLP_PARAMS * 4 * 2
        assert int(r["payload_bytes_up"]) == MLP_PARAMS * 4 * 2
        assert r["accuracy"] != ""
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed"
    assert summary["payload_bytes_up"] == summary["payload_bytes_down"] == MLP_PARAMS * 4 * 2 * 2
    assert summary["peak_rss_mib"] > 0 and summary["wall_time_s"] > 0


def test_codec_per_direction_bytes_and_saving(tmp_path):
    """int8 down, int4 up on real processes: exact packed payloads and the saving vs fp32."""
    text = SCENARIO.replace(
        "algorithm: {local_epochs: 1, batch_size: 20, lr: 0.1}",
        "algorithm:\n  local_epochs: 1\n  batch_size: 20\n  lr: 0.1\n  codec:\n"
        "    down: {name: int, bits: 8}\n    up: {name: int, bits: 4, rounding: nearest}",
    )
    assert "codec" in text
    out = tmp_path / "run"
    res = run_cli("run", str(write_scenario(tmp_path / "s.yaml", text)), "--out", str(out), timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    tensors = [784 * 64, 64, 64 * 10, 10]
    for r in read_csv(out / "rounds.csv"):
        assert int(r["payload_bytes_down"]) == 2 * sum(math.ceil(n * 8 / 8) for n in tensors)
        assert int(r["payload_bytes_up"]) == 2 * sum(math.ceil(n * 4 / 8) for n in tensors)
        assert int(r["fp32_bytes_up"]) == int(r["fp32_bytes_down"]) == 2 * MLP_PARAMS * 4
        assert int(r["completed"]) == 2
    summary = json.loads((out / "summary.json").read_text())
    assert summary["saving_vs_fp32"] == pytest.approx(1 - (8 + 4) / 64, abs=1e-4)


def test_tcp_with_loss_is_deterministic_and_counts_resent_segments(tmp_path):
    """2 % segment loss on both client links under tcp, run twice with the same seed: identical
    transfers (times and bytes). Resent segments are on the link: link bytes grow by whole
    segments over the loss-free framing, and the times exceed the loss-free slow-start times."""
    text = SCENARIO.replace("latency_ms: 50}", "latency_ms: 50, loss: 0.02}").replace("latency_ms: 20}", "latency_ms: 20, loss: 0.02}")
    assert text.count("loss: 0.02") == 2
    runs = []
    for i in range(2):
        out = tmp_path / f"run{i}"
        res = run_cli("run", str(write_scenario(tmp_path / f"s{i}.yaml", text)), "--out", str(out), timeout=120)
        assert res.returncode == 0, res.stderr[-3000:]
        runs.append(read_csv(out / "transfers.csv"))
    key = lambda t: (t["round"], t["kind"], t["src"], t["dst"])  # noqa: E731
    first, second = sorted(runs[0], key=key), sorted(runs[1], key=key)
    assert [(t["t_start"], t["t_end"], t["link_bytes"]) for t in first] == [(t["t_start"], t["t_end"], t["link_bytes"]) for t in second]
    link_of = {"slow": LINKS["slow"], "fast": LINKS["fast"]}
    resent = 0
    for tr in first:
        extra = int(tr["link_bytes"]) - link_bytes(int(tr["wire_bytes"]))
        assert extra >= 0 and extra % 1514 == 0  # whole segments, sent again
        resent += extra // 1514
    assert resent > 0  # about 2 % of 8 x 141 segments
    slowest_clean = max(tcp_transfer_time(link_bytes(int(t["wire_bytes"])) * 8, r, lat + SERVER_LATENCY)
                        for t in first for r, lat in [(min(u, d), la) for u, d, la in link_of.values()])
    assert max(float(t["t_end"]) - float(t["t_start"]) for t in first) >= slowest_clean
