"""A live run under attack and under faults: strangers and impostors on the network socket, a
host that stops answering, and the signals job managers send. Real processes, real sockets."""
import json
import math
import random
import signal
import subprocess
import sys
import time

import msgpack
import psutil
import pytest
import zmq

from conftest import REPO, children_by_name, network_endpoint, read_csv, rounds_done, start_run, wait_for_rounds, write_scenario
from protocol import envelope

RUN = """
name: hardened
seed: 11
rounds: 12
task:
  dataset: synthetic
  model: mnist_cnn
  synthetic: {samples: 800, test_samples: 50}
population:
  clients: 4
  hosts: 2
  devices: [{ms_per_sample: 2}]
  links: [{up_mbps: 20, down_mbps: 50, latency_ms: 10}]
selection: {clients_per_round: 4}
algorithm: {local_epochs: 1, batch_size: 50}
eval: {every: 0}
"""


def attack(endpoint: str) -> int:
    """Everything a stranger or an impostor might send; returns how many messages must have reached
    the network (and been refused) before the last one, which is over the size limit."""
    ctx = zmq.Context()
    rng = random.Random(7)

    def dealer(identity: bytes | None = None) -> zmq.Socket:
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 5000)
        if identity is not None:
            sock.setsockopt(zmq.IDENTITY, identity)
        sock.connect(endpoint)
        return sock

    def raw(op: str, **fields) -> bytes:  # packed without any check
        return msgpack.packb({"v": envelope.VERSION, "op": op, **fields}, use_bin_type=True)

    send = dict(src="server", dst="c0000", kind="task", round=0, t=0.0, n=0, body={}, payload=0, fp32=0)
    messages = [
        [b""],
        [envelope.pack("hello", peer="server", actors=["server", "c0000"])],
        [envelope.pack("hello", peer="host0", actors=["c0000", "c0001"])],
        [envelope.pack("send", **send), b"\x00" * 100],
        [envelope.pack("send", **{**send, "src": "c0001", "dst": "server", "kind": "update"}), b"\x01" * 10],
        [envelope.pack("timer", actor="server", at=0.0, tag="deadline:0")],
        *[[envelope.pack("done", actor=a, hold=h, busy_until=None, busy_s=None)] for h in range(30) for a in ("server", "c0000")],
        [envelope.pack("deliver", src="server", dst="c0000", kind="task", round=0, t=0.0, hold=0, body={}, device=None, shared=0)],
        [envelope.pack("stop")],
        [envelope.pack("peer_lost", peer="host0")],
        [envelope.pack("report", body={"type": "finished"})],
        [envelope.pack("record", body={"transfers": [{"id": 1}]})],
        [envelope.pack("alive", busy_s=1e9)],
        *[[raw("send", **{**send, field: value})] for field, value in
          (("t", math.nan), ("t", math.inf), ("t", -1.0), ("n", 2**63), ("payload", -1), ("round", 2**64 - 1),
           ("dst", 7), ("kind", "nonsense"), ("body", [1, 2]))],
        [raw("timer", actor="c0000", at=math.nan, tag="x")],
        [raw("nonsense")],
        [msgpack.packb([1, 2, 3])],
    ]
    messages += [[m[0][: len(m[0]) // 2]] for m in messages[1:12]]  # truncated envelopes
    messages += [[rng.randbytes(rng.randint(1, 300))] for _ in range(100)]  # random frames
    messages += [[rng.randbytes(3 * 2**20)], [rng.randbytes(2**20), rng.randbytes(2**20)]]  # megabytes of garbage
    anonymous, stranger, impostor = dealer(), dealer(b"host9"), dealer(b"server")
    for sock in (anonymous, stranger, impostor):
        for frames in messages:
            sock.send_multipart(frames)
    anonymous.send(rng.randbytes(64 * 2**20))  # over the run's message size limit: ZeroMQ drops the connection
    time.sleep(1.0)
    ctx.destroy(linger=5000)
    return 2 * len(messages)  # the impostor's connection is refused by ZeroMQ itself: its messages never arrive


def run_attacked(tmp_path, name: str, attacked: bool):
    out = tmp_path / name
    proc = start_run(write_scenario(tmp_path / f"{name}.yaml", RUN), out)
    try:
        refused = 0
        if attacked:
            wait_for_rounds(out, 2, proc)
            refused = attack(network_endpoint(proc.pid))
            assert rounds_done(out) < 12, "the run ended before the attack did; make it longer"
        stdout, stderr = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, stderr[-3000:]
    return out, stdout, stderr, refused


def without_wall(rows):
    return [{k: v for k, v in r.items() if k != "wall_s"} for r in rows]


def test_a_run_under_attack_gives_exactly_the_results_of_an_undisturbed_one(tmp_path):
    quiet, _, _, _ = run_attacked(tmp_path, "quiet", attacked=False)
    loud, stdout, stderr, sent = run_attacked(tmp_path, "loud", attacked=True)
    assert read_csv(loud / "transfers.csv") == read_csv(quiet / "transfers.csv")
    assert read_csv(loud / "clients.csv") == read_csv(quiet / "clients.csv")
    assert without_wall(read_csv(loud / "rounds.csv")) == without_wall(read_csv(quiet / "rounds.csv"))
    summary = json.loads((loud / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["rounds_completed"] == 12
    refused = summary["refused_messages"]
    assert refused["total"] >= sent
    assert "host9" in refused["by_peer"] and any(p.startswith("0x") for p in refused["by_peer"])
    assert f"refused {refused['total']} messages" in stdout
    assert "Traceback" not in stderr
    assert "refused a message from host9: not a peer of this run" in stderr
    assert "refused_messages" not in json.loads((quiet / "summary.json").read_text())


STOPPABLE = RUN.replace("rounds: 12", "rounds: 14").replace("eval: {every: 0}", "eval: {every: 0}\nrun: {peer_timeout_s: 3}")


def test_a_stopped_host_is_declared_lost_and_the_run_completes(tmp_path):
    out = tmp_path / "run"
    proc = start_run(write_scenario(tmp_path / "s.yaml", STOPPABLE), out)
    try:
        wait_for_rounds(out, 2, proc)
        host = children_by_name(proc.pid)["flemu-host1"]
        stopped_at = time.monotonic()
        host.send_signal(signal.SIGSTOP)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["rounds_completed"] == 14
    lost = [i for i in summary["incidents"] if i.get("process") == "host1"]
    assert len(lost) == 1, summary["incidents"]
    incident = lost[0]
    assert "silent for" in incident["what"] and "declared lost" in incident["what"]
    assert incident["declared_at_emulated_s"] > 0 and incident["wall_time_s"] > 3
    assert time.monotonic() - stopped_at < 60
    assert not psutil.pid_exists(host.pid) or host.status() == psutil.STATUS_ZOMBIE
    rows = read_csv(out / "rounds.csv")
    assert int(rows[-1]["selected"]) == 2 and int(rows[-1]["completed"]) == 2  # host0's two clients go on
    assert "Traceback" not in stderr


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_and_sighup_end_the_run_like_ctrl_c(tmp_path, signum):
    out = tmp_path / "run"
    proc = start_run(write_scenario(tmp_path / "s.yaml", RUN.replace("rounds: 12", "rounds: 60")), out)
    try:
        wait_for_rounds(out, 1, proc)
        pids = [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
        proc.send_signal(signum)
        try:
            stdout, stderr = proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise AssertionError(f"still running 15 s after {signum.name}") from None
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signum
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "terminated" and summary["reason"] == f"stopped by {signum.name}"
    assert 1 <= summary["rounds_completed"] == rounds_done(out) < 60
    assert not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert "plots not written" in stderr and "Traceback" not in stderr


STOP_WHILE_WAKING = """
import sys, threading, time
import zmq
from node.runtime import Runtime

rt = Runtime("p", "inproc://none", [])
for i in range(400):
    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    pull.bind("inproc://wake")
    wake = rt._signal(ctx, "inproc://wake")
    stop = threading.Event()

    def hammer():  # (the runtime has two such threads, each waking the loop again and again)
        while not stop.is_set():
            try:
                wake()
            except zmq.ZMQError:
                pass

    th = threading.Thread(target=hammer, daemon=True)
    th.start()
    time.sleep(0.002)
    closers = getattr(rt, "_wake_closers", [])
    for close in closers:  # what Runtime.run does as it ends, before destroying the context
        close()
    closers.clear()
    ctx.destroy(linger=0)
    stop.set()
    th.join()
print("survived")
"""


def test_a_runtime_ends_cleanly_while_its_threads_still_wake_the_loop():
    """A worker that finishes a job as the socket loop ends wakes it on a socket that the context
    is tearing down: libzmq can abort the process then (`Assertion failed: pfd.revents & POLLIN`;
    a remote host ended with SIGABRT in CI under load, and a bare pyzmq loop of the same pattern
    aborts in about one run of three). The loop now closes each thread's wake socket under that
    thread's lock first, and a wake after that does nothing. 400 shutdowns with a thread waking
    all the while, in a process of their own: none may abort, raise or hang. (The race is narrow:
    this loop did not hit it in 4 runs of the old code, so it guards the shutdown path rather than
    reproducing the abort every time.)"""
    res = subprocess.run([sys.executable, "-c", STOP_WHILE_WAKING], capture_output=True, text=True, timeout=120,
                         cwd=str(REPO))
    assert res.returncode == 0 and "survived" in res.stdout, (res.returncode, res.stderr[-2000:])


STOP_WHILE_TRAINING = """
import sys, time
from pathlib import Path
import torch
from node.actor import Reaction
from node.runtime import Runtime

torch.set_num_threads(1)
endpoint, started = sys.argv[1], Path(sys.argv[2])


class Busy:
    name = "c0"

    def react(self, msg):
        def work():
            started.touch()
            x = torch.randn(600, 600)
            for _ in range(150):  # about a second inside torch, the GIL released
                x = (x @ x).clamp_(-1, 1)
            return Reaction()
        return Reaction(work=work, work_s=1.0)


Runtime("host0", endpoint, [Busy()], None).run()
print("left the run", flush=True)
"""


def test_a_host_told_to_stop_while_a_job_runs_in_torch_exits_cleanly(tmp_path):
    """A remote host leaves through the interpreter's own exit. A worker thread still inside a torch
    operation then was ended by pthread_exit on its way back to the GIL, and the C++ frames it
    unwound through called std::terminate: SIGABRT, exit -6 (CI, test_remote_hosts). The runtime now
    waits for the job in progress before it returns. A real runtime in its own process, told to
    stop while its one job multiplies matrices."""
    ctx = zmq.Context()
    net = ctx.socket(zmq.ROUTER)
    port = net.bind_to_random_port("tcp://127.0.0.1")
    started = tmp_path / "started"
    proc = subprocess.Popen([sys.executable, "-c", STOP_WHILE_TRAINING, f"tcp://127.0.0.1:{port}", str(started)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(REPO))
    try:
        assert net.poll(60_000), "the runtime never said hello"
        peer, hello = net.recv_multipart()
        assert envelope.unpack(hello)["op"] == "hello"
        net.send_multipart([peer, envelope.pack("deliver", src="server", dst="c0", kind="task", round=1, t=0.0,
                                                hold=1, body={}, device=None, shared=0)])
        deadline = time.monotonic() + 60
        while not started.exists():
            assert time.monotonic() < deadline and proc.poll() is None, "the job never started"
            time.sleep(0.01)
        net.send_multipart([peer, envelope.pack("stop")])
        out, err = proc.communicate(timeout=150)
    finally:
        if proc.poll() is None:
            proc.kill()
        ctx.destroy(linger=0)
    assert proc.returncode == 0 and "left the run" in out, (proc.returncode, err[-2000:])
    assert "terminate called" not in err
