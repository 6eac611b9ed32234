"""The ``yolo-ckpt`` command: ``train``, ``profile``, ``plan``, ``compare``, ``bench`` and ``help``, with ``yolo``'s ``key=value`` syntax.

``train`` takes every ``yolo train`` argument with the same syntax and defaults (parsed with Ultralytics' own
helpers from ``ultralytics.cfg``), plus yolo-ckpt's keys (``yolo_ckpt/cfg/default.yaml``). Two offline-safe
exceptions to ``yolo train``'s defaults: with no ``data=`` it trains on the built-in synthetic dataset of the task,
and with no ``model=`` it builds ``yolo11n.yaml`` (``yolo11n-seg.yaml``, ...; ``yolo26n-sem.yaml`` and
``yolo26n-depth.yaml`` for semantic and depth) instead of downloading weights.

``profile`` and ``plan`` read the same keys as ``train`` (:mod:`yolo_ckpt.memory.runspec` decides the device, AMP, optimizer
and objects per image they stand for), plus their own (``objects=``, ``format=``, profile's ``plot=``:
``yolo_ckpt/cfg/estimate.yaml``), and say what they assumed; their result is all that goes to stdout. Every command
checks yolo-ckpt's keys once, through :mod:`yolo_ckpt.config`, before it builds or writes anything.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ultralytics.utils import DEFAULT_CFG, DEFAULT_CFG_DICT, LOGGER

from ..config import (
    BENCH_DEFAULTS,
    BENCH_DEFAULTS_PATH,
    DEFAULTS_PATH,
    ESTIMATE_DEFAULTS,
    ESTIMATE_DEFAULTS_PATH,
    CkptConfig,
    EstimateOptions,
    check_bool,
)
from ..errors import ConfigError, NoRoomError, one_line, user_input
from ..shipped import shipped
from ..suggest import did_you_mean
from .args import key_value, parse_train_args

if TYPE_CHECKING:  # annotations only: pandas is imported where a table is built
    import pandas

COMMANDS = {
    "train": "train a model with activation checkpointing",
    "profile": "per-layer memory and FLOPs table and estimated peak of a training step: none against recompute=",
    "plan": "largest imgsz and batch that fit memory_budget= for none, backbone, head, loss, all and auto",
    "compare": "delta table of runs against the first: RUN_DIR_A RUN_DIR_B ... [out=DIR]",
    "bench": (
        "run a benchmark matrix: matrix=NAME|FILE [out=DIR] [datasets=DIR] [rerun=True] [dry=True] [setting=value] "
        "(out: runs/bench/NAME)"
    ),
    "help": "show this help",
}
PROFILE_ONLY = ("plot",)  # keys of cfg/estimate.yaml that plan does not take
# model= default per task, built from its YAML (nothing downloads): YOLO11n, or YOLO26n where only YOLO26 has the task
DEFAULT_MODELS = {
    "detect": "yolo11n.yaml",
    "segment": "yolo11n-seg.yaml",
    "obb": "yolo11n-obb.yaml",
    "pose": "yolo11n-pose.yaml",
    "classify": "yolo11n-cls.yaml",
    "semantic": "yolo26n-sem.yaml",
    "depth": "yolo26n-depth.yaml",
}


def help_text() -> str:
    """The text of ``yolo-ckpt help``: commands, examples, and yolo-ckpt's keys with their defaults and comments, as
    ``cfg/default.yaml`` (train's), ``cfg/estimate.yaml`` (profile's and plan's) and ``cfg/bench.yaml`` (bench's)
    write them."""
    commands = "\n".join(f"  {name:<8}{text}" for name, text in COMMANDS.items())
    keys, estimate_keys, bench_keys = (
        "\n".join(f"  {line}" for line in path.read_text().splitlines() if line.strip() and not line.startswith("#"))
        for path in (DEFAULTS_PATH, ESTIMATE_DEFAULTS_PATH, BENCH_DEFAULTS_PATH)
    )
    return (
        "usage: yolo-ckpt COMMAND [TASK] key=value ...\n\n"
        f"commands:\n{commands}\n\n"
        "examples:\n  yolo-ckpt train data=path/to/data.yaml model=yolo11s.yaml imgsz=1536 recompute=backbone\n"
        "  yolo-ckpt profile model=yolo11s.yaml imgsz=1536 batch=8 recompute=all\n"
        "  yolo-ckpt plan model=yolo11s.yaml memory_budget=16GB imgsz=1536 batch=8 format=json\n"
        "  yolo-ckpt bench matrix=cpu-step dry=True   # what would run, and where; without dry=True it measures\n"
        "  yolo-ckpt train cfg=heavy-blocks data=path/to/data.yaml\n\n"
        f"shipped matrices (bench matrix=NAME): {', '.join(shipped('bench'))}\n"
        f"shipped policies (train cfg=NAME): {', '.join(shipped('policies'))}\n\n"
        "train takes every 'yolo train' argument (see 'yolo cfg'), with the same syntax and defaults, except:\n"
        "  data   default: the built-in synthetic dataset of the task (1600 px aerial-like scenes)\n"
        "  model  default: yolo11n.yaml (yolo11n-seg.yaml, ...; yolo26n-sem.yaml, yolo26n-depth.yaml) built from\n"
        "         scratch, nothing is downloaded; RT-DETR YAMLs (rtdetr-l.yaml, ...) train with RTDETRTrainer\n\n"
        f"yolo-ckpt's keys (defaults from {DEFAULTS_PATH.name}):\n{keys}\n\n"
        f"profile's and plan's keys (defaults from {ESTIMATE_DEFAULTS_PATH.name}):\n{estimate_keys}\n\n"
        f"bench's keys (defaults from {BENCH_DEFAULTS_PATH.name}; other key=value pairs are the matrix's settings):\n{bench_keys}\n\n"
        "profile and plan read train's keys as train does: data= (classes, objects, images for optimizer=auto), device=\n"
        "(default: the device train would use, CUDA where torch sees one, else the CPU; device=0 plans for a GPU from any\n"
        "machine; cpu estimates fp32), amp=, optimizer=, epochs=, nbs=; the output states what it assumed.\n"
    )


def prepare_train(args: list[str]):
    """Parse and check ``yolo-ckpt train`` arguments; resolve the task, the model and the data.

    The model is built as ``yolo train`` builds it (``ultralytics/cfg/__init__.py``, ``entrypoint``): a model whose
    name contains ``rtdetr`` with the ``RTDETR`` class (so ``RTDETRTrainer`` trains it), any other with ``YOLO``
    (which picks World and YOLOE models itself); the trainer is the checkpointed one of that model's task table.

    Returns:
        ``(model, trainer_class, overrides)`` for ``model.train(trainer=trainer_class, **overrides)``; None where
        ``resume model=path/to/last.pt`` found a run trained to its last epoch whose end a kill stopped, and finished it
        (:func:`yolo_ckpt.train.resume.finish_run`, its line printed).

    Raises:
        SyntaxError: for unknown keys or a key without a value. ConfigError: for an invalid yolo-ckpt key, an
        unknown task, a missing or unreadable ``cfg=`` file or model, a ``recompute=`` the model does not have,
        ``resume`` of a finished run, or Ultralytics' own error for its saved arguments
        (:func:`yolo_ckpt.train.resume.check_resumable`). All before any run directory is created.
    """
    from ultralytics import RTDETR, YOLO

    from ..checkpointing.policy import layout_of
    from ..train.inputs import check_data_for_task, check_train_inputs
    from ..train.resume import check_resumable, finish_run
    from ..train.trainer import trainer_for

    overrides = parse_train_args(args)
    task = overrides.pop("task", None)
    if task is not None:
        trainer_for(task)  # unknown task: fail before building anything
    name = overrides.pop("model", None) or DEFAULT_MODELS[task or "detect"]
    check_train_inputs({**overrides, "model": name})  # before the model is built (the trainer's key check repeats it)
    CkptConfig.from_args(overrides)  # yolo-ckpt's keys' forms (memory_budget=12GBB), which need no model; checked once
    check_data_for_task(overrides.get("data"), task)
    if Path(str(name)).suffix.lower() in {".yaml", ".yml"}:
        layout_of(name)  # a YAML without backbone:/head: fails here, with its name, not in Ultralytics' parse_model
    tidy_beside(name)
    with user_input(checkpoint=name):
        model = RTDETR(name) if "rtdetr" in Path(str(name)).stem.lower() else YOLO(name, task=task)
    check_data_for_task(overrides.get("data"), model.task)  # the model's task (yolo11n-cls.yaml), before the trainer's set-up
    resume = overrides.get("resume")
    # resume=True of a finished run: stock's Model.train starts a new one with the defaults (data=coco8.yaml) before any
    # trainer exists, so it is checked here (its end finished, if a kill stopped it); resume=path/to/last.pt is the
    # trainer's key check's (the checkpoint is not unpickled once more here)
    if resume and not isinstance(resume, (str, Path)):
        if not model.ckpt:
            raise ConfigError(
                f"resume needs the run's checkpoint, e.g. yolo-ckpt train resume model=path/to/last.pt; model={name} is not one"
            )
        if check_resumable(model.ckpt_path, model.ckpt, finishes=True):  # trained to its last epoch, its end stopped by a kill
            with _diagnostics_to_stderr():
                line = finish_run(model.ckpt_path)
            print(f"yolo-ckpt: {line}", file=sys.stderr)
            return None
    trainer = trainer_for(model.task, model)
    trainer.check_keys({**overrides, "model": model.model.yaml if overrides.get("resume") is None else None})  # against the loaded model
    if overrides.get("data") is None and not overrides.get("resume"):
        from ..data.synthetic import synthetic_dataset

        overrides["data"] = str(synthetic_dataset(model.task))
    return model, trainer, overrides


def tidy_beside(model) -> None:
    """Where ``model=`` is a ``.pt`` file (a run's ``last.pt``/``best.pt``), remove the temporary files that killed
    saves left beside it (:func:`yolo_ckpt.train.atomic.remove_stale_temporaries`): every command that touches a run
    tidies it, not only a trainer's start."""
    from ..train.atomic import remove_stale_temporaries

    if Path(str(model)).suffix.lower() == ".pt" and Path(str(model)).is_file():
        remove_stale_temporaries(Path(str(model)).parent)


@contextlib.contextmanager
def _diagnostics_to_stderr():
    """Inside the block, Ultralytics' log lines and every progress bar go to stderr, so that stdout holds only the
    result (``format=json | json.load``). Only the console handlers move (Ultralytics' is a plain StreamHandler): a
    FileHandler or a test runner's capture handler (pytest >= 9.2 adds one to Ultralytics' logger) keeps its stream."""
    handlers = [h for h in LOGGER.handlers if type(h) is logging.StreamHandler]
    streams = [h.stream for h in handlers]
    for h in handlers:
        h.setStream(sys.stderr)
    try:
        with contextlib.redirect_stdout(sys.stderr):  # TQDM writes to the sys.stdout of when it is made
            yield
    finally:
        for h, stream in zip(handlers, streams):
            h.setStream(stream)


def dataset_on_disk(data: str, task: str) -> dict:
    """The dataset dict the task's trainer reads (Ultralytics' ``check_det_dataset``, ``check_cls_dataset`` for
    classify), without downloading anything or running a data.yaml's ``download:`` code: profile and plan only estimate.

    Raises:
        ConfigError: naming ``data=`` when the dataset is not on disk (and how to fetch it), or cannot be read.
    """
    from ultralytics.data.utils import check_cls_dataset, check_det_dataset

    fetch = (
        f"data={data} is not on disk; profile and plan never download: fetch it first "
        f"(yolo-ckpt train or yolo train data={data} downloads it)"
    )
    with user_input():
        if task != "classify":
            try:
                return check_det_dataset(data, autodownload=False)
            except FileNotFoundError as e:
                raise ConfigError(f"{fetch}: {str(e).splitlines()[0]}") from e
        if not Path(data).is_dir():
            raise ConfigError(fetch)
        return check_cls_dataset(data)


def estimate_setup(args: list[str], command: str = "plan", early=None):
    """Parse the arguments of ``command`` (``profile`` or ``plan``, which does not take profile's ``plot=``) into the
    run ``yolo-ckpt train`` would make of the same keys (:func:`yolo_ckpt.memory.planned_run.planned_run`).
    ``early(config)``: the command's own checks of yolo-ckpt's keys, made before the model is built (plan's budget).

    The model is built from ``model=`` (no download; a ``.pt`` is loaded once) as the trainer builds it: with the
    data's classes and channels when ``data=`` is given (Ultralytics' ``check_det_dataset``, or ``check_cls_dataset``
    for classify), its parameters trainable as training makes them. The device is ``device=``, else the one ``train``
    would use (:func:`yolo_ckpt.memory.ultralytics_rules.device_type`); AMP as that device runs it.

    Returns:
        ``(run, opts)``: the :class:`~yolo_ckpt.memory.planned_run.PlannedRun` (model, spec, trained imgsz, config), and the
        keys with defaults (Ultralytics' for ``yolo train``'s keys, ``cfg/estimate.yaml``'s for ``objects``,
        ``format`` and ``plot``; ``imgsz`` is the largest size a step trains at, ``imgsz_given`` the value given).

    Raises:
        SyntaxError: for unknown keys. ConfigError: for a bad yolo-ckpt key (:meth:`~yolo_ckpt.config.CkptConfig.from_args`),
        ``objects=``, ``format=`` or ``plot=`` (:meth:`~yolo_ckpt.config.EstimateOptions.from_args`) or batch, a task
        the estimate does not cover, a model or dataset that cannot be read, a training set train refuses
        (:func:`yolo_ckpt.train.data_check.check_labels`: no labels, all images corrupt, ...); the keys' errors before
        the model is built.
    """
    from ultralytics import YOLO
    from ultralytics.cfg import get_cfg

    from ..checkpointing.policy import ModelLayout, layout_of
    from ..memory.planned_run import planned_run
    from ..memory.ultralytics_rules import TASKS, device_type
    from ..train.data_check import CHECKED_TASKS, check_labels
    from ..train.inputs import check_data_for_task
    from ..train.planning import ESTIMATE_BASE_BATCH

    keys = {k: v for k, v in ESTIMATE_DEFAULTS.items() if command == "profile" or k not in PROFILE_ONLY}
    given = parse_train_args(args, keys)
    config = CkptConfig.from_args(given)  # bad keys fail here, before the model is built
    opts = {**DEFAULT_CFG_DICT, **given, **dataclasses.asdict(EstimateOptions.from_args(given))}
    if early is not None:
        early(config)
    opts["autobatch"] = command == "plan" and opts["batch"] == -1  # the batch train picks, answered once the model is built
    if not opts["autobatch"] and (not isinstance(opts["batch"], int) or opts["batch"] < 1):
        raise ConfigError(
            f"batch={opts['batch']!r}: profile estimates a given batch (an int >= 1); plan takes one, or batch=-1 for the batch "
            "train would pick"
        )
    opts["model"] = opts["model"] or DEFAULT_MODELS.get(opts["task"] or "detect", "yolo11n.yaml")
    tidy_beside(opts["model"])
    check_data_for_task(opts["data"], given.get("task"))
    if Path(str(opts["model"])).suffix.lower() in {".yaml", ".yml"}:
        layout_of(opts["model"])  # a missing YAML named as given (Ultralytics names 'yolo11n.yaml' for yolo11nn.yaml)
    with user_input(checkpoint=opts["model"]):
        yolo = YOLO(opts["model"], task=given.get("task"))
    check_data_for_task(opts["data"], yolo.task)
    if yolo.task not in TASKS:
        raise ConfigError(f"profile and plan estimate {', '.join(TASKS)} models; model={opts['model']} is a {yolo.task} model")
    # the task's defaults, as train takes them: its loss region where the head has one (not RT-DETR's, ...)
    config = config.for_task(yolo.task if ModelLayout.from_model(yolo.model).has_loss_region else None, given)
    cfg = get_cfg(DEFAULT_CFG, {k: v for k, v in opts.items() if k in DEFAULT_CFG_DICT and k != "format"} | {"task": yolo.task})
    model, data = yolo.model, None
    if opts["data"]:
        data = dataset_on_disk(opts["data"], yolo.task)
        model = yolo.task_map[yolo.task]["model"](yolo.model.yaml, nc=data["nc"], ch=data["channels"], verbose=False)
        if yolo.ckpt:  # a trained .pt: its weights, as the trainer's get_model loads them into the data's model
            model.load(yolo.model)
    batch = ESTIMATE_BASE_BATCH if opts["autobatch"] else opts["batch"]  # batch=-1: train's base pass (planned_batch)
    checked = data is not None and yolo.task in CHECKED_TASKS
    try:
        run = planned_run(
            cfg, model, config, device_type(opts["device"]), data, batch=batch, objects=given.get("objects"),
            object_size=opts["object_size"],
        )
    except RuntimeError:  # Ultralytics' dataset build ("No valid images found"): train's check says why, in one line
        if checked:
            check_labels(data, yolo.task, cfg.fraction, cfg.single_cls)
        raise
    if checked:  # the training set's checks train makes, from the label cache the dataset build just wrote: no 2nd scan
        check_labels(data, yolo.task, cfg.fraction, cfg.single_cls)
    opts["imgsz_given"], opts["imgsz"] = opts["imgsz"], run.imgsz
    return run, opts


def _trained_at(opts: dict) -> str:
    """`` (imgsz=333 trains at 352)`` where the size estimated is not the ``imgsz=`` given, else empty."""
    if str(opts["imgsz_given"]) == str(opts["imgsz"]):
        return ""
    scale = f" with multi_scale={opts['multi_scale']}" if opts["multi_scale"] else ""
    return f" (imgsz={opts['imgsz_given']}{scale} trains at up to {opts['imgsz']})"


def profile_table(profile, policy) -> pandas.DataFrame:
    """Per-layer rows of a ``recompute=none`` :class:`~yolo_ckpt.memory.step.StepProfile` (MiB, GFLOPs), the layers of
    ``policy`` marked (the final head's row when ``policy.head``: its branches), and a total row: the saved-for-backward
    column adds up to the total."""
    import pandas as pd

    from ..report.layer_plot import is_recomputed

    rows = [
        {
            "layer": r.index,
            "type": r.type,
            "output_MiB": r.output_bytes / 2**20,
            "saved_MiB": r.saved_bytes / 2**20,
            "freed_if_recomputed_MiB": r.freeable_bytes / 2**20,
            "forward_GFLOPs": r.forward_flops / 1e9,
            "recompute": policy.mode if is_recomputed(policy, r.index, len(profile.layers)) else "",
        }
        for r in profile.layers
    ]
    table = pd.DataFrame(rows)
    total = table.drop(columns=["layer", "type", "recompute"]).sum()
    return pd.concat([table, pd.DataFrame([{"layer": "total", "type": "", **total, "recompute": ""}])], ignore_index=True)


def profile(args: list[str]) -> dict:
    """``yolo-ckpt profile``: estimate one training step for none and for ``recompute=`` (default: backbone), for the
    run the keys describe (see :func:`estimate_setup`); the result on stdout, progress and logs on stderr. With
    ``plot=True`` the per-layer picture of the ``none`` estimate, ``recompute=``'s layers marked, beside the phases of
    the ``recompute=`` estimate (:mod:`yolo_ckpt.report.layer_plot`), goes to ``layers.png`` in a new folder named as
    ``yolo`` names runs (``project=``,
    ``name=``; default ``<runs_dir>/profile/profile<N>``); its path is the result's ``plot``."""
    import json

    from ultralytics.utils import TQDM

    from ..checkpointing.policy import ModelLayout, resolve
    from ..memory.estimate import estimate_step
    from ..memory.loss_calibration import loss_models

    with _diagnostics_to_stderr():
        run, opts = estimate_setup(args, "profile")
        model, config, spec = run.model, run.config, run.spec
        recompute, mode = config.recompute, config.recompute_mode
        policy = resolve(recompute, ModelLayout.from_model(model), mode=mode)
        steps = TQDM(total=3, desc="yolo-ckpt profile: calibrating the loss, estimating none, estimating the policy")
        formulas = loss_models(model, spec.amp, config.loss_chunk, config.assign_chunk)  # the stock loss's, the region's
        steps.update()
        results = {}
        for name, spec_name, loss in (("none", "none", False), ("policy", recompute, policy.loss)):
            results[name] = estimate_step(
                model, opts["imgsz"], opts["batch"], spec.objects, spec_name, mode, spec.optimizer, spec.amp, formulas[loss],
                sizes=run.sizes,
            )
            steps.update()
        steps.close()
    table = profile_table(results["none"], policy)
    summary = {
        "model": opts["model"],
        "imgsz": opts["imgsz"],
        "imgsz_given": opts["imgsz_given"],
        "batch": opts["batch"],
        "objects": spec.objects,
        "amp": spec.amp,
        "assumed": spec.to_dict(),
        "recompute": policy.spec,
        "recompute_mode": mode,
        "recomputed_layers": policy.layers(),
        "recomputed_regions": policy.regions(),
        "estimated_peak_bytes": {"none": results["none"].peak_bytes, "policy": results["policy"].peak_bytes},
        "phase_peak_bytes": {k: r.phase_peak_bytes for k, r in results.items()},
        "loss_bytes": results["none"].loss_bytes,
        "static_bytes": results["none"].static_bytes,
        "layers": table.to_dict("records"),
    }
    if opts["plot"]:
        from types import SimpleNamespace

        from ultralytics.cfg import get_save_dir

        from ..report.layer_plot import layer_plot, write_layer_plot

        title = (
            f"{Path(str(opts['model'])).stem} at imgsz={opts['imgsz']} batch={opts['batch']}, "
            f"recompute=none's layers (estimate); orange: recompute={policy.spec}"
        )
        # the folder as 'yolo' names a run's: project=, name= (default profile, profile2, ...), exist_ok=
        folder = get_save_dir(
            SimpleNamespace(project=opts["project"], name=opts["name"], exist_ok=opts["exist_ok"], task="profile", mode="profile")
        )
        folder.mkdir(parents=True, exist_ok=True)
        summary["plot"] = str(write_layer_plot(layer_plot(results["none"], policy, title, phases=results["policy"]), folder / "layers.png"))
        print(f"per-layer picture written to {summary['plot']}", file=sys.stderr)
    if opts["format"] == "json":
        print(json.dumps(summary, indent=2))
    else:
        print(f"{opts['model']} at imgsz={opts['imgsz']}{_trained_at(opts)} batch={opts['batch']}; {spec.describe()}")
        print(table.to_string(index=False, float_format=lambda v: f"{v:.2f}"))
        none, pol = results["none"], results["policy"]
        print(f"\nparameters, buffers, optimizer state and the batch: {none.static_bytes / 2**20:.1f} MiB")
        print(f"loss/assigner ({spec.objects} objects per image): {none.loss_bytes / 2**20:.1f} MiB at its peak")
        print(f"estimated peak, recompute=none: {none.peak_bytes / 2**20:.1f} MiB")
        print(f"estimated peak, {policy}: {pol.peak_bytes / 2**20:.1f} MiB ({pol.peak_bytes / none.peak_bytes:.2f}x)")
    return summary


def _plan_budget(config: CkptConfig) -> int:
    """``memory_budget=`` in bytes, which plan needs; checked before the model is built.

    Raises:
        ConfigError: without one, or for a fraction (it needs the CUDA memory of the run's own process).
    """
    if config.memory_budget is None:
        raise ConfigError("plan needs memory_budget= (bytes with a unit, e.g. memory_budget=16GB)")
    return config.memory_budget.bytes(None)


def plan_setup(args: list[str]):
    """The :class:`~yolo_ckpt.memory.planner.MemoryModel` ``yolo-ckpt plan`` plans with, for its arguments: the run
    :func:`estimate_setup` makes of them (its headroom on the assumed device, ``loss_chunk=``).

    Returns:
        ``(memory, budget, opts, spec)``: the memory model, ``memory_budget=`` in bytes, the keys with defaults and
        the :class:`~yolo_ckpt.memory.runspec.RunSpec`.

    With ``batch=-1``, ``opts["batch"]`` becomes the batch train would pick for ``memory_budget=`` off CUDA, by the same
    function (:func:`yolo_ckpt.train.planning.estimated_batch`: with the run's policy, ``all`` for ``recompute=auto``,
    capped by the training set's images); on CUDA train measures with AutoBatch instead (and keeps the smaller of the two
    for segment models), which needs the GPU itself.

    Raises:
        ConfigError: as :func:`estimate_setup` raises (without ``memory_budget=``, for a fraction); PlanError: with
            ``batch=-1`` where not even batch 1 fits.
    """
    from ..checkpointing.policy import is_auto
    from ..train.planning import estimated_batch

    run, opts = estimate_setup(args, "plan", early=_plan_budget)
    budget = _plan_budget(run.config)
    print("yolo-ckpt plan: estimating the model (calibrating its loss formula, one fake pass)", file=sys.stderr)
    memory = run.memory_model()
    if opts["autobatch"]:
        recompute = "all" if is_auto(run.config.recompute) else run.config.recompute  # train's plan_recompute with batch=-1
        images = run.counts.images if run.counts else None
        opts["batch"] = estimated_batch(memory, recompute, budget, opts["imgsz"], images)
        cap = f", at most the {images} training images" if images else ""
        how = (
            f"the estimate's largest batch that fits{cap}; train on CUDA measures its own with AutoBatch"
            if run.spec.device == "cuda"
            else f"train's pick for recompute={recompute}: the estimate's largest batch that fits{cap}"
        )
        print(f"yolo-ckpt plan: batch=-1 -> batch={opts['batch']}, {how}", file=sys.stderr)
    return memory, budget, opts, run.spec


def plan(args: list[str]) -> list[dict]:
    """``yolo-ckpt plan``: for none, backbone, head, loss (segment models), all (layers, head branches and loss) and
    auto, the estimated peak at ``imgsz=`` (the largest size it trains at) and ``batch=``, the headroom kept on top of
    it (CUDA, against a budget in
    bytes) and the margin left in ``memory_budget=``, the largest imgsz (at ``batch``) and batch (at ``imgsz``) that
    fit, and each policy's recompute cost; for the run the keys describe (see :func:`estimate_setup`). Every peak is
    a fake pass's (the largest imgsz and batch: the composed answer, checked by one; ``MemoryModel.largest_imgsz``).
    The result on stdout, progress and logs on stderr."""
    import json

    import pandas as pd
    from ultralytics.utils import TQDM

    from ..memory.planner import PlanError
    from ..memory.ultralytics_rules import grid_size

    with _diagnostics_to_stderr():
        memory, budget, opts, spec = plan_setup(args)
        stride = grid_size(memory.model.stride)  # the training size's grid (train_imgsz: Ultralytics' gs)
        imgsz, batch, headroom = opts["imgsz"], opts["batch"], memory.headroom
        print("yolo-ckpt plan: planning auto", file=sys.stderr)
        try:
            auto = memory.plan(budget, batch, imgsz)
        except PlanError:
            auto = None  # even 'all' does not fit at this imgsz and batch
        rows = []
        names = ("none", "backbone", "head") + (("loss",) if "loss" in memory.candidates else ()) + ("all", "auto")
        for name in TQDM(names, desc="yolo-ckpt plan: checking each policy's peak, largest imgsz and batch"):
            units = memory.units(name if name != "auto" else (auto.recompute if auto else "all"))
            # each row's peak from its fake pass, the check that decides (the composition is close, not exact)
            cost = (
                auto
                if name == "auto" and auto
                else memory.as_plan(units, memory.estimate(memory.spec(units), batch, imgsz).peak_bytes, budget, batch, imgsz)
            )
            rows.append({
                "recompute": name if name != "auto" else f"auto ({cost.recompute})",
                "estimated_peak_MiB": cost.estimated_peak_bytes / 2**20,
                "headroom_MiB": cost.headroom_bytes / 2**20,
                "margin_MiB": cost.margin_bytes / 2**20,
                "fits": cost.fits,
                f"max_imgsz_at_batch_{batch}": memory.largest_imgsz(units, budget, batch, stride),
                f"max_batch_at_imgsz_{imgsz}": memory.largest_batch(units, budget, imgsz),
                "recompute_GFLOPs": cost.recompute_flops / 1e9,
                "recompute_pct_of_step": 100 * cost.recompute_cost,
            })
    result = {
        "model": opts["model"],
        "memory_budget_bytes": budget,
        "memory_headroom": str(headroom),
        "imgsz": imgsz,
        "imgsz_given": opts["imgsz_given"],
        "batch": batch,
        "assumed": spec.to_dict(),
        "policies": rows,
    }
    if opts["format"] == "json":
        print(json.dumps(result, indent=2))
    else:
        print(
            f"{opts['model']} at imgsz={imgsz}{_trained_at(opts)} batch={batch}, memory_budget={budget / 2**20:.0f} MiB, "
            f"memory_headroom={headroom}"
        )
        print(spec.describe())
        print(pd.DataFrame(rows).to_string(index=False, float_format=lambda v: f"{v:.1f}"))
    return rows


def compare(args: list[str]):
    """``yolo-ckpt compare RUN_DIR_A RUN_DIR_B ... [out=DIR]``: print the delta table of the runs' reports against
    the first and write it as ``compare.csv`` and ``compare.md`` into ``out=`` (default: a new
    ``<runs_dir>/compare/compare<N>``, so nothing is overwritten)."""
    from ultralytics.utils import SETTINGS
    from ultralytics.utils.files import increment_path

    from ..report.compare import compare_markdown, compare_runs, compare_warning

    dirs = [a for a in args if "=" not in a]
    options = dict(key_value(a) for a in args if "=" in a)
    if set(options) - {"out"}:
        raise SyntaxError(f"compare takes run directories and out=; unknown keys {sorted(set(options) - {'out'})}")
    table = compare_runs(dirs)
    markdown = compare_markdown(table)
    if warning := compare_warning(table):
        print(f"yolo-ckpt: {warning[0].lower()}{warning[1:]}", file=sys.stderr)
    print(markdown)
    out = Path(str(options["out"])) if "out" in options else increment_path(Path(SETTINGS["runs_dir"]) / "compare" / "compare")
    out.mkdir(parents=True, exist_ok=True)
    table.to_csv(out / "compare.csv", index=False)
    (out / "compare.md").write_text(markdown + "\n")
    print(f"written to {out}")
    return table


def bench(args: list[str]):
    """``yolo-ckpt bench matrix=NAME|FILE [out=DIR] [datasets=DIR] [rerun=True] [dry=True] [cells=N,...] [setting=value
    ...]``: run a benchmark matrix, shipped or a file (see :mod:`yolo_ckpt.bench.matrix`); bench's own keys are those
    of ``cfg/bench.yaml``, other ``key=value`` pairs replace the matrix's settings (``epochs=10``). Cells already in
    ``out``'s results.csv with the same settings are skipped (``rerun=True``: measured again); ``datasets=`` is searched
    first for the matrix's datasets; ``cells=`` runs only the cells of these numbers; ``dry=True`` checks the matrix and
    says what would run, writing nothing.

    Raises:
        SyntaxError: without ``matrix=``, or for a bare word. ConfigError: as
            :func:`yolo_ckpt.bench.matrix.run_matrix` raises, and for a ``rerun=`` or ``dry=`` that is not a bool.
    """
    from ..bench.matrix import run_matrix

    bare = [a for a in args if "=" not in a]
    options = dict(key_value(a) for a in args if "=" in a)
    if bare or "matrix" not in options:
        raise SyntaxError(
            f"bench takes matrix=NAME or matrix=FILE, optionally out=DIR and settings as key=value; got {' '.join(args) or 'nothing'}"
        )
    own = {k: options.pop(k, default) for k, default in BENCH_DEFAULTS.items()}  # the rest are the matrix's settings
    switches = {k: check_bool(k, own[k]) for k in ("rerun", "dry")}
    return run_matrix(
        str(own["matrix"]), own["out"], command=" ".join(["yolo-ckpt bench", *args]), overrides=options, datasets=own["datasets"],
        cells=own["cells"], **switches,
    )


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``yolo-ckpt`` console script; returns the exit status (2 for bad input)."""
    args = sys.argv[1:] if argv is None else list(argv)
    command = args[0].lstrip("-") if args else "help"
    if command in {"help", "h"} or {"help", "-h", "--help"} & set(args[1:]):
        print(help_text())
        return 0
    if command not in COMMANDS:
        print(f"yolo-ckpt: unknown command '{args[0]}'{did_you_mean(command, COMMANDS)}; commands: {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    try:
        if command == "train":
            prepared = prepare_train(args[1:])
            if prepared is None:  # resume finished a run's end (its line printed): nothing to train
                return 0
            model, trainer, overrides = prepared
            try:
                model.train(trainer=trainer, **overrides)
            except RuntimeError as e:  # bad data=: Ultralytics' get_dataset raises "Dataset '...' error ..." (run dir put back)
                if not str(e).startswith("Dataset '"):
                    raise
                raise ConfigError(str(e).splitlines()[0]) from e
        else:
            {"profile": profile, "plan": plan, "compare": compare, "bench": bench}[command](args[1:])
    except (ConfigError, SyntaxError) as e:  # the input's fault (PlanError too); anything else is a bug: traceback
        print(f"yolo-ckpt: error: {one_line(e)}", file=sys.stderr)
        return 2
    except NoRoomError as e:  # a full disk or the file-size limit: the line says how much the save needs
        print(f"yolo-ckpt: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as e:  # Ctrl-C: a trainer's says what it left (yolo_ckpt.train.resume.stop_on_interrupt)
        print(f"yolo-ckpt: {one_line(e) if str(e) else 'interrupted'}", file=sys.stderr)
        return 130  # 128 + SIGINT, as a shell reports a process that SIGINT ended
    return 0

