"""What fits on a GPU at 1536-4096 px: the largest batch of ``recompute=none`` and ``recompute=all`` per model, imgsz and
card, from the memory model (estimates on CUDA with AMP, not measured on a GPU).

    python -m benchmarks.high_resolution.what_fits [models=yolo11n.yaml,...] [imgsz=1536,2048,...] [base=2048] \\
        [out=benchmarks/results/what-fits]

Per model, one memory model (:class:`yolo_ckpt.memory.planner.MemoryModel`, planned as ``yolo-ckpt plan device=0``
plans it: CUDA, AMP, AdamW, 20 whole-image boxes per image, the default ``memory_headroom`` of 1.15x + 500 MiB); per
imgsz and policy, its fake passes (:meth:`~yolo_ckpt.memory.composed.ComposedEstimate.estimate`) at batch 1 and 2: each
phase's peak (forward, loss, backward, optimizer) is affine in the batch, and a cell's largest batch is the largest
whose every phase, extrapolated, fits the card with the headroom (0: not batch 1 either). ``yolo-ckpt plan`` checks its
own answers with a fake pass at the answer and one above; this table checks one cell per model (``checks``: the 24 GB
card's ``all`` at the largest imgsz, extrapolated against the fake pass at its batch). The composed peaks of the
planner are not used: at 1024-3072 px they were 13-19% under the fake pass for ``all`` on CUDA with AMP (measured
here, yolo11n; its plans are checked by fake passes, this table's cells would not be).

Cards are their memory as ``nvidia-smi`` reports it (``CARDS``: MiB); 20 boxes per image of the whole image is the
memory model's worst case for the loss (give ``data=`` to ``plan`` for a dataset's own). Writes ``what_fits.csv``
(model, imgsz, card, policy, largest batch, the batch-1 peak in MiB), ``result.md`` (one table per card: models by
imgsz, ``none / all``) and ``record.json`` to ``out``. The docs' choosing page includes ``result.md``.
"""

from __future__ import annotations

import csv
import sys
import time
from pathlib import Path

from yolo_ckpt.bench.results_io import provenance, publish
from yolo_ckpt.cli.args import parse_keys
from yolo_ckpt.cli.main import run_command

KEYS = ("models", "imgsz", "base", "out")
MODELS = tuple(f"yolo{v}{s}{t}.yaml" for v in ("11", "12", "26") for s in "nsm" for t in ("", "-seg"))
SIZES = (1536, 2048, 2560, 3072, 3584, 4096)
# MiB as nvidia-smi reports the cards: 8 GB (RTX 4060/3070), 12 GB (RTX 3060/4070), 16 GB (RTX 4080, V100), 24 GB
# (RTX 3090/4090, A10, L4: 24564 on a 4090), 80 GB (A100/H100: 81920 and 81559)
CARDS = {"8 GB": 8192, "12 GB": 12288, "16 GB": 16384, "24 GB": 24564, "80 GB": 81559}
POLICIES = ("none", "all")
LIMIT = 256  # the largest batch looked for


def main(argv: list[str]) -> dict:
    opts = parse_keys(argv, KEYS, "benchmarks.high_resolution.what_fits")
    models = listed(opts["models"]) if "models" in opts else list(MODELS)
    sizes = [int(s) for s in listed(opts["imgsz"])] if "imgsz" in opts else list(SIZES)
    base, out = int(opts.get("base", 2048)), opts.get("out")

    from yolo_ckpt.memory.planned_run import PlannedRun

    rows, checks = [], []
    for model in models:
        t = time.perf_counter()
        run = PlannedRun.from_keys({"model": model, "imgsz": base, "batch": 1, "device": "0"})
        memory = run.memory_model()
        cells = {}
        for imgsz in sizes:
            for policy in POLICIES:
                one, two = (memory.estimate(policy, b, imgsz).phase_peak_bytes for b in (1, 2))
                cells[imgsz, policy] = {phase: (one[phase], two[phase] - one[phase]) for phase in one}  # (at batch 1, per image)
                for card, mib in CARDS.items():
                    rows.append({"model": model, "imgsz": imgsz, "card": card, "card_MiB": mib, "policy": policy,
                                 "largest_batch": largest_batch(memory, cells[imgsz, policy], mib * 2**20),
                                 "peak_MiB_at_batch_1": round(max(one.values()) / 2**20, 1)})
        top = max(sizes)
        batch = largest_batch(memory, cells[top, "all"], CARDS["24 GB"] * 2**20)
        if batch:
            affine = max(first + (batch - 1) * slope for first, slope in cells[top, "all"].values())
            fake = memory.estimate("all", batch, top).peak_bytes
            checks.append({"model": model, "imgsz": top, "batch": batch, "affine_MiB": round(affine / 2**20, 1),
                           "fake_pass_MiB": round(fake / 2**20, 1), "check_pct": round(100 * (affine / fake - 1), 2),
                           "seconds": round(time.perf_counter() - t, 1)})
            print(checks[-1], flush=True)
    result = {**provenance(["python -m benchmarks.high_resolution.what_fits", *argv], seeds=[]), "checks": checks}
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        with open(Path(out) / "what_fits.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    publish(result, table(rows, checks), out)
    return result


def listed(value) -> list:
    """A ``key=a,b`` value as a list (the key=value parser gives a tuple for ``a,b`` and the value alone for ``a``)."""
    return list(value) if isinstance(value, (list, tuple)) else str(value).split(",")


def largest_batch(memory, phases: dict, card: int) -> int:
    """The largest batch (0 to :data:`LIMIT`) whose every phase's peak, ``first + (batch - 1) * per_image`` from
    ``phases`` (``{phase: (bytes at batch 1, bytes per image)}``), plus the memory model's headroom, fits ``card``
    bytes (0: not batch 1 either)."""
    def fits(batch: int) -> bool:
        return all(memory.fits(first + (batch - 1) * slope, card) for first, slope in phases.values())

    return next((b for b in range(LIMIT, 0, -1) if fits(b)), 0)


def table(rows: list[dict], checks: list[dict]) -> list[str]:
    """``result.md``'s lines: per card, a row per model and a column per imgsz, ``none / all`` largest batch (``-``:
    not batch 1), then the composed-against-fake-pass checks."""
    sizes = sorted({r["imgsz"] for r in rows})
    largest = {(r["model"], r["imgsz"], r["card"], r["policy"]): r["largest_batch"] for r in rows}
    lines = [
        "Largest batch of `recompute=none` / `recompute=all` on CUDA with AMP, from the memory model (estimates: not yet "
        "measured on a GPU), with the default headroom of 1.15x + 500 MiB; 20 boxes per image; `-`: not even batch 1.",
    ]
    for card in dict.fromkeys(r["card"] for r in rows):
        lines += ["", f"**{card}** ({CARDS[card]} MiB as nvidia-smi reports it)", "",
                  "| model | " + " | ".join(f"{s} px" for s in sizes) + " |", "|---|" + "---|" * len(sizes)]
        for model in dict.fromkeys(r["model"] for r in rows):
            cells = (" / ".join(str(largest[model, s, card, p] or "-") for p in POLICIES) for s in sizes)
            lines.append(f"| {Path(model).stem} | " + " | ".join(cells) + " |")
    lines += ["", "The 24 GB card's `all` at the largest imgsz: the peak extrapolated from batch 1 and 2 against the fake pass at "
              "the batch it gives:", "",
              "| model | imgsz | batch | extrapolated MiB | fake pass MiB | difference | seconds for the model |",
              "|---|---|---|---|---|---|---|",
              *(f"| {Path(c['model']).stem} | {c['imgsz']} | {c['batch']} | {c['affine_MiB']} | {c['fake_pass_MiB']} "
                f"| {c['check_pct']:+.2f}% | {c['seconds']} |" for c in checks)]
    return lines


if __name__ == "__main__":
    sys.exit(run_command(main, sys.argv[1:], "benchmarks.high_resolution.what_fits"))
