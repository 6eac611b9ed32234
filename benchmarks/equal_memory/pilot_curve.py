"""Issue 33's pilot: the learning curve of a stock full-resolution run (arm (d)), to choose the schedule every arm of
the accuracy-at-equal-memory study trains on (the first epoch count at which (d) reaches mAP50 >= 0.5 on val)::

    yolo train model=yolo11n.yaml data=<copy of ../shared/datasets/deeppcb>/data.yaml imgsz=640 epochs=80 batch=8 \\
        workers=0 seed=0 deterministic=True plots=False project=<dir> name=<run>      # OMP_NUM_THREADS=1, in the background
    python -m benchmarks.equal_memory.pilot_curve run=<dir>/<run> [threads=1] out=benchmarks/results/accuracy-pilot-deeppcb

Reads the run's ``results.csv`` (Ultralytics writes a row per finished epoch, so a run still going is read as far as it
got) and ``args.yaml``, and publishes the curve: epoch, wall seconds, mAP50, mAP50-95, with the epoch mAP50 first
reached 0.5 (or that it has not yet).
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import yaml

from yolo_ckpt.bench.results_io import provenance, publish
from yolo_ckpt.cli.args import parse_keys
from yolo_ckpt.cli.main import run_command

TARGET = 0.5  # mAP50 on val that arm (d) must reach (issue 33)


def curve(run: Path) -> list[dict]:
    """The run's rows: epoch, training seconds so far, mAP50 and mAP50-95 on val (Ultralytics' ``results.csv``). Its
    ``time`` restarts from 0 when the run is resumed; the seconds here add up each resumed stretch."""
    with open(run / "results.csv") as f:
        rows = [{k.strip(): v.strip() for k, v in row.items()} for row in csv.DictReader(f)]
    out, before, last = [], 0.0, 0.0
    for r in rows:
        t = float(r["time"])
        if t < last:  # resumed: the clock restarted
            before += last
        last = t
        out.append({"epoch": int(float(r["epoch"])), "seconds": before + t, "mAP50": float(r["metrics/mAP50(B)"]),
                    "mAP50-95": float(r["metrics/mAP50-95(B)"])})
    return out


def model_of(run: Path, model: str) -> str:
    """The model the run was built from: ``args.yaml``'s, or after a resume (which writes the checkpoint there) the
    YAML its checkpoint's model was built from."""
    if not str(model).endswith(".pt"):
        return model
    import torch

    ckpt = torch.load(run / "weights" / "last.pt", map_location="cpu", weights_only=False)
    net = ckpt.get("model") or ckpt.get("ema")  # Ultralytics saves the EMA and leaves "model" empty
    return Path(net.yaml.get("yaml_file", model)).name


KEYS = ("run", "threads", "out")  # the key=value words main takes


def main(argv: list[str]) -> dict:
    opts = parse_keys(argv, KEYS, "benchmarks.equal_memory.pilot_curve", required=("run",))
    run = Path(opts["run"])
    args = yaml.safe_load((run / "args.yaml").read_text())
    args["model"] = model_of(run, args.get("model"))
    rows = curve(run)
    reached = next((r["epoch"] for r in rows if r["mAP50"] >= TARGET), None)
    keys = ("model", "data", "imgsz", "epochs", "batch", "optimizer", "seed", "workers", "deterministic")
    record = provenance(["python -m benchmarks.equal_memory.pilot_curve", *argv], seeds=[args.get("seed")])
    run_args = {k: args.get(k) for k in keys}
    if run_args["data"]:  # the data.yaml against its datasets root (<name>/data.yaml), not the reading machine's path
        run_args["data"] = Path(*Path(str(run_args["data"])).parts[-2:]).as_posix()
    result = {**record, "run_args": run_args,
              "rows": rows, "reached_epoch": reached}
    result["machine"]["torch_threads"] = int(opts.get("threads", 1))  # the run's (OMP_NUM_THREADS=1), not this reader's
    best = max(rows, key=lambda r: r["mAP50"]) if rows else None
    lines = [
        f"Pilot of issue 33's arm (d): stock Ultralytics at full resolution, trained from scratch (no weights can be had),"
        f" {', '.join(f'{k}={args.get(k)}' for k in keys if k not in ('data', 'workers', 'deterministic'))}, dataset"
        f" {Path(str(args.get('data'))).parent.name}; {len(rows)} of {args.get('epochs')} epochs finished when read"
        f" ({rows[-1]['seconds'] / 3600:.1f} h of training on a shared 2-core machine, the run at nice 19 beside other work,"
        " resumed across sessions)."
        if rows else "No epoch finished yet.",
        "",
        (f"**mAP50 first reached {TARGET} at epoch {reached}.**" if reached else
         f"**mAP50 has not reached {TARGET} yet: best {best['mAP50']:.3f} at epoch {best['epoch']}.**" if best else ""),
        "",
        "| epoch | hours | mAP50 | mAP50-95 |",
        "|---|---|---|---|",
        *(f"| {r['epoch']} | {r['seconds'] / 3600:.2f} | {r['mAP50']:.3f} | {r['mAP50-95']:.3f} |" for r in rows),
    ]
    publish(result, lines, opts.get("out"))
    return result


if __name__ == "__main__":
    sys.exit(run_command(main, sys.argv[1:], "benchmarks.equal_memory.pilot_curve"))
