import csv
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"

if not os.environ.get("EMULATOR_DATA") and SHARED_DATA.is_dir():
    os.environ["EMULATOR_DATA"] = str(SHARED_DATA)
# No test fetches a data set from the internet: the mirrors point at a port nothing listens on
# (tests/test_download.py serves its own over local HTTP), so a missing one fails at once.
os.environ["EMULATOR_DATA_MIRRORS"] = "http://127.0.0.1:9/{dataset}/"


def have_mnist() -> bool:
    root = os.environ.get("EMULATOR_DATA")
    return bool(root) and (Path(root) / "MNIST" / "raw" / "train-images-idx3-ubyte").exists()


def have_fashion_mnist() -> bool:
    root = os.environ.get("EMULATOR_DATA")
    return bool(root) and (Path(root) / "FashionMNIST" / "raw" / "train-images-idx3-ubyte").exists()


needs_mnist = pytest.mark.skipif(not have_mnist(), reason="MNIST raw files not found (set EMULATOR_DATA)")
needs_fashion_mnist = pytest.mark.skipif(not have_fashion_mnist(), reason="Fashion-MNIST raw files not found (set EMULATOR_DATA)")


def run_cli(*args: str, timeout: float = 300, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """The CLI in a process of its own. A run still going after `timeout` seconds fails the test with
    what says why: every process of the run (state, CPU seconds, the stacks it dumps on SIGUSR1),
    the machine's load and the CPU time the hypervisor stole meanwhile, and what the run printed."""
    cmd = [sys.executable, "-m", "emulator", *args]
    steal_before = _stolen_s()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=cwd or REPO, env=os.environ.copy())
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        tree = _describe_and_kill(proc)
        try:
            out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            out, err = "(no output: a process of the run still holds its pipes)", ""
        pytest.fail(f"{' '.join(args)} still running after {timeout:g} s\n{tree}\n"
                    f"the machine: load {os.getloadavg()}, {_stolen_s() - steal_before:.1f} s stolen by the hypervisor "
                    f"since the run began\nstdout: {out[-3000:]}\nstderr (stacks on SIGUSR1): {err[-12000:]}",
                    pytrace=False)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _stolen_s() -> float:
    return float(getattr(psutil.cpu_times(), "steal", 0.0))


def _describe_and_kill(proc: subprocess.Popen) -> str:
    """Each process of the run with its state and CPU seconds, after asking each to dump its threads'
    stacks to the run's stderr (the CLI registers faulthandler for SIGUSR1); then all are killed."""
    try:
        conductor = psutil.Process(proc.pid)
        procs = [conductor] + conductor.children(recursive=True)
    except psutil.Error:
        procs = []
    lines = []
    for p in procs:
        try:
            cpu = p.cpu_times()
            lines.append(f"  {p.pid} {p.name()} {p.status()} user {cpu.user:.1f} s system {cpu.system:.1f} s "
                         f"threads {p.num_threads()}")
            p.send_signal(signal.SIGUSR1)
        except psutil.Error:
            pass
    time.sleep(2)
    for p in procs:
        try:
            p.kill()
        except psutil.Error:
            pass
    return "the run's processes:\n" + "\n".join(lines)


def write_scenario(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def read_csv(path) -> list[dict]:
    """Every row of a run's CSV file, as dicts of strings."""
    with open(path) as f:
        return list(csv.DictReader(f))


def link_bytes(wire: int) -> int:
    """Link bytes of a message under the default framing: 66 header bytes per 1448-byte segment."""
    return wire + math.ceil(wire / 1448) * 66


def start_run(path: Path, out: Path) -> subprocess.Popen:
    """A run in the background, for tests that interfere with it."""
    return subprocess.Popen([sys.executable, "-m", "emulator", "run", str(path), "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)


def rounds_done(out) -> int:
    try:
        return len(read_csv(out / "rounds.csv"))
    except FileNotFoundError:
        return 0


def wait_for_rounds(out, n, proc, timeout=90):
    deadline = time.monotonic() + timeout
    while rounds_done(out) < n:
        assert proc.poll() is None, proc.stderr.read()[-3000:]
        assert time.monotonic() < deadline, "run did not progress"
        time.sleep(0.1)


def children_by_name(pid):
    return {p.name(): p for p in psutil.Process(pid).children(recursive=True)}


def network_endpoint(conductor_pid: int, timeout: float = 30) -> str:
    """The ipc endpoint a run's network process listens on (read from its open sockets)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        net = children_by_name(conductor_pid).get("flemu-network")
        if net is not None:
            for conn in net.net_connections(kind="unix"):
                if conn.laddr and "flemu-" in conn.laddr:
                    return "ipc://" + conn.laddr
        time.sleep(0.1)
    raise AssertionError("no network process listening")


def greeted_network(cfg):
    """A Network object (no process, no socket) built from cfg, every peer of cfg.peers greeted,
    with nothing queued or reported yet: for tests that feed it frames and step it by hand."""
    import io  # noqa: PLC0415  (this module is imported by every test)

    import zmq  # noqa: PLC0415
    from emulator.network import Network  # noqa: PLC0415
    from protocol import envelope  # noqa: PLC0415

    net = Network(cfg)
    net.guard.log = io.StringIO()
    for peer, actors in cfg.peers.items():
        net.receive(peer.encode(), [zmq.Frame(envelope.pack("hello", peer=peer, actors=actors))])
    net.queue.clear()
    net._outbox.clear()
    return net
