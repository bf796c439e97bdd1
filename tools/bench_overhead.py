"""Emulation overhead: the same local-training work in a plain PyTorch loop and through the
emulator (real processes, real sockets), measured in the same run.

Work per round: C clients x S samples x 1 epoch of SGD on the MNIST CNN, then FedAvg.
Prints wall time per round for both and their ratio, startup time to round 1, and peak total
memory of all emulator processes.
Usage: python tools/bench_overhead.py [--clients 10] [--samples 50] [--rounds 8]"""
from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from node.client import TaskSpec, Trainer
from node.data import synthetic
from node.models import state_to_numpy
from node.strategy import WeightedAverage
from node.training import LocalTraining

SCENARIO = """
name: bench_overhead
seed: 0
rounds: {rounds}
task:
  dataset: synthetic
  model: mnist_cnn
  synthetic: {{samples: {total}, test_samples: 100, shape: [1, 28, 28], classes: 10}}
population:
  clients: {clients}
  devices: [{{ms_per_sample: 5}}]
  links: [{{up_mbps: 20, down_mbps: 50, latency_ms: 20}}]
selection: {{clients_per_round: {clients}}}
algorithm: {{local_epochs: 1, batch_size: 10, lr: 0.05}}
eval: {{every: 0}}
"""


def plain_loop(clients: int, samples: int, rounds: int) -> list[float]:
    torch.set_num_threads(max(1, torch.get_num_threads()))
    train, test = synthetic(clients * samples, 100, (1, 28, 28), 10, seed=0)
    trainer = Trainer(TaskSpec("mnist_cnn", train, test, 0))
    global_state = state_to_numpy(trainer.model)
    shards = np.array_split(np.arange(clients * samples), clients)
    times = []
    for r in range(rounds):
        t = time.perf_counter()
        avg = WeightedAverage()
        for i, shard in enumerate(shards):
            state, _ = trainer.train(global_state, shard, LocalTraining(1, 10, 0.05), np.random.default_rng([0, r, i]))
            avg.add(state, shard.size)
        global_state = avg.result(global_state)
        times.append(time.perf_counter() - t)
    return times


def emulator_run(clients: int, samples: int, rounds: int, *overrides: str) -> tuple[list[float], dict, float]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.yaml"
        path.write_text(SCENARIO.format(rounds=rounds, total=clients * samples, clients=clients))
        out = Path(tmp) / "run"
        sets = [arg for o in overrides for arg in ("--set", o)]
        launched = time.perf_counter()
        res = subprocess.run([sys.executable, "-m", "emulator", "run", str(path), "--out", str(out), *sets],
                             capture_output=True, text=True)
        command_s = time.perf_counter() - launched
        if res.returncode != 0:
            sys.exit(f"emulator run failed:\n{res.stderr[-3000:]}")
        with open(out / "rounds.csv") as f:
            walls = [float(r["wall_s"]) for r in csv.DictReader(f)]
        summary = json.loads((out / "summary.json").read_text())
    return [b - a for a, b in zip(walls, walls[1:])], summary, command_s


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--samples", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=8)
    args = ap.parse_args()
    plain = plain_loop(args.clients, args.samples, args.rounds)[1:]  # first round warms up
    one, _, _ = emulator_run(args.clients, args.samples, args.rounds, "population.hosts=1")
    emu, summary, command_s = emulator_run(args.clients, args.samples, args.rounds)
    p, o, e = (float(np.median(x)) for x in (plain, one, emu))
    print(f"work per round: {args.clients} clients x {args.samples} samples x 1 epoch, MNIST CNN, "
          f"{args.rounds} rounds (first dropped); {torch.get_num_threads()} torch threads in the plain loop")
    print(f"plain PyTorch loop              : {p * 1e3:8.1f} ms/round (median)")
    print(f"emulator, 1 host (same threads) : {o * 1e3:8.1f} ms/round  ratio {o / p:.3f}")
    print(f"emulator, default hosts         : {e * 1e3:8.1f} ms/round  ratio {e / p:.3f}")
    print(f"startup: conductor start to clock start {summary['startup_s']:.2f} s; command launch to exit "
          f"{command_s:.2f} s, of which the conductor's own run {summary['wall_time_s']:.2f} s "
          f"(the rest is interpreter start and imports)")
    print(f"peak total RSS {summary['peak_rss_mib']:.0f} MiB (sum over processes, shared pages counted "
          f"in each), peak total PSS {summary['peak_pss_mib']:.0f} MiB")


if __name__ == "__main__":
    main()
