"""What a matrix cell's planned values become: ``imgsz=fit``, ``batch=-1``, ``recompute=auto`` and relative
``memory_budget=0.6x``, from yolo-ckpt's memory model (:class:`yolo_ckpt.planner.MemoryModel`), the same model the
trainers plan with."""

from __future__ import annotations

import copy

from ultralytics.utils import DEFAULT_CFG

from yolo_ckpt.planner import MemoryModel
from yolo_ckpt.policy import is_auto

from .cells import RelativeBudget, cell_budget


def needs_memory_model(cell: dict) -> bool:
    """Whether a cell has a value only the memory model can settle."""
    relative = isinstance(cell_budget(cell["memory_budget"]), RelativeBudget)
    return is_auto(cell["recompute"]) or cell["batch"] == -1 or cell["imgsz"] == "fit" or relative


def memory_model(model, objects: int, optimizer: str = "AdamW", amp: bool = False) -> MemoryModel:
    """The memory model of ``model``, of any planned task (a CPU copy is estimated; ``objects`` per image for the loss)."""
    probe = copy.deepcopy(model).cpu().train()
    probe.args = DEFAULT_CFG
    return MemoryModel(probe, 640, 2, objects=objects, optimizer=optimizer, amp=amp)


def settle(cell: dict, memory: MemoryModel | None, cuda_available_bytes: int | None = None) -> dict:
    """A cell's concrete ``imgsz``, ``batch``, ``recompute`` (for auto the planned units: layers, head, loss) and ``budget_bytes``.

    ``recompute=auto`` plans the units at the settled imgsz and batch; with ``batch=-1`` it recomputes everything (all)
    and takes the largest batch, as the trainers do. ``imgsz=fit`` is the largest multiple of the model's largest
    stride whose estimated peak fits.

    Raises:
        ValueError: when nothing fits the budget (imgsz or batch 0, or the plan's own error).
    """
    out = {"imgsz": cell["imgsz"], "batch": cell["batch"], "recompute": cell["recompute"], "budget_bytes": None}
    if memory is None:
        return out
    budget = cell_budget(cell["memory_budget"])
    if isinstance(budget, RelativeBudget):
        out["budget_bytes"] = budget.bytes(memory.peak((), cell["batch"], cell["imgsz"]))
    elif budget is not None:
        out["budget_bytes"] = budget.bytes(cuda_available_bytes)
    auto = is_auto(cell["recompute"])
    spec = "all" if auto and cell["batch"] == -1 else cell["recompute"]
    units = () if auto and spec != "all" else memory.units(spec)
    if out["imgsz"] == "fit":
        out["imgsz"] = memory.largest_imgsz(units, out["budget_bytes"], out["batch"], int(max(memory.strides)))
        if out["imgsz"] == 0:
            raise ValueError(f"imgsz=fit: no imgsz fits memory_budget={cell['memory_budget']} at batch={cell['batch']} with recompute={spec}")
    if out["batch"] == -1:
        out["batch"] = memory.largest_batch(units, out["budget_bytes"], out["imgsz"])
        if out["batch"] == 0:
            raise ValueError(f"batch=-1: not even batch 1 fits memory_budget={cell['memory_budget']} at imgsz={out['imgsz']} with recompute={spec}")
    out["recompute"] = memory.plan(out["budget_bytes"], out["batch"], out["imgsz"]).recompute if auto and spec != "all" else spec
    return out


