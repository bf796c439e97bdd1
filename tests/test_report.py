"""The report's plots stay readable for large rounds."""
from emulator.report import gantt_rows


def test_a_large_rounds_timeline_shows_those_that_did_not_count_first_in_name_order():
    rows = [{"client": f"c{i:04d}", "outcome": "late" if i % 100 == 7 else "ok"} for i in range(1300)]
    shown = gantt_rows(rows, most=20)
    assert len(shown) == 20
    assert [c["client"] for c in shown if c["outcome"] != "ok"] == [f"c{i:04d}" for i in range(7, 1300, 100)]
    assert [c["client"] for c in shown] == sorted(c["client"] for c in shown)
    assert [c["client"] for c in shown if c["outcome"] == "ok"] == [f"c{i:04d}" for i in range(7)]


def test_a_small_round_shows_everyone():
    rows = [{"client": f"c{i}", "outcome": "ok"} for i in range(5)]
    assert gantt_rows(rows) == rows
