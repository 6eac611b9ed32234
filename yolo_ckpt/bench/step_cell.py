"""``step`` cells: peak memory and step time of one real training step per policy, against ``recompute=none`` in
the same process.

A step is forward, loss with targets (a fixed number of objects per image on a fixed synthetic batch of the model's
classes, :func:`yolo_ckpt.memory.synthetic_batch.training_batch`), backward and an AdamW step (the optimizer ``optimizer=auto``
picks for short runs, built by Ultralytics' builder; its state exists, as in every step after the first), under
AMP as Ultralytics trains a cell's ``amp``: fp16 autocast on CUDA, fp32 on the CPU (where Ultralytics turns it off). Peak
memory is measured by yolo-ckpt's one step harness, :func:`yolo_ckpt.memory.step.profile_step`, on a copy of the model:
parameters, gradients, optimizer state, the batch and activations; on CUDA the allocator's
``max_memory_allocated`` (less what was on the device before), elsewhere the live tensor storages
(:class:`yolo_ckpt.memory.tracker.LiveTensorTracker`). Step time is the median
over interleaved pairs (cell, baseline): a noisy shared machine slows both alike, and the ratio is what is
reported: the median of the pairs' ratios (each of the cell's steps over the baseline's step beside it), with its
interval: the smallest and the largest of them. Beside it the FLOP bound of
the overhead: the FLOPs of the cell's step as it runs (its recomputed layers and head branches run their forward
again in backward, the attention region rebuilds score rows in its backward), over those of a step without recompute
at the same imgsz and batch, both counted by ``torch.utils.flop_counter`` on a fake pass
(:func:`yolo_ckpt.memory.step_flops`: matrix products and convolutions of the forward and backward; elementwise
work, the attention region's exponentials among it, and the loss are not counted). It is a bound in
FLOPs, not in time: recomputed forward convolutions cost less time per FLOP than a step's average (its backward
convolutions are slower), so measured ratios can come in under it; ``selective`` keeps the outputs of convolutions and
products and recomputes elementwise ops, which it does not count. The recomputations of one step are counted
(:func:`yolo_ckpt.count_recomputations`): modules (layers, inner blocks, head branches), the chunk passes of the
attention region's backward, and, apart, the images whose mask loss the loss region recomputed; a policy that
recomputed nothing would show 0. Exactness: each cell's gradients and BatchNorm statistics after its measured step
(same weights, same batch) are compared with ``torch.equal`` to the baseline's (``same_gradients``).
"""

from __future__ import annotations

import statistics
import time

import torch
from ultralytics import YOLO
from ultralytics.utils import DEFAULT_CFG

from yolo_ckpt import apply_checkpointing, count_recomputations
from yolo_ckpt.memory import amp_enabled, autocast_for, build_optimizer, profile_step, step_flops, training_batch

from .cells import failed
from .planning import needs_memory_model, planned_cell, settle


def measure(cells: list[dict], settings: dict) -> list[dict]:
    """Rows of a group of step cells; ``cells[0]`` is their ``recompute=none`` baseline.

    Args:
        cells: matrix cells (:data:`yolo_ckpt.bench.cells.CELL_KEYS`) of one model.
        settings: ``objects`` per image, ``pairs`` of timed steps, ``device`` (default: CUDA if present), ``seed``.

    Returns:
        Per cell: status, imgsz and batch used, recompute (the layers, for auto), layers recomputed, recomputations
        per step (modules), attention chunk passes per step and images whose mask loss was recomputed per step, peak
        bytes and MiB, median step time (s), time ratio against the baseline of this process (the median of the
        pairs' ratios) with its interval (``time_ratio_low``, ``time_ratio_high``: the extreme ratios of one pair),
        FLOP bound, the FLOPs of a step's forward and backward without recompute (``step_GFLOPs``) and
        ``same_gradients`` (gradients and buffers ``torch.equal`` to the baseline's; None where the cell's imgsz or
        batch differ from it). A cell that raises while it is set up or its
        peak measured gets a ``failed`` row; the others go on.

    Raises:
        Exception: whatever the baseline cell raises (without it there is no ratio), or what a timed step raises;
            the whole group fails.
    """
    device = torch.device(settings["device"] or ("cuda" if torch.cuda.is_available() else "cpu"))
    torch.manual_seed(settings["seed"])
    model = YOLO(cells[0]["model"], task=cells[0]["task"]).model.train()  # the task's model class, built from its YAML
    model.args = DEFAULT_CFG  # the loss's hyperparameters: their values do not change its memory or time
    amp = amp_enabled(cells[0]["amp"], device.type)  # as Ultralytics trains (fp32 on the CPU); one per group: a baseline key
    planned = any(needs_memory_model(c) for c in cells)
    memory = planned_cell(cells[0], model, {**settings, "device": device.type, "optimizer": "AdamW"}).memory_model() if planned else None
    model.to(device)
    optimizer = build_optimizer(model, "AdamW")
    free = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else None
    runs, rows = [], []
    for cell in cells:
        try:
            plan = settle(cell, memory, free)
            batch = training_batch(model, plan["batch"], plan["imgsz"], settings["objects"], settings["seed"])  # kept on
            policy = apply_checkpointing(model, plan["recompute"], mode=cell["recompute_mode"])  # the CPU: no cell's
            autocast = autocast_for(amp, device.type)  # peak may count another cell's batch on the device
            state = {}  # the step's gradients and buffers, against the baseline's
            with count_recomputations() as counter:  # the policy as applied, measured on a copy of the model
                step = profile_step(model, _to(batch, device), None, cell["recompute_mode"], "AdamW", amp, flops=False, state=state)
            peak = step.peak_bytes
            counts = (counter.total, counter.attention_chunks, counter.loss_images)
            cell_flops = step_flops(model, plan["imgsz"], plan["batch"], plan["recompute"], cell["recompute_mode"])
            runs.append((cell, plan, batch, policy, autocast, peak, counts, cell_flops, state))
            rows.append(None)
        except Exception as e:
            if cell is cells[0]:
                raise  # no baseline, no ratios: the whole group fails with this reason
            rows.append(failed(e))
    base_key, base_state = (runs[0][1]["imgsz"], runs[0][1]["batch"]), runs[0][8]
    flops = {base_key: runs[0][7]}  # FLOPs of a step without recompute, by (imgsz, batch)
    for _, plan, *_ in runs:  # a planned cell's own size (fit, batch=-1): a step without recompute there
        if (plan["imgsz"], plan["batch"]) not in flops:
            flops[plan["imgsz"], plan["batch"]] = step_flops(model, plan["imgsz"], plan["batch"])
    times = _interleaved_times(runs, model, optimizer, settings["pairs"])
    for k, ((cell, plan, _, policy, _, peak, counts, cell_flops, state), seconds) in enumerate(zip(runs, times)):
        recomputations, attention_chunks, loss_images = counts
        key = (plan["imgsz"], plan["batch"])
        # pair by pair: in round r the baseline's step after cell k's is its (r * (cells - 1) + k - 1)-th
        ratios = [t / times[0][r * (len(runs) - 1) + k - 1] for r, t in enumerate(seconds)] if k else [1.0]
        rows[cells.index(cell)] = {
            "status": "ok",
            "imgsz_used": plan["imgsz"],
            "batch_used": plan["batch"],
            "budget_MiB": plan["budget_bytes"] / 2**20 if plan["budget_bytes"] else float("nan"),
            "recomputed": policy.spec if cell["recompute"] != policy.spec else "",
            "layers": len(policy.indices),
            "recomputations_per_step": recomputations,
            "attention_chunks_per_step": attention_chunks,
            "loss_images_recomputed_per_step": loss_images,
            "peak_bytes": peak,
            "peak_MiB": peak / 2**20,
            "step_time_s": statistics.median(seconds),
            "time_ratio": statistics.median(ratios),  # of the pairs: a ratio of the two medians can fall outside them
            "time_ratio_low": min(ratios),
            "time_ratio_high": max(ratios),
            "flop_bound": cell_flops / flops[key],
            "step_GFLOPs": flops[key] / 1e9,
            "same_gradients": same_state(state, base_state) if key == base_key else None,
            "device": str(device),
        }
    return rows


def _to(batch: dict, device: torch.device) -> dict:
    """The batch's tensors on ``device``."""
    return {k: v.to(device) for k, v in batch.items()}


def _step(model, optimizer, batch, autocast) -> None:
    """One training step: forward and loss (under autocast for amp), backward, optimizer step."""
    optimizer.zero_grad(set_to_none=True)
    with autocast():
        loss, _ = model.loss(batch)
    loss.sum().backward()
    optimizer.step()


def same_state(a: dict, b: dict) -> bool:
    """Whether two steps' ``state`` (:func:`yolo_ckpt.memory.profile_step`'s: gradients and buffers by name) hold the
    same names and ``torch.equal`` tensors."""
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _interleaved_times(runs, model, optimizer, pairs: int) -> list[list[float]]:
    """Seconds of ``pairs`` steps per run, each step of a cell next to one of the baseline (``runs[0]``)."""
    times = [[] for _ in runs]

    def timed(k: int) -> None:
        cell, plan, batch, _, autocast, *_ = runs[k]
        apply_checkpointing(model, plan["recompute"], mode=cell["recompute_mode"])
        device = next(model.parameters()).device
        batch = _to(batch, device)
        sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        sync()
        t = time.perf_counter()
        _step(model, optimizer, batch, autocast)
        sync()
        times[k].append(time.perf_counter() - t)

    for _ in range(pairs):
        for k in range(1, len(runs)):
            timed(k)
            timed(0)
        if len(runs) == 1:
            timed(0)
    return times
