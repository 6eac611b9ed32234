"""A matrix cell: its keys and defaults, its budget (:func:`cell_budget`), the settings a kind of matrix shares, a
cell's names and its failed row.

Imported by the matrix reader (:mod:`.matrix`) and by the cells that run (:mod:`.step_cell`, :mod:`.train_cell`)
and the tables (:mod:`.tables`); it imports none of them, so the bench's modules import in one direction.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from pathlib import Path

from yolo_ckpt.checkpointing.policy import spec_string
from yolo_ckpt.config import Budget
from yolo_ckpt.errors import ConfigError

CELL_KEYS = {  # key: default
    "study": "",  # a free label that groups cells, e.g. "same-settings"
    "model": "yolo11n.yaml",
    "task": None,  # default: the model's
    "dataset": "synthetic",  # train cells only
    "imgsz": 640,  # an int, or "fit": the largest that fits memory_budget with the cell's policy
    "batch": 2,  # -1: the largest that fits memory_budget with the cell's policy
    "amp": False,
    "recompute": "none",
    "recompute_mode": "full",
    "memory_budget": None,  # bytes with a unit; "0.6x" (step cells): 0.6 x the estimated peak of recompute=none
    "tiles": None,  # train cells: {size: px or fit, overlap: px}: train on tiles of the images at imgsz, validate on the images
    "hybrid": False,  # with tiles: the tiles train all but the last close_mosaic epochs, the full images at imgsz those (.hybrid)
}
# generated when a cell runs: the task's synthetic set; small_object_dataset() at the image side each name gives
SMALL_OBJECT_SETS = {"small-objects": 320, "small-objects-640": 640}
BUILT_IN_DATASETS = ("synthetic", *SMALL_OBJECT_SETS)
SETTINGS = {
    "step": {"objects": 20, "pairs": 5, "device": None, "seed": 0},
    "train": {"val_images": None, "device": None},  # plus any 'yolo train' argument
}


@dataclass(frozen=True)
class RelativeBudget:
    """A step cell's ``memory_budget: 0.6x`` (bench only): ``factor`` x the estimated ``recompute=none`` peak at the
    cell's imgsz and batch."""

    factor: float

    def bytes(self, none_peak_bytes: int) -> int:
        """The budget in bytes for a ``recompute=none`` estimated peak of ``none_peak_bytes``."""
        return int(self.factor * none_peak_bytes)


def cell_budget(value) -> Budget | RelativeBudget | None:
    """A cell's ``memory_budget`` value: None (unset), a :class:`RelativeBudget` for ``"0.6x"``, else
    :meth:`yolo_ckpt.config.Budget.parse`'s (bytes with a unit, or a CUDA fraction).

    Raises:
        ValueError: naming the value and the valid forms.
    """
    if value is None:
        return None
    if isinstance(value, str) and value.strip().endswith("x"):
        try:
            factor = float(value.strip()[:-1])
        except ValueError:
            factor = math.nan
        if not 0 < factor < math.inf:
            raise ConfigError(
                f"memory_budget={value!r} is not valid; valid: bytes with a unit (2GB), a fraction of the CUDA memory (0.6) or a "
                "factor of the recompute=none peak (0.6x)"
            )
        return RelativeBudget(factor)
    return Budget.parse(value)


def is_none(cell: dict) -> bool:
    """Whether a cell is a baseline (no recomputation)."""
    return spec_string(cell["recompute"]).strip().lower() in {"none", ""} and cell["recompute_mode"] == "full"


def cell_id(cell: dict) -> str:
    """A cell's stable name in ``results.csv``: its keys and values, ``model=yolo11n.yaml,imgsz=640,...``
    (``tiles`` and ``hybrid`` only when set, so the names of cells from before those keys stay as they were)."""
    unset = {"tiles": None, "hybrid": False}
    return ",".join(f"{k}={spec_string(v) if k == 'recompute' else v}" for k, v in cell.items() if not (k in unset and v is unset[k]))


def run_name(cell: dict) -> str:
    """A short, file-safe run directory name for a cell: readable prefix and a hash of its id."""
    digest = hashlib.sha1(cell_id(cell).encode()).hexdigest()[:8]
    stem = Path(str(cell["model"])).stem
    recompute = spec_string(cell["recompute"]).replace(",", "+")[:20]
    return (
        f"{cell['study'] or 'cell'}-{Path(str(cell['dataset'])).stem}-{stem}-{cell['imgsz']}-{recompute}-{cell['recompute_mode']}-{digest}"
    )


def failed(error: BaseException) -> dict:
    """The row of a cell that raised: status ``failed`` and the reason (``OutOfMemoryError: ...``)."""
    reason = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
    return {"status": "failed", "reason": reason[:300]}
