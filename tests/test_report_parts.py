"""Reports over one envelope travel in parts (protocol/reportparts.py): a round of thousands of
clients is reported whole, and a malformed part is refused with a line, never a traceback."""
import msgpack
import pytest

from protocol import envelope
from protocol.reportparts import MAX_PARTS, PART_BYTES, ReportJoiner, report_parts


def _round_report(clients: int) -> dict:
    return {"type": "round", "round": 3, "t_start": 1.5, "t_end": 9.25,
            "clients": [{"client": f"c{i:07d}", "outcome": "ok", "status": {"battery": 0.5 + i * 1e-7, "cpu": 0.25},
                         "checkin_t": i / 7} for i in range(clients)]}


def _through_network(parts: list[bytes], t_net: float) -> list[dict]:
    """What the network does to each: unpack it (validated), add its time, pack it for the conductor."""
    out = []
    for raw in parts:
        env = envelope.unpack(raw)
        forwarded = envelope.pack("report", body={**env["body"], "t_net": t_net})
        assert len(forwarded) <= envelope.MAX_ENVELOPE_BYTES
        out.append(envelope.unpack(forwarded)["body"])
    return out


def test_a_small_report_goes_in_one_envelope_as_before():
    body = _round_report(10)
    assert report_parts("server", body, 0) == [envelope.pack("report", body={"peer": "server", **body})]


def test_a_round_of_20000_clients_arrives_whole():
    body = _round_report(20_000)
    assert len(msgpack.packb(body)) > envelope.MAX_ENVELOPE_BYTES  # one envelope would be refused
    parts = report_parts("server", body, 7)
    assert len(parts) == -(-len(msgpack.packb(body, use_bin_type=True)) // PART_BYTES) >= 3
    joiner = ReportJoiner()
    got = [joiner.add(b) for b in _through_network(parts, 9.25)]
    assert got[:-1] == [None] * (len(parts) - 1)
    assert got[-1] == {"peer": "server", **body, "t_net": 9.25}
    assert joiner.open == {}


def test_two_peers_parts_interleaved_are_joined_apart():
    a, b = _round_report(15_000), {**_round_report(13_000), "round": 4}
    pa, pb = _through_network(report_parts("host0", a, 1), 1.0), _through_network(report_parts("host1", b, 1), 2.0)
    joiner, whole = ReportJoiner(), []
    for x, y in zip(pa, pb):
        whole += [r for r in (joiner.add(x), joiner.add(y)) if r is not None]
    assert [r["peer"] for r in whole] == ["host0", "host1"]
    assert whole[0]["clients"] == a["clients"] and whole[1]["round"] == 4


@pytest.mark.parametrize("change, why", [
    ({"index": 1}, "came after 0 parts"),
    ({"of": MAX_PARTS + 1}, "out of range"),
    ({"data": "text"}, "bytes of data"),
    ({"extra": 1}, "nothing else"),
])
def test_a_malformed_part_is_refused_with_a_reason(change, why):
    part = _through_network(report_parts("server", _round_report(15_000), 0), 0.0)[0]
    with pytest.raises(ValueError, match=why):
        ReportJoiner().add({**part, **change})


def test_parts_that_do_not_decode_are_refused():
    joiner = ReportJoiner()
    with pytest.raises(ValueError, match="does not decode"):
        joiner.add({"peer": "p", "type": "part", "id": 0, "index": 0, "of": 1, "data": b"\xc1"})
    assert joiner.open == {}


def test_a_peer_cannot_hoard_unfinished_reports():
    joiner = ReportJoiner()
    for rid in range(20):
        assert joiner.add({"peer": "p", "type": "part", "id": rid, "index": 0, "of": 2, "data": b"x"}) is None
    assert len(joiner.open) == 4


def test_a_report_over_the_cap_fails_at_the_sender():
    with pytest.raises(ValueError, match="over the"):
        report_parts("server", {"blob": b"\0" * (MAX_PARTS * PART_BYTES + 1)}, 0)


def test_a_run_whose_reports_go_in_parts_records_the_same_rounds(tmp_path, monkeypatch):
    """Real processes: with parts of 700 bytes every round report (15 clients) is split by the
    forked server and joined by the conductor; every row is what the reports in one piece give."""
    from protocol import reportparts
    from test_quiet_kinds import _run
    from conftest import read_csv

    assert _run(tmp_path, "whole")["status"] == "completed"
    joined = []
    add = reportparts.ReportJoiner.add

    def counting(self, part):
        body = add(self, part)
        joined.append(body is not None)
        return body

    monkeypatch.setattr(reportparts, "SPLIT_ABOVE_BYTES", 1000)
    monkeypatch.setattr(reportparts, "PART_BYTES", 700)
    monkeypatch.setattr(reportparts.ReportJoiner, "add", counting)
    summary = _run(tmp_path, "parts")
    assert summary["status"] == "completed" and summary["incidents"] == []
    assert joined.count(True) >= 3 and joined.count(False) > joined.count(True)  # each round's report, in parts
    drop = lambda rows: [{k: v for k, v in r.items() if k != "wall_s"} for r in rows]  # noqa: E731
    assert drop(read_csv(tmp_path / "parts" / "rounds.csv")) == drop(read_csv(tmp_path / "whole" / "rounds.csv"))
    assert read_csv(tmp_path / "parts" / "clients.csv") == read_csv(tmp_path / "whole" / "clients.csv")
