"""What sets the floor of ``recompute=all`` at high resolution (issue 45's item 3): every storage alive at the peak of one
training step, in bytes, grouped by what made it (parameters, gradients, the optimizer state, the input batch, the
outputs each layer's forward left alive, the loss, the recomputation running, the attention region's chunks), on the
CPU in float32, counted by the live tensor tracker with a tag per storage.

    python -m benchmarks.high_resolution.floor model=yolo11n.yaml imgsz=3072 [batch=1] [recompute=all] [attn_chunk=256] \\
        [out=folder]

The step is :func:`yolo_ckpt.memory.step.profile_step`'s on the CPU (the same copy, policy, AdamW, loss, per-layer
accounting and :func:`~yolo_ckpt.memory.step.run_step`), its peak equal to the harness's: the tracker
(:class:`~yolo_ckpt.memory.tracker.LiveTensorTracker` with a ``tagger``) snapshots the storages alive at each phase's
peak, each tagged at creation with the phase, the module whose forward was running (the recomputation, in backward)
and the layer whose backward was running. AdamW's state, which the harness adds to the earlier phases' peaks (one
step stands for a steady-state one), is its own group. Per layer, the same groups at its backward peak, and that peak
with the parameter-free layers folded into the region after them (:func:`fold_saving`: an estimate where the engine
does not fold them, the measurement where it does). With ``out=`` (``benchmarks/results/attention-floor-folded``) the
groups go to ``<model>-<imgsz>-b<batch>-<recompute>-alive.csv`` and the layers (held at the peak, each layer's forward
and backward peak) to ``...-layers.csv``; ``result.md`` tables every run in the folder; ``record.json`` ties the last
run to its commit, the earlier runs kept under ``earlier_runs``.
"""

from __future__ import annotations

import copy
import csv
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import torch

from yolo_ckpt.bench.results_io import provenance, publish, with_earlier_runs
from yolo_ckpt.checkpointing.chunks import DEFAULT_ATTN_CHUNK, check_attn_chunk
from yolo_ckpt.cli.args import parse_keys
from yolo_ckpt.cli.main import run_command
from yolo_ckpt.memory.tracker import LiveTensorTracker

KEYS = ("model", "imgsz", "batch", "recompute", "attn_chunk", "out")  # the key=value words main takes
PHASES = ("tracked", "forward", "loss", "backward", "optimizer")  # run_step's phases, in order, after tracking
GRADIENT = "gradient"  # the tag of a parameter's gradient
MiB = 2**20


class PhaseTracker(LiveTensorTracker):
    """The live tensor tracker with a tagger, keeping each phase's peak snapshot, ``snapshots[phase] = (peak bytes,
    {storage key: (bytes, tag)})`` (``phase`` an index of :data:`PHASES`), and each layer's backward peak snapshot,
    ``backward[layer]`` alike (the segments :class:`~yolo_ckpt.memory.layer_accounting.LayerAccounting` marks)."""

    def __init__(self, tagger):
        super().__init__(tagger)
        self.phase = 0
        self.snapshots: dict[int, tuple[int, dict]] = {}
        self.backward: dict[int, tuple[int, dict]] = {}
        self.accounting = None

    def mark(self) -> int:
        peak = super().mark()
        # the accounting marks as a layer's backward ends, before it moves on: in_backward is the layer just ended
        layer = self.accounting.in_backward if self.accounting is not None else None
        if PHASES[self.phase] == "backward" and layer is not None and peak >= self.backward.get(layer, (0,))[0]:
            self.backward[layer] = (peak, self.marked_storages)
        return peak

    def start_phase(self) -> int:
        self.close_phase()
        self.phase += 1
        return super().start_phase()

    def close_phase(self) -> None:
        """Keep this phase's peak and its storages (the last phase's: call it after the step)."""
        self.snapshots[self.phase] = (self.phase_peak_bytes, dict(self.phase_peak_storages))


def measure(model: str, imgsz: int, batch: int, recompute: str, attn_chunk: int) -> dict:
    """One training step of ``model`` on :func:`~yolo_ckpt.memory.training_batch` (``batch`` images of
    ``imgsz``, 20 boxes each), ``recompute`` applied, tracked with tags. Returns ``peak_bytes`` (the harness's: the
    optimizer state counted in every phase before its own), ``phase`` (where the peak is), ``moment`` (the tag of the
    storage that made it), ``alive`` (group rows), ``layers`` (per-layer rows), ``state_bytes``, ``phase_peaks`` (MiB),
    ``seconds``, ``recomputations`` and ``attention_chunk_passes``."""
    from ultralytics import YOLO
    from ultralytics.utils import DEFAULT_CFG

    from yolo_ckpt import count_recomputations
    from yolo_ckpt.checkpointing.attention import in_chunked_attention
    from yolo_ckpt.checkpointing.engine import FoldedLayer, apply_checkpointing, checkpointed_layers, folded_layers, layer_inputs
    from yolo_ckpt.memory import build_optimizer, training_batch
    from yolo_ckpt.memory.layer_accounting import LayerAccounting
    from yolo_ckpt.memory.step import run_step

    torch.manual_seed(0)
    net = YOLO(model).model
    net.args = DEFAULT_CFG
    data = training_batch(net, batch, imgsz, 20)
    probe = copy.deepcopy(net).train()  # as profile_step: a copy, the policy, Ultralytics' optimizer, the accounting
    spec = apply_checkpointing(probe, recompute, attn_chunk=attn_chunk).spec
    opt = build_optimizer(probe, "AdamW")
    accounting = LayerAccounting(probe)
    # a module's qualified name; one shared by several parents (Conv.default_act, one SiLU for every Conv) by its type
    shared = Counter(id(m) for _, m in probe.model.named_modules(remove_duplicate=False))
    names = {id(m): name if shared[id(m)] == 1 else f"{type(m).__name__} (shared)" for name, m in probe.model.named_modules() if name}
    running: list[str] = []  # the modules whose forward runs now, innermost last (recomputations in backward)

    def tag():
        """(phase, outermost and innermost module running, the layer whose backward runs, in the attention region)"""
        outer, inner = (running[0], running[-1]) if running else (None, None)
        return tracker.phase, outer, inner, accounting.in_backward, in_chunked_attention()

    def enter(module, args):
        if id(module) in names:
            running.append(names[id(module)])

    def leave(module, args, output):
        if id(module) in names:
            running.pop()

    tracker = PhaseTracker(tag)
    accounting.tracker = tracker  # the layer whose backward runs, and each layer's forward and backward peak
    tracker.accounting = accounting
    handles = [
        torch.nn.modules.module.register_module_forward_pre_hook(enter),
        # always: a recomputation stopped early (non-reentrant checkpoint stops once it has what backward needs)
        torch.nn.modules.module.register_module_forward_hook(leave, always_call=True),
        *(p.register_post_accumulate_grad_hook(lambda p: tracker.retag(p.grad, GRADIENT)) for p in probe.parameters() if p.requires_grad),
    ]
    try:
        with count_recomputations() as counter, tracker:
            tracker.track(list(probe.parameters()), list(probe.buffers()), data)
            t = time.perf_counter()
            peaks, _, state = run_step(probe, data, opt, lambda preds: probe.loss(data, preds)[0].sum(), tracker)
            seconds = time.perf_counter() - t
            tracker.close_phase()
    finally:
        accounting.remove()
        for h in handles:
            h.remove()
    # the harness's peak (run_step's peaks: the state added before the optimizer phase) and the phase that holds it
    phase = max(range(1, len(PHASES)), key=lambda p: peaks[PHASES[p]])
    peak_bytes, storages = tracker.snapshots[phase]
    stateful = PHASES[phase] != "optimizer"
    assert peak_bytes + (state if stateful else 0) == peaks[PHASES[phase]], "the snapshot is not the harness's peak"

    def key_set(tensors):
        return {t.untyped_storage()._cdata for t in tensors}

    params, buffers = key_set(probe.parameters()), key_set(probe.buffers())
    images = key_set(v for v in data.values() if isinstance(v, torch.Tensor))
    types = [str(m.type).rsplit(".", 1)[-1] for m in probe.model]
    stock_rows = {r.index: r for r in accounting.profile_rows(probe, {})[0]}
    outputs = {i: r.output_bytes for i, r in stock_rows.items()}
    regions = folded_layers(probe, set(checkpointed_layers(probe)))
    sources = {i: layer_inputs(probe.model, i) for i in range(len(types))}

    def grouped(snapshot: dict) -> tuple[dict, dict]:
        alive: dict[tuple, int] = defaultdict(int)
        held: dict[int, int] = defaultdict(int)  # bytes held from each layer's forward
        for key, (nbytes, label) in snapshot.items():
            alive[group(key, label, params, buffers, images, types)] += nbytes
            if label != GRADIENT and label[0] == PHASES.index("forward") and label[1] is not None:
                held[int(label[1].split(".")[0])] += nbytes
        if PHASES[phase] != "optimizer":
            alive[("optimizer state", "", "", "AdamW's exp_avg and exp_avg_sq, carried by every step after the first")] += state
        return alive, held

    alive, held = grouped(storages)
    rows = [
        {"group": g, "layer": layer, "type": kind, "what": what, "MiB": round(n / MiB, 1), "bytes": n}
        for (g, layer, kind, what), n in sorted(alive.items(), key=lambda kv: -kv[1])
    ]
    layers = []
    for i in range(len(types)):
        bytes_at, snapshot = tracker.backward.get(i, (0, {}))
        sums, held_i = grouped(snapshot)
        share = defaultdict(int)
        for (g, layer, _, _), n in sums.items():
            share["held (parameter-free layers)" if g == "held from the forward" and layer and int(layer) in regions else g] += n
        layers.append({
            "layer": i, "type": types[i], "recomputed": stock_rows[i].recompute or "no", "output_MiB": round(outputs[i] / MiB, 1),
            "held_at_peak_MiB": round(held.get(i, 0) / MiB, 1),
            "forward_peak_MiB": round((accounting.forward_peaks.get(i, 0) + state) / MiB, 1),
            "backward_peak_MiB": round((bytes_at + state) / MiB, 1) if snapshot else "",
            **{f"at_backward_peak_{g.replace(' ', '_')}_MiB": round(share.get(g, 0) / MiB, 1) for g in BACKWARD_GROUPS},
            "folded_estimate_MiB": round((bytes_at + state - fold_saving(i, held_i, regions, sources, outputs)) / MiB, 1)
            if snapshot else "",
        })
    return {
        "model": model, "imgsz": imgsz, "batch": batch, "recompute": spec, "attn_chunk": attn_chunk,
        "peak_bytes": peak_bytes + (state if stateful else 0), "phase": PHASES[phase],
        "moment": describe(next(reversed(storages.values()))[1], types),
        "state_bytes": state, "phase_peaks_MiB": {k: round(v / MiB, 1) for k, v in peaks.items()}, "seconds": round(seconds, 1),
        "recomputations": counter.total, "attention_chunk_passes": counter.attention_chunks,
        "folded_regions": {str(j): c for j, c in regions.items()}, "engine_folds": any(isinstance(m, FoldedLayer) for m in probe.model),
        "alive": rows, "layers": layers,
    }


# the groups of a layer's backward peak in the layers CSV: the held outputs split into the parameter-free layers'
# (Upsample, Concat: the ones a fold frees) and the rest
BACKWARD_GROUPS = (
    "held from the forward", "held (parameter-free layers)", "recomputation", "attention region", "backward", "loss",
    "gradients", "parameters", "buffers", "input batch", "optimizer state",
)


def fold_saving(moment: int, held: dict[int, int], regions: dict[int, int], sources: dict[int, list[int]], outputs: dict[int, int]) -> int:
    """Bytes folding the parameter-free layers ``regions`` (:func:`yolo_ckpt.checkpointing.engine.folded_layers`) frees at
    the backward peak of layer ``moment``, from what was held then without the fold (``held``: bytes held from each
    layer's forward; ``sources``: each layer's :func:`~yolo_ckpt.checkpointing.engine.layer_inputs`; ``outputs``: each
    layer's output bytes): each region not yet
    backpropagated (its folded outputs still held) stops holding them and holds the folded layers' inputs instead,
    those not held anyway counted once; a region whose own backward runs now rebuilds its folded outputs, so only
    its new inputs count, as a cost."""
    layers_of = defaultdict(set)
    for j, c in regions.items():
        layers_of[c].add(j)
    saving, new = 0, set()
    for c, folded in layers_of.items():
        inputs = {k for j in folded for k in sources[j]} - folded
        running = moment == c or moment in folded
        if running or any(held.get(j, 0) for j in folded):
            saving += 0 if running else sum(held.get(j, 0) for j in folded)
            new |= {k for k in inputs if not held.get(k, 0)}
    return saving - sum(outputs[k] for k in new)


def group(key: int, label, params: set, buffers: set, images: set, types: list[str]) -> tuple[str, str, str, str]:
    """The group of a storage alive at the peak, from its key and tag: ``(group, layer, layer type, what)``."""
    if label == GRADIENT:
        return "gradients", "", "", "of the parameters whose backward has run"
    if key in params or key in buffers or key in images:
        return ("parameters" if key in params else "buffers" if key in buffers else "input batch"), "", "", ""
    phase, module, _, in_backward, in_attention = label
    layer = module.split(".")[0] if module else ("" if in_backward is None else str(in_backward))
    kind = types[int(layer)] if layer else ""
    if PHASES[phase] == "forward":
        return "held from the forward", layer, kind, "outputs (and what a layer not recomputed saves)"
    if PHASES[phase] == "loss":
        return "loss", "", "", "what the loss keeps for its backward"
    if PHASES[phase] == "backward" and in_attention:
        return "attention region", layer, kind, "chunk working set (its forward in a recomputation, its backward)"
    if PHASES[phase] == "backward" and module:
        return "recomputation", layer, kind, "what the recomputed forward saves for the layer's backward"
    if PHASES[phase] == "backward":
        return "backward", layer or "loss", kind, "gradients of activations and backward temporaries"
    return PHASES[phase], "", "", ""


def describe(label, types: list[str]) -> str:
    """The moment a tag was made, in words."""
    if label == GRADIENT:
        return "a parameter's gradient"
    phase, _, module, in_backward, in_attention = label
    where = f" of layer {in_backward} ({types[in_backward]})" if in_backward is not None else ""
    inside = f", in {module}" if module else ""
    inside += " (attention region)" if in_attention else ""
    return f"{PHASES[phase]}{where}{inside}"


def main(argv: list[str]) -> dict:
    opts = parse_keys(argv, KEYS, "benchmarks.high_resolution.floor")
    model, imgsz, batch = str(opts.get("model", "yolo11n.yaml")), int(opts.get("imgsz", 3072)), int(opts.get("batch", 1))
    recompute, attn_chunk = opts.get("recompute", "all"), check_attn_chunk(opts.get("attn_chunk", DEFAULT_ATTN_CHUNK))
    out = opts.get("out")
    run = measure(model, imgsz, batch, recompute, attn_chunk)
    stem = f"{Path(model).stem}-{imgsz}-b{batch}-{opts.get('recompute', 'all')}"
    summary = {k: v for k, v in run.items() if k not in ("alive", "layers")}
    result = provenance(["python -m benchmarks.high_resolution.floor", *argv], seeds=[0])
    runs = {stem: summary}
    if out:
        folder = Path(out)
        folder.mkdir(parents=True, exist_ok=True)
        for name, rows in (("alive", run["alive"]), ("layers", run["layers"])):
            with open(folder / f"{stem}-{name}.csv", "w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=list(rows[0]))
                w.writeheader()
                w.writerows(rows)
        earlier = with_earlier_runs(dict(result), folder)
        from yolo_ckpt.bench.results_io import read_record

        runs = {**(read_record(folder) or {}).get("runs", {}), stem: summary}
        result = {**earlier, "runs": runs}
    else:
        result = {**result, "runs": runs}
    publish(result, report(runs, Path(out) if out else None, run), out)
    return result


def report(runs: dict, folder: Path | None, run: dict) -> list[str]:
    """``result.md``'s lines: per run, its peak and where, the groups alive then and the layers (from ``folder``'s CSVs,
    or ``run``'s rows without a folder)."""
    lines = [
        "What is alive at the peak of one training step, CPU float32, live tensors tagged at creation, a grid of 20 boxes.",
        "Groups: `held from the forward` are the outputs a layer's forward left alive (a recomputed layer keeps only its",
        "inputs, so these are the region boundaries; the head's are what the loss saved of the predictions, which the",
        "step drops once the loss has them), `recomputation` what the recomputed forward of the layer being",
        "backpropagated saved, `backward`",
        "gradients of activations and temporaries, `attention region` its chunks.",
        "Per layer: its output, what its forward left alive at the step's peak, its forward and backward peaks and what",
        "was alive at its backward peak by group (`held (parameter-free layers)`: the Upsample and Concat outputs kept",
        "as region inputs), and the backward peak estimated with those layers folded into the region after them",
        "(`fold_saving`: the region keeps their inputs instead).",
    ]
    for stem, s in sorted(runs.items()):
        alive = list(csv.DictReader(open(folder / f"{stem}-alive.csv"))) if folder else run["alive"]
        layers = list(csv.DictReader(open(folder / f"{stem}-layers.csv"))) if folder else run["layers"]
        folded = max(float(r["folded_estimate_MiB"] or 0) for r in layers)
        rest = max(v for k, v in s["phase_peaks_MiB"].items() if k != "backward")
        pairs = ", ".join(f"{j} into {c}" for j, c in s["folded_regions"].items())
        lines += [
            "", f"## {s['model']} {s['imgsz']} px, batch {s['batch']}, recompute={s['recompute']}", "",
            f"Peak {s['peak_bytes'] / MiB:.1f} MiB in the {s['phase']} phase, made by: {s['moment']}. Phase peaks (MiB): "
            + ", ".join(f"{k} {v}" for k, v in s["phase_peaks_MiB"].items())
            + f". Step {s['seconds']} s; {s['recomputations']} recomputations, {s['attention_chunk_passes']} attention chunk passes. "
            + (
                f"The engine folds the parameter-free layers {pairs} into the region after them."
                if s.get("engine_folds")
                else f"Folding the parameter-free layers {pairs} into the region after them: backward peak estimated at "
                f"{folded:.1f} MiB (the other phases' peaks as measured, at most {rest:.1f} MiB)."
            ),
            "", "| group | layer | type | what | MiB | share |", "|---|---|---|---|---|---|",
            *(
                f"| {r['group']} | {r['layer']} | {r['type']} | {r['what']} | {r['MiB']} | {int(r['bytes']) / s['peak_bytes']:.1%} |"
                for r in alive
            ),
            "", "| " + " | ".join(k.removesuffix("_MiB").replace("at_backward_peak_", "").replace("_", " ") for k in layers[0]) + " |",
            "|" + "---|" * len(layers[0]),
            *("| " + " | ".join(str(v) for v in r.values()) + " |" for r in layers),
        ]
    return lines


if __name__ == "__main__":
    sys.exit(run_command(main, sys.argv[1:], "benchmarks.high_resolution.floor"))
