"""yolo-ckpt: activation checkpointing (recomputation) for Ultralytics YOLO training at full resolution.

The public names load on first use (PEP 562 ``__getattr__``, made by ``lazy_loader.attach``: Scientific Python's
SPEC 1): ``import yolo_ckpt.checkpointing.policy`` or ``import yolo_ckpt.config`` loads neither Ultralytics nor
torch's training stack, while ``from yolo_ckpt import CheckpointDetectionTrainer`` imports the trainers then.
The installed Ultralytics release is checked against the tested range at import from its package metadata, without
importing it.
"""

from __future__ import annotations

import warnings
from importlib.metadata import PackageNotFoundError, version

import lazy_loader

__version__ = "0.1.0"

# The Ultralytics releases this version was tested with (the pin in pyproject.toml): its trainer internals move.
ULTRALYTICS_TESTED = ((8, 4, 190), (8, 5, 0))

# the module of the package that defines them -> public names
__getattr__, __dir__, __all__ = lazy_loader.attach(__name__, submod_attrs={
    "checkpointing.engine": [
        "apply_checkpointing", "checkpointed_layers", "checkpointed_modules", "remove_checkpointing",
    ],
    "checkpointing.patching": ["count_recomputations"],
    "checkpointing.policy": ["ModelLayout", "RecomputePolicy", "resolve"],
    "train.trainer": [
        "CheckpointClassificationTrainer", "CheckpointDetectionTrainer", "CheckpointOBBTrainer",
        "CheckpointPoseTrainer", "CheckpointSegmentationTrainer", "checkpointed", "trainer_for",
    ],
    "train.resume": ["check_resumable"],
})


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

