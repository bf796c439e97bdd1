"""Training speed: wall seconds per round of the same local-training work done
(a) by plain PyTorch, clients one after another in one process,
(b) by the emulator with cohort training off, and
(c) by the emulator with cohort training on (node/cohort.py),
all measured in this run (on the flower workload (a) runs before (b) and again after (c), and its
rounds of both passes count, so a machine that slows down during the benchmark slows the
baseline too), with the ratios (b)/(a) and (c)/(a); and samples per second of each
against the same model trained as one large batch in one process (the hardware's practical
ceiling for this model: no per-client weights, no per-client steps).

Workloads:
  flower    Flower's benchmark: 100 clients, 10 per round, 50 samples each, batch 10, 1 epoch,
            SGD 0.01, the 1.66M-parameter MNIST CNN (synthetic 28x28 inputs: same cost as MNIST);
            --model mlp runs it with the small MLP instead.
  edge_1000 scenarios/edge_1000.yaml for a few rounds (MNIST needed; set EMULATOR_DATA), against
            a plain loop over as many clients per round as the emulator trained, each with its
            capped session (64 samples), 2 epochs, batch 10, the core paper's clipping and
            Lipschitz estimate.

Usage: python tools/bench_training.py [--workload flower|edge_1000|all] [--rounds 8] [--cohort 32] [--model mnist_cnn]
                                      [--device auto|cpu|cuda] [--repeats 1] [--json]
--json prints one JSON object per workload with keys plain_s, off_s, cohort_s, ratio_off,
ratio_cohort, device (and the rest of the figures).
--repeats N measures each workload N times over (each time (a), (b), (c) and (a) again): the
figures are then the run with the median ratio_off, and ratios_off / ratios_cohort list every
run's. A 2-core VM whose speed drifts moved one run's (b)/(a) between 0.96 and 1.22 in one
evening; the median of several says more than any one of them."""
from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from node.client import TaskSpec, Trainer  # noqa: E402
from node.layers import torch_layers  # noqa: E402
from node.data import synthetic  # noqa: E402
from node.models import state_to_numpy  # noqa: E402
from node.strategy import WeightedAverage  # noqa: E402
from node.training import LocalTraining, device_of  # noqa: E402

FLOWER = """
name: bench_training_flower
seed: 0
rounds: {rounds}
task:
  dataset: synthetic
  model: {model}
  synthetic: {{samples: 5000, test_samples: 100, shape: [1, 28, 28], classes: 10}}
  device: {device}
population:
  clients: 100
  devices: [{{ms_per_sample: 5}}]
  links: [{{up_mbps: 20, down_mbps: 50, latency_ms: 20}}]
selection: {{clients_per_round: 10}}
algorithm: {{local_epochs: 1, batch_size: 10, lr: 0.01}}
eval: {{every: 0}}
"""


def torch_device(spec: str) -> str:
    if spec == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return spec


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def plain_rounds(task: TaskSpec, sessions: list[list[np.ndarray]], local: LocalTraining) -> list[float]:
    """Seconds per round of one-by-one training over each round's client sessions, then FedAvg,
    with the model's layers as plain PyTorch runs them (not node/layers.py's compiled paths)."""
    with torch_layers():
        return _plain_rounds(task, sessions, local)


def _plain_rounds(task: TaskSpec, sessions: list[list[np.ndarray]], local: LocalTraining) -> list[float]:
    trainer = Trainer(task, "off")
    device = str(device_of(trainer.model))
    global_state = state_to_numpy(trainer.model)
    times = []
    for r, clients in enumerate(sessions):
        sync(device)
        start = time.perf_counter()
        average = WeightedAverage()
        for i, indices in enumerate(clients):
            state, _ = trainer.train(global_state, indices, local, np.random.default_rng([0, r, i]))
            average.add(state, indices.size)
        global_state = average.result(global_state)
        sync(device)
        times.append(time.perf_counter() - start)
    return times


def bracketed(plain: Callable[[], list[float]], emulated: Callable[[], tuple]) -> tuple[list[float], tuple]:
    """The plain loop's round times measured before and after the emulator's runs, so that a
    machine whose speed drifts during the benchmark moves the baseline too (the first round of
    each pass warms up: figures() drops the first, the second pass's is dropped here), and the
    emulator's results."""
    before = plain()
    results = emulated()
    return before + plain()[1:], results


def ceiling(task: TaskSpec, batch: int, steps: int = 12) -> float:
    """Samples per second of plain SGD on one model with one large batch."""
    model = task.build()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = task.train.batch(torch.arange(batch) % task.train.y.numel())
    loss_fn = torch.nn.CrossEntropyLoss()
    device = str(device_of(model))
    for i in range(steps + 2):
        if i == 2:
            sync(device)
            start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        opt.step()
    sync(device)
    return batch * steps / (time.perf_counter() - start)


def emulator_rounds(path: Path, out: Path, *overrides: str) -> tuple[list[float], list[dict], dict]:
    sets = [arg for o in overrides for arg in ("--set", o)]
    res = subprocess.run([sys.executable, "-m", "emulator", "run", str(path), "--out", str(out), "--quiet", *sets],
                         capture_output=True, text=True, cwd=REPO)
    if res.returncode != 0:
        sys.exit(f"emulator run {path} {' '.join(overrides)} failed:\n{res.stderr[-3000:]}")
    with open(out / "rounds.csv") as f:
        rows = list(csv.DictReader(f))
    walls = [float(r["wall_s"]) for r in rows]
    summary = json.loads((out / "summary.json").read_text())
    return [b - a for a, b in zip(walls, walls[1:])], rows, summary


def flower_workload(args, tmp: Path) -> dict:
    rounds = args.rounds
    path = tmp / "flower.yaml"
    path.write_text(FLOWER.format(rounds=rounds, device=args.device, model=args.model))
    train, test = synthetic(5000, 100, (1, 28, 28), 10, seed=0)
    task = TaskSpec(args.model, train, test, 0).on(torch_device(args.device))
    shards = np.array_split(np.arange(5000), 100)
    rng = np.random.default_rng(0)
    sessions = [[shards[i] for i in rng.choice(100, 10, replace=False)] for _ in range(rounds)]
    plain, ((off, _, off_summary), (on, _, on_summary)) = bracketed(
        lambda: plain_rounds(task, sessions, LocalTraining(1, 10, 0.01)),
        lambda: (emulator_rounds(path, tmp / "off", "algorithm.cohort=off"),
                 emulator_rounds(path, tmp / "on", f"algorithm.cohort={args.cohort}")))
    return figures("flower" if args.model == "mnist_cnn" else f"flower_{args.model}", plain, off, on, 10 * 50, task, 100, off_summary, on_summary)


def edge_workload(args, tmp: Path) -> dict:
    from emulator.scenario import load_scenario
    from emulator.world import build_world
    from node.stages import LocalDP

    path = REPO / "scenarios" / "edge_1000.yaml"
    rounds = max(3, min(args.rounds, 5))
    base = (f"rounds={rounds}", "eval.every=0", f"task.device={args.device}")
    sc, _ = load_scenario(path, list(base))
    world = build_world(sc)
    task = world.task.on(torch_device(args.device))
    alg = sc.algorithm
    off, off_rows, off_summary = emulator_rounds(path, tmp / "edge_off", *base, "algorithm.cohort=off")
    on, _, on_summary = emulator_rounds(path, tmp / "edge_on", *base, f"algorithm.cohort={args.cohort}")
    trained = int(round(np.mean([int(r["selected"]) for r in off_rows[1:]])))  # what the emulator trained per round
    cap = alg.max_samples_per_round
    rng = np.random.default_rng(0)
    profiles = [c.profile for c in world.clients]
    sessions = []
    for _ in range(rounds):
        picked = rng.choice(len(profiles), trained, replace=False)
        sessions.append([np.sort(rng.choice(profiles[i].indices, min(cap, profiles[i].indices.size), replace=False))
                         for i in picked])
    local = LocalDP(world.client.privacy).training(LocalTraining(alg.local_epochs, alg.batch_size, alg.lr))
    # the sessions need the emulator's count of trained clients, so both plain passes follow it here
    plain = plain_rounds(task, sessions, local) + plain_rounds(task, sessions, local)[1:]
    samples = int(np.mean([sum(s.size for s in clients) for clients in sessions])) * alg.local_epochs
    return figures("edge_1000", plain, off, on, samples, task, trained * alg.batch_size, off_summary, on_summary)


def figures(name: str, plain: list[float], off: list[float], on: list[float], samples: int, task: TaskSpec,
            batch: int, off_summary: dict, on_summary: dict) -> dict:
    p, o, c = (float(np.median(x[1:] if len(x) > 2 else x)) for x in (plain, off, on))  # the first round warms up
    device = str(task.device)
    if device.startswith("cuda"):
        device = f"{device} ({torch.cuda.get_device_name(torch.device(device))})"
    ceiling_sps = ceiling(task, batch)
    cohorts = on_summary.get("cohorts", {})
    return {
        "workload": name, "device": device, "plain_s": round(p, 4), "off_s": round(o, 4), "cohort_s": round(c, 4),
        "ratio_off": round(o / p, 3), "ratio_cohort": round(c / p, 3),
        "samples_per_round": samples, "plain_sps": round(samples / p), "off_sps": round(samples / o),
        "cohort_sps": round(samples / c), "ceiling_sps": round(ceiling_sps), "ceiling_batch": batch,
        "cohort_largest": max((v["largest"] for v in cohorts.values()), default=1),
        "cohort_mean": round(sum(v["clients"] for v in cohorts.values()) / max(1, sum(v["groups"] for v in cohorts.values())), 1),
        "hosts": len(on_summary.get("training_devices", {})),
        "pss_gib_off": round(off_summary.get("peak_pss_mib", 0) / 1024, 3),
        "pss_gib_cohort": round(on_summary.get("peak_pss_mib", 0) / 1024, 3),
        "torch_threads": torch.get_num_threads(),
    }


def median_run(runs: list[dict]) -> dict:
    """The run whose ratio_off is the median (the lower middle one of an even count), with every
    run's ratios beside it."""
    if len(runs) == 1:
        return runs[0]
    chosen = sorted(runs, key=lambda f: f["ratio_off"])[(len(runs) - 1) // 2]
    return {**chosen, "repeats": len(runs), "ratios_off": [f["ratio_off"] for f in runs],
            "ratios_cohort": [f["ratio_cohort"] for f in runs]}


def show(f: dict) -> None:
    print(f"{f['workload']} on {f['device']}: {f['samples_per_round']} samples per round, {f['hosts']} host(s), "
          f"{f['torch_threads']} torch threads in the plain loop")
    print(f"  (a) plain PyTorch, one by one : {f['plain_s'] * 1e3:8.1f} ms/round  {f['plain_sps']:7d} samples/s")
    print(f"  (b) emulator, cohort off      : {f['off_s'] * 1e3:8.1f} ms/round  {f['off_sps']:7d} samples/s  "
          f"(b)/(a) {f['ratio_off']:.3f}  peak PSS {f['pss_gib_off']:.2f} GiB")
    print(f"  (c) emulator, cohort on       : {f['cohort_s'] * 1e3:8.1f} ms/round  {f['cohort_sps']:7d} samples/s  "
          f"(c)/(a) {f['ratio_cohort']:.3f}  peak PSS {f['pss_gib_cohort']:.2f} GiB  "
          f"(cohorts: largest {f['cohort_largest']}, mean {f['cohort_mean']})")
    print(f"  ceiling: one model, batch {f['ceiling_batch']}   : {f['ceiling_sps']:7d} samples/s")
    if "repeats" in f:
        print(f"  the median of {f['repeats']} runs by (b)/(a); every run's (b)/(a): {f['ratios_off']}, (c)/(a): {f['ratios_cohort']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", choices=["flower", "edge_1000", "all"], default="flower")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--cohort", type=int, default=32, help="algorithm.cohort for (c)")
    ap.add_argument("--device", default="auto", help="task.device for all three (auto | cpu | cuda | cuda:N)")
    ap.add_argument("--model", default="mnist_cnn", help="the flower workload's model (mnist_cnn, or mlp: dense layers)")
    ap.add_argument("--repeats", type=int, default=1, help="measure each workload this many times; report the median run")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.repeats < 1:
        ap.error(f"--repeats must be at least 1, got {args.repeats}")
    chosen = ["flower", "edge_1000"] if args.workload == "all" else [args.workload]
    with tempfile.TemporaryDirectory() as tmp:
        for name in chosen:
            runs = [(flower_workload if name == "flower" else edge_workload)(args, Path(tmp)) for _ in range(args.repeats)]
            f = median_run(runs)
            if args.json:
                print(json.dumps(f), flush=True)
            else:
                show(f)


if __name__ == "__main__":
    main()
