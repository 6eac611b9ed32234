"""``train`` cells: one real training run through the Checkpoint*Trainers, read back from its run report.

The run takes the cell's model, data, imgsz, batch, amp and policy plus the matrix's ``settings`` (any ``yolo
train`` argument: epochs, fraction, seed, nbs, ...). ``val_images: N`` validates on the first N validation images
(sorted by path): validating dense high-resolution images dominates CPU time. Peak memory, step time and accuracy
come from the run's :class:`yolo_ckpt.report.record.RunReport` (``ckpt_report.json``); the final weights are hashed so that runs with and
without recomputation can be shown identical.

A ``tiles`` cell trains on a tile dataset (:func:`yolo_ckpt.data.tiles.tile_dataset`, written once into
``<out>/data/``) and validates on those tiles during training; its mAP figures are those of the best and the last
weights validated afterwards on the full val images at the cell's ``imgsz`` (``val_imgsz``). Every epoch of it passes each
source pixel at least once (pixels in tile overlaps more often), in more, smaller steps; to match the pixels
processed by full-image cells, give it fewer epochs (``yolo_ckpt/cfg/bench/small-objects-tiles.yaml`` says how).

A cell whose run a kill stopped (a matrix rerun finds its ``last.pt`` unfinished, saved with the same imgsz, batch
and settings) is resumed, exactly (:mod:`yolo_ckpt.train.exact_resume`): long cells span sessions. Its wall time adds
the earlier runs' epochs (Ultralytics' ``time`` column of ``results.csv``); its recomputations count the last run's.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import torch
from ultralytics.utils import YAML

from yolo_ckpt.data.tiles import dataset_root, split_images, tile_dataset
from yolo_ckpt.errors import MissingFileError

from .cells import SETTINGS, SMALL_OBJECT_SETS, run_name
from .hybrid import TileSchedule, check_phases, switch_epoch
from .planning import planned_cell, settle


def run(cell: dict, settings: dict, data: str, project: Path) -> dict:
    """Train one cell into ``project/<run name>`` and return its row.

    Returns:
        status, the run directory, imgsz and batch used, recompute (the layers planned, for auto), layers,
        recomputations (layer forwards recomputed in backward over the whole run: 0 proves a baseline), epochs,
        optimizer steps (a tiles cell's epoch has more, smaller batches; ``nbs`` accumulates batches into one),
        training and validation peak memory (MiB) and their source, median step time (s), wall time of the training
        and its validations (s; a tiles cell's full-image validations included) and its two parts, ``train_s`` and
        ``val_s`` (every validation: each epoch's, the final one, a tiles cell's full-image ones), ``train_images``
        (the images trained, after ``fraction=``; tiles for a tiles cell), ``pixels_M`` (millions of pixels trained:
        epochs x images x imgsz^2, the size every training image enters the model at), ``best_epoch`` (the epoch
        ``best.pt`` holds), the accuracy of the best weights and of the last epoch (:func:`epoch_figures`: mAP50 and
        mAP50-95 of the task's output, the boxes' too for segment and pose, or top-1/top-5; fractions; a tiles cell's on
        the full val images), ``class_AP50`` and ``class_AP50-95`` (per-class AP of the best weights, JSON
        ``{name: AP}``), ``val_imgsz`` (the imgsz they were validated at) and ``weights_sha256`` of the final model and
        EMA state.

    Raises:
        Exception: whatever the training raises (the matrix records it as a failed cell).
    """
    from ultralytics import YOLO

    from yolo_ckpt import count_recomputations, trainer_for
    from yolo_ckpt.report.compare import class_ap
    from yolo_ckpt.report.record import load_report, task_metrics

    if data == "synthetic":
        from yolo_ckpt.data.synthetic import synthetic_dataset

        data = str(synthetic_dataset(cell["task"]))
    elif data in SMALL_OBJECT_SETS:
        from yolo_ckpt.data.small_objects import small_object_dataset

        data = str(small_object_dataset(SMALL_OBJECT_SETS[data]))
    if settings["val_images"]:
        data = str(val_subset(data, int(settings["val_images"]), project.parent / "data"))
    yolo = YOLO(cell["model"], task=cell["task"])
    imgsz, train_data, tiles, schedule = cell["imgsz"], data, cell["tiles"], None
    if imgsz == "fit":  # the trainers plan recompute=auto and batch=-1 themselves; plan as they do
        imgsz = fit_imgsz(cell, data, settings)
    if tiles is not None:  # written once per cell; a rerun reuses it (complete: tile_dataset renames it into place)
        if cell["hybrid"]:  # both phases planned (size=fit: the tiles arm's) before anything is written
            size = hybrid_tiles(cell, data, settings)
        else:
            size = tiles["size"] if tiles["size"] != "fit" else fit_imgsz(cell, data, settings)
        folder = project.parent / "data" / f"tiles-{run_name(cell)}"
        if not folder.is_dir():
            tile_dataset(data, folder, size, tiles["overlap"], cell["imgsz"], cell["task"])
        if cell["hybrid"]:  # the run is the full-image one; the tiles replace its train loader until the switch
            schedule = TileSchedule(folder / "data.yaml", size)
            schedule.add_to(yolo)
        else:
            imgsz, train_data = size, str(folder / "data.yaml")
    overrides = {k: v for k, v in settings.items() if k not in SETTINGS["train"]}
    if settings["device"] is not None:
        overrides["device"] = settings["device"]
    start = time.perf_counter()
    last = interrupted_run(project / run_name(cell), {**overrides, "imgsz": imgsz, "batch": cell["batch"]})
    earlier = trained_seconds(last.parent.parent) if last else 0.0
    with count_recomputations() as counter:
        if last:
            yolo = YOLO(last, task=cell["task"])
            if schedule is not None:  # the resumed run trains in its epoch's phase
                schedule.add_to(yolo)
            yolo.train(resume=True, trainer=trainer_for(yolo.task))
        else:
            yolo.train(
                trainer=trainer_for(yolo.task),
                data=train_data,
                imgsz=imgsz,
                batch=cell["batch"],
                amp=cell["amp"],
                recompute=cell["recompute"],
                recompute_mode=cell["recompute_mode"],
                memory_budget=cell["memory_budget"],
                project=str(project.resolve()),  # Ultralytics puts a relative project under its runs_dir
                name=run_name(cell),
                **overrides,
            )
    trainer = yolo.trainer
    report = load_report(trainer.save_dir)
    peak, val_peak = report.train_peak_allocated_bytes, report.val_peak_allocated_bytes
    best, last, per_class = report.metrics, last_epoch_metrics(trainer.save_dir), report.class_ap
    val_s = report.val_time_s if report.val_time_s is not None else float("nan")
    weights = weights_sha256(trainer)  # before validating anew, which fuses the model it validates
    if tiles is not None and not cell["hybrid"]:  # validate the best and the last weights on the full images, as the others were
        started = time.perf_counter()
        device = {"device": settings["device"]} if settings["device"] is not None else {}
        full, full_last = (
            YOLO(w, task=cell["task"]).val(
                data=data, imgsz=cell["imgsz"], batch=cell["batch"], plots=False, project=str(trainer.save_dir), name=name,
                max_det=trainer.args.max_det, **device,  # a checkpoint keeps no val keys: the run's, as its own validation
            )
            for w, name in ((trainer.best, "val-full"), (trainer.last, "val-full-last"))
        )
        best, last, per_class = task_metrics(full.results_dict), task_metrics(full_last.results_dict), class_ap(report.task, full)
        val_s += time.perf_counter() - started
    wall = earlier + time.perf_counter() - start
    train_images = len(trainer.train_loader.dataset)  # what trained (after fraction=); tiles for a tiles cell
    pixels = report.epochs * train_images * report.imgsz**2  # every training image enters the model imgsz^2
    if schedule is not None:  # a hybrid's tile epochs, then its full ones (the loader it ends with)
        switch = switch_epoch(report.epochs, trainer.args.close_mosaic)
        full, train_images = train_images, len(list(Path(schedule.train).iterdir()))
        pixels = switch * train_images * schedule.imgsz**2 + (report.epochs - switch) * full * report.imgsz**2
    return {
        "status": "ok",
        "run_dir": str(trainer.save_dir),
        "imgsz_used": report.imgsz,
        "batch_used": report.batch,
        "recomputed": report.recompute,
        "layers": len(report.recomputed_layers),
        "recomputations": counter.total,
        "epochs_run": report.epochs,
        "optimizer_steps": trainer.ema.updates,  # one EMA update per optimizer step (a resumed run's restored)
        "peak_MiB": peak / 2**20 if peak is not None else float("nan"),
        "val_peak_MiB": val_peak / 2**20 if val_peak is not None else float("nan"),
        "memory_source": report.memory_source,
        "step_time_s": report.train_step_time_median_s,
        "wall_s": wall,
        "train_s": wall - val_s,
        "val_s": val_s,
        "train_images": train_images,
        "pixels_M": pixels / 1e6,
        "best_epoch": report.best_epoch,
        **epoch_figures(report.task, best, last),
        "class_AP50": json.dumps(per_class.get("AP50", {})),
        "class_AP50-95": json.dumps(per_class.get("AP50-95", {})),
        "val_imgsz": cell["imgsz"] if tiles is not None else report.imgsz,
        **({"tile_imgsz": schedule.imgsz, "switch_epoch": switch + 1} if schedule is not None else {}),
        "weights_sha256": weights,
        "device": report.device,
    }


def last_epoch_metrics(run_dir: Path) -> dict:
    """The last epoch's validation in ``run_dir/results.csv`` (Ultralytics' row per epoch) as
    :func:`yolo_ckpt.report.record.task_metrics` names; {} without the file."""
    import pandas as pd

    from yolo_ckpt.report.record import task_metrics

    path = run_dir / "results.csv"
    return task_metrics(pd.read_csv(path).rename(columns=str.strip).iloc[-1].to_dict()) if path.is_file() else {}


def epoch_figures(task: str, best: dict, last: dict) -> dict:
    """A row's accuracy of the best weights (``best``) and of the last epoch (``last``), both
    :func:`yolo_ckpt.report.record.task_metrics` names: ``mAP50``, ``mAP50-95``, ``top1``, ``top5`` of the task's
    output (:func:`yolo_ckpt.report.compare.primary_metrics`) and ``last_mAP50``, ``last_mAP50-95``; where the task's
    output is not boxes (segment, pose), the boxes' too: ``box_mAP50``, ``box_mAP50-95``, ``last_box_mAP50``,
    ``last_box_mAP50-95``."""
    from yolo_ckpt.report.compare import PRIMARY_KIND, primary_metrics

    last_primary = primary_metrics(task, last)
    row = {**primary_metrics(task, best), "last_mAP50": last_primary["mAP50"], "last_mAP50-95": last_primary["mAP50-95"]}
    if PRIMARY_KIND.get(task, "box") != "box":
        nan = float("nan")
        for name in ("mAP50", "mAP50-95"):
            row[f"box_{name}"], row[f"last_box_{name}"] = best.get(f"box_{name}", nan), last.get(f"box_{name}", nan)
    return row


def interrupted_run(run_dir: Path, args: dict) -> Path | None:
    """``run_dir``'s ``last.pt`` if a kill stopped the run before its end and it was started with ``args`` (the
    cell's imgsz, batch and settings, as saved in its ``train_args``); else None (no run, a finished one, or one of
    other settings: the cell trains anew, in a folder of its own). A cell's AutoBatch batch (``-1``, or a fraction
    in (0, 1)) matches any batch saved: the run saves the batch AutoBatch chose, not the one asked."""
    from ultralytics.nn.tasks import torch_safe_load

    from yolo_ckpt import check_resumable
    from yolo_ckpt.errors import FinishedRunError

    last = run_dir / "weights" / "last.pt"
    if not last.is_file():
        return None
    ckpt = torch_safe_load(str(last))[0]
    try:
        check_resumable(last, ckpt)
    except FinishedRunError:
        return None
    saved = ckpt.get("train_args") or {}
    if float(args.get("batch", 1)) < 1:  # ultralytics/engine/trainer.py _setup_train: self.args.batch = self.auto_batch()
        args = {k: v for k, v in args.items() if k != "batch"}
    return None if any(saved.get(k) != v for k, v in args.items()) else last


def trained_seconds(run_dir: Path) -> float:
    """Seconds of training and validation of the epochs in ``run_dir/results.csv``, over every run that wrote them:
    Ultralytics' ``time`` column counts from each run's start (a resumed run's restarts), so the sum of each run's
    last value. 0.0 without the file."""
    import pandas as pd

    path = run_dir / "results.csv"
    if not path.is_file():
        return 0.0
    times = pd.read_csv(path)["time"]
    ends = times[times.shift(-1, fill_value=-1.0) < times]  # the last epoch of each run: the next one's time is smaller
    return float(ends.sum())


def weights_sha256(trainer) -> str:
    """SHA-256 of the final in-memory weights and buffers of the model and of its EMA (full precision, state_dict
    order): equal hashes mean bit-identical training results (``last.pt`` stores the EMA in half precision)."""
    from ultralytics.utils.torch_utils import unwrap_model

    digest = hashlib.sha256()
    for module in (unwrap_model(trainer.model), trainer.ema.ema):
        for name, tensor in module.state_dict().items():
            digest.update(name.encode())
            digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def fit_imgsz(cell: dict, data: str, settings: dict) -> int:
    """The largest imgsz whose estimated training peak with the cell's policy and batch fits its ``memory_budget``,
    for the run the cell trains, planned as ``yolo-ckpt train`` plans it (:func:`.planning.planned_cell`: the data's
    classes and objects with its augmentation's factors, the optimizer Ultralytics will build, AMP and the headroom
    on the run's device).

    Raises:
        ValueError: when no imgsz fits."""
    return settle({**cell, "imgsz": "fit"}, memory_model(cell, data, settings))["imgsz"]


def memory_model(cell: dict, data: str, settings: dict):
    """The :class:`~yolo_ckpt.memory.MemoryModel` of the run ``cell`` trains on ``data`` (a data.yaml), planned as
    ``yolo-ckpt train`` plans it (:func:`.planning.planned_cell`)."""
    from ultralytics import YOLO
    from ultralytics.data.utils import check_det_dataset

    yolo = YOLO(cell["model"], task=cell["task"])  # the task's model class (a segment model plans its mask loss)
    dataset = check_det_dataset(data, autodownload=False)
    model = yolo.task_map[yolo.task]["model"](yolo.model.yaml, nc=dataset["nc"], ch=dataset["channels"], verbose=False)
    return planned_cell(cell, model, settings, dataset).memory_model()


def hybrid_tiles(cell: dict, data: str, settings: dict) -> int:
    """A hybrid cell's tile size (px), its two phases planned to fit its ``memory_budget`` before anything is written
    (:func:`.hybrid.check_phases`): the tiles at their size without recomputation (``size: fit``: the tiles arm's,
    the largest that fits so) and the full images at the cell's imgsz with its recompute (auto planned there, as the
    trainer plans it).

    Raises:
        ConfigError: a phase that does not fit (one line); PlanError: no plan of ``recompute=auto`` fits."""
    memory = memory_model(cell, data, settings)
    full = settle(cell, memory)
    size = cell["tiles"]["size"]
    if size == "fit":
        size = settle({**cell, "imgsz": "fit", "recompute": "none"}, memory)["imgsz"]
    phases = {"tiles": (size, "none"), "full images": (full["imgsz"], full["recompute"])}
    check_phases(memory, full["batch"], phases, full["budget_bytes"])
    return size


def val_subset(data: str, n: int, folder: Path) -> Path:
    """A copy of ``data`` (in ``folder``) whose val split is its first ``n`` validation images (a list file);
    the dataset itself is not touched."""
    spec, root = dataset_root(data)
    images = split_images(root, spec["val"])[:n]
    if not images:
        raise MissingFileError(f"{data}: no validation images found for val_images={n}")
    folder.mkdir(parents=True, exist_ok=True)
    stem = f"{Path(data).resolve().parent.name}-val{n}"
    (folder / f"{stem}.txt").write_text("".join(f"{p}\n" for p in images))
    out = folder / f"{stem}.yaml"
    YAML.save(out, {**spec, "path": str(root), "val": str((folder / f"{stem}.txt").resolve())})
    return out
