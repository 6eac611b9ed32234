"""Measured peak of one training step with and without the attention region (:mod:`yolo_ckpt.checkpointing.attention`):
``recompute=none`` and ``recompute=all`` with and without ``attention``, on the CPU in float32, counted by the live
tensor tracker (:func:`yolo_ckpt.memory.step.profile_step`), on a grid of boxes (:func:`training_batch`), with the
chunk passes counted that prove the region ran.

    python -m benchmarks.attention_peaks model=yolo11n.yaml imgsz=3072 [batch=1] [attn_chunk=256] [policies=...] [out=...csv]

Writes one row per policy (``policies=``: some of ``none``, ``all without attention``, ``all``, joined by commas;
default all three, and rows already in ``out`` for the others are kept): peak MiB, its ratio to ``none``, step
seconds, chunk passes.
"""

from __future__ import annotations

import csv
import platform
import sys
import time
from pathlib import Path

import torch


def main(
    model: str = "yolo11n.yaml", imgsz: str = "3072", batch: str = "1", attn_chunk: str = "256", policies: str = "", out: str = ""
) -> None:
    from ultralytics import YOLO
    from ultralytics.utils import DEFAULT_CFG

    from yolo_ckpt import count_recomputations
    from yolo_ckpt.checkpointing.policy import ModelLayout, resolve
    from yolo_ckpt.memory.step import profile_step
    from yolo_ckpt.memory.training_batch import training_batch

    torch.manual_seed(0)
    net = YOLO(model).model
    net.args = DEFAULT_CFG
    data = training_batch(net, int(batch), int(imgsz), 20)
    policy = resolve("all", ModelLayout.from_model(net))
    without = ",".join([*map(str, policy.indices), *(r for r in policy.regions() if r != "attention")])
    specs = {"none": "none", "all without attention": without, "all": "all"}
    out = Path(out or f"benchmarks/results/attention-peaks/{Path(model).stem}-{imgsz}-b{batch}.csv")
    chosen = policies.split(",") if policies else list(specs)
    kept = {r["policy"]: r for r in csv.DictReader(open(out))} if out.exists() else {}
    rows = [kept[name] for name in specs if name in kept and name not in chosen]
    for name in chosen:
        spec = specs[name]
        with count_recomputations() as counter:
            t = time.perf_counter()
            step = profile_step(net, data, spec, flops=False, attn_chunk=int(attn_chunk))
            seconds = time.perf_counter() - t
        rows.append({"model": model, "imgsz": imgsz, "batch": batch, "policy": name, "peak_MiB": round(step.peak_bytes / 2**20, 1),
                     "step_seconds": round(seconds, 1), "attention_chunk_passes": counter.attention_chunks, "attn_chunk": attn_chunk})
        print(rows[-1], flush=True)
    rows.sort(key=lambda r: list(specs).index(r["policy"]))
    none = next((float(r["peak_MiB"]) for r in rows if r["policy"] == "none"), None)
    for r in rows:
        r["ratio_to_none"] = round(float(r["peak_MiB"]) / none, 3) if none else ""
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    (out.parent / "machine.txt").write_text(
        f"{platform.processor() or platform.machine()}, torch {torch.__version__}, capability "
        f"{torch.backends.cpu.get_cpu_capability()}, threads {torch.get_num_threads()}\n"
    )
    print(out)


if __name__ == "__main__":
    main(**dict(a.split("=", 1) for a in sys.argv[1:]))
