"""``yolo-ckpt train``: every ``yolo train`` argument, with its syntax and defaults, plus yolo-ckpt's keys; with no
``data=`` the task's built-in synthetic dataset, with no ``model=`` the task's nano YAML
(:data:`yolo_ckpt.config.DEFAULT_MODELS`), nothing downloaded."""

from __future__ import annotations

import sys
from pathlib import Path

from ..config import DEFAULT_MODELS, CkptConfig
from ..errors import ConfigError, user_input
from .args import parse_train_args
from .console import diagnostics_to_stderr


def train(args: list[str]):
    """``yolo-ckpt train``: the model trained with the checkpointed trainer of its task (:func:`prepare_train`).

    Returns:
        The trainer's metrics (``model.train``'s result); None where ``resume`` only finished a run's end.

    Examples:
        >>> train(["model=yolo11n.yaml", "data=coco8.yaml", "imgsz=1280", "recompute=auto", "memory_budget=4GB"])
        >>> train(["resume", "model=runs/detect/train/weights/last.pt"])  # exact resume

    Raises:
        ConfigError: as :func:`prepare_train` raises, and for a ``data=`` Ultralytics cannot read (its
            ``Dataset '...' error``, the run folder put back).
    """
    prepared = prepare_train(args)
    if prepared is None:  # resume finished a run's end (its line printed): nothing to train
        return None
    model, trainer, overrides = prepared
    try:
        return model.train(trainer=trainer, **overrides)
    except RuntimeError as e:  # bad data=: Ultralytics' get_dataset raises "Dataset '...' error ..." (run dir put back)
        if not str(e).startswith("Dataset '"):
            raise
        raise ConfigError(str(e).splitlines()[0]) from e


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
        SyntaxError: for unknown keys or a key without a value.
        ConfigError: for an invalid yolo-ckpt key, an unknown task, a missing or unreadable ``cfg=`` file or model, a
            ``recompute=`` the model does not have, ``resume`` of a finished run, or Ultralytics' own error for its
            saved arguments (:func:`yolo_ckpt.train.resume.check_resumable`). All before any run directory is created.
    """
    overrides = parse_train_args(args)  # argument errors before torch is imported
    from ultralytics import RTDETR, YOLO

    from ..checkpointing.model_file import layout_of
    from ..train.inputs import check_data_for_task, check_train_inputs
    from ..train.resume import check_resumable, finish_run
    from ..train.trainer import trainer_for

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
            with diagnostics_to_stderr():
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
