"""Soak test: a long communication-only run with faults on, watching every process's memory.

Runs `python -m emulator run` on a generated scenario (20 clients on 2 hosts, Markov
availability, a truncate fault on one client for the whole run, a link_down window every 5
rounds on a rotating client, a round deadline) and samples the RSS of the conductor and of every
child process every 100 rounds. Growth after warm-up is (RSS at the end - RSS after the warm-up)
/ RSS after the warm-up, per process; the target is under 5 %.

Usage: python tools/soak.py [--rounds 3000] [--warmup 500] [--every 100] [--json]"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]

SCENARIO = """
name: soak
seed: 1
rounds: {rounds}
task:
  dataset: synthetic
  model: mlp
  synthetic: {{samples: 2000, test_samples: 50}}
population:
  clients: 20
  hosts: 2
  devices: [{{ms_per_sample: 1}}]
  links: [{{up_mbps: 20, down_mbps: 50, latency_ms: 20, loss: 0.001}}]
  availability: {{kind: markov, mean_on_s: 60, mean_off_s: 20}}
selection: {{clients_per_round: 8}}
round: {{timeout_s: 5}}
algorithm: {{train: false, local_epochs: 1, batch_size: 50}}
eval: {{every: 0}}
network: {{transport: tcp}}
faults:
{faults}
"""


def scenario(rounds: int, round_s: float) -> str:
    """The whole run's faults: truncation on c0001 throughout, and a 3 s link_down every 5
    rounds' worth of emulated time on a client chosen in turn."""
    faults = ["  - {kind: truncate, actor: c0001}"]
    span = rounds * round_s
    for i, at in enumerate(range(5, int(span), max(1, int(5 * round_s)))):
        faults.append(f"  - {{kind: link_down, actor: c{2 + i % 18:04d}, at_s: {at}, duration_s: 3}}")
    return SCENARIO.format(rounds=rounds, faults="\n".join(faults))


def processes(pid: int) -> dict[str, psutil.Process]:
    root = psutil.Process(pid)
    found = {"conductor": root}
    for child in root.children(recursive=True):
        try:
            found[child.name().removeprefix("flemu-")] = child
        except psutil.Error:
            pass
    return found


def rss_mib(procs: dict[str, psutil.Process]) -> dict[str, float]:
    out = {}
    for name, proc in procs.items():
        try:
            out[name] = proc.memory_info().rss / 2**20
        except psutil.Error:
            pass
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3000)
    ap.add_argument("--warmup", type=int, default=500, help="rounds before the reference sample")
    ap.add_argument("--every", type=int, default=100, help="sample every this many rounds")
    ap.add_argument("--round-s", type=float, default=4.6, help="expected emulated seconds per round (spaces the faults)")
    ap.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    args = ap.parse_args()
    log = sys.stderr if args.json else sys.stdout
    with tempfile.TemporaryDirectory(prefix="flemu-soak-") as tmp:
        path = Path(tmp) / "soak.yaml"
        path.write_text(scenario(args.rounds, args.round_s))
        err_path = Path(tmp) / "stderr.log"  # a file, not a pipe: nobody reads stderr until the end
        with open(err_path, "w") as err:
            proc = subprocess.Popen([sys.executable, "-m", "emulator", "run", str(path), "--out", str(Path(tmp) / "run"),
                                     "--json-progress"], stdout=subprocess.PIPE, stderr=err, text=True, cwd=REPO)
        samples: dict[int, dict[str, float]] = {}
        t0 = time.monotonic()
        summary: dict = {}
        procs: dict[str, psutil.Process] = {}
        for line in proc.stdout:
            record = json.loads(line)
            if record["type"] == "summary":
                summary = record
                continue
            if record["type"] != "round" or (record["round"] + 1) % args.every:
                continue
            procs = procs or processes(proc.pid)
            done = record["round"] + 1
            samples[done] = rss_mib(procs)
            print(f"round {done:5d}  wall {time.monotonic() - t0:7.1f} s  emulated {record['t_end']:9.1f} s  " +
                  "  ".join(f"{k} {v:6.1f} MiB" for k, v in samples[done].items()), file=log, flush=True)
        proc.wait()
        stderr = err_path.read_text()
        run_summary = json.loads((Path(tmp) / "run" / "summary.json").read_text())
    if proc.returncode != 0:
        print(stderr[-3000:], file=sys.stderr)
    reference = min((r for r in samples if r >= args.warmup), default=None)
    last = max(samples, default=None)
    growth = {}
    if reference is not None and last is not None and last > reference:
        growth = {name: (samples[last][name] - samples[reference][name]) / samples[reference][name]
                  for name in samples[reference] if name in samples[last]}
    figures = {
        "rounds": run_summary.get("rounds_completed"), "status": summary.get("status"),
        "wall_s": time.monotonic() - t0, "emulated_s": run_summary.get("emulated_time_s"),
        "client_outcomes": run_summary.get("client_outcomes"), "incidents": len(run_summary.get("incidents", [])),
        "warmup_rounds": reference, "rss_mib_by_round": samples, "growth_after_warmup": growth,
        "max_growth_after_warmup": max(growth.values(), default=None),
    }
    if args.json:
        print(json.dumps(figures, indent=1))
    else:
        print(f"status {figures['status']}, {figures['rounds']} rounds, wall {figures['wall_s']:.0f} s, "
              f"emulated {figures['emulated_s']:.0f} s, outcomes {figures['client_outcomes']}")
        for name, g in sorted(growth.items()):
            print(f"{name:10s} growth after round {reference}: {100 * g:+.2f} %")
        if growth:
            print(f"max growth after warm-up: {100 * figures['max_growth_after_warmup']:+.2f} % (target < 5 %)")
    sys.exit(0 if proc.returncode == 0 else 1)


if __name__ == "__main__":
    main()
