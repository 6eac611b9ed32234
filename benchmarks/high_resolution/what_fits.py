"""What fits on a GPU at 1536-4096 px: the largest batch of ``recompute=none`` and ``recompute=all`` per model, imgsz and
card, from the memory model (estimates on CUDA with AMP, not measured on a GPU).

    python -m benchmarks.high_resolution.what_fits [models=yolo11n.yaml,...] [imgsz=1536,2048,...] [base=2048] \\
        [out=benchmarks/results/what-fits]

Per model, one memory model (:class:`yolo_ckpt.memory.memory_model.MemoryModel`, planned as ``yolo-ckpt plan device=0``
plans it: CUDA, AMP, AdamW, 20 whole-image boxes per image, the default ``memory_headroom`` of 1.15x + 500 MiB). Per
imgsz and policy, its fake passes (:meth:`~yolo_ckpt.memory.composed.ComposedEstimate.estimate`) at batch 1 and 2
give each phase's peak (forward, loss, backward, optimizer) as a line in the batch, whose answer for a card is the
guess; then the guess's own fake pass must fit the card with the headroom, else a batch lower in proportion to the
excess, and so on down (:func:`largest_batch`): every batch in the table fits by its own fake pass. The line is a lower bound of the peak
(segmentation's loss grows faster than the batch: yolo11n-seg at 4096, batch 11, 24521 MiB on the line, 27429 by
its fake pass), so the walk is down only and its answer the largest that fits. The composed peaks of the planner are
not used: at 1024-3072 px they were 13-19% under the fake pass for ``all`` on CUDA with AMP (yolo11n).

Cards are their memory as ``nvidia-smi`` reports it (``CARDS``: MiB); 20 boxes per image of the whole image is the
memory model's worst case for the loss (give ``data=`` to ``plan`` for a dataset's own). Writes ``what_fits.csv``
(model, imgsz, card, policy, largest batch, the batch-1 peak in MiB), ``result.md`` (one table per card: models by
imgsz, ``none / all``) and ``record.json`` to ``out``; the rows of models this run does not make are kept there
(its earlier runs' records under ``earlier_runs``), so the models can be run apart. The docs' choosing page includes
``result.md``.
"""

from __future__ import annotations

import csv
import sys
import time
from pathlib import Path

from yolo_ckpt.bench.results_io import provenance, publish, read_record, with_earlier_runs
from yolo_ckpt.cli.args import listed, parse_keys
from yolo_ckpt.cli.main import run_command

KEYS = ("models", "imgsz", "base", "out")
MODELS = tuple(f"yolo{v}{s}{t}.yaml" for v in ("11", "12", "26") for s in "nsm" for t in ("", "-seg"))
SIZES = (1536, 2048, 2560, 3072, 3584, 4096)
# MiB as nvidia-smi reports the cards: 8 GB (RTX 4060/3070), 12 GB (RTX 3060/4070), 16 GB (RTX 4080, V100), 24 GB
# (RTX 3090/4090, A10, L4: 24564 on a 4090), 80 GB (A100/H100: 81920 and 81559)
CARDS = {"8 GB": 8192, "12 GB": 12288, "16 GB": 16384, "24 GB": 24564, "80 GB": 81559}
POLICIES = ("none", "all")
LIMIT = 256  # the largest batch looked for
INTS = ("imgsz", "card_MiB", "largest_batch", "guess")  # what_fits.csv's integer columns


def main(argv: list[str]) -> dict:
    opts = parse_keys(argv, KEYS, "benchmarks.high_resolution.what_fits")
    models = listed(opts["models"]) if "models" in opts else list(MODELS)
    sizes = [int(s) for s in listed(opts["imgsz"])] if "imgsz" in opts else list(SIZES)
    base, out = int(opts.get("base", 2048)), opts.get("out")

    from yolo_ckpt.memory import PlannedRun

    rows, checks = [], []
    for model in models:
        t = time.perf_counter()
        run = PlannedRun.from_keys({"model": model, "imgsz": base, "batch": 1, "device": "0"})
        memory = run.memory_model()
        for imgsz in sizes:
            for policy in POLICIES:
                one, two = (memory.estimate(policy, b, imgsz).phase_peak_bytes for b in (1, 2))
                line = {phase: (one[phase], two[phase] - one[phase]) for phase in one}  # (at batch 1, per image)
                for card, mib in CARDS.items():
                    batch, guess = largest_batch(memory, policy, imgsz, line, mib * 2**20)
                    rows.append({"model": model, "imgsz": imgsz, "card": card, "card_MiB": mib, "policy": policy,
                                 "largest_batch": batch, "guess": guess, "peak_MiB_at_batch_1": round(max(one.values()) / 2**20, 1)})
        walked = [r for r in rows if r["model"] == model and r["guess"] != r["largest_batch"]]
        checks.append({"model": model, "cells": len(sizes) * len(POLICIES) * len(CARDS), "below_the_line": len(walked),
                       "most_below": max((r["guess"] - r["largest_batch"] for r in walked), default=0),
                       "seconds": round(time.perf_counter() - t, 1)})
        print(checks[-1], flush=True)
        result = save(rows, checks, argv, out, models)  # after each model: a stopped run keeps the models it made
    return result


def save(rows: list[dict], checks: list[dict], argv: list[str], out: str | None, asked: list[str]) -> dict:
    """Write the rows and checks of the models made so far (with ``out``: beside the kept rows of the folder's other
    models) and print the tables; returns the record, whose ``not_made`` lists the models of ``asked`` (this run's)
    not made yet: a stopped run's record says which of its command's models it lacks."""
    models = {c["model"] for c in checks}
    result = {**provenance(["python -m benchmarks.high_resolution.what_fits", *argv], seeds=[0]), "checks": list(checks)}  # no random draw
    result["not_made"] = [m for m in asked if m not in models]
    if out:
        folder = Path(out)
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / "what_fits.csv"
        if path.is_file():  # earlier runs' models, kept in their order, this run's after them
            kept = [r for r in csv.DictReader(open(path)) if r["model"] not in models]
            rows = [{k: int(v) if k in INTS else float(v) if k == "peak_MiB_at_batch_1" else v for k, v in r.items()} for r in kept] + rows
            earlier = read_record(folder) or {}
            result["checks"][:0] = [c for c in earlier.get("checks", []) if c["model"] not in models]
            if earlier.get("command") != result["command"]:  # this run's own earlier saves are not earlier runs
                result = with_earlier_runs(result, folder)
            else:
                result["earlier_runs"] = earlier.get("earlier_runs", [])
        with open(path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    publish(result, table(rows, result["checks"]), out)
    return result


def largest_batch(memory, policy: str, imgsz: int, line: dict, card: int) -> tuple[int, int]:
    """``(largest batch, guess)``: the guess, the largest batch (0 to :data:`LIMIT`) whose every phase on ``line``
    (``{phase: (bytes at batch 1, bytes per image)}``) fits ``card`` bytes with the memory model's headroom; the
    answer, the guess or the first batch below it whose own fake pass fits (0: not batch 1 either)."""
    def on_line(batch: int) -> bool:
        return all(memory.fits(first + (batch - 1) * slope, card) for first, slope in line.values())

    guess = batch = next((b for b in range(LIMIT, 0, -1) if on_line(b)), 0)
    while batch:
        need = memory.headroom.need(memory.estimate(policy, batch, imgsz).peak_bytes)
        if need <= card:
            break
        # down in proportion to the excess: with a fixed part in the need (static bytes, the headroom's 500 MiB) this
        # stays at or above the largest batch that fits, so none is skipped
        batch = min(batch - 1, batch * card // need)
    return batch, guess


def table(rows: list[dict], checks: list[dict]) -> list[str]:
    """``result.md``'s lines: per card, a row per model (in :data:`MODELS`' order) and a column per imgsz, ``none /
    all`` largest batch (``-``: not batch 1), then the composed-against-fake-pass checks."""
    sizes = sorted({r["imgsz"] for r in rows})
    order = {m: i for i, m in enumerate(MODELS)}  # by family, size and task, whatever order the runs made them in
    models = sorted(dict.fromkeys(r["model"] for r in rows), key=lambda m: order.get(m, len(order)))
    largest = {(r["model"], r["imgsz"], r["card"], r["policy"]): r["largest_batch"] for r in rows}
    lines = [
        "Largest batch of `recompute=none` / `recompute=all` on CUDA with AMP, from the memory model (estimates: not yet "
        "measured on a GPU), with the default headroom of 1.15x + 500 MiB; 20 boxes per image; `-`: not even batch 1.",
    ]
    for card in dict.fromkeys(r["card"] for r in rows):
        lines += ["", f"**{card}** ({CARDS[card]} MiB as nvidia-smi reports it)", "",
                  "| model | " + " | ".join(f"{s} px" for s in sizes) + " |", "|---|" + "---|" * len(sizes)]
        for model in models:
            cells = (" / ".join(str(largest[model, s, card, p] or "-") for p in POLICIES) for s in sizes)
            lines.append(f"| {Path(model).stem} | " + " | ".join(cells) + " |")
    lines += ["", "Per model, the cells whose fake pass did not fit the line's guess (the answer is the batch below that fits):", "",
              "| model | cells | below the line | most below | seconds for the model |", "|---|---|---|---|---|",
              *(f"| {Path(c['model']).stem} | {c['cells']} | {c['below_the_line']} | {c['most_below']} | {c['seconds']} |" for c in checks)]
    return lines


if __name__ == "__main__":
    sys.exit(run_command(main, sys.argv[1:], "benchmarks.high_resolution.what_fits"))
