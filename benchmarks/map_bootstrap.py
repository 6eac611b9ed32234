"""Issue 33's noise: a bootstrap interval over the val images for each arm's mAP, and for the difference between each
arm and a baseline arm, from one validation per arm::

    python -m benchmarks.map_bootstrap results=benchmarks/results/equal-memory-deeppcb-seed0 datasets=/work/ds \\
        baseline=auto [resamples=2000] [seed=0] out=benchmarks/results/equal-memory-deeppcb-seed0-noise

Reads the bench's ``results.csv`` (each ok row's run folder, dataset, ``val_imgsz``, recompute) and validates each
run's ``weights/best.pt`` on the dataset's val split as its mAP was measured: at ``val_imgsz``, batch ``2 x batch``
as the trainer's final validation (a tiles cell's full-image validation: ``batch``). Ultralytics' own
``DetectionValidator`` matches the predictions; :class:`PerImage` keeps each image's matches (true positives at the 10
IoU thresholds, confidences, classes), and mAP over any multiset of images is Ultralytics' ``ap_per_class`` on their
concatenation, so the whole val set gives the run's own figure (checked: ``mAP50 as recorded``).

The interval: B resamples of the val images with replacement, the 2.5th and 97.5th percentiles of mAP over them (the
percentile bootstrap, Efron and Tibshirani, *An Introduction to the Bootstrap*, 1993, ch. 13). A difference to the
baseline resamples the same images for both arms (a paired bootstrap: what the images share cancels); an interval that
holds 0 says the difference is inside the val set's noise. It is the noise of the val images only, not of training
(another seed trains other weights): issue 33 allows either.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from ultralytics.models.yolo.detect import DetectionValidator
from ultralytics.utils.metrics import ap_per_class

from yolo_ckpt.bench.matrix import read_results
from yolo_ckpt.bench.results_io import provenance, publish
from yolo_ckpt.cli.args import parse_keys
from yolo_ckpt.cli.main import run_command
from yolo_ckpt.errors import ConfigError

STATS = ("tp", "conf", "pred_cls", "target_cls")  # what ap_per_class reads of each image's matches


class PerImage(DetectionValidator):
    """Ultralytics' detection validator, keeping each image's matches as it hands them to its metrics:
    ``images[name]`` = {tp (n, 10) bool, conf (n,), pred_cls (n,), target_cls (m,)}, n predictions, m labels."""

    def init_metrics(self, model):
        super().init_metrics(model)
        self.images, update = {}, self.metrics.update_stats

        def keep(stat, update=update):
            self.images[stat["im_name"]] = {k: np.asarray(stat[k]) for k in STATS}
            update(stat)

        self.metrics.update_stats = keep


def mean_ap(images: list[dict]) -> tuple[float, float]:
    """mAP50 and mAP50-95 of a multiset of images' matches (:class:`PerImage`), as Ultralytics computes them over a
    val set (``ap_per_class``: each class's AP at 10 IoU thresholds, averaged over the classes with labels)."""
    stats = {k: np.concatenate([im[k] for im in images]) for k in STATS}
    if not len(stats["target_cls"]):
        return 0.0, 0.0
    ap = ap_per_class(stats["tp"], stats["conf"], stats["pred_cls"], stats["target_cls"])[5]  # (classes, 10)
    return (float(ap[:, 0].mean()), float(ap.mean())) if len(ap) else (0.0, 0.0)


def bootstrap(arms: dict[str, dict], names: list[str], resamples: int, seed: int) -> np.ndarray:
    """mAP50 and mAP50-95 of each arm over ``resamples`` resamples of the images ``names`` with replacement, the same
    resample for every arm: (resamples, arms, 2)."""
    rng = np.random.default_rng(seed)
    out = np.empty((resamples, len(arms), 2))
    for r in range(resamples):
        pick = [names[i] for i in rng.integers(0, len(names), len(names))]
        for a, images in enumerate(arms.values()):
            out[r, a] = mean_ap([images[n] for n in pick])
    return out


def interval(values: np.ndarray) -> tuple[float, float]:
    """The 95% percentile interval of bootstrap ``values`` (the 2.5th and 97.5th percentiles)."""
    return float(np.percentile(values, 2.5)), float(np.percentile(values, 97.5))


def _tiles(row: dict) -> str:
    """A bench row's tiles setting, '' for a cell trained on whole images (the csv leaves it empty: NaN)."""
    return row["tiles"] if isinstance(row.get("tiles"), str) else ""


def validate(row: dict, datasets: Path) -> dict:
    """Each val image's matches for the run of a bench ``row``, validated as the bench measured its mAP."""
    from ultralytics import YOLO

    data = datasets / row["dataset"] / "data.yaml"
    batch = int(row["batch"]) if _tiles(row) else 2 * int(row["batch"])
    validator = {}

    class Kept(PerImage):  # the instance Ultralytics builds, to read its images after
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            validator["it"] = self

    YOLO(Path(row["run_dir"]) / "weights" / "best.pt").val(
        validator=Kept, data=str(data), imgsz=int(row["val_imgsz"]), batch=batch, plots=False, verbose=False, workers=0
    )
    return validator["it"].images


KEYS = ("results", "datasets", "baseline", "resamples", "seed", "out")  # the key=value words main takes


def arm_name(row: dict) -> str:
    """An arm as the bench's table names it: recompute, and tiles or imgsz."""
    return f"{row['recompute']} @{int(row['imgsz_used'])}" + (f" tiles {_tiles(row)}" if _tiles(row) else "")


def main(argv: list[str]) -> dict:
    opts = parse_keys(argv, KEYS, "benchmarks.map_bootstrap", required=("results", "datasets"))
    folder, datasets = Path(opts["results"]), Path(opts["datasets"])
    rows = [r for r in read_results(folder).to_dict("records") if r["status"] == "ok"]
    baseline = opts.get("baseline", "auto")
    if baseline not in {r["recompute"] for r in rows}:
        raise ConfigError(f"baseline={baseline}: no ok row of {folder} has that recompute; valid: {sorted({r['recompute'] for r in rows})}")
    resamples, seed = int(opts.get("resamples", 2000)), int(opts.get("seed", 0))
    arms = {arm_name(r): validate(r, datasets) for r in rows}
    names = sorted(set.intersection(*(set(images) for images in arms.values())))
    base = next(i for i, r in enumerate(rows) if r["recompute"] == baseline)
    draws = bootstrap(arms, names, resamples, seed)
    full = [mean_ap([images[n] for n in names]) for images in arms.values()]
    table = [
        {
            "arm": name, "recorded": [rows[a]["mAP50"], rows[a]["mAP50-95"]], "mAP": list(full[a]),
            "interval": [interval(draws[:, a, k]) for k in (0, 1)],
            "delta": [full[a][k] - full[base][k] for k in (0, 1)],
            "delta_interval": [interval(draws[:, a, k] - draws[:, base, k]) for k in (0, 1)],
        }
        for a, name in enumerate(arms)
    ]
    command = " ".join(["python -m benchmarks.map_bootstrap", *argv])
    result = {**provenance(command), "results": str(folder), "images": len(names), "resamples": resamples, "seed": seed,
              "baseline": arm_name(rows[base]), "arms": table}
    fmt = lambda lo_hi: f"[{lo_hi[0]:+.3f}, {lo_hi[1]:+.3f}]"  # noqa: E731

    def verdict(lo_hi):  # same weights give the same figure on every resample
        return " equal" if lo_hi == (0.0, 0.0) else " inside the noise" if lo_hi[0] <= 0 <= lo_hi[1] else ""

    lines = [
        f"Bootstrap over the {len(names)} val images of `{folder.name}` ({resamples} resamples, seed {seed}): each arm's"
        f" best.pt validated once; differences to `{arm_name(rows[base])}` on the same resampled images. 95% percentile"
        " intervals; a difference whose interval holds 0 is inside the val set's noise.",
        "",
        "| arm | mAP50 (as recorded) | 95% interval | mAP50-95 (as recorded) | 95% interval | mAP50 - baseline | 95% interval |"
        " mAP50-95 - baseline | 95% interval |",
        "|---|---|---|---|---|---|---|---|---|",
        *(
            f"| {t['arm']} | {t['mAP'][0]:.3f} ({t['recorded'][0]:.3f}) | {fmt(t['interval'][0]).replace('+', '')} |"
            f" {t['mAP'][1]:.3f} ({t['recorded'][1]:.3f}) | {fmt(t['interval'][1]).replace('+', '')} |"
            + ("".join(f" {t['delta'][k]:+.3f} | {fmt(t['delta_interval'][k])}{verdict(t['delta_interval'][k])} |" for k in (0, 1))
               if a != base else " baseline | | | |")
            for a, t in enumerate(table)
        ),
    ]
    publish(result, lines, opts.get("out"))
    return result


if __name__ == "__main__":
    sys.exit(run_command(main, sys.argv[1:], "benchmarks.map_bootstrap"))
