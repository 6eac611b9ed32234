"""Measured peak of one training step with and without the attention region (:mod:`yolo_ckpt.checkpointing.attention`):
``recompute=none`` and ``recompute=all`` with and without ``attention``, on the CPU in float32, counted by the live
tensor tracker (:func:`yolo_ckpt.memory.step.profile_step`), on a grid of boxes (:func:`training_batch`), with the
chunk passes counted that prove the region ran.

    python -m benchmarks.high_resolution.attention_peaks model=yolo11n.yaml imgsz=3072 [batch=1] [attn_chunk=256] [policies=...] \\
        [out=folder]

Writes one row per policy (``policies=``: some of ``none``, ``all without attention``, ``all``, joined by commas;
default all three): peak MiB, its ratio to ``none``, step seconds, chunk passes. With ``out=`` (a folder,
``benchmarks/results/attention-peaks``), the rows go to ``<model>-<imgsz>-b<batch>.csv`` there (its rows of other
policies kept), ``result.md`` tables every CSV of the folder and ``record.json`` ties this run to its commit, the
earlier runs into the folder kept under ``earlier_runs`` (:func:`yolo_ckpt.bench.results_io.with_earlier_runs`).
"""

from __future__ import annotations

import csv
import sys
import time
from pathlib import Path

import torch

from yolo_ckpt.bench.results_io import provenance, publish, with_earlier_runs
from yolo_ckpt.checkpointing.chunks import DEFAULT_ATTN_CHUNK, check_attn_chunk
from yolo_ckpt.cli.args import listed, parse_keys
from yolo_ckpt.cli.main import run_command

KEYS = ("model", "imgsz", "batch", "attn_chunk", "policies", "out")  # the key=value words main takes
POLICIES = ("none", "all without attention", "all")


def main(argv: list[str]) -> dict:
    opts = parse_keys(argv, KEYS, "benchmarks.high_resolution.attention_peaks")
    model, imgsz, batch = str(opts.get("model", "yolo11n.yaml")), int(opts.get("imgsz", 3072)), int(opts.get("batch", 1))
    attn_chunk, out = check_attn_chunk(opts.get("attn_chunk", DEFAULT_ATTN_CHUNK)), opts.get("out")
    chosen = listed(opts["policies"]) if "policies" in opts else list(POLICIES)
    if unknown := [p for p in chosen if p not in POLICIES]:
        raise SyntaxError(f"policies={opts['policies']}: {unknown} unknown; valid: {', '.join(POLICIES)}, joined by commas")

    from ultralytics import YOLO
    from ultralytics.utils import DEFAULT_CFG

    from yolo_ckpt import count_recomputations
    from yolo_ckpt.checkpointing.policy import ModelLayout, resolve
    from yolo_ckpt.memory import profile_step, training_batch

    torch.manual_seed(0)
    net = YOLO(model).model
    net.args = DEFAULT_CFG
    data = training_batch(net, batch, imgsz, 20)
    policy = resolve("all", ModelLayout.from_model(net))
    without = ",".join([*map(str, policy.indices), *(r for r in policy.regions() if r != "attention")])
    specs = {"none": "none", "all without attention": without, "all": "all"}
    path = Path(out) / f"{Path(model).stem}-{imgsz}-b{batch}.csv" if out else None
    kept = {r["policy"]: r for r in csv.DictReader(open(path))} if path and path.exists() else {}
    rows = [kept[name] for name in specs if name in kept and name not in chosen]
    for name in chosen:
        with count_recomputations() as counter:
            t = time.perf_counter()
            step = profile_step(net, data, specs[name], flops=False, attn_chunk=attn_chunk)
            seconds = time.perf_counter() - t
        rows.append({"model": model, "imgsz": imgsz, "batch": batch, "policy": name, "peak_MiB": round(step.peak_bytes / 2**20, 1),
                     "step_seconds": round(seconds, 1), "attention_chunk_passes": counter.attention_chunks, "attn_chunk": attn_chunk})
        print(rows[-1], flush=True)
    rows.sort(key=lambda r: list(specs).index(r["policy"]))
    none = next((float(r["peak_MiB"]) for r in rows if r["policy"] == "none"), None)
    for r in rows:
        r["ratio_to_none"] = round(float(r["peak_MiB"]) / none, 3) if none else ""
    result = provenance(["python -m benchmarks.high_resolution.attention_peaks", *argv], seeds=[0])
    if path:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
        result = {**with_earlier_runs(result, path.parent), "csv": sorted(p.name for p in path.parent.glob("*.csv"))}
    publish(result, table(report_rows(path.parent) if path else rows), out)
    return result


def report_rows(folder: Path) -> list[dict]:
    """The rows of every CSV of ``folder``, file by file (by name)."""
    return [r for path in sorted(Path(folder).glob("*.csv")) for r in csv.DictReader(open(path))]


def table(rows: list[dict]) -> list[str]:
    """``result.md``'s lines: one table row per measured policy, the figures as the CSVs hold them."""
    return [
        "Peak of one training step, CPU float32, live tensors (`profile_step`), a grid of 20 boxes, attention chunk passes counted.",
        "",
        "| model | imgsz | batch | policy | peak MiB | ratio to none | step s | attention chunk passes | attn_chunk |",
        "|---|---|---|---|---|---|---|---|---|",
        *(
            f"| {r['model']} | {r['imgsz']} | {r['batch']} | {r['policy']} | {r['peak_MiB']} | {r['ratio_to_none']} | {r['step_seconds']} "
            f"| {r['attention_chunk_passes']} | {r['attn_chunk']} |"
            for r in rows
        ),
    ]


if __name__ == "__main__":
    sys.exit(run_command(main, sys.argv[1:], "benchmarks.high_resolution.attention_peaks"))
