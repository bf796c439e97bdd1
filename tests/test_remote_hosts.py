"""Hosts on other machines: CURVE keys and the ZAP handler, the lobby, and whole runs whose hosts
join over TCP from another network namespace (root), or over loopback where namespaces cannot be
made. The CSVs must equal a local run's; a wrong key is refused and the run says so; a peer with a
valid key cannot claim another host's actors; a host that vanishes is handled as a killed one."""
from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import msgpack
import psutil
import pytest
import zmq
from zmq.utils.monitor import recv_monitor_message

from emulator.placement import Lobby, Placement, PlacementError, RemoteHost, network_listen
from emulator.world import usable_cores
from protocol import curve, envelope

from conftest import REPO, needs_mnist, read_csv, run_cli, write_scenario

LOCAL_THREADS = max(1, usable_cores() // 2)  # what each of 2 forked hosts trains with: the same here, for equal floats
NS_A, NS_B = f"flemu-ta{os.getpid() % 10000}", f"flemu-tb{os.getpid() % 10000}"
ADDR_A, ADDR_B = "10.213.9.1", "10.213.9.2"

TINY = """
name: remote
seed: 5
rounds: {rounds}
task: {{dataset: synthetic, model: mlp, partition: {{kind: iid}}, synthetic: {{samples: 600, test_samples: 100}}}}
population:
  clients: 8
  devices: [{{name: d, share: 1.0, ms_per_sample: 5.0}}]
  links:
    - {{name: wifi, share: 0.5, up_mbps: 20, down_mbps: 50, latency_ms: 10}}
    - {{name: lte, share: 0.5, up_mbps: 5, down_mbps: 20, latency_ms: 40}}
server: {{link: {{up_mbps: 100, down_mbps: 100, latency_ms: 1}}}}
selection: {{clients_per_round: {per_round}}}
algorithm: {{local_epochs: 1, batch_size: 16, lr: 0.05}}
eval: {{every: 1}}
run: {{peer_timeout_s: 3}}
"""


# ---- keys, ZAP, lobby ----------------------------------------------------------------------------
def test_key_files_are_private_and_read_back(tmp_path):
    keys, paths = curve.make_keys(tmp_path / "k", hosts=2)
    assert [p.name for p in paths] == ["host-1.key", "host-2.key"]
    for path in [tmp_path / "k" / "conductor.key", *paths]:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "k").stat().st_mode) == 0o700
    back = curve.read_run_keys(tmp_path / "k" / "conductor.key")
    assert back == keys
    host = curve.read_host_key(paths[1])
    assert host.run_public == keys.run.public and host.host.public == keys.hosts[1]
    with pytest.raises(curve.KeyFileError, match="not a host key file"):
        curve.read_host_key(tmp_path / "k" / "conductor.key")
    with pytest.raises(curve.KeyFileError, match="not a conductor key file"):
        curve.read_run_keys(paths[0])
    with pytest.raises(curve.KeyFileError, match="key file not found"):
        curve.read_host_key(tmp_path / "nope.key")
    bad = json.loads(paths[0].read_text())
    bad["secret"] = "x" * 39
    (tmp_path / "bad.key").write_text(json.dumps(bad))
    with pytest.raises(curve.KeyFileError, match="secret is not a 40-character Z85"):
        curve.read_host_key(tmp_path / "bad.key")


def _auth_events(sock: zmq.Socket, connect: str, timeout: float = 5.0) -> set[int]:
    monitor = sock.get_monitor_socket()
    sock.connect(connect)
    sock.send(b"hello")
    seen: set[int] = set()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not seen & {zmq.EVENT_HANDSHAKE_SUCCEEDED, zmq.EVENT_HANDSHAKE_FAILED_AUTH,
                                                       zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL}:
        if monitor.poll(100):
            seen.add(recv_monitor_message(monitor)["event"])
    return seen


def test_zap_admits_only_the_run_host_keys_and_reports_the_rest(tmp_path):
    keys, paths = curve.make_keys(tmp_path / "k", hosts=1)
    stranger = curve.HostKey(keys.run.public, curve.KeyPair.new())  # knows the run's public key, not admitted
    server_ctx, client_ctx = zmq.Context(), zmq.Context()
    log = tmp_path / "zap.log"
    try:
        with open(log, "w") as f:
            zap = curve.ZapHandler(server_ctx, keys.hosts, "test", log=f)
            server = server_ctx.socket(zmq.ROUTER)
            keys.serve(server)
            port = server.bind_to_random_port("tcp://127.0.0.1")
            url = f"tcp://127.0.0.1:{port}"
            good = client_ctx.socket(zmq.DEALER)
            curve.read_host_key(paths[0]).connect(good)
            assert zmq.EVENT_HANDSHAKE_SUCCEEDED in _auth_events(good, url)
            assert server.poll(3000) and server.recv_multipart()[1] == b"hello"
            bad = client_ctx.socket(zmq.DEALER)
            stranger.connect(bad)
            assert zmq.EVENT_HANDSHAKE_FAILED_AUTH in _auth_events(bad, url)
            plain = client_ctx.socket(zmq.DEALER)  # no CURVE at all: the handshake itself fails
            assert zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL in _auth_events(plain, url)
            assert not server.poll(500), "a refused peer's message reached the server"
            refusals = zap.refusals()
            zap.close()
        assert [r["key"] for r in refusals] == [stranger.host.public]
        assert refusals[0]["address"] == "127.0.0.1" and refusals[0]["why"] == "not a key this run admits"
        assert f"[test] refused a connection from 127.0.0.1: not a key this run admits (key {stranger.host.public})" \
            in log.read_text()
    finally:
        client_ctx.destroy(linger=0)
        server_ctx.destroy(linger=0)


def test_lobby_gives_each_slot_once_after_the_network_listens(tmp_path):
    keys, paths = curve.make_keys(tmp_path / "k", hosts=1)
    host_key = curve.read_host_key(paths[0])
    ctx = zmq.Context()
    try:
        hosts = [RemoteHost("host0"), RemoteHost("host1")]
        lobby = Lobby(ctx, "tcp://127.0.0.1:0", keys, hosts, {"scenario": {"k": 1}, "fingerprint": "f" * 32, "silence_s": 9.0})
        url = lobby.address_for_hosts()

        def joiner(slot: str = "") -> zmq.Socket:
            sock = ctx.socket(zmq.DEALER)
            host_key.connect(sock)
            sock.connect(url)
            sock.send(envelope.pack("join", host="m", pid=1, slot=slot))
            return sock

        def answer(sock: zmq.Socket) -> dict | None:
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                lobby.receive()
                if sock.poll(50):
                    return envelope.unpack(sock.recv())
            return None

        first = joiner("host1")
        deadline = time.monotonic() + 3
        while not lobby.pending and time.monotonic() < deadline:
            lobby.receive()
            time.sleep(0.02)
        assert len(lobby.pending) == 1 and not first.poll(200), "a host was answered before the network listened"
        assert lobby.network_listening("tcp://0.0.0.0:47555") == ["host1 joined from m (pid 1, 127.0.0.1)"]  # and the address it came from
        got = envelope.unpack(first.recv())
        assert (got["op"], got["peer"], got["index"], got["network_port"]) == ("welcome", "host1", 1, 47555)
        assert got["scenario"] == {"k": 1} and got["fingerprint"] == "f" * 32 and got["silence_s"] == 9.0
        taken = answer(joiner("host1"))
        assert taken["op"] == "join_refused" and "'host1' is not free" in taken["why"]
        assert answer(joiner())["peer"] == "host0"
        full = answer(joiner())
        assert full["op"] == "join_refused" and "all its 2 hosts" in full["why"]
        assert hosts[0].joined_from == {"machine": "m", "pid": 1, "address": "127.0.0.1"} and lobby.joined == ["host1", "host0"]
        older = ctx.socket(zmq.DEALER)  # a host of another release: its envelopes carry another version
        host_key.connect(older)
        older.connect(url)
        older.send(msgpack.packb({"v": envelope.VERSION - 1, "op": "join", "host": "m", "pid": 2, "slot": ""}))
        refused = answer(older)
        assert refused["op"] == "join_refused" and f"protocol version {envelope.VERSION - 1} unknown" in refused["why"]
        lobby.close()
    finally:
        ctx.destroy(linger=0)


def test_placement_options_that_cannot_work_are_named():
    with pytest.raises(PlacementError, match="needs --listen"):
        Placement("remote", 2).check()
    with pytest.raises(PlacementError, match="expected tcp://ADDR:PORT"):
        Placement("remote", 2, "udp://x:1").check()
    with pytest.raises(PlacementError, match="add --hosts remote:N"):
        Placement("local", None, "tcp://127.0.0.1:5000").check()
    assert network_listen("tcp://0.0.0.0:5000") == "tcp://0.0.0.0:5001"
    assert network_listen("tcp://10.0.0.1:0") == "tcp://10.0.0.1:*"


def test_cli_refuses_bad_remote_options_in_one_line(tmp_path):
    path = write_scenario(tmp_path / "s.yaml", TINY.format(rounds=1, per_round=2))
    res = run_cli("run", str(path), "--hosts", "local:2", timeout=60)
    assert res.returncode == 2 and "expected remote:N" in res.stderr and "Traceback" not in res.stderr
    res = run_cli("run", str(path), "--hosts", "remote:2", timeout=60)
    assert res.returncode == 2 and "error: --hosts remote:N needs --listen" in res.stderr
    res = run_cli("host", "--connect", "tcp://127.0.0.1:1", "--key", str(tmp_path / "none.key"), timeout=60)
    assert res.returncode == 2 and "key file not found" in res.stderr and "Traceback" not in res.stderr


def test_a_host_leaves_a_network_that_stopped_answering(tmp_path):
    """A remote host has no parent to outlive: it leaves once heartbeats go unanswered."""
    from node.runtime import Runtime

    ctx = zmq.Context()
    try:
        silent = ctx.socket(zmq.ROUTER)  # takes the host's messages and never answers
        port = silent.bind_to_random_port("tcp://127.0.0.1")
        t0 = time.monotonic()
        Runtime("host0", f"tcp://127.0.0.1:{port}", [], None, silence_s=1.5).run()
        took = time.monotonic() - t0
        assert 1.5 <= took < 6, took
        assert silent.poll(0), "the host sent nothing (no hello, no heartbeat)"
    finally:
        ctx.destroy(linger=0)


# ---- whole runs ----------------------------------------------------------------------------------
def namespaces_available() -> str | None:
    """None when two namespaces joined by a veth pair can be made here, else why not."""
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    if shutil.which("ip") is None:
        return "needs iproute2 (ip)"
    probe = f"flemu-probe{os.getpid() % 10000}"
    res = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None if res.returncode == 0 else f"cannot create a network namespace: {res.stderr.strip()}"


def two_namespaces(*ends: tuple[str, str, str]) -> None:
    """Two network namespaces, each (name, its end of the veth pair, its address in a /24), made
    and joined by a veth pair: two machines on one cable, as far as TCP is concerned."""
    def ip(*args: str) -> None:
        subprocess.run(["ip", *args], check=True, capture_output=True)
    (ns_a, dev_a, _), (ns_b, dev_b, _) = ends
    for ns, _, _ in ends:
        ip("netns", "add", ns)
        ip("-n", ns, "link", "set", "lo", "up")
    ip("link", "add", dev_a, "netns", ns_a, "type", "veth", "peer", "name", dev_b, "netns", ns_b)
    for ns, dev, addr in ends:
        ip("-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
        ip("-n", ns, "link", "set", dev, "up")


@pytest.fixture(scope="module")
def two_machines():
    """Namespaces A (conductor, network, server) and B (hosts) joined by a veth pair: two machines
    as far as TCP is concerned."""
    why = namespaces_available()
    if why:
        pytest.skip(why)

    try:
        two_namespaces((NS_A, "flemu-va", ADDR_A), (NS_B, "flemu-vb", ADDR_B))
        yield {"a": ["ip", "netns", "exec", NS_A], "b": ["ip", "netns", "exec", NS_B], "addr": ADDR_A}
    finally:
        for ns in (NS_A, NS_B):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def _emulator(prefix: list[str], *args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([*prefix, sys.executable, "-m", "emulator", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=REPO, env=os.environ.copy(), **kw)


def _finish(proc: subprocess.Popen, timeout: float = 240) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"{proc.args} did not end: {err[-3000:]}")
    return proc.returncode, out, err


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, f"{path} did not appear"
        time.sleep(0.1)


def _two_hosts_run_it(m: dict, conductor: subprocess.Popen, out: Path, port: int, *options: str) -> None:
    """Two hosts join the run from machine b with their slots' keys; the run and both complete."""
    hosts = [_emulator(m["b"], "host", "--connect", f"tcp://{m['addr']}:{port}", "--key",
                       str(out / "keys" / f"host-{k}.key"), "--threads", str(LOCAL_THREADS), *options) for k in (1, 2)]
    code, _, err = _finish(conductor)
    assert code == 0, err[-3000:]
    for h in hosts:
        h_code, _, h_err = _finish(h, 60)
        assert h_code == 0, h_err[-2000:]


def _same_results(local: Path, remote: Path) -> None:
    for name in ("rounds.csv", "clients.csv", "transfers.csv"):
        a, b = read_csv(local / name), read_csv(remote / name)
        assert len(a) == len(b) > 0, name
        for i, (x, y) in enumerate(zip(a, b)):
            x.pop("wall_s", None)
            y.pop("wall_s", None)
            assert x == y, f"{name} row {i}: {x} != {y}"


@pytest.fixture(scope="module")
def two_machines_or_loopback(request):
    """The namespaces where they can be made; else one machine's loopback (same code, same checks).
    CI runs as root: there a test that cannot make namespaces fails rather than fall back."""
    why = namespaces_available()
    if why is None:
        return request.getfixturevalue("two_machines")
    if os.environ.get("CI"):
        pytest.fail(f"CI must run this across network namespaces, and cannot: {why}")
    return {"a": [], "b": [], "addr": "127.0.0.1"}


NS_THREE = {name: f"flemu-3{name}{os.getpid() % 10000}" for name in ("a", "b", "c", "br")}
ADDR_THREE = {"a": "10.213.10.1", "b": "10.213.10.2", "c": "10.213.10.3"}


@pytest.fixture(scope="module")
def three_machines():
    """Three namespaces (a: the conductor, network and server; b and c: one host each), each with a
    veth into a bridge in a fourth: three machines on one switch, as far as TCP is concerned. No
    fallback: where namespaces cannot be made the test is skipped, and in CI it fails."""
    why = namespaces_available()
    if why:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run this across network namespaces, and cannot: {why}")
        pytest.skip(why)

    def ip(*args: str) -> None:
        subprocess.run(["ip", *args], check=True, capture_output=True)
    tag = os.getpid() % 10000
    try:
        for ns in NS_THREE.values():
            ip("netns", "add", ns)
            ip("-n", ns, "link", "set", "lo", "up")
        br = NS_THREE["br"]
        ip("-n", br, "link", "add", "flemu-br", "type", "bridge")
        ip("-n", br, "link", "set", "flemu-br", "up")
        for name in ("a", "b", "c"):
            inner, outer = f"flemu-v{name}", f"flemu-p{name}{tag}"[:15]
            ip("link", "add", inner, "netns", NS_THREE[name], "type", "veth", "peer", "name", outer, "netns", br)
            ip("-n", NS_THREE[name], "addr", "add", f"{ADDR_THREE[name]}/24", "dev", inner)
            ip("-n", NS_THREE[name], "link", "set", inner, "up")
            ip("-n", br, "link", "set", outer, "master", "flemu-br")
            ip("-n", br, "link", "set", outer, "up")
        yield {name: ["ip", "netns", "exec", NS_THREE[name]] for name in ("a", "b", "c")}
    finally:
        for ns in NS_THREE.values():
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


ROGUE = """
import sys, time, zmq
from protocol import curve, envelope
addr, port, key_file, actor = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
ctx = zmq.Context()
sock = ctx.socket(zmq.DEALER)
sock.setsockopt(zmq.IDENTITY, b"host0")
curve.read_host_key(key_file).connect(sock)
sock.connect(f"tcp://{addr}:{port}")
sock.send(envelope.pack("hello", peer="host0", actors=[actor]))
time.sleep(1.0)
ctx.destroy(linger=500)
"""


def test_hosts_joining_over_tcp_give_the_local_run_results_and_strangers_are_refused(tmp_path, two_machines_or_loopback):
    m = two_machines_or_loopback
    path = write_scenario(tmp_path / "s.yaml", TINY.format(rounds=3, per_round=4))
    local = run_cli("run", str(path), "--set", "population.hosts=2", "--out", str(tmp_path / "local"), "--quiet", timeout=240)
    assert local.returncode == 0, local.stderr[-3000:]
    port = 47400 + os.getpid() % 500
    out = tmp_path / "remote"
    conductor = _emulator(m["a"], "run", str(path), "--hosts", "remote:2", "--listen", f"tcp://{m['addr']}:{port}",
                          "--out", str(out), "--plain")
    try:
        key_file = out / "keys" / "host-1.key"
        _wait_for(key_file, conductor)
        # a key this run does not admit, with the run's public key: refused at the handshake
        curve.make_keys(tmp_path / "other")
        wrong = json.loads((tmp_path / "other" / "host-1.key").read_text())
        wrong["run_public"] = json.loads(key_file.read_text())["run_public"]
        (tmp_path / "wrong.key").write_text(json.dumps(wrong))
        code, _, err = _finish(_emulator(m["b"], "host", "--connect", f"tcp://{m['addr']}:{port}", "--key",
                                         str(tmp_path / "wrong.key"), "--timeout", "30"), 60)
        assert code == 2 and "refused this host's key" in err, err[-2000:]
        # a slot is bound to its key: host-2.key holds slot host1, and cannot join as host0
        other_slot = out / "keys" / "host-2.key"
        code, _, err = _finish(_emulator(m["b"], "host", "--connect", f"tcp://{m['addr']}:{port}", "--key",
                                         str(other_slot), "--slot", "host0", "--timeout", "30"), 60)
        assert code == 2 and "its key is host slot 'host1''s, not 'host0''s" in err, err[-2000:]
        # a valid key cannot claim another host's actors (the network checks every hello)
        # (says hello as host0 for an actor of host1, then leaves, so that the real host0 can join)
        rogue = subprocess.run([*m["b"], sys.executable, "-c", ROGUE, m["addr"], str(port + 1), str(key_file), "c0007"],
                               capture_output=True, text=True, timeout=60, cwd=REPO)
        assert rogue.returncode == 0, rogue.stderr
        # nor speak to the network as host0 with host1's key (every message of a slot must come with its key)
        rogue = subprocess.run([*m["b"], sys.executable, "-c", ROGUE, m["addr"], str(port + 1), str(other_slot),
                                "c0001"], capture_output=True, text=True, timeout=60, cwd=REPO)
        assert rogue.returncode == 0, rogue.stderr
        _two_hosts_run_it(m, conductor, out, port)
    finally:
        if conductor.poll() is None:
            conductor.kill()
    _same_results(tmp_path / "local", out)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed"
    assert summary["placement"]["launcher"] == "remote" and sorted(summary["placement"]["joined"]) == ["host0", "host1"]
    assert summary["placement"]["network"].endswith(f":{port + 1}")
    incidents = [i["what"] for i in summary.get("incidents", [])]
    assert any(w == "refused a connection to the conductor: not a key this run admits" for w in incidents), incidents
    assert any("refused a claim on actor names: host0 claimed actors it was not given (['c0007'])" in w
               for w in incidents), incidents
    assert any("a message as host0 that did not come with host0's key" in w for w in incidents), incidents


def test_a_remote_host_that_vanishes_is_handled_like_a_killed_one(tmp_path, two_machines_or_loopback):
    m = two_machines_or_loopback
    path = write_scenario(tmp_path / "s.yaml", TINY.format(rounds=6, per_round=8))
    port = 46400 + os.getpid() % 500
    out = tmp_path / "remote"
    conductor = _emulator(m["a"], "run", str(path), "--hosts", "remote:2", "--listen", f"tcp://{m['addr']}:{port}",
                          "--out", str(out), "--plain")
    hosts = []
    try:
        _wait_for(out / "keys" / "host-1.key", conductor)
        for k, slot in ((1, "host0"), (2, "host1")):
            hosts.append(_emulator(m["b"], "host", "--connect", f"tcp://{m['addr']}:{port}", "--key",
                                   str(out / "keys" / f"host-{k}.key"), "--threads", "1", "--slot", slot,
                                   start_new_session=True))
        _wait_for(out / "rounds.csv", conductor)
        deadline = time.monotonic() + 60
        while len(read_csv(out / "rounds.csv")) < 1:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        os.killpg(hosts[1].pid, signal.SIGKILL)  # the host and the ip-netns wrapper: gone without a word
        code, _, err = _finish(conductor)
    finally:
        for p in [conductor, *hosts]:
            if p.poll() is None:
                p.kill()
    assert code == 0, err[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    lost = [i for i in summary["incidents"] if i["what"].startswith("host1 process silent for")]
    assert len(lost) == 1 and "its clients count as failed from now on" in lost[0]["what"], summary["incidents"]
    assert summary["status"] == "completed" and summary["rounds_completed"] == 6
    rows = read_csv(out / "rounds.csv")
    after = int(lost[0]["after_round"])
    assert int(rows[0]["completed"]) == 8
    # the round under way when host1 died loses those of its clients that had not answered yet;
    # every later round has only host0's 4
    hit = rows[after + 1]
    assert 4 <= int(hit["completed"]) < 8 and int(hit["completed"]) + int(hit["failed"]) == 8, hit
    assert len(rows) > after + 2 and all(int(r["completed"]) == 4 for r in rows[after + 2:]), rows
    h_code, _, h_err = _finish(hosts[0], 60)
    assert h_code == 0, h_err[-3000:]


@needs_mnist
def test_a_host_without_the_run_data_is_refused_and_the_run_says_why(tmp_path):
    """With --data local its data root is its own: where the data set is missing, the run fails at
    once with the reason."""
    port = 45400 + os.getpid() % 500
    out = tmp_path / "remote"
    conductor = _emulator([], "run", "scenarios/smoke.yaml", "--set", "task.model=mlp", "--hosts", "remote:1",
                          "--listen", f"tcp://127.0.0.1:{port}", "--out", str(out), "--plain")
    try:
        _wait_for(out / "keys" / "host-1.key", conductor)
        (tmp_path / "empty").mkdir()
        code, _, err = _finish(_emulator([], "host", "--connect", f"tcp://127.0.0.1:{port}", "--key",
                                         str(out / "keys" / "host-1.key"), "--data-root", str(tmp_path / "empty"),
                                         "--data", "local"), 120)
        assert code == 2 and "task.dataset: dataset 'mnist' is not under" in err, err[-2000:]  # (its fetch fails: no mirror in tests)
        code, _, err = _finish(conductor, 60)
    finally:
        if conductor.poll() is None:
            conductor.kill()
    assert code == 1 and "failed: task.dataset: dataset 'mnist' is not under" in err, err[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["placement"]["joined"]["host0"]["pid"] > 0


@needs_mnist
def test_hosts_without_the_data_set_get_their_clients_rows_from_the_lobby(tmp_path, two_machines_or_loopback):
    """Hosts whose machine has no data set (an empty data root) get, from the lobby, every label and
    the samples of the rows their clients hold, and the run equals the local one. A lobby whose
    limit is below what a host's clients hold refuses it in one line, and the run fails saying so."""
    m = two_machines_or_loopback
    smoke = ("scenarios/smoke.yaml", "--set", "task.model=mlp")
    local = run_cli("run", *smoke, "--set", "population.hosts=2", "--out", str(tmp_path / "local"), "--quiet", timeout=240)
    assert local.returncode == 0, local.stderr[-3000:]
    (tmp_path / "empty").mkdir()
    port = 44900 + os.getpid() % 500
    for limit, out in (("1024", tmp_path / "remote"), ("1", tmp_path / "small")):
        conductor = _emulator(m["a"], "run", *smoke, "--hosts", "remote:2", "--listen", f"tcp://{m['addr']}:{port}",
                              "--serve-data-mb", limit, "--out", str(out), "--plain")
        try:
            _wait_for(out / "keys" / "host-2.key", conductor)
            hosts = [_emulator(m["b"], "host", "--connect", f"tcp://{m['addr']}:{port}", "--key",
                               str(out / "keys" / f"host-{k}.key"), "--data-root", str(tmp_path / "empty"),
                               "--threads", str(LOCAL_THREADS), "--timeout", "15") for k in (1, 2)]
            code, said, err = _finish(conductor)
            host_ends = [_finish(h, 60) for h in hosts]
        finally:
            if conductor.poll() is None:
                conductor.kill()
        if limit == "1":
            assert code == 1 and "over the lobby's limit of 1 MiB (run --serve-data-mb)" in err, err[-2000:]
            # the first refused ends the run; the other was refused too, or found no run left to join
            assert any(c == 2 and "would not send this host its data" in e for c, _, e in host_ends), host_ends
            assert all(c == 2 for c, _, _ in host_ends), host_ends
            continue
        assert code == 0, err[-3000:]
        for h_code, _, h_err in host_ends:
            assert h_code == 0 and "got its clients' data from the lobby" in h_err, h_err[-2000:]
        assert said.count("got its clients' data from the lobby") == 2, said[-2000:]  # the run's log says so too
        _same_results(tmp_path / "local", out)


def test_hosts_read_the_scenario_files_the_lobby_sends(tmp_path, two_machines_or_loopback):
    """A scenario whose LTE uplinks follow a pool of Mahimahi traces under the data root: hosts on a
    machine without them get the files with their welcome and build the same world (its trace
    draws and offsets included), and the run equals the local one."""
    traces = Path(os.environ.get("EMULATOR_DATA", "")) / "traces" / "mahimahi"
    if not (traces / "TMobile-LTE-short.up").exists():
        pytest.skip("the shared Mahimahi traces are not here (set EMULATOR_DATA)")
    m = two_machines_or_loopback
    text = TINY.format(rounds=2, per_round=4).replace(
        "{name: lte, share: 0.5, up_mbps: 5, down_mbps: 20, latency_ms: 40}",
        "{name: lte, share: 0.5, down_mbps: 20, latency_ms: 40, up_trace: {files: 'traces/mahimahi/*-LTE-short.up'}}")
    path = write_scenario(tmp_path / "s.yaml", text)
    local = run_cli("run", str(path), "--set", "population.hosts=2", "--out", str(tmp_path / "local"), "--quiet", timeout=240)
    assert local.returncode == 0, local.stderr[-3000:]
    port = 44300 + os.getpid() % 500
    out = tmp_path / "remote"
    conductor = _emulator(m["a"], "run", str(path), "--hosts", "remote:2", "--listen", f"tcp://{m['addr']}:{port}",
                          "--out", str(out), "--plain")
    (tmp_path / "empty").mkdir()
    try:
        _wait_for(out / "keys" / "host-2.key", conductor)
        _two_hosts_run_it(m, conductor, out, port, "--data-root", str(tmp_path / "empty"))
    finally:
        if conductor.poll() is None:
            conductor.kill()
    _same_results(tmp_path / "local", out)
    assert len({r["up_mbps"] for r in read_csv(out / "population.csv") if r["link"] == "lte"}) > 1  # traced: means differ


def test_three_machines_on_a_switch_and_a_cut_cable(tmp_path, three_machines):
    """The conductor in one namespace, a host in each of two others, real TCP with CurveZMQ through
    a bridge: each host joins from its own address (asserted, so loopback cannot pass), and cutting
    one host's cable mid-run (ip link set down) is found by the heartbeats: its clients fail, the
    run completes and says so."""
    m = three_machines
    path = write_scenario(tmp_path / "s.yaml", TINY.format(rounds=6, per_round=8))
    port = 44400 + os.getpid() % 500
    out = tmp_path / "remote"
    listen = f"tcp://{ADDR_THREE['a']}:{port}"
    conductor = _emulator(m["a"], "run", str(path), "--hosts", "remote:2", "--listen", listen, "--set",
                          "run.peer_timeout_s=3", "--out", str(out), "--plain")
    hosts = []
    try:
        _wait_for(out / "keys" / "host-1.key", conductor)
        for k, slot, machine in ((1, "host0", "b"), (2, "host1", "c")):
            hosts.append(_emulator(m[machine], "host", "--connect", listen, "--key", str(out / "keys" / f"host-{k}.key"),
                                   "--threads", "1", "--slot", slot, start_new_session=True))
        _wait_for(out / "rounds.csv", conductor)
        deadline = time.monotonic() + 60
        while len(read_csv(out / "rounds.csv")) < 1:
            assert time.monotonic() < deadline and conductor.poll() is None
            time.sleep(0.05)
        subprocess.run([*m["c"], "ip", "link", "set", "flemu-vc", "down"], check=True)  # the cable, not the process
        code, _, err = _finish(conductor)
    finally:
        for p in [conductor, *hosts]:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL) if p in hosts else p.kill()
    assert code == 0, err[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    joined = summary["placement"]["joined"]
    assert joined["host0"]["address"] == ADDR_THREE["b"] and joined["host1"]["address"] == ADDR_THREE["c"], joined
    lost = [i for i in summary["incidents"] if i["what"].startswith("host1 process silent for")]
    assert len(lost) == 1 and "its clients count as failed from now on" in lost[0]["what"], summary["incidents"]
    assert summary["status"] == "completed" and summary["rounds_completed"] == 6
    rows = read_csv(out / "rounds.csv")
    after = int(lost[0]["after_round"])
    assert int(rows[0]["completed"]) == 8 and len(rows) > after + 2
    assert all(int(r["completed"]) == 4 for r in rows[after + 2:]), rows


def test_checkpoints_with_remote_hosts_and_a_resume_they_join_again(tmp_path, two_machines_or_loopback):
    """Hosts on another machine send their checkpoint parts to the network, which writes them into
    the run directory; the conductor is SIGKILLed after round 3's checkpoint (and the hosts' machine
    goes with it); a resume waits for hosts again, hands each its clients' parts through the lobby,
    and the CSVs equal those of an uninterrupted run with forked hosts. A checkpoint that remote
    hosts wrote is not resumed with forked ones (only a host ever loads a host's part)."""
    from test_resume import RESUMABLE, checkpointed_rounds, without_wall  # noqa: PLC0415

    m = two_machines_or_loopback
    path = write_scenario(tmp_path / "s.yaml", RESUMABLE)
    whole = run_cli("run", str(path), "--out", str(tmp_path / "whole"), "--quiet", timeout=240)
    assert whole.returncode == 0, whole.stderr[-3000:]
    port = 45400 + os.getpid() % 500
    out = tmp_path / "remote"

    def join(k: int) -> subprocess.Popen:
        return _emulator(m["b"], "host", "--connect", f"tcp://{m['addr']}:{port}", "--key",
                         str(out / "keys" / f"host-{k}.key"), "--threads", str(LOCAL_THREADS), start_new_session=True)
    conductor = _emulator(m["a"], "run", str(path), "--hosts", "remote:2", "--listen", f"tcp://{m['addr']}:{port}",
                          "--out", str(out), "--plain")
    hosts, children = [], []
    try:
        _wait_for(out / "keys" / "host-2.key", conductor)
        hosts = [join(1), join(2)]
        deadline = time.monotonic() + 180
        while checkpointed_rounds(out) < 3:
            assert conductor.poll() is None and time.monotonic() < deadline, "no checkpoint of round 3 came"
            time.sleep(0.01)
        children = psutil.Process(conductor.pid).children(recursive=True)  # ip-netns exec execs: the conductor
        conductor.send_signal(signal.SIGKILL)  # its network and server follow it
    finally:
        for proc in (conductor, *hosts):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL) if proc is not conductor else proc.kill()
            proc.communicate()
    psutil.wait_procs(children, timeout=10)
    cut_at = checkpointed_rounds(out)
    meta = json.loads((out / "checkpoint" / "meta.json").read_text())
    assert meta["remote_parts"] == ["host0", "host1"] and 3 <= cut_at < 12
    assert (out / "checkpoint" / "host0.pkl").stat().st_size > 0  # written by the network from host0's messages

    refused = run_cli("resume", str(out), timeout=60)
    assert refused.returncode == 2 and "wrote their part from other machines" in refused.stderr, refused.stderr[-2000:]

    resumed = _emulator(m["a"], "resume", str(out), "--hosts", "remote:2", "--listen", f"tcp://{m['addr']}:{port}", "--plain")
    hosts = [join(1), join(2)]  # the run's keys are used again
    try:
        code, stdout, err = _finish(resumed)
        assert code == 0, err[-3000:]
        for h in hosts:
            h_code, _, h_err = _finish(h, 60)
            assert h_code == 0, h_err[-2000:]
    finally:
        for proc in (resumed, *hosts):
            if proc.poll() is None:
                proc.kill()
    for name in ("transfers", "clients", "devices"):
        assert read_csv(out / f"{name}.csv") == read_csv(tmp_path / "whole" / f"{name}.csv"), name
    assert without_wall(read_csv(out / "rounds.csv")) == without_wall(read_csv(tmp_path / "whole" / "rounds.csv"))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["resumed"][0]["from_round"] == cut_at


# ---- the Slurm recipe, on namespaces -------------------------------------------------------------
STANDIN = REPO / "tests" / "cluster_standin"


@pytest.fixture
def node_names(three_machines):
    """Names for the three machines that resolve inside each of them (`ip netns exec` mounts
    /etc/netns/NS/hosts over /etc/hosts), as a cluster's DNS would."""
    names = {f"node-{m}": ADDR_THREE[m] for m in ("a", "b", "c")}
    names["flemu-conductor"] = ADDR_THREE["a"]  # the Kubernetes recipe's Service
    made = []
    for m in ("a", "b", "c"):  # the cut-cable test may have left one down
        subprocess.run(["ip", "-n", NS_THREE[m], "link", "set", f"flemu-v{m}", "up"], check=True)
    try:
        for m in ("a", "b", "c"):
            folder = Path("/etc/netns") / NS_THREE[m]
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "hosts").write_text("127.0.0.1 localhost\n" + "".join(f"{a} {n}\n" for n, a in names.items()))
            made.append(folder)
        yield {f"node-{m}": NS_THREE[m] for m in ("a", "b", "c")}  # (ordered: node-a is the allocation's first)
    finally:
        for folder in made:
            shutil.rmtree(folder, ignore_errors=True)


def test_the_slurm_job_script_runs_on_three_nodes(tmp_path, node_names):
    """examples/slurm/flemu.sbatch, unchanged, as Slurm would run it on a 3-node allocation: the
    script on the first node, its srun steps through a stand-in srun that starts each task in its
    node's namespace with SLURM_PROCID set (tests/cluster_standin). The conductor comes up on
    node-a, one host on each of node-b and node-c with its own key, and the run completes."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')  # the job's `python`: this one's
    (bin_dir / "python").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{STANDIN}:{os.environ['PATH']}", "SLURM_JOB_NUM_NODES": "3",
           "SLURM_JOB_NODELIST": ",".join(node_names), "SLURM_CPUS_PER_TASK": "1", "FLEMU_KEYS": str(tmp_path / "keys"),
           "FLEMU_PORT": str(44400 + os.getpid() % 500),
           "FLEMU_STANDIN_NODES": ",".join(f"{n}={ns}" for n, ns in node_names.items())}
    out = tmp_path / "run"
    job = subprocess.run(["ip", "netns", "exec", node_names["node-a"], "bash", str(REPO / "examples" / "slurm" / "flemu.sbatch"),
                          "scenarios/smoke.yaml", "--set", "task.model=mlp", "--out", str(out), "--quiet"],
                         capture_output=True, text=True, timeout=300, cwd=REPO, env=env)
    assert job.returncode == 0, job.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["rounds_completed"] == 3
    joined = summary["placement"]["joined"]
    assert {slot: j["address"] for slot, j in joined.items()} == {"host0": ADDR_THREE["b"], "host1": ADDR_THREE["c"]}
    assert sorted(p.name for p in (tmp_path / "keys").iterdir()) == ["conductor.key", "host-1.key", "host-2.key"]


@needs_mnist
def test_the_kubernetes_manifest_runs_with_hosts_that_have_no_data(tmp_path, node_names):
    """examples/kubernetes/flemu.yaml, unchanged, through a stand-in kubelet (tests/cluster_standin/
    kube.py): the conductor's Pod on node-a with the keys Secret and the data volume mounted where
    the manifest says, the Indexed Job's two hosts on node-b and node-c with only the keys, joining
    the Service's name. The hosts have no data set: each gets its clients' rows from the lobby."""
    keys = tmp_path / "keys"
    assert run_cli("keys", str(keys), "--hosts", "2").returncode == 0
    workdir = tmp_path / "image"  # the image's working directory: the scenarios, and where runs/ goes
    workdir.mkdir()
    (workdir / "scenarios").symlink_to(REPO / "scenarios")
    env = {k: v for k, v in os.environ.items() if k != "EMULATOR_DATA"}  # the hosts' machines have no data
    env["PYTHONPATH"] = str(REPO)
    mount_points = [Path("/var/run/secrets/flemu"), Path("/var/lib/flemu/data")]
    before = [p.exists() for p in mount_points]
    job = subprocess.run([sys.executable, str(STANDIN / "kube.py"), str(REPO / "examples" / "kubernetes" / "flemu.yaml"),
                          "--pod-node", node_names["node-a"], "--job-nodes", f"{node_names['node-b']},{node_names['node-c']}",
                          "--volume", f"keys={keys}", "--volume", f"data={os.environ['EMULATOR_DATA']}"],
                         capture_output=True, text=True, timeout=300, cwd=workdir, env=env)
    assert job.returncode == 0, job.stderr[-3000:]
    assert job.stderr.count("got its clients' data from the lobby") == 2, job.stderr[-3000:]
    (run_dir,) = (workdir / "runs").iterdir()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["rounds_completed"] == 3
    joined = summary["placement"]["joined"]
    assert {slot: j["address"] for slot, j in joined.items()} == {"host0": ADDR_THREE["b"], "host1": ADDR_THREE["c"]}
    assert [p.exists() for p in mount_points] == before  # the stand-in removed the mount points it made
