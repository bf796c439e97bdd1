"""Secure aggregation's protocol (issue 44, item 1): the server and client actors in one process
(tests/secure_harness.py), every message as bytes. The server's integer sum equals the plain sum
of the same fixed-point updates exactly, with and without dropouts in each phase; below the
threshold the round fails naming the phase; a tampered ciphertext or a wrong share is found and
its sender named; the same seed gives the same bytes and times."""
import math

import numpy as np
import pytest

from node.actor import Message
from node.secure import analytic, vector
from node.secure import server as secure_server
from node.strategies.dpfedavg import DpFedAvg
from node.strategies.scaffold import Scaffold
from protocol.secagg import graph, records
from node.secure.config import SecureCosts
from secure_harness import HOP_S, Star, lose_from, protocol


@pytest.fixture
def sums(monkeypatch):
    """Every integer sum a server computes, in order."""
    seen = []
    original = secure_server.SecureRound._compute

    def compute(self):
        out = original(self)
        if out is not None:
            seen.append(out[0].copy())
        return out

    monkeypatch.setattr(secure_server.SecureRound, "_compute", compute)
    return seen


def same_model(a: Star, b: Star) -> bool:
    return all(np.array_equal(a.server.global_state[k], b.server.global_state[k]) for k in a.server.global_state)


def test_masked_sum_is_the_plain_sum_of_the_same_fixed_point_updates(sums):
    plain = Star(protocol("plain"), rounds=2).run()
    masked = Star(protocol("secagg"), rounds=2).run()
    assert len(sums) == 4 and all(np.array_equal(sums[i], sums[i + 2]) for i in range(2))
    assert sums[0].dtype == np.uint64 and sums[0].max() > 0
    assert same_model(plain, masked)
    assert [r["accuracy"] for r in plain.rounds()] == [r["accuracy"] for r in masked.rounds()]
    # and the masked vectors themselves look nothing like the plain ones
    up = [m for m in masked.sent if m.kind == "sa_masked"]
    clear = [m for m in plain.sent if m.kind == "sa_masked"]
    assert len(up) == len(clear) == 10 and all(a.frames[0] != b.frames[0] for a, b in zip(up, clear))


def test_secaggplus_on_a_sparse_graph_sums_the_same(sums):
    plain = Star(protocol("plain"), clients=9).run()
    sparse = Star(protocol("secaggplus", degree=4), clients=9).run()
    secure = sparse.rounds()[0]["secure"]
    assert (secure["degree"], secure["threshold"]) == (4, 3)
    rosters = [m for m in sparse.sent if m.kind == "sa_roster"]
    assert len(rosters) == 9 and all(len(records.unpack_keys(m.frames[0])) == 4 for m in rosters)
    assert np.array_equal(sums[0], sums[1]) and same_model(plain, sparse)


@pytest.mark.parametrize("kind, contributes", [("sa_keys", False), ("sa_shares", False), ("sa_masked", False),
                                               ("sa_unmask", True)])
def test_a_dropout_in_each_phase_leaves_the_sum_of_those_who_contributed(kind, contributes, sums):
    masked = Star(protocol("secagg"), lose=lose_from("c2", kind), timeout_s=100.0).run()
    # plain: c2's update counts exactly when its masked input reached the server
    plain = Star(protocol("plain"), lose=(lambda m: False) if contributes else lose_from("c2", "sa_masked"),
                 timeout_s=100.0).run()
    rnd = masked.rounds()[0]
    assert rnd["completed"] == (5 if contributes else 4)
    assert np.array_equal(sums[0], sums[1]) and same_model(plain, masked)
    phases = {p["phase"]: p for p in rnd["secure"]["phases"]}
    dropped_in = {"sa_keys": "keys", "sa_shares": "shares", "sa_masked": "input", "sa_unmask": "unmask"}[kind]
    assert phases[dropped_in]["entered"] - phases[dropped_in]["answered"] == 1
    # it waited out the phase's timeout (60 s), or the masked input's, the round's deadline (100 s)
    assert phases[dropped_in]["t_end"] == pytest.approx(100.0 if kind == "sa_masked" else phases[dropped_in]["t_start"] + 60)


def test_a_host_lost_during_training_is_a_dropout():
    star = Star(protocol("secagg"), lose=lose_from("c4", "sa_masked"))
    original = star.apply

    def apply(name, reaction, t):  # the network reports c4's host gone once the masked inputs are due
        original(name, reaction, t)
        if name == "server" and any(s.kind == "sa_relay" for s in reaction.sends):
            star.push(Message("network", "server", "peer_down", -1, t + 0.001, {"actors": ["c4"]}))

    star.apply = apply
    star.run()
    rnd = star.rounds()[0]
    assert rnd["completed"] == 4 and rnd["t_end"] < 30  # no timeout waited: the loss ended the phase
    assert {c["client"]: c["outcome"] for c in rnd["clients"]}["c4"] == "no_update"


@pytest.mark.parametrize("kind, phase, left", [("sa_keys", "keys", 2), ("sa_unmask", "unmask", 2)])
def test_below_the_threshold_the_round_fails_naming_the_phase(kind, phase, left):
    gone = {"c0", "c1", "c2"}
    star = Star(protocol("secagg"), lose=lambda m: m.kind == kind and m.src in gone)
    before = {k: v.copy() for k, v in star.server.global_state.items()}
    star.run()
    failed = star.of_type("secagg_failed")
    assert len(failed) == 1 and failed[0]["phase"] == phase and failed[0]["threshold"] == 3
    assert failed[0]["left"] == left
    rnd = star.rounds()[0]
    assert rnd["completed"] == 0 and rnd["secure"]["failed"]
    assert all(np.array_equal(before[k], star.server.global_state[k]) for k in before)


def test_a_tampered_ciphertext_excludes_its_sender_and_the_round_goes_on(sums):
    masked = Star(protocol("secagg", corrupt_clients=("c1",))).run()
    plain = Star(protocol("plain"), lose=lose_from("c1", "sa_masked"), timeout_s=100.0).run()
    excluded = masked.of_type("secagg_excluded")
    assert [(e["client"], e["phase"]) for e in excluded] == [("c1", "input")]
    assert "do not authenticate" in excluded[0]["why"]
    rnd = masked.rounds()[0]
    assert rnd["completed"] == 4 and {c["client"]: c["outcome"] for c in rnd["clients"]}["c1"] == "rejected"
    assert np.array_equal(sums[0], sums[1]) and same_model(plain, masked)


def test_a_share_that_does_not_verify_names_its_holder(sums):
    def alter(msg):
        if msg.kind == "sa_unmask" and msg.src == "c2":  # c2 sends a wrong share of every secret it holds
            out = [(o, w, bytes([s[0] ^ 1]) + s[1:]) for o, w, s in records.unpack_shares(msg.frames[0])]
            return Message(msg.src, msg.dst, msg.kind, msg.round, msg.t, msg.body, [records.pack_shares(out)])
        return msg

    masked = Star(protocol("secagg", threshold=3), alter=alter).run()
    plain = Star(protocol("plain")).run()
    named = {(e["client"], e["owner"]) for e in masked.of_type("secagg_bad_share")}
    assert {client for client, _ in named} == {"c2"} and len(named) == 5  # every self-mask seed c2 held a share of
    assert not masked.of_type("secagg_excluded") and masked.rounds()[0]["completed"] == 5
    assert same_model(plain, masked)


def test_same_seed_same_bytes_and_times():
    runs = [Star(protocol("secaggplus", degree=4), clients=7, lose=lose_from("c3", "sa_masked"), timeout_s=50.0).run()
            for _ in range(2)]
    a, b = ([(m.src, m.dst, m.kind, m.t, [bytes(f) for f in m.frames]) for m in r.sent] for r in runs)
    assert a == b and len(a) > 40
    assert runs[0].rounds()[0]["t_end"] == runs[1].rounds()[0]["t_end"]


def test_client_side_dp_noise_composes_with_secure_aggregation():
    strategy = DpFedAvg({"noise": "client", "clip": 0.5, "noise_multiplier": 1.0})
    star = Star(protocol("secagg", weighting="uniform"), strategy=strategy, lose=lose_from("c0", "sa_masked"),
                timeout_s=50.0).run()
    release, = star.of_type("privacy")
    assert release["mechanism"] == "dpfedavg"
    # 4 of 5 added their share of the noise: the ledger charges z sqrt(4/5), not z
    assert math.isclose(release["rho"], 1 / (2 * (1.0 * math.sqrt(4 / 5)) ** 2))


def test_secaggplus_parameters_meet_their_bounds():
    for n, dropout in ((100, 0.1), (1000, 0.3)):
        choice = graph.choose_secaggplus(n, dropout, 0.05)
        holders, t = choice.degree + 1, choice.threshold
        assert not choice.complete and t > holders / 2
        assert n * (1 - graph.binomial_tail_at_least(holders, t, 1 - dropout)) <= 2 ** -30
        assert n * graph.binomial_tail_at_least(holders, t, 0.05) <= 2 ** -40
        smaller = graph.choose_secaggplus(n, dropout, 0.05)
        assert smaller.degree == choice.degree  # deterministic
    ids = list(range(1, 31))
    g = graph.neighbours(ids, 6, seed=5)
    assert all(len(v) == 6 for v in g.values()) and all(u in g[v] for u in ids for v in g[u])


@pytest.mark.parametrize("cfg, clients", [(protocol("secagg"), 5), (protocol("secaggplus", degree=4), 9),
                                          (protocol("plain"), 5)])
def test_the_analytic_cost_is_the_actors_bytes(cfg, clients):
    """node/secure/analytic.py's payload bytes, without dropouts, are exactly the messages' frames."""
    star = Star(cfg, clients=clients).run()
    length = vector.length(star.server.spec)
    cost = analytic.round_cost(cfg, clients, length)
    secure = [m for m in star.sent if m.kind.startswith("sa_")]
    up = sum(len(m.frames[0]) for m in secure if m.dst == "server")
    down = sum(len(m.frames[0]) for m in secure if m.src == "server")
    assert (up, down) == (cost.server_up_bytes, cost.server_down_bytes)
    mine = [m for m in secure if "c1" in (m.src, m.dst)]
    assert sum(len(m.frames[0]) for m in mine if m.src == "c1") == cost.client_up_bytes
    assert sum(len(m.frames[0]) for m in mine if m.dst == "c1") == cost.client_down_bytes


def test_a_masked_input_is_a_check_in():
    """With check-in, a client that reported back may be selected again without going off and on."""
    star = Star(protocol("secagg"))
    star.server.cfg.checkin = True
    star.server.pool = {}
    star.apply("server", star.server.react(Message("c1", "server", "sa_masked", 0, 1.0, {"status": {"battery": 0.5}},
                                                    [b""])), 1.0)
    assert star.server.pool == {"c1": {"battery": 0.5, "checkin_t": 1.0}}


def test_scaffold_sums_its_control_variates_in_the_same_masked_vector(sums):
    runs = [Star(protocol(name, clip=2.0), rounds=2, strategy=Scaffold()).run() for name in ("plain", "secagg")]
    plain, masked = runs
    assert same_model(plain, masked) and np.array_equal(sums[0], sums[2]) and np.array_equal(sums[1], sums[3])
    c_plain, c_masked = plain.server.strategy.c, masked.server.strategy.c
    assert c_plain and all(np.array_equal(c_plain[k], c_masked[k]) for k in c_plain)
    assert any(np.abs(v).max() > 0 for v in c_masked.values())
    # the vector is the model's floats, the control variates' changes and the weight slot
    spec = masked.server.spec
    assert sums[0].size == 2 * sum(int(np.prod(s)) for s, d in spec.values() if d == "f4") + 1


def test_the_cryptography_is_charged_to_emulated_time_by_the_cost_model():
    """A key pair 0.5 s, an agreement 0.1 s, ... on the machine; the devices train at its speed
    (scale 1): the keys leave 2 x 0.5 s after the task, the shares k (0.1 + 0.01) + 2 (k + 1) t 0.001
    s after the roster, and the server's unmasking takes what node/secure/analytic.py says."""
    costs = SecureCosts(host_ms_per_sample=1.0, keygen_s=0.5, agree_s=0.1, split_s=0.001, seal_s=0.01, word_s=1e-6,
                        combine_s=0.002)
    star = Star(protocol("secagg", costs=costs)).run()
    task = next(m for m in star.sent if m.kind == "task" and m.dst == "c1")
    keys = next(m for m in star.sent if m.kind == "sa_keys" and m.src == "c1")
    assert keys.t - HOP_S == pytest.approx(task.t + 1.0)
    roster = next(m for m in star.sent if m.kind == "sa_roster" and m.dst == "c1")
    shares = next(m for m in star.sent if m.kind == "sa_shares" and m.src == "c1")
    k, t = 4, 3
    assert shares.t - HOP_S == pytest.approx(roster.t + k * 0.11 + 2 * (k + 1) * t * 0.001)
    rnd = star.rounds()[0]
    length = vector.length(star.server.spec)
    expected = analytic.round_cost(protocol("secagg", costs=costs), 5, length, 0.0, costs).server_compute_s
    assert rnd["secure"]["server_s"] == pytest.approx(expected) and expected > 0.01


def test_a_deadline_during_the_key_phases_leaves_the_masked_input_a_timeout_of_its_own():
    """The round's deadline passes while c4's shares are still awaited: the shares phase closes, and
    the masked input phase (which the deadline no longer bounds) waits phase_timeout_s for c3."""
    lose = lambda m: (m.src == "c4" and m.kind == "sa_shares") or (m.src == "c3" and m.kind == "sa_masked")  # noqa: E731
    star = Star(protocol("secagg", phase_timeout_s=60.0), lose=lose, timeout_s=10.0).run(until_s=1000)
    rnd = star.rounds()[0]
    phases = {p["phase"]: p for p in rnd["secure"]["phases"]}
    assert phases["shares"]["t_end"] == pytest.approx(10.0) and phases["input"]["entered"] == 4
    assert phases["input"]["t_end"] == pytest.approx(70.0) and rnd["completed"] == 3
