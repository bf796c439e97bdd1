"""Shared by the study scripts: run scenarios one after another with overrides, then compare them."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run_and_compare(runs: list[tuple[str, Path, list[str]]], out: Path) -> int:
    """Each run is (label, scenario, --set overrides); its results go to out/label. Stops at the first failure."""
    dirs = []
    for label, scenario, sets in runs:
        run_dir = out / label
        cmd = [sys.executable, "-m", "emulator", "run", str(scenario), "--out", str(run_dir)]
        for s in sets:
            cmd += ["--set", s]
        print(f"== {label}: {' '.join(sets)}", flush=True)
        res = subprocess.run(cmd, cwd=REPO, stdout=subprocess.PIPE, text=True)
        done = [line for line in res.stdout.splitlines() if line.startswith(("completed", "failed", "interrupted"))]
        print(done[-1] if done else "(no summary line)", flush=True)
        if res.returncode != 0:
            print(f"{label} failed with exit code {res.returncode}", file=sys.stderr)
            return res.returncode
        dirs.append(run_dir)
    return subprocess.run([sys.executable, "-m", "emulator", "compare", *map(str, dirs), "--out", str(out)],
                          cwd=REPO).returncode
