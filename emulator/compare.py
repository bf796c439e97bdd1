"""Compare finished runs side by side, like Table 6 of the core paper, extended with emulated
time: best accuracy, payload GiB, saving against the fp32 run, total emulated time and the
emulated time to a target accuracy."""
from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import yaml

GIB = 2**30
COLUMNS = ["run", "mode", "rounds", "best_accuracy", "final_accuracy", "payload_gib", "saving_vs_fp32",
           "emulated_time_s", "time_to_target_s", "target", "wire_gib", "wall_time_s"]


class CompareError(ValueError):
    """A run directory cannot be compared; the message names it and what is missing."""


def algorithm_of(scenario: dict) -> str:
    alg = scenario.get("algorithm", {})
    name = alg.get("name", "fedavg")
    if name == "fibfl":
        return alg.get("firma", {}).get("variant", "fibfl++")
    return "fedprox" if name == "fedavg" and alg.get("prox_mu") else name


def mode_of(scenario: dict, with_algorithm: bool = False) -> str:
    """The run's label: its codecs or bit schedule, prefixed by the algorithm when it is not
    plain FedAvg or when runs of several algorithms are compared."""
    algorithm = algorithm_of(scenario)
    codecs = _codec_mode(scenario.get("algorithm", {}))
    if algorithm == "fedavg" and not with_algorithm:
        return codecs
    return algorithm if codecs == "fp32" else f"{algorithm} {codecs}"


def _codec_mode(alg: dict) -> str:
    schedule = alg.get("quantization", {}).get("schedule", "static")
    if schedule != "static":
        return schedule
    down, up = alg.get("codec", {}).get("down", {}), alg.get("codec", {}).get("up", {})

    def label(spec: dict) -> str:
        return f"int{spec.get('bits', 8)}" if spec.get("name") == "int" else str(spec.get("name"))

    return label(down) if label(down) == label(up) else f"{label(down)}/{label(up)}"


def load_run(run_dir: Path) -> dict[str, Any]:
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
        scenario = yaml.safe_load((run_dir / "scenario.yaml").read_text())
        with open(run_dir / "rounds.csv") as f:
            rounds = list(csv.DictReader(f))
    except FileNotFoundError as exc:
        raise CompareError(f"{run_dir}: not a run directory ({Path(exc.filename).name} is missing)") from None
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise CompareError(f"{run_dir}: unreadable run files ({exc})") from None
    return {"dir": run_dir, "summary": summary, "scenario": scenario, "rounds": rounds}


def time_to(rounds: list[dict], target: float | None) -> float | None:
    if target is None:
        return None
    for row in rounds:
        if row.get("accuracy") not in (None, "") and float(row["accuracy"]) >= target:
            return float(row["t_end"])
    return None


def compare(run_dirs: list[Path], target: float | None = None) -> list[dict[str, Any]]:
    runs = [load_run(Path(d)) for d in run_dirs]
    payload = {id(r): sum(r["summary"].get(f"payload_bytes_{d}", 0) for d in ("up", "down", "peer", "cloud")) for r in runs}
    mixed = len({algorithm_of(r["scenario"]) for r in runs}) > 1
    # Saving against an fp32 run only among runs of one algorithm; across algorithms, each run's
    # saving is against fp32 of its own tensors.
    baseline = None if mixed else next((r for r in runs if mode_of(r["scenario"]) == "fp32"), None)
    rows = []
    for r in runs:
        s = r["summary"]
        goal = target if target is not None else s.get("target_accuracy")
        if baseline is not None and payload[id(baseline)]:
            saving = 1 - payload[id(r)] / payload[id(baseline)]
        else:
            saving = s.get("saving_vs_fp32")  # against fp32 of the same tensors
        rows.append({
            "run": r["dir"].name, "mode": mode_of(r["scenario"], with_algorithm=mixed), "rounds": s.get("rounds_completed"),
            "best_accuracy": s.get("best_accuracy"), "final_accuracy": s.get("final_accuracy"),
            "payload_gib": payload[id(r)] / GIB, "saving_vs_fp32": saving,
            "emulated_time_s": s.get("emulated_time_s"), "time_to_target_s": time_to(r["rounds"], goal),
            "target": goal, "wire_gib": sum(s.get(f"wire_bytes_{d}", 0) for d in ("up", "down", "peer", "cloud")) / GIB,
            "wall_time_s": s.get("wall_time_s"),
        })
    return rows


def _fmt(key: str, value: Any) -> str:
    if value is None:
        return "-"
    if key in ("best_accuracy", "final_accuracy", "target"):
        return f"{100 * value:.2f}"
    if key == "saving_vs_fp32":
        return f"{100 * value:.2f} %"
    if key.endswith("_gib"):
        return f"{value:.4f}"
    if key.endswith("_s"):
        return f"{value:.1f}"
    return str(value)


HEADERS = {"best_accuracy": "best acc %", "final_accuracy": "final acc %", "payload_gib": "payload GiB",
           "saving_vs_fp32": "saving vs fp32", "emulated_time_s": "emulated s", "time_to_target_s": "time to target s",
           "target": "target %", "wire_gib": "wire GiB", "wall_time_s": "wall s"}


def markdown(rows: list[dict[str, Any]]) -> str:
    head = [HEADERS.get(c, c) for c in COLUMNS]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(_fmt(c, r[c]) for c in COLUMNS) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def write(rows: list[dict[str, Any]], out_dir: Path) -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    csv_path, md_path = out_dir / "compare.csv", out_dir / "compare.md"
    with open(csv_path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(rows)
    md_path.write_text(markdown(rows))
    return csv_path, md_path
