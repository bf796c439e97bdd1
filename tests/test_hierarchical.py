"""topology: hierarchical (HierFAVG) in real processes: 2 edge aggregators, 4 clients, 2 edge
rounds per cloud round, every transfer time, round end and per-tier byte count by hand."""
import json

import pytest

from conftest import link_bytes, read_csv, run_cli, write_scenario

MLP_PARAMS = 784 * 64 + 64 + 64 * 10 + 10
P = MLP_PARAMS * 4  # fp32 payload of one model
CLIENT_UP, CLIENT_DOWN, CLIENT_LAT = 1e6, 2e6, 0.020
EDGE_RATE, EDGE_LAT = 10e6, 0.005
CLOUD_LAT = 0.001
COMPUTE_S = 10.0 * 100 / 1000  # 10 ms per sample, 100 samples each
K = 2

SCENARIO = """
name: hier
seed: 5
rounds: 2
task: {dataset: synthetic, model: mlp, synthetic: {samples: 400, test_samples: 100, shape: [1, 28, 28], classes: 10}}
population:
  clients: 4
  hosts: 2
  devices: [{ms_per_sample: 10}]
  links: [{name: dsl, up_mbps: 1, down_mbps: 2, latency_ms: 20}]
server: {link: {latency_ms: 1}}
topology: hierarchical
hierarchy: {edges: 2, edge_rounds: 2, link: {up_mbps: 10, down_mbps: 10, latency_ms: 5}}
selection: {clients_per_round: 4}
algorithm: {local_epochs: 1, batch_size: 20, lr: 0.1}
network: {transport: fluid}
"""


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hier")
    out = tmp / "run"
    res = run_cli("run", str(write_scenario(tmp / "s.yaml", SCENARIO)), "--out", str(out), "--quiet", timeout=180)
    assert res.returncode == 0, res.stderr[-3000:]
    return out


def hand_time(tr):
    """Fluid link arithmetic: the bottleneck is the client's access link on the client tier (the
    edge's 10 Mbit/s carries at most two 1-2 Mbit/s flows) and the edge's link on the cloud tier."""
    bits = link_bytes(int(tr["wire_bytes"])) * 8
    if tr["src"].startswith("edge") and tr["dst"] == "server" or tr["src"] == "server":
        return bits / EDGE_RATE + EDGE_LAT + CLOUD_LAT
    rate = CLIENT_DOWN if tr["kind"] == "task" else CLIENT_UP
    return bits / rate + CLIENT_LAT + EDGE_LAT


def test_every_transfer_by_link_arithmetic(run_dir):
    transfers = read_csv(run_dir / "transfers.csv")
    # per cloud round: 2 cloud->edge, 2 edge->cloud, and per edge round 4 tasks and 4 updates
    assert len(transfers) == 2 * (4 + K * 8)
    for tr in transfers:
        assert int(tr["payload_bytes"]) == P
        assert float(tr["t_end"]) - float(tr["t_start"]) == pytest.approx(hand_time(tr), abs=1e-9)
    aggregator = {r["client"]: r["aggregator"] for r in read_csv(run_dir / "population.csv")}
    assert aggregator == {"c0000": "edge0", "c0001": "edge1", "c0002": "edge0", "c0003": "edge1"}
    for tr in transfers:  # clients talk to their own edge only
        client = tr["dst"] if tr["src"].startswith("edge") else tr["src"]
        if client.startswith("c"):
            assert aggregator[client] in (tr["src"], tr["dst"])


def test_round_ends_and_tier_bytes_by_hand(run_dir):
    wire = {r["kind"] + r["src"][:4] + r["dst"][:4]: int(r["wire_bytes"]) for r in read_csv(run_dir / "transfers.csv")}
    cloud_s = link_bytes(wire["taskservedge"]) * 8 / EDGE_RATE + EDGE_LAT + CLOUD_LAT
    up_cloud_s = link_bytes(wire["updateedgeserv"]) * 8 / EDGE_RATE + EDGE_LAT + CLOUD_LAT
    edge_round_s = (link_bytes(wire["taskedgec000"]) * 8 / CLIENT_DOWN + COMPUTE_S
                    + link_bytes(wire["updatec000edge"]) * 8 / CLIENT_UP + 2 * (CLIENT_LAT + EDGE_LAT))
    rounds = read_csv(run_dir / "rounds.csv")
    t = 0.0
    for r in rounds:
        t += cloud_s + K * edge_round_s + up_cloud_s
        assert float(r["t_end"]) == pytest.approx(t, abs=1e-9)
        assert int(r["payload_bytes_down"]) == int(r["payload_bytes_up"]) == K * 4 * P  # client tier
        assert int(r["payload_bytes_cloud"]) == 2 * 2 * P  # edge <-> cloud, both ways
        assert int(r["selected"]) == int(r["completed"]) == K * 4
        assert r["accuracy"] != ""
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["payload_bytes_cloud"] == 2 * 4 * P and summary["payload_bytes_up"] == 2 * K * 4 * P


def test_edges_csv_has_both_tiers(run_dir):
    rows = read_csv(run_dir / "edges.csv")
    assert len(rows) == 2 * (2 * K + 2)
    client_tier = [r for r in rows if r["tier"] == "client"]
    assert sorted({(r["round"], r["edge"], r["edge_round"]) for r in client_tier}) == sorted(
        (str(c), e, str(c * K + j)) for c in range(2) for e in ("edge0", "edge1") for j in range(K))
    for r in client_tier:
        assert int(r["selected"]) == int(r["completed"]) == 2
        assert int(r["payload_bytes_down"]) == int(r["payload_bytes_up"]) == 2 * P
    ends = {r["round"]: (float(r["t_start"]), float(r["t_end"])) for r in read_csv(run_dir / "rounds.csv")}
    for r in (r for r in rows if r["tier"] == "cloud"):
        assert int(r["payload_bytes_down"]) == int(r["payload_bytes_up"]) == P
        assert (float(r["t_start"]), float(r["t_end"])) == pytest.approx(ends[r["round"]], abs=1e-9)  # the cloud round
    clients = read_csv(run_dir / "clients.csv")
    assert len(clients) == 2 * K * 4 and {c["outcome"] for c in clients} == {"ok"}
    assert all(c["aggregator"] in ("edge0", "edge1") and c["edge_round"] != "" for c in clients)


def test_shared_links_become_edge_backhauls(tmp_path):
    from emulator.scenario import ScenarioError, load_scenario
    from emulator.world import build_world
    text = SCENARIO.replace("hierarchy: {edges: 2,", "hierarchy: {edges: shared_links,").replace(
        "  links: [{name: dsl, up_mbps: 1, down_mbps: 2, latency_ms: 20}]",
        "  links: [{name: a, share: 0.5, up_mbps: 1, down_mbps: 2}, {name: b, share: 0.5, up_mbps: 1, down_mbps: 2}]\n"
        "  shared_links: [{name: tower, up_mbps: 5, links: [a]}, {name: wifi, up_mbps: 8, links: [b]}]")
    sc, _ = load_scenario(write_scenario(tmp_path / "s.yaml", text))
    world = build_world(sc)
    assert [e.name for e in world.edges] == ["edge-tower", "edge-wifi"]
    assert world.group_of == {"edge-tower": ["tower"], "edge-wifi": ["wifi"]}  # not the clients' any more
    assert sorted(len(e.clients) for e in world.edges) == [2, 2]
    with pytest.raises(ScenarioError, match="shared_links needs population.shared_links"):
        load_scenario(write_scenario(tmp_path / "t.yaml", SCENARIO.replace("edges: 2,", "edges: shared_links,")))
    with pytest.raises(ScenarioError, match="algorithm.name"):
        load_scenario(write_scenario(tmp_path / "u.yaml", SCENARIO.replace("algorithm: {", "algorithm: {name: fedbuff, ")))
