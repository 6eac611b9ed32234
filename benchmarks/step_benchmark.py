"""Peak memory and step time of one training step per recompute policy, against recompute=none in one process.

A training step is forward, loss with targets (a fixed number of objects per image), backward and an SGD step,
on a fixed synthetic batch. Peak memory is the peak live-tensor bytes (parameters, gradients, optimizer state,
activations) counted by yolo_ckpt.memory.LiveTensorTracker. Time: the median over interleaved pairs
(policy, none), so a noisy shared machine slows both alike; the ratio is what is reported. Beside it, the FLOP
lower bound of the overhead: forward FLOPs of the recomputed layers / FLOPs of a whole step without recompute
(torch.utils.flop_counter).

Policies are ``recompute[:recompute_mode]``, e.g. ``all:selective``; several are separated by ``+``.

    python benchmarks/step_benchmark.py model=yolo11n.yaml imgsz=1536 batch=1 objects=20 pairs=7 \
        policies=backbone+all+all:selective out=benchmarks/results/step-yolo11n-1536
"""

from __future__ import annotations

import statistics
import sys
import time

import torch
from torch.utils.flop_counter import FlopCounterMode
from ultralytics.nn.tasks import DetectionModel
from ultralytics.utils import DEFAULT_CFG

from results_io import provenance, publish

from yolo_ckpt import apply_checkpointing
from yolo_ckpt.memory import LiveTensorTracker, detect_batch


def step(model, optimizer, batch) -> None:
    """One training step: forward, loss, backward, optimizer step."""
    optimizer.zero_grad(set_to_none=True)
    loss, _ = model.loss(batch)
    loss.sum().backward()
    optimizer.step()


def peak_bytes(model, optimizer, batch) -> int:
    """Peak live-tensor bytes of one training step, optimizer state and gradients included."""
    step(model, optimizer, batch)  # creates the optimizer state, as in any step after the first
    optimizer.zero_grad(set_to_none=True)
    with LiveTensorTracker() as tracker:
        state = [t for s in optimizer.state.values() for t in s.values()]
        tracker.track(list(model.parameters()), list(model.buffers()), state, batch)
        step(model, optimizer, batch)
    return tracker.peak_bytes


def flops(model, batch, recomputed) -> tuple[int, int]:
    """(FLOPs of one step without recompute, forward FLOPs of the ``recomputed`` layers)."""
    apply_checkpointing(model, "none")
    with FlopCounterMode(display=False) as counter:
        loss, _ = model.loss(batch)
        loss.sum().backward()
    per_module = counter.get_flop_counts()
    model.zero_grad(set_to_none=True)
    with FlopCounterMode(display=False) as fwd:
        model(batch["img"])
    forward = fwd.get_flop_counts()
    layer = sum(sum(forward.get(f"DetectionModel.model.{i}", {}).values()) for i in recomputed)
    return sum(per_module["Global"].values()), layer


def main(argv: list[str]) -> dict:
    opts = dict(a.split("=", 1) for a in argv)
    model_cfg = opts.get("model", "yolo11n.yaml")
    imgsz, bs, objects = int(opts.get("imgsz", 1536)), int(opts.get("batch", 1)), int(opts.get("objects", 20))
    pairs, policies = int(opts.get("pairs", 7)), opts.get("policies", "backbone+all").split("+")
    torch.manual_seed(0)
    model = DetectionModel(model_cfg, verbose=False).train()
    model.args = DEFAULT_CFG
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-6, momentum=0.9)
    batch = detect_batch(bs, imgsz, objects)

    def use(policy: str):
        recompute, _, mode = policy.partition(":")
        return apply_checkpointing(model, recompute, mode=mode or "full")

    rows = {}
    for policy in ["none", *policies]:
        rows[policy] = {"layers": list(use(policy).indices), "peak_bytes": peak_bytes(model, optimizer, batch)}
    times = {p: [] for p in rows}
    for _ in range(pairs):
        for policy in policies:
            for p in (policy, "none"):  # interleaved: each policy next to its baseline
                use(p)
                t = time.perf_counter()
                step(model, optimizer, batch)
                times[p].append(time.perf_counter() - t)
    step_flops = None
    for policy, row in rows.items():
        step_flops, recomputed_flops = flops(model, batch, row["layers"])
        row.update(
            step_time_median_s=statistics.median(times[policy]),
            peak_ratio=row["peak_bytes"] / rows["none"]["peak_bytes"],
            time_ratio=statistics.median(times[policy]) / statistics.median(times["none"]),
            flop_lower_bound_ratio=1 + recomputed_flops / step_flops,
        )
    result = {
        "model": model_cfg,
        "imgsz": imgsz,
        "batch": bs,
        "objects_per_image": objects,
        "pairs": pairs,
        "step_flops": step_flops,
        **provenance(argv),
        "policies": rows,
    }
    lines = [
        f"{model_cfg} imgsz={imgsz} batch={bs} objects={objects}, median of {pairs} interleaved pairs",
        "",
        "| recompute | layers | peak MiB | peak vs none | step s | time vs none | FLOP lower bound |",
        "|---|---|---|---|---|---|---|",
    ]
    for p, r in rows.items():
        lines.append(
            f"| {p} | {len(r['layers'])} | {r['peak_bytes'] / 2**20:.0f} | {r['peak_ratio']:.2f}x | "
            f"{r['step_time_median_s']:.2f} | {r['time_ratio']:.2f}x | {r['flop_lower_bound_ratio']:.2f}x |"
        )
    publish(result, lines, opts.get("out"))
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
