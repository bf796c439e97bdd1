import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"

if not os.environ.get("EMULATOR_DATA") and SHARED_DATA.is_dir():
    os.environ["EMULATOR_DATA"] = str(SHARED_DATA)


def have_mnist() -> bool:
    root = os.environ.get("EMULATOR_DATA")
    return bool(root) and (Path(root) / "MNIST" / "raw" / "train-images-idx3-ubyte").exists()


needs_mnist = pytest.mark.skipif(not have_mnist(), reason="MNIST raw files not found (set EMULATOR_DATA)")


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
