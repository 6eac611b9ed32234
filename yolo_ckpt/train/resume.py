"""Resuming a run: whether its ``last.pt`` can be resumed, decided before any trainer is built.

A finished run's ``last.pt`` is stripped (Ultralytics' ``strip_optimizer``: ``optimizer`` None, ``epoch`` -1). Stock
``Model.train(resume=True)`` then warns and starts a new run with the defaults (``ultralytics/engine/model.py``,
``Model.train``: resumable iff ``epoch >= 0`` and ``optimizer`` is not None), whose ``data=coco8.yaml`` downloads;
``resume=path/to/last.pt`` fails later, in ``BaseTrainer.resume_training``'s assert (``0 < epoch + 1 < epochs``).
"""

from __future__ import annotations

from pathlib import Path

from ..errors import ConfigError


def is_finished(ckpt: dict) -> bool:
    """Whether the checkpoint dict ``ckpt`` cannot be resumed: no optimizer state or ``epoch`` < 0 (the rule of
    Ultralytics' ``Model.train``), or its last epoch is the run's last (``BaseTrainer.resume_training``'s assert)."""
    epoch = ckpt.get("epoch", -1)
    epochs = (ckpt.get("train_args") or {}).get("epochs")
    return epoch < 0 or ckpt.get("optimizer") is None or (isinstance(epochs, int) and epoch + 1 >= epochs)


def check_resumable(path, ckpt: dict | None = None) -> None:
    """Raise if the ``last.pt`` at ``path`` (its loaded dict ``ckpt``, if at hand) is of a finished run.

    Raises:
        ConfigError: one line naming the run and the command that starts a new run from its weights
            (``best.pt`` beside it, else ``last.pt``, with the run's ``data=``).
    """
    if ckpt is None:
        from ultralytics.nn.tasks import torch_safe_load

        ckpt = torch_safe_load(str(path))[0]
    if not is_finished(ckpt):
        return
    weights = Path(path)
    best = weights.with_name("best.pt")
    data = (ckpt.get("train_args") or {}).get("data")
    new_run = f"yolo-ckpt train model={best if best.is_file() else weights}" + (f" data={data}" if data else "")
    raise ConfigError(
        f"resume: the run {weights.parent.parent} is finished ({weights} has no optimizer state to resume); start a new run from "
        f"its weights: {new_run}"
    )
