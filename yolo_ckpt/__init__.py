"""yolo-ckpt: activation checkpointing (recomputation) for Ultralytics YOLO training at full resolution."""

from __future__ import annotations

import warnings

import ultralytics

__version__ = "0.1.0"

# The Ultralytics releases this version was tested with (the pin in pyproject.toml): its trainer internals move.
ULTRALYTICS_TESTED = ((8, 4, 190), (8, 5, 0))


def _check_ultralytics(version: str = ultralytics.__version__) -> bool:
    """Warn (and return False) when the installed Ultralytics is outside the tested range."""
    parsed = tuple(int(p) for p in version.split(".")[:3] if p.isdigit())
    lo, hi = ULTRALYTICS_TESTED
    if lo <= parsed < hi:
        return True
    warnings.warn(
        f"yolo-ckpt {__version__} was tested with ultralytics>={'.'.join(map(str, lo))},<{'.'.join(map(str, hi))}; "
        f"found {version}. Its trainer internals may differ: pip install 'ultralytics>=8.4.190,<8.5'",
        stacklevel=2,
    )
    return False


_check_ultralytics()

from .engine import (  # noqa: E402
    apply_checkpointing,
    checkpointed_layers,
    checkpointed_modules,
    count_recomputations,
    remove_checkpointing,
)
from .policy import ModelLayout, RecomputePolicy, resolve  # noqa: E402
from .trainer import (  # noqa: E402
    CheckpointClassificationTrainer,
    CheckpointDetectionTrainer,
    CheckpointOBBTrainer,
    CheckpointPoseTrainer,
    CheckpointSegmentationTrainer,
    checkpointed,
    trainer_for,
)

__all__ = [
    "CheckpointClassificationTrainer",
    "CheckpointDetectionTrainer",
    "CheckpointOBBTrainer",
    "CheckpointPoseTrainer",
    "CheckpointSegmentationTrainer",
    "ModelLayout",
    "RecomputePolicy",
    "apply_checkpointing",
    "checkpointed",
    "checkpointed_layers",
    "checkpointed_modules",
    "count_recomputations",
    "remove_checkpointing",
    "resolve",
    "trainer_for",
]
