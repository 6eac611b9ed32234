"""Issue 33's noise: a bootstrap interval over the val images for each arm's mAP, and for the difference between each
arm and a baseline arm, from one validation per arm::

    python -m benchmarks.equal_memory.map_bootstrap results=benchmarks/results/equal-memory-deeppcb-seed0 datasets=DIR \\
        baseline=auto [resamples=2000] [seed=0] out=benchmarks/results/equal-memory-deeppcb-seed0-noise

``results``: one bench results folder, or several separated by commas (arms of other schedules on the same val set;
each arm is then named ``<folder>: <arm>``). ``baseline``: an arm as the table names it (``"none @352"``), or a
recompute policy that one arm alone has (``auto``).

Reads the bench's ``results.csv`` (each ok row's run folder, dataset, ``val_imgsz``, recompute) and validates each
run's ``weights/best.pt`` on the dataset's val split as its mAP was measured: at ``val_imgsz``, batch ``2 x batch_used``
as the trainer's final validation (a tiles cell's full-image validation: ``batch``). Ultralytics' own
``DetectionValidator`` (``SegmentationValidator`` for a segmentation run; the run's ``max_det``) matches the predictions; :class:`PerImage`
(:class:`SegmentPerImage`) keeps each image's matches (true positives at the 10 IoU thresholds, of the boxes and, for
segmentation, of the masks; confidences, classes), and mAP over any multiset of images is Ultralytics' ``ap_per_class``
on their concatenation, so the whole val set gives the run's own figure (checked: ``mAP50 as recorded``). A
segmentation run's table is of its masks (the bench's mAP columns), with its boxes' below it.

The interval: B resamples of the val images with replacement, and the 95% bias-corrected and accelerated (BCa)
interval of mAP over them (Efron and Tibshirani, *An Introduction to the Bootstrap*, 1993, ch. 14; SciPy's
``scipy.stats.bootstrap``): mAP is not linear in the images, and a resample's repeated images shift and skew its
distribution, so the plain percentiles sit off the whole set's figure; BCa corrects both. A difference to the baseline
resamples the same images for both arms (a paired bootstrap: what the images share cancels); an interval that holds 0
says the difference is inside the val set's noise. It is the noise of the val images only, not of training (another
seed trains other weights): issue 33 allows either.
"""

from __future__ import annotations

import shlex
import sys
import warnings
from collections import Counter
from pathlib import Path

import numpy as np
from scipy.stats import DegenerateDataWarning, bootstrap as scipy_bootstrap
from ultralytics.models.yolo.detect import DetectionValidator
from ultralytics.models.yolo.segment import SegmentationValidator
from ultralytics.utils import DEFAULT_CFG, YAML
from ultralytics.utils.metrics import ap_per_class

from yolo_ckpt.bench.matrix import read_results
from yolo_ckpt.bench.results_io import provenance, publish, repo_relative
from yolo_ckpt.bench.tables import arm_label, tiles_setting
from yolo_ckpt.cli.args import listed, parse_keys
from yolo_ckpt.cli.main import run_command
from yolo_ckpt.errors import ConfigError

STATS = ("tp", "conf", "pred_cls", "target_cls")  # what ap_per_class reads of each image's matches
TASKS = ("detect", "segment")  # the tasks whose validators keep their images here


class PerImage(DetectionValidator):
    """Ultralytics' detection validator, keeping each image's matches as it hands them to its metrics:
    ``images[name]`` = {tp (n, 10) bool, conf (n,), pred_cls (n,), target_cls (m,)}, n predictions, m labels; with
    ``tp_m`` (n, 10), the masks' true positives, where the validator matches masks too (:class:`SegmentPerImage`)."""

    def init_metrics(self, model):
        super().init_metrics(model)
        self.images, update = {}, self.metrics.update_stats

        def keep(stat, update=update):
            self.images[stat["im_name"]] = {k: np.asarray(stat[k]) for k in (*STATS, "tp_m") if k in stat}
            update(stat)

        self.metrics.update_stats = keep


class SegmentPerImage(PerImage, SegmentationValidator):
    """:class:`PerImage` on Ultralytics' segmentation validator: each image's box and mask matches."""


def mean_ap(images: list[dict], tp: str = "tp") -> tuple[float, float]:
    """mAP50 and mAP50-95 of a multiset of images' matches (:class:`PerImage`), as Ultralytics computes them over a
    val set (``ap_per_class``: each class's AP at 10 IoU thresholds, averaged over the classes with labels), of the
    boxes (``tp="tp"``) or the masks (``"tp_m"``)."""
    stats = {k: np.concatenate([im[k] for im in images]) for k in (tp, *STATS[1:])}
    if not len(stats["target_cls"]):
        return 0.0, 0.0
    ap = ap_per_class(stats[tp], stats["conf"], stats["pred_cls"], stats["target_cls"])[5]  # (classes, 10)
    return (float(ap[:, 0].mean()), float(ap.mean())) if len(ap) else (0.0, 0.0)


def bootstrap(arms: dict[str, dict], names: list[str], baseline: str, resamples: int, seed: int, tp: str = "tp") -> dict[str, np.ndarray]:
    """Each arm's mAP50 and mAP50-95 (of the boxes, or of the masks with ``tp="tp_m"``: :func:`mean_ap`) over the
    images ``names`` and over ``resamples`` resamples of them with replacement (the same resample for every arm), and
    its difference to arm ``baseline`` on each.

    Returns ``mAP`` and ``delta`` (arms, 2), the whole set's figures (mAP50, mAP50-95); ``interval`` and
    ``delta_interval`` (arms, 2, 2), their 95% BCa intervals (low, high), an interval of a figure that no resample
    changes (an arm against itself, or against equal weights) being that figure twice; ``draws`` (arms, 2, resamples),
    each resample's mAP.

    Raises:
        ValueError: where a figure that resamples change has no BCa interval (too few images or resamples)."""
    images = list(arms.values())
    base = list(arms).index(baseline)

    def statistic(pick):  # pick: indices into names -> (2 [mAP, mAP - baseline's], arms, 2)
        m = np.array([mean_ap([arm[names[i]] for i in pick], tp) for arm in images])
        return np.stack([m, m - m[base]])

    whole = statistic(np.arange(len(names)))
    with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", DegenerateDataWarning)  # a constant figure's BCa is 0/0; it is set below
        res = scipy_bootstrap((np.arange(len(names)),), statistic, n_resamples=resamples, vectorized=False,
                              method="BCa", rng=np.random.default_rng(seed))
    constant = np.ptp(res.bootstrap_distribution, axis=-1) == 0
    ci = np.stack([np.where(constant, whole, res.confidence_interval.low),
                   np.where(constant, whole, res.confidence_interval.high)], axis=-1)  # (2, arms, 2, 2)
    if np.isnan(ci).any():
        raise ValueError(f"the BCa interval is undefined for {np.argwhere(np.isnan(ci[..., 0])).tolist()} (kind, arm, "
                         f"metric) of {len(names)} images and {resamples} resamples; valid: more images or resamples")
    return {"mAP": whole[0], "delta": whole[1], "interval": ci[0], "delta_interval": ci[1],
            "draws": res.bootstrap_distribution[0]}


def validate(row: dict, datasets: Path) -> dict:
    """Each val image's matches for the run of a bench ``row`` (its ``task`` one of :data:`TASKS`), validated as the
    bench measured its mAP."""
    from ultralytics import YOLO

    data = datasets / row["dataset"] / "data.yaml"
    trained = int(row["batch_used"])  # the batch that trained: batch=-1's AutoBatch answer, not -1
    batch = trained if tiles_setting(row) else 2 * trained
    validator = {}

    class Kept(SegmentPerImage if row["task"] == "segment" else PerImage):  # the instance Ultralytics builds, to read its images after
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            validator["it"] = self

    run = Path(row["folder_path"]) / str(row["run_dir"])
    trained_args = YAML.load(run / "args.yaml") if (run / "args.yaml").is_file() else {}
    YOLO(run / "weights" / "best.pt").val(  # a checkpoint keeps none of the run's val keys: max_det from its args
        validator=Kept, data=str(data), imgsz=int(row["val_imgsz"]), batch=batch, plots=False, verbose=False, workers=0,
        max_det=trained_args.get("max_det", DEFAULT_CFG.max_det),
    )
    return validator["it"].images


KEYS = ("results", "datasets", "baseline", "resamples", "seed", "out")  # the key=value words main takes


def main(argv: list[str]) -> dict:
    opts = parse_keys(argv, KEYS, "benchmarks.equal_memory.map_bootstrap", required=("results", "datasets"))
    folders, datasets = [Path(f) for f in listed(opts["results"])], Path(opts["datasets"])
    where = ", ".join(map(str, folders))
    rows = [{**r, "folder": f.name, "folder_path": f} for f in folders for r in read_results(f).to_dict("records") if r["status"] == "ok"]
    named = [arm_label(r) if len(folders) == 1 else f"{r['folder']}: {arm_label(r)}" for r in rows]
    if len(set(named)) < len(named):
        twice = sorted(n for n, k in Counter(named).items() if k > 1)
        raise ConfigError(f"{where}: two ok rows are the same arm ({twice}); valid: one row per arm")
    baseline = str(opts.get("baseline", "auto") or "none")  # key=value parsing reads none as None, as the yolo CLI does
    by_recompute = [n for n, r in zip(named, rows) if r["recompute"] == baseline]
    base = named.index(baseline) if baseline in named else named.index(by_recompute[0]) if len(by_recompute) == 1 else None
    if base is None:
        unique = [p for p, k in Counter(r["recompute"] for r in rows).items() if k == 1]
        raise ConfigError(f"baseline={baseline} names no one arm of {where}; valid: {sorted(set(named) | set(unique))}")
    tasks = {r.get("task", "detect") for r in rows}
    if len(tasks) > 1 or not tasks <= set(TASKS):
        raise ConfigError(f"{where}: arms of task {sorted(tasks)}; valid: one task of {list(TASKS)}")
    resamples, seed = int(opts.get("resamples", 2000)), int(opts.get("seed", 0))
    arms = dict(zip(named, (validate(r, datasets) for r in rows)))
    names = sorted(arms[named[0]])
    if short := {n: len(set(names) ^ set(images)) for n, images in arms.items() if set(images) != set(names)}:
        raise ValueError(f"the arms were validated on different val images (images not shared, per arm: {short}); valid: one val set")
    # the bench's mAP columns are the masks' for segmentation (tp_m), its box_ columns the boxes'
    kinds = [("tp_m", "", "masks"), ("tp", "box_", "boxes")] if tasks == {"segment"} else [("tp", "", "boxes")]
    tables = {}
    for tp, column, _ in kinds:
        boot = bootstrap(arms, names, named[base], resamples, seed, tp)
        tables[tp] = [
            {
                "arm": name, "recorded": [rows[a][f"{column}mAP50"], rows[a][f"{column}mAP50-95"]], "mAP": boot["mAP"][a].tolist(),
                "interval": boot["interval"][a].tolist(), "delta": boot["delta"][a].tolist(),
                "delta_interval": boot["delta_interval"][a].tolist(),
            }
            for a, name in enumerate(arms)
        ]
    command = shlex.join(["python", "-m", "benchmarks.equal_memory.map_bootstrap", *argv])  # quoted: an arm name has a space
    result = {**provenance(command, seeds=[seed]), "results": [repo_relative(f) for f in folders], "images": len(names),
              "resamples": resamples, "seed": seed, "baseline": named[base], "arms": tables[kinds[0][0]]}
    if len(kinds) > 1:
        result["box_arms"] = tables["tp"]
    fmt = lambda lo_hi: f"[{lo_hi[0]:+.3f}, {lo_hi[1]:+.3f}]"  # noqa: E731

    def verdict(lo_hi):  # same weights give the same figure on every resample
        return " equal" if list(lo_hi) == [0.0, 0.0] else " inside the noise" if lo_hi[0] <= 0 <= lo_hi[1] else ""

    lines = [
        f"Bootstrap over the {len(names)} val images of {', '.join(f'`{f.name}`' for f in folders)} ({resamples} resamples,"
        f" seed {seed}): each arm's best.pt validated once; differences to `{named[base]}` on the same resampled images. 95% BCa"
        " intervals; a difference whose interval holds 0 is inside the val set's noise.",
    ]
    for tp, _, what in kinds:
        lines += [
            "",
            *([f"**{what.capitalize()}**", ""] if len(kinds) > 1 else []),
            "| arm | mAP50 (as recorded) | 95% interval | mAP50-95 (as recorded) | 95% interval | mAP50 - baseline | 95% interval |"
            " mAP50-95 - baseline | 95% interval |",
            "|---|---|---|---|---|---|---|---|---|",
            *(
                f"| {t['arm']} | {t['mAP'][0]:.3f} ({t['recorded'][0]:.3f}) | {fmt(t['interval'][0]).replace('+', '')} |"
                f" {t['mAP'][1]:.3f} ({t['recorded'][1]:.3f}) | {fmt(t['interval'][1]).replace('+', '')} |"
                + ("".join(f" {t['delta'][k]:+.3f} | {fmt(t['delta_interval'][k])}{verdict(t['delta_interval'][k])} |" for k in (0, 1))
                   if a != base else " baseline | | | |")
                for a, t in enumerate(tables[tp])
            ),
        ]
    publish(result, lines, opts.get("out"))
    return result


if __name__ == "__main__":
    sys.exit(run_command(main, sys.argv[1:], "benchmarks.equal_memory.map_bootstrap"))
