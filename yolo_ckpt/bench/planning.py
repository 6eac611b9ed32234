"""What a matrix cell's planned values become: ``imgsz=fit``, ``batch=-1``, ``recompute=auto`` and relative
``memory_budget=0.6x``, from the run the cell trains planned by the one builder the trainers and ``yolo-ckpt plan``
use (:func:`yolo_ckpt.memory.planning.planned_run`): the same keys give the same spec and estimate, and the same
decision of ``recompute=auto`` and ``batch=-1`` (:func:`yolo_ckpt.memory.planning.decide`)."""

from __future__ import annotations

from ultralytics.cfg import get_cfg
from ultralytics.utils import DEFAULT_CFG, DEFAULT_CFG_DICT

from yolo_ckpt.checkpointing.policy import is_auto
from yolo_ckpt.config import DEFAULTS, CkptConfig
from yolo_ckpt.errors import ConfigError
from yolo_ckpt.memory import ESTIMATE_BASE_BATCH, MemoryModel, PlannedRun, decide, device_type, planned_run

from .cells import RelativeBudget, cell_budget

BASE_IMGSZ = 640  # the base pass of a cell whose imgsz is planned (fit); batch=-1's: ESTIMATE_BASE_BATCH, as train's


def needs_memory_model(cell: dict) -> bool:
    """Whether a cell has a value only the memory model can settle."""
    relative = isinstance(cell_budget(cell["memory_budget"]), RelativeBudget)
    return is_auto(cell["recompute"]) or cell["batch"] == -1 or cell["imgsz"] == "fit" or relative


def planned_cell(cell: dict, model, settings: dict, data: dict | None = None) -> PlannedRun:
    """The run ``cell`` trains (or steps), planned as ``yolo-ckpt train`` plans the same keys.

    Args:
        cell: the matrix cell (:data:`.cells.CELL_KEYS`); its Ultralytics keys (task, imgsz, batch, amp) and
            yolo-ckpt's (recompute_mode; memory_budget in bytes or a CUDA fraction, whose headroom a CUDA plan keeps).
        model: the cell's Ultralytics model (with the data's classes).
        settings: the matrix's settings: every ``yolo train`` key among them is the run's (epochs, optimizer,
            mosaic, ...), as is every yolo-ckpt key that is not a cell key (``memory_headroom``, ``loss_chunk``, ...),
            ``device`` the device it runs on (default: the one ``train`` would use), and a step cell's ``objects`` per
            image.
        data: the dataset dict the trainer reads (``check_det_dataset``), or None (a step cell: ``objects``).
    """
    keys = {k: v for k, v in {**settings, **cell}.items() if k in DEFAULT_CFG_DICT and v is not None}
    keys["imgsz"] = cell["imgsz"] if cell["imgsz"] != "fit" else BASE_IMGSZ
    keys["batch"] = cell["batch"] if cell["batch"] != -1 else ESTIMATE_BASE_BATCH
    budget = cell["memory_budget"] if not isinstance(cell_budget(cell["memory_budget"]), RelativeBudget) else None
    given = {k: settings[k] for k in DEFAULTS if k in settings}  # the matrix's memory_headroom=, loss_chunk=, ... as train reads them
    config = CkptConfig.from_args({**given, "recompute_mode": cell["recompute_mode"], "memory_budget": budget})
    objects = None if data is not None else settings.get("objects")
    return planned_run(get_cfg(DEFAULT_CFG, keys), model, config, device_type(settings.get("device")), data, objects=objects)


def settle(cell: dict, memory: MemoryModel | None, cuda_available_bytes: int | None = None) -> dict:
    """A cell's concrete ``imgsz``, ``batch``, ``recompute`` (for auto the planned units: layers, head, loss) and ``budget_bytes``.

    ``recompute=auto`` and ``batch=-1`` are decided as the trainers decide them (:func:`~yolo_ckpt.memory.planning.decide`:
    ``auto`` plans the units at the settled imgsz and batch; with ``batch=-1`` it recomputes everything, ``all``, and takes
    the largest batch). ``imgsz=fit``, first, is the largest multiple of the model's largest stride whose estimated peak
    fits (with ``auto`` at a given batch: ``none``'s).

    Raises:
        ValueError: when nothing fits the budget (ConfigError for imgsz, PlanError for the batch or the plan).
    """
    out = {"imgsz": cell["imgsz"], "batch": cell["batch"], "recompute": cell["recompute"], "budget_bytes": None}
    if memory is None:
        return out
    budget = cell_budget(cell["memory_budget"])
    if isinstance(budget, RelativeBudget):
        out["budget_bytes"] = budget.bytes(memory.peak((), cell["batch"], cell["imgsz"]))
    elif budget is not None:
        out["budget_bytes"] = budget.bytes(cuda_available_bytes)
    if out["imgsz"] == "fit":
        spec = decide(cell["recompute"], cell["batch"]).recompute  # 'all' for auto with batch=-1; auto at a batch: planned next
        units = () if is_auto(spec) else memory.units(spec)
        out["imgsz"] = memory.largest_imgsz(units, out["budget_bytes"], out["batch"])  # on the training size's grid
        if out["imgsz"] == 0:
            raise ConfigError(
                f"imgsz=fit: no imgsz fits memory_budget={cell['memory_budget']} at batch={cell['batch']} with recompute={spec}"
            )
    decision = decide(cell["recompute"], out["batch"], memory, out["budget_bytes"], out["imgsz"])
    out["batch"], out["recompute"] = decision.batch, decision.recompute
    return out


