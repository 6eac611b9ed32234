"""What a run measures for its report as it trains, and the report at its end: the step times, validation seconds and
CUDA peaks (the callbacks of :data:`CALLBACKS`, :func:`validating`, :func:`cuda_peak`), the CPU's memory probes
(:func:`memory_probes`) and the run report (:func:`run_report`, :class:`yolo_ckpt.report.record.RunReport`) with its
per-layer picture (:func:`run_picture`). Plain functions of a :class:`~yolo_ckpt.train.trainer.CheckpointTrainerMixin`
trainer; what they measure goes to the trainer's :class:`~yolo_ckpt.train.state.RunState` (``trainer.ckpt_state``)."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import torch
from ultralytics.utils import LOGGER, RANK
from ultralytics.utils.torch_utils import unwrap_model

from ..memory import attention_tokens
from ..report.compare import class_ap
from ..report.layer_plot import LayerPlot, layer_plot, write_layer_plot
from ..report.record import (
    FINAL_VALIDATION,
    MEMORY_PROBE,
    NOT_MEASURED,
    PROBE_SKIPPED,
    REPORT_NAME,
    WARMUP_STEPS,
    PlanRecord,
    RunReport,
    attention_text,
    probe_counts,
    task_metrics,
)
from .log import PREFIX
from .planning import estimate_step_peaks
from .tasks import task_of

LAYER_PLOT_NAME = "ckpt_layers.png"


def _on_train_batch_start(trainer) -> None:
    trainer.ckpt_state.t0 = time.perf_counter()


def _on_train_batch_end(trainer) -> None:
    if trainer.device.type == "cuda":
        torch.cuda.synchronize(trainer.device)
    state = trainer.ckpt_state
    state.step_s.append(time.perf_counter() - state.t0)


def _on_train_end(trainer) -> None:
    """Write the run report and log where it is and its headline; with ``plots=True`` the per-layer picture of the
    run (``ckpt_layers.png``, :func:`run_picture`)."""
    record = write_run_report(trainer)
    picture = run_picture(trainer, record) if trainer.args.plots else None
    if picture is not None:
        write_layer_plot(picture, trainer.save_dir / LAYER_PLOT_NAME)
    elif trainer.args.plots:
        LOGGER.info(f"{PREFIX}no {LAYER_PLOT_NAME}: no set-up estimate ({trainer.ckpt_state.estimate_skipped}) and no CPU probe of a step")


def write_run_report(trainer, not_measured: tuple = ()) -> RunReport:
    """Write the trainer's run report (``trainer.run_report``, without what ``not_measured`` names) to
    ``ckpt_report.json`` in its run folder, log where, where the attention region ran its chunking
    (:func:`~yolo_ckpt.report.record.attention_text`), and its headline, last; returns it."""
    record = trainer.run_report(not_measured)
    path = record.write(trainer.save_dir)
    trainer.ckpt_state.ending = "written"
    attention = f"{PREFIX}{attention_text(record.attention)}\n" if record.attention else ""
    LOGGER.info(f"{PREFIX}run report {path}\n{attention}{PREFIX}{record.headline()}")  # the headline last: the run's last line
    return record


@contextlib.contextmanager
def ending(trainer):
    """Around ``BaseTrainer.final_eval``: ``trainer.ckpt_state.ending`` says the final validation runs, then (once it
    is done) that the memory probe is next (:func:`report_interrupted_end` reads it)."""
    trainer.ckpt_state.ending = FINAL_VALIDATION
    yield
    trainer.ckpt_state.ending = MEMORY_PROBE


def report_interrupted_end(trainer) -> str:
    """Where Ctrl-C or SIGTERM stopped the run in its end (``trainer.ckpt_state.ending``: the final validation, or the
    end-of-run memory probe), write the run report with what is known (:func:`write_run_report`; the final
    validation's metrics, else the last epoch's, and the probe marked not measured) and return the words that say so
    (``; its report ... written without ...``); elsewhere nothing ("")."""
    ending = trainer.ckpt_state.ending
    if ending not in {FINAL_VALIDATION, MEMORY_PROBE}:
        return ""
    not_measured = (FINAL_VALIDATION, MEMORY_PROBE) if ending == FINAL_VALIDATION else (MEMORY_PROBE,)
    write_run_report(trainer, not_measured)
    missing = " and ".join(n.replace("_", " ") for n in not_measured)
    return f"; its report {trainer.save_dir / REPORT_NAME} written without its {missing}"


def run_picture(trainer, record: RunReport) -> LayerPlot | None:
    """The run's per-layer picture (:mod:`yolo_ckpt.report.layer_plot`): from the set-up estimate
    (:func:`yolo_ckpt.train.planning.estimate_step_peaks`), ``recompute=none``'s layers marked as the run's policy
    recomputes them and both steps' phases side by side, in MiB, as ``yolo-ckpt profile plot=True`` draws them;
    without that estimate, the CPU probe's step alone, its title saying why ``none`` is missing; None with neither
    (a CUDA run that skipped the estimate)."""
    state = trainer.ckpt_state
    stem, steps = Path(str(trainer.args.model)).stem, state.estimated_steps
    if steps:
        step = state.estimated_step
        title = (
            f"{stem} at batch {step['batch']} imgsz {step['imgsz']}, the set-up estimate: recompute=none's layers;\n"
            f"orange: what this run's recompute={record.recompute} recomputes"
        )
        return layer_plot(steps["none"], trainer.policy, title, phases=steps["policy"])
    if state.train_probe is None:
        return None
    title = (
        f"{stem}, recompute={record.recompute}: one training step on the CPU (the run report's probe);\n"
        f"no recompute=none beside it: its estimate was skipped ({state.estimate_skipped})"
    )
    return layer_plot(state.train_probe, trainer.policy, title)


def _on_pretrain_routine_end(trainer) -> None:
    trainer.ckpt_state.batch_at_start = trainer.batch_size  # after batch=-1; an OOM halving may lower it later
    if RANK in {-1, 0}:
        estimate_step_peaks(trainer, task_of(type(trainer)))


def _on_train_start(trainer) -> None:
    trainer.ckpt_state.run_dir_before = None  # the first epoch starts: a failure from here on keeps the run folder as it is


CALLBACKS = {
    "on_pretrain_routine_end": _on_pretrain_routine_end,
    "on_train_start": _on_train_start,
    "on_train_batch_start": _on_train_batch_start,
    "on_train_batch_end": _on_train_batch_end,
    "on_train_end": _on_train_end,
}


def add_callbacks(trainer, callbacks: dict | None = None) -> None:
    """Add ``callbacks`` (``{event: function}``; default :data:`CALLBACKS`) to ``trainer``, each once (the DDP worker
    gets them back in ``_callbacks`` already)."""
    for event, callback in (CALLBACKS if callbacks is None else callbacks).items():
        if callback not in trainer.callbacks[event]:
            trainer.add_callback(event, callback)


def keep_probe_batch(trainer, batch: dict) -> None:
    """On the CPU, unless ``probe=False``, keep the first full-size batch (the first of the most images, when the
    dataset is smaller than the batch) for the end-of-run memory probe."""
    kept = trainer.ckpt_state.probe_batch
    fuller = kept is None or len(kept["img"]) < min(len(batch["img"]), trainer.batch_size)
    if trainer.device.type == "cpu" and trainer.ckpt_config.probe and fuller:
        trainer.ckpt_state.probe_batch = dict(batch)


@contextlib.contextmanager
def validating(trainer):
    """A validation: its seconds added to the run's (``trainer.ckpt_state.val_s``), its CUDA peak counted as validation's
    (:func:`cuda_peak`), so that the report holds training's time and memory apart from validation's."""
    start = time.perf_counter()
    try:
        with cuda_peak(trainer, "val"):
            yield
    finally:
        trainer.ckpt_state.val_s.append(time.perf_counter() - start)


@contextlib.contextmanager
def cuda_peak(trainer, section: str):
    """Count the CUDA allocator's peak inside the block as ``section`` ("val") and the peak before it as
    "train" (:class:`~yolo_ckpt.train.state.RunState`); nothing off CUDA."""
    if trainer.device.type != "cuda":
        yield
        return
    bank_cuda_peak(trainer, "train")
    try:
        yield
    finally:
        bank_cuda_peak(trainer, section)


def bank_cuda_peak(trainer, section: str) -> None:
    """Add the CUDA allocator's peaks since the last reset to ``section``'s (max of both), then reset them."""
    peaks = getattr(trainer.ckpt_state, f"{section}_peak")
    peaks["allocated"] = max(peaks.get("allocated", 0), torch.cuda.max_memory_allocated(trainer.device))
    peaks["reserved"] = max(peaks.get("reserved", 0), torch.cuda.max_memory_reserved(trainer.device))
    torch.cuda.reset_peak_memory_stats(trainer.device)


def memory_probes(trainer):
    """CPU: one training step (forward, loss, backward and the step of the run's optimizer, its state included:
    what the plan estimates) on the kept full-size batch, measured in live tensors, and the peak live-tensor
    bytes of one validation batch of the final model.

    Returns:
        ``(train StepProfile, val_bytes)``; the validation batch is the validation loader's batch size. With
        ``distill_model=`` the training step is not probed (``None``): the harness measures one model's step,
        and a distillation step runs the teacher too.
    """
    from ultralytics.nn.tasks import BaseModel

    from ..memory import optimizer_for, probe_validation_step, profile_step

    batch = trainer.ckpt_state.probe_batch
    model = unwrap_model(trainer.model)
    if not isinstance(model, BaseModel):  # DistillationModel (student and teacher)
        return None, probe_validation_step(trainer.ema.ema, batch["img"])
    val_batch = trainer.test_loader.batch_size or len(batch["img"])
    images = batch["img"].repeat((val_batch + len(batch["img"]) - 1) // len(batch["img"]), 1, 1, 1)[:val_batch]
    config = trainer.ckpt_config
    step = profile_step(  # flops=False: neither the report nor the picture reads per-layer FLOPs (one forward less)
        model, batch, trainer.policy.spec, trainer.policy.mode, optimizer_for(trainer.args.optimizer), flops=False,
        loss_chunk=config.loss_chunk, assign_chunk=config.assign_chunk, attn_chunk=config.attn_chunk,
    )
    return step, probe_validation_step(trainer.ema.ema, images)


def run_report(trainer, not_measured: tuple = ()) -> RunReport:
    """The :class:`~yolo_ckpt.report.record.RunReport` of a finished run: its policy and settings, the CUDA
    allocator's peaks (CPU: :func:`memory_probes` on the kept batch, whose step profile is kept as
    ``trainer.ckpt_state.train_probe`` for the picture; none with ``probe=False``, nor where ``not_measured`` names
    the memory probe), the median step time after :data:`~yolo_ckpt.report.record.WARMUP_STEPS`, the seconds spent
    validating, the plan, the final metrics (the last epoch's where ``not_measured`` names the final validation) and,
    where the policy runs the attention region, its chunking at the trained imgsz
    (:func:`~yolo_ckpt.memory.attention_shapes.attention_tokens`)."""
    args, state, policy = trainer.args, trainer.ckpt_state, trainer.policy
    if trainer.device.type == "cuda":
        bank_cuda_peak(trainer, "train")
        source, train, val = "cuda_allocator", state.train_peak, state.val_peak
    elif not trainer.ckpt_config.probe:
        source, train, val = PROBE_SKIPPED, {}, {}
    elif MEMORY_PROBE in not_measured:
        source, train, val = NOT_MEASURED, {}, {}
    else:
        start = time.perf_counter()
        state.train_probe, v = memory_probes(trainer) if state.probe_batch is not None else (None, None)
        if state.probe_batch is not None:  # its cost said, beside the way to skip it (issue 31: it dominated tiny runs)
            LOGGER.info(f"{PREFIX}CPU memory probe of one training step and one validation batch: {time.perf_counter() - start:.1f} s "
                        "(probe=False skips it)")
        t = state.train_probe.peak_bytes if state.train_probe else None
        source, train, val = "cpu_probe_live_tensors", {"allocated": t}, {"allocated": v}
    return build_report(
        vars(args), policy, state.step_s, trainer.metrics, not_measured,
        recompute_mode=trainer.ckpt_config.recompute_mode,
        device=str(trainer.device),
        imgsz=args.imgsz,
        batch=trainer.batch_size,  # after Ultralytics' halvings on an out-of-memory error in the first epoch
        batch_at_start=state.batch_at_start,
        amp=bool(trainer.amp),
        epochs=trainer.epoch + 1,
        memory_source=source,
        **probe_counts(state.probe_batch),
        train_peak_allocated_bytes=train.get("allocated"),
        train_peak_reserved_bytes=train.get("reserved"),
        val_peak_allocated_bytes=val.get("allocated"),
        val_peak_reserved_bytes=val.get("reserved"),
        val_time_s=sum(state.val_s),
        estimated_none_peak_bytes=state.estimated_peaks.get("none"),
        estimated_all_peak_bytes=state.estimated_peaks.get("all"),
        estimated_policy_peak_bytes=state.estimated_peaks.get("policy"),
        estimated_step=state.estimated_step,
        estimate_skipped=state.estimate_skipped,
        plan=None if state.plan is None else PlanRecord.of(state.plan, state.run_spec.to_dict() if state.run_spec else None),
        best_epoch=state.best_epoch,
        class_ap=class_ap(args.task, getattr(trainer.validator, "metrics", None)),  # final_eval's: best.pt's
        attention=(
            run_attention(unwrap_model(trainer.model), args.imgsz, trainer.ckpt_config.attn_chunk) if policy and policy.attention else None
        ),
    )


def run_attention(model, imgsz: int, attn_chunk: int) -> dict | None:
    """The attention region's chunking (``attn_chunk`` queries) at the trained ``imgsz`` (pixels) of ``model`` for the
    report (:func:`~yolo_ckpt.memory.attention_shapes.attention_tokens`); None, with a warning, where its fake forward
    fails: the report is written without it."""
    try:
        return attention_tokens(model, imgsz, attn_chunk)
    except Exception as e:  # a report, not a gate: the run's report still gets written
        LOGGER.warning(f"{PREFIX}the run report leaves out the attention region's chunking: {type(e).__name__}: {e}")
        return None


def build_report(args: dict, policy, step_s: list | None, metrics: dict | None, not_measured, **measured) -> RunReport:
    """The one builder of a :class:`~yolo_ckpt.report.record.RunReport`, for a run the trainer ends (:func:`run_report`)
    and one ``resume`` finishes (:func:`finished_run_report`): what every report takes from the run's arguments
    ``args`` (``task``, ``model``, ``data``; ``recompute`` where ``policy``, the
    :class:`~yolo_ckpt.checkpointing.policy.RecomputePolicy` that trained, is None), the step times ``step_s`` (seconds
    each; the median after :data:`~yolo_ckpt.report.record.WARMUP_STEPS`), ``metrics`` (Ultralytics' ``results_dict``,
    None or empty without a validation) and ``not_measured``; the rest of the fields as ``measured`` gives them."""
    steps, metrics = (step_s or [])[WARMUP_STEPS:], metrics or {}
    return RunReport(
        versions=versions(),
        task=args.get("task"),
        model=str(args.get("model")),
        data=str(args.get("data")),
        recompute=policy.spec if policy else args.get("recompute"),
        recomputed_layers=policy.layers() if policy else [],
        recomputed_regions=policy.regions() if policy else [],
        train_step_time_median_s=median(steps),
        train_steps_timed=len(steps),
        metrics=task_metrics(metrics),
        ultralytics_metrics={k: float(v) for k, v in metrics.items()},
        not_measured=list(not_measured),
        **measured,
    )


def versions() -> dict:
    """The report's ``versions``: yolo-ckpt's, Ultralytics' and torch's."""
    import ultralytics

    from .. import __version__

    return {"yolo_ckpt": __version__, "ultralytics": ultralytics.__version__, "torch": torch.__version__}


def median(values: list) -> float | None:
    """The median of ``values``, None for none."""
    import statistics

    return statistics.median(values) if values else None


def finished_run_report(ckpt: dict, args: dict, metrics: dict, step_s: list | None) -> RunReport:
    """The :class:`~yolo_ckpt.report.record.RunReport` of a run whose end ``resume`` finished
    (:func:`~yolo_ckpt.train.resume.finish_run`), from what its stripped ``last.pt`` (``ckpt``) holds and the run's
    arguments ``args`` (:func:`~yolo_ckpt.train.resume.run_args`; as given: ``batch=-1`` stays -1): the policy its
    ``recompute=`` resolves to on the saved model (``auto``'s plan is not kept: no layers), ``metrics`` (Ultralytics'
    ``results_dict`` of the final validation, empty without ``best.pt``) and ``step_s`` (the exact resume state's step
    times, None without one). The memory probe is not measured: the trainer that kept its batch is gone. The device is
    the one ``device=`` selects on this machine, where the final validation ran (Ultralytics' ``select_device``:
    ``cuda:0`` or ``cpu`` for none given), as the trainer's report names it; as given where this machine has no such
    device."""
    from ultralytics.utils.torch_utils import select_device

    from ..checkpointing.policy import ModelLayout, is_auto, resolve
    from ..config import CkptConfig
    from ..memory import frozen_layers
    from ..report.record import STEP_TIMES

    spec, mode, model = args.get("recompute"), args.get("recompute_mode", "full"), ckpt.get("model") or ckpt.get("ema")
    policy = None
    if model is not None and spec is not None and not is_auto(spec):
        with contextlib.suppress(Exception):  # a policy the saved model no longer resolves: the report says recompute= alone
            policy = resolve(spec, ModelLayout.from_model(model), frozen_layers(args.get("freeze")), mode)
    device = args.get("device")
    with contextlib.suppress(ValueError):  # a device this machine lacks: the report names it as given
        device = select_device(device, verbose=False)
    return build_report(
        args, policy, step_s, metrics, [MEMORY_PROBE] + ([STEP_TIMES] if step_s is None else []),
        recompute_mode=mode,
        device=str(device),
        imgsz=args.get("imgsz"),
        batch=args.get("batch"),
        batch_at_start=None,
        amp=bool(args.get("amp")),
        epochs=args.get("epochs"),
        memory_source=NOT_MEASURED,
        attention=run_attention(model, args.get("imgsz"), CkptConfig.from_args(args).attn_chunk) if policy and policy.attention else None,
    )
