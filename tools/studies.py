"""Shared by the study scripts: run scenarios one after another with overrides, then compare them."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run_scenario(scenario: str | Path, run_dir: Path, sets: list[str], flags: tuple[str, ...] = (),
                 **kwargs) -> subprocess.CompletedProcess:
    """`python -m emulator run SCENARIO --out RUN_DIR [FLAGS] --set ...` in this tree, text output;
    `kwargs` go to subprocess.run (what to capture)."""
    cmd = [sys.executable, "-m", "emulator", "run", str(scenario), "--out", str(run_dir), *flags]
    for s in sets:
        cmd += ["--set", s]
    return subprocess.run(cmd, cwd=REPO, text=True, **kwargs)


def run_and_compare(runs: list[tuple[str, Path, list[str]]], out: Path) -> int:
    """Each run is (label, scenario, --set overrides); its results go to out/label. Stops at the first failure."""
    dirs = []
    for label, scenario, sets in runs:
        run_dir = out / label
        print(f"== {label}: {' '.join(sets)}", flush=True)
        res = run_scenario(scenario, run_dir, sets, stdout=subprocess.PIPE)
        done = [line for line in res.stdout.splitlines() if line.startswith(("completed", "failed", "interrupted"))]
        print(done[-1] if done else "(no summary line)", flush=True)
        if res.returncode != 0:
            print(f"{label} failed with exit code {res.returncode}", file=sys.stderr)
            return res.returncode
        dirs.append(run_dir)
    return subprocess.run([sys.executable, "-m", "emulator", "compare", *map(str, dirs), "--out", str(out)],
                          cwd=REPO).returncode
