"""Resuming a run: whether its ``last.pt`` can be resumed, decided before any trainer is built; the end a kill
interrupted, finished; and Ctrl-C, which stops a run with a ``last.pt`` that resumes.

A finished run's ``last.pt`` is stripped (Ultralytics' ``strip_optimizer``: ``optimizer`` None, ``epoch`` -1). Stock
``Model.train(resume=True)`` then warns and starts a new run with the defaults (``ultralytics/engine/model.py``,
``Model.train``: resumable iff ``epoch >= 0`` and ``optimizer`` is not None), whose ``data=coco8.yaml`` downloads;
``resume=path/to/last.pt`` fails later, in ``BaseTrainer.resume_training``'s assert (``0 < epoch + 1 < epochs``),
which also refuses a ``last.pt`` saved at the run's last epoch whose end (``BaseTrainer.final_eval``: the strip of
``last.pt`` and ``best.pt``, the validation of ``best.pt``) a kill stopped.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from pathlib import Path

from ..errors import FinishedRunError, Terminated, user_input
from .atomic import atomic_saves, remove_stale_temporaries
from .exact_resume import load_state, remove_state, state_path
from .run_stats import finished_run_report, report_interrupted_end

# where a Ctrl-C that Python swallowed (raised inside a weakref callback or a __del__, "Exception ignored in ...")
# still stops the run: every training step and validation batch, and the ends of set-up and of each epoch
INTERRUPT_POINTS = ("on_pretrain_routine_end", "on_train_batch_end", "on_val_batch_end", "on_fit_epoch_end")


def read_checkpoint(path) -> dict:
    """The checkpoint dict of the ``.pt`` at ``path``, as Ultralytics loads it (``torch_safe_load``).

    Raises:
        ConfigError: for a file that is not a loadable Ultralytics checkpoint (:func:`~yolo_ckpt.errors.user_input`).
    """
    from ultralytics.nn.tasks import torch_safe_load

    with user_input(checkpoint=str(path)):
        return torch_safe_load(str(path))[0]


def is_stripped(ckpt: dict) -> bool:
    """Whether the checkpoint dict ``ckpt`` is a finished run's: no optimizer state or ``epoch`` < 0 (Ultralytics'
    ``strip_optimizer``; the rule of its ``Model.train``)."""
    return ckpt.get("epoch", -1) < 0 or ckpt.get("optimizer") is None


def ended_unstripped(ckpt: dict) -> bool:
    """Whether ``ckpt`` was saved at its run's last epoch and still holds its optimizer state: the run's end (the
    final validation and strip) did not happen, and no epoch is left to train (``resume_training``'s assert)."""
    epochs = (ckpt.get("train_args") or {}).get("epochs")
    return not is_stripped(ckpt) and isinstance(epochs, int) and ckpt["epoch"] + 1 >= epochs


def run_args(weights, ckpt: dict) -> dict:
    """The arguments of the run whose ``last.pt`` is ``weights`` (loaded: ``ckpt``): its ``train_args``, over the run
    folder's ``args.yaml`` (``strip_optimizer`` keeps only Ultralytics' own keys in a stripped checkpoint; the trainer
    wrote yolo-ckpt's into ``args.yaml``)."""
    from ultralytics.utils import YAML

    saved = {}
    with contextlib.suppress(Exception):  # missing or unreadable: the checkpoint's alone
        saved = YAML.load(Path(weights).parent.parent / "args.yaml") or {}
    return {**(saved if isinstance(saved, dict) else {}), **(ckpt.get("train_args") or {})}


def lacks_report(weights, ckpt: dict) -> bool:
    """Whether ``ckpt`` (the ``last.pt`` at ``weights``) is a stripped yolo-ckpt run's whose folder has no run report:
    a kill (SIGKILL, or a SIGTERM where another handler ended the process) stopped its end after the strip."""
    from ..config import DEFAULTS
    from ..report.record import REPORT_NAME

    args = run_args(weights, ckpt)
    return is_stripped(ckpt) and any(k in args for k in DEFAULTS) and not (Path(weights).parent.parent / REPORT_NAME).exists()


def is_finished(ckpt: dict) -> bool:
    """Whether the checkpoint dict ``ckpt`` cannot be resumed: :func:`is_stripped` or :func:`ended_unstripped`."""
    return is_stripped(ckpt) or ended_unstripped(ckpt)


def check_resumable(path, ckpt: dict | None = None, finishes: bool = False) -> bool:
    """Raise if the ``last.pt`` at ``path`` (its loaded dict ``ckpt``, if at hand) cannot be resumed; first remove the
    temporary files killed saves left beside it (:func:`~yolo_ckpt.train.atomic.remove_stale_temporaries`).

    Args:
        finishes: the caller finishes a run whose end a kill stopped (:func:`ended_unstripped`, :func:`lacks_report`,
            :func:`finish_run`): for such a run return True instead of raising.

    Returns:
        True for a run whose end is left to finish (only with ``finishes``); False for a run that resumes.

    Raises:
        ConfigError: Ultralytics' own check of the run's saved arguments (``get_cfg``: ``'epochs=0' is an invalid
            value``), first, as stock's ``check_resume`` raises it (a ValueError) before any other check.
        FinishedRunError: one line naming the run, what is true of its ``last.pt`` (stripped, or saved at the last
            epoch with its optimizer state) and the command that starts a new run from its weights (``best.pt``
            beside it, else ``last.pt``, with the run's ``data=``), or that finishes its end (:func:`finish_run`).
    """
    from ultralytics.cfg import get_cfg

    weights = Path(path)
    remove_stale_temporaries(weights.parent)  # a killed save's, whether the run resumes or is refused
    ckpt = read_checkpoint(path) if ckpt is None else ckpt
    with user_input():
        get_cfg(ckpt.get("train_args") or {})
    if not is_finished(ckpt):
        return False
    if finishes and lacks_report(weights, ckpt):
        return True
    run = weights.parent.parent
    if ended_unstripped(ckpt):
        if finishes:
            return True
        raise FinishedRunError(
            f"resume: the run {run} trained all its {ckpt['epoch'] + 1} epochs and was stopped in its end ({weights} still holds "
            f"its optimizer state; the final validation and strip did not run): no epoch is left to resume; finish it: "
            f"yolo-ckpt train resume model={weights}"
        )
    best = weights.with_name("best.pt")
    data = (ckpt.get("train_args") or {}).get("data")
    new_run = f"yolo-ckpt train model={best if best.is_file() else weights}" + (f" data={data}" if data else "")
    raise FinishedRunError(
        f"resume: the run {run} is finished ({weights} has no optimizer state to resume); start a new run from its weights: {new_run}"
    )


def finish_run(path) -> str:
    """Do what a killed run's end did not (:func:`ended_unstripped`, :func:`lacks_report`), as ``BaseTrainer.final_eval``
    does it: remove the exact resume state (:mod:`~yolo_ckpt.train.exact_resume`; its step times kept for the
    report), strip ``last.pt`` and ``best.pt`` (atomically, :func:`~yolo_ckpt.train.atomic.atomic_saves`; not again
    where they are), then validate ``best.pt`` on the run's data, its plots into the run folder, and write the run
    report (:func:`~yolo_ckpt.train.run_stats.finished_run_report`: the memory probe not measured). Returns the one
    line that says so.

    Raises:
        ConfigError: as validation raises for the run's data (a dataset no longer on disk), after the strip.
    """
    from ultralytics import YOLO
    from ultralytics.utils.torch_utils import strip_optimizer

    last = Path(path)
    best, run = last.with_name("best.pt"), last.parent.parent
    remove_stale_temporaries(last.parent)
    state = load_state(state_path(last.parent))[0]
    remove_state(last.parent)  # nothing is left to resume
    ckpt = read_checkpoint(last)
    args, metrics = run_args(last, ckpt), {}
    if not is_stripped(ckpt):
        with atomic_saves(last.parent):
            ckpt = strip_optimizer(last)
            if best.is_file():
                strip_optimizer(best, updates={"train_results": ckpt.get("train_results")})
    if best.is_file():
        kw = {k: args[k] for k in ("data", "imgsz", "device", "plots", "split", "workers") if k in args}
        if isinstance(args.get("batch"), int) and args["batch"] > 0:  # not batch=-1: AutoBatch is the trainer's
            kw["batch"] = 2 * args["batch"]  # the validation loader's batch in training (DetectionTrainer.get_dataloader)
        with user_input():
            metrics = YOLO(best).val(**kw, project=str(run.parent), name=run.name, exist_ok=True).results_dict
    report = finished_run_report(ckpt, args, metrics, state.get("step_s") if state else None).write(run)
    validated = f", {best.name} validated" if best.is_file() else ""
    return (
        f"resume: the run {run} had trained all its {args.get('epochs')} epochs; its end, stopped by a kill, is done: "
        f"{last.name} and {best.name} stripped{validated}, {report} written (no memory probe)"
    )


def interrupted(last, since: float | None = None) -> str:
    """The line that says what a Ctrl-C left of the run whose ``last.pt`` is ``last``: the epoch it resumes from and
    the command, or that nothing (no checkpoint yet) or only the run's end (:func:`finish_run`) is left.

    Args:
        since: when a new run started (``time.time()``, seconds): a ``last.pt`` older than that is an earlier run's
            in the same folder (``exist_ok=True``), not one this run saved; None for a resumed run.
    """
    last = Path(last)
    if not last.is_file() or (since is not None and last.stat().st_mtime < since):
        return "interrupted before the run saved a checkpoint: nothing to resume"
    ckpt = read_checkpoint(last)
    if ended_unstripped(ckpt):
        return f"interrupted in the run's end (its final validation and strip); finish it: yolo-ckpt train resume model={last}"
    if is_stripped(ckpt):
        return f"interrupted after the run finished: {last} is its final checkpoint"
    epochs = ckpt["train_args"]["epochs"]
    return f"interrupted: {last} holds epoch {ckpt['epoch'] + 1} of {epochs}; resume: yolo-ckpt train resume model={last}"


@contextlib.contextmanager
def stop_on_interrupt(trainer):
    """Inside the block Ctrl-C (SIGINT) stops ``trainer`` with a KeyboardInterrupt whose message is
    :func:`interrupted`'s line, leaving ``last.pt`` as its last complete save.

    Python's default handler raises KeyboardInterrupt in whatever runs when the signal arrives: inside a weakref
    callback or a ``__del__`` (activation checkpointing frees its saved tensors through weakref callbacks many times
    a step) the exception is printed as "Exception ignored in ..." and dropped, and the run trains on to its end. So
    the handler also remembers the signal, and the trainer's callbacks at :data:`INTERRUPT_POINTS` raise it again:
    the run stops within one training step or validation batch at worst. A signal during the save of ``last.pt``
    and its exact resume state waits for both (``trainer.ckpt_state.saving``): a resume then finds the pair of one
    epoch. SIGTERM, where its handler is the
    default (the process ends at once), stops the run the same way, as :class:`~yolo_ckpt.errors.Terminated`. A stop
    in the run's end (its final validation, its memory probe) still writes the run report with what is known
    (:func:`~yolo_ckpt.train.run_stats.report_interrupted_end`). Not in a thread other than the main one
    (where signals are not delivered) nor where SIGINT has another handler than Python's (ignored, or the user's).
    """
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield
        return
    pending = []
    signals = [signal.SIGINT] + ([signal.SIGTERM] if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL else [])

    def stop():
        raise Terminated if pending[-1] == signal.SIGTERM else KeyboardInterrupt

    def handler(signum, frame):
        pending.append(signum)
        if not trainer.ckpt_state.saving:  # mid-save: the next interrupt point raises it, once last.pt and its state are whole
            stop()

    def check(_):
        if pending:
            stop()

    for event in INTERRUPT_POINTS:
        trainer.add_callback(event, check)
    stock = {s: signal.signal(s, handler) for s in signals}
    started = time.time()
    try:
        yield
    except KeyboardInterrupt as e:
        with contextlib.suppress(Exception):  # an unreadable last.pt: the bare KeyboardInterrupt, as stock's
            e.args = (interrupted(trainer.last, None if trainer.args.resume else started),)
        with contextlib.suppress(Exception):  # what is known of an interrupted end; a failure to write it keeps the line
            e.args = ((e.args[0] if e.args else "interrupted") + report_interrupted_end(trainer),)
        raise
    finally:
        for s, stock_handler in stock.items():
            signal.signal(s, stock_handler)
        for event in INTERRUPT_POINTS:
            trainer.callbacks[event].remove(check)
