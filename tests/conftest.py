import csv
import math
import os
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


def have_mnist() -> bool:
    root = os.environ.get("EMULATOR_DATA")
    return bool(root) and (Path(root) / "MNIST" / "raw" / "train-images-idx3-ubyte").exists()


def have_fashion_mnist() -> bool:
    root = os.environ.get("EMULATOR_DATA")
    return bool(root) and (Path(root) / "FashionMNIST" / "raw" / "train-images-idx3-ubyte").exists()


needs_mnist = pytest.mark.skipif(not have_mnist(), reason="MNIST raw files not found (set EMULATOR_DATA)")
needs_fashion_mnist = pytest.mark.skipif(not have_fashion_mnist(), reason="Fashion-MNIST raw files not found (set EMULATOR_DATA)")


def run_cli(*args: str, timeout: float = 300, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "emulator", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd or REPO, env=os.environ.copy())


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
