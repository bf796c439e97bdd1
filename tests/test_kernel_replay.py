"""The tcp model against kernel CUBIC measurements recorded by `tools/validate_shaping.py --grid
--json` (tools/validation/kernel_grid.jsonl: two namespaces, the TUN delay line, tbf). The model
side is recomputed here for the recorded kernel times, so a change of the model that moves any
case out of the issue's bands fails without root or a kernel. Bands: loss-free payloads of 1 MiB
and more and the idle-gap cases within [0.95, 1.05], loss-free 64 KiB within [0.85, 1.15], lossy
cases within [0.75, 1.33] of the kernel's median."""
import json
import sys

import pytest

from conftest import REPO

sys.path.insert(0, str(REPO / "tools"))
import validate_shaping as vs  # noqa: E402

GRID = REPO / "tools" / "validation" / "kernel_grid.jsonl"
# Measured outside their band, with why (the README and the issue note give the numbers): after
# a 1 s idle gap on a 300 ms RTT the kernel restarts with one window halving where the model's RTO
# estimate (3 RTT decaying to RTT + 200 ms) gives two, so the model is 8 % slow there.
KNOWN_OUTSIDE = {(5.0, 150.0, 0.0, 50.0, 1048576, 1.0, "tcp"): 1.10, (100.0, 150.0, 0.0, 50.0, 1048576, 1.0, "tcp"): 1.10}


def band(rec):
    if rec["loss"] > 0:
        return 0.75, 1.33
    if rec["idle_s"] > 0 or rec["payload_bytes"] >= 2**20:
        return 0.95, 1.05
    return 0.85, 1.15


def recorded_cases():
    seen = {}
    for line in GRID.read_text().splitlines():
        rec = json.loads(line)
        key = (rec["rate_mbps"], rec["delay_ms"], rec["loss"], rec["queue_ms"], rec["payload_bytes"], rec["idle_s"], rec["path"])
        seen.setdefault(key, rec)
    return seen


def test_the_recorded_grid_is_substantial():
    cases = recorded_cases()
    assert len(cases) >= 100
    assert {c[2] for c in cases} >= {0.0, 0.001}  # loss-free and lossy
    assert {c[1] for c in cases} >= {0.0, 10.0, 40.0, 150.0}


@pytest.mark.parametrize("model", ["tcp", "fluid"])
def test_replayed_against_recorded_kernel_times(model):
    class Args:
        pause, seed = 0.05, 1

    outside = {}
    for key, rec in recorded_cases().items():
        case = vs.record_case(rec)
        new = vs.record(case, rec["path"], model, rec["kernel_times"], Args, vs.TUN_FRAMING, vs.TcpParams())
        lo, hi = band(new)
        if not lo <= new["ratio"] <= hi:
            outside[key] = new["ratio"]
    if model == "tcp":
        assert set(outside) <= set(KNOWN_OUTSIDE), {k: v for k, v in outside.items() if k not in KNOWN_OUTSIDE}
        assert all(outside[k] <= KNOWN_OUTSIDE[k] for k in outside)
    else:
        # the fluid model misses wherever slow start or loss matters: the comparison discriminates
        assert len(outside) >= 40
