"""yolo-ckpt: activation checkpointing (recomputation) for Ultralytics YOLO training at full resolution.

The public names load on first use (PEP 562 ``__getattr__``): ``import yolo_ckpt.checkpointing.policy`` or ``import
yolo_ckpt.config`` loads neither Ultralytics nor torch's training stack, while ``from yolo_ckpt import
CheckpointDetectionTrainer`` imports the trainers then. The installed Ultralytics release is checked against the
tested range at import from its package metadata, without importing it.
"""

from __future__ import annotations

import importlib
import warnings
from importlib.metadata import PackageNotFoundError, version

__version__ = "0.1.0"

# The Ultralytics releases this version was tested with (the pin in pyproject.toml): its trainer internals move.
ULTRALYTICS_TESTED = ((8, 4, 190), (8, 5, 0))

# public name -> the module of the package that defines it
_EXPORTS = {
    "apply_checkpointing": "checkpointing.engine",
    "checkpointed_layers": "checkpointing.engine",
    "checkpointed_modules": "checkpointing.engine",
    "count_recomputations": "checkpointing.patching",
    "remove_checkpointing": "checkpointing.engine",
    "ModelLayout": "checkpointing.policy",
    "RecomputePolicy": "checkpointing.policy",
    "resolve": "checkpointing.policy",
    "CheckpointClassificationTrainer": "train.trainer",
    "CheckpointDetectionTrainer": "train.trainer",
    "CheckpointOBBTrainer": "train.trainer",
    "CheckpointPoseTrainer": "train.trainer",
    "CheckpointSegmentationTrainer": "train.trainer",
    "checkpointed": "train.trainer",
    "check_resumable": "train.resume",
    "trainer_for": "train.trainer",
}
__all__ = sorted(_EXPORTS)


def check_ultralytics(installed: str | None = None) -> bool:
    """Warn (and return False) when the installed Ultralytics (``installed``: a version string, default its package
    metadata) is outside :data:`ULTRALYTICS_TESTED`; True inside it, or when Ultralytics is not installed."""
    if installed is None:
        try:
            installed = version("ultralytics")
        except PackageNotFoundError:
            return True
    parsed = tuple(int(p) for p in installed.split(".")[:3] if p.isdigit())
    lo, hi = ULTRALYTICS_TESTED
    if lo <= parsed < hi:
        return True
    warnings.warn(
        f"yolo-ckpt {__version__} was tested with ultralytics>={'.'.join(map(str, lo))},<{'.'.join(map(str, hi))}; "
        f"found {installed}. Its trainer internals may differ: pip install 'ultralytics>=8.4.190,<8.5'",
        stacklevel=2,
    )
    return False


check_ultralytics()


def __getattr__(name: str):
    """Import the module that defines the public ``name`` on its first use (PEP 562)."""
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value  # later look-ups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
