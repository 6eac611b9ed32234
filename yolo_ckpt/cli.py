"""The ``yolo-ckpt`` command: ``train``, ``profile``, ``plan``, ``compare``, ``bench`` and ``help``, with ``yolo``'s ``key=value`` syntax.

``train`` takes every ``yolo train`` argument with the same syntax and defaults (parsed with Ultralytics' own
helpers from ``ultralytics.cfg``), plus yolo-ckpt's keys (``yolo_ckpt/cfg/default.yaml``). Two offline-safe
exceptions to ``yolo train``'s defaults: with no ``data=`` it trains on the built-in synthetic dataset of the task,
and with no ``model=`` it builds ``yolo11n.yaml`` (``yolo11n-seg.yaml``, ...) instead of downloading weights.
"""

from __future__ import annotations

import sys
from pathlib import Path

from ultralytics.cfg import TASKS, check_dict_alignment, merge_equals_args, parse_key_value_pair
from ultralytics.utils import DEFAULT_CFG, DEFAULT_CFG_DICT, YAML

from .trainer import DEFAULTS, DEFAULTS_PATH

COMMANDS = {
    "train": "train a model with activation checkpointing",
    "profile": "per-layer memory and FLOPs table and estimated peak of a training step: none against recompute=",
    "plan": "largest imgsz and batch that fit memory_budget= for none, backbone, all and auto",
    "compare": "delta table of runs against the first: RUN_DIR_A RUN_DIR_B ... [out=DIR]",
    "bench": "run a benchmark matrix: matrix=cfg/bench/NAME.yaml [out=DIR] [setting=value] (out: runs/bench/NAME)",
    "help": "show this help",
}
ESTIMATE_KEYS = {"objects": 20}  # profile/plan: objects per image the loss is estimated for (trainers count the data)
MODEL_SUFFIX = {"detect": "", "segment": "-seg", "obb": "-obb", "pose": "-pose", "classify": "-cls"}


def help_text() -> str:
    """The text of ``yolo-ckpt help``: commands, an example, and yolo-ckpt's keys with their defaults."""
    commands = "\n".join(f"  {name:<8}{text}" for name, text in COMMANDS.items())
    keys = "\n".join(
        f"  {line}" for line in DEFAULTS_PATH.read_text().splitlines() if line.strip() and not line.startswith("#")
    )
    return (
        "usage: yolo-ckpt COMMAND [TASK] key=value ...\n\n"
        f"commands:\n{commands}\n\n"
        "examples:\n  yolo-ckpt train data=path/to/data.yaml model=yolo11s.yaml imgsz=1536 recompute=backbone\n"
        "  yolo-ckpt profile model=yolo11s.yaml imgsz=1536 batch=8 recompute=all\n"
        "  yolo-ckpt plan model=yolo11s.yaml memory_budget=16GB imgsz=1536 batch=8 format=json\n"
        "  yolo-ckpt bench matrix=cfg/bench/cpu-step.yaml out=benchmarks/results/cpu-step\n\n"
        "train takes every 'yolo train' argument (see 'yolo cfg'), with the same syntax and defaults, except:\n"
        "  data   default: the built-in synthetic dataset of the task (1600 px aerial-like scenes)\n"
        "  model  default: yolo11n.yaml (yolo11n-seg.yaml, ...) built from scratch, nothing is downloaded\n\n"
        f"yolo-ckpt's keys (defaults from {DEFAULTS_PATH.name}):\n{keys}\n"
        f"  objects: {ESTIMATE_KEYS['objects']} # profile and plan: objects per image for the loss estimate\n"
        "  format: text # profile and plan: text or json\n"
    )


def parse_train_args(args: list[str], extra: dict | None = None) -> dict:
    """``["data=x.yaml", "imgsz=1536", "segment", "cfg=my.yaml"]`` -> overrides dict, the way ``yolo`` parses them.

    Args:
        args: the words after the command.
        extra: further valid keys and their defaults (profile and plan take ``objects=``).

    Raises:
        SyntaxError: for an unknown key (with Ultralytics' suggestions of similar keys) or a bare word that is
            neither a task nor a boolean key.
    """
    valid = {**DEFAULT_CFG_DICT, **DEFAULTS, **(extra or {})}
    overrides: dict = {}
    for a in merge_equals_args(args):
        a = a.removeprefix("--").rstrip(",")
        if "=" in a:
            k, v = parse_key_value_pair(a)
            if k == "cfg" and v is not None:  # a YAML of overrides, as in 'yolo train cfg=custom.yaml'
                overrides = {**{k2: v2 for k2, v2 in YAML.load(v).items() if k2 != "cfg"}, **overrides}
            else:
                overrides[k] = v
        elif a in TASKS:
            overrides["task"] = a
        elif isinstance(valid.get(a), bool):
            overrides[a] = True
        else:
            check_dict_alignment(valid, {a: ""})
            raise SyntaxError(f"'{a}' is missing an '=' sign to set its value, i.e. try '{a}={valid[a]}'")
    check_dict_alignment(valid, overrides)
    return overrides


def prepare_train(args: list[str]):
    """Parse and check ``yolo-ckpt train`` arguments; resolve the task, the model and the data.

    Returns:
        ``(model, trainer_class, overrides)`` for ``model.train(trainer=trainer_class, **overrides)``.

    Raises:
        SyntaxError: for unknown keys. ValueError: for an invalid ``recompute=`` value or an unsupported task.
        AssertionError: for a key without a value (Ultralytics' parser). FileNotFoundError: for a missing
        ``cfg=`` file or model. NotImplementedError: for a model Ultralytics' YOLO class cannot train (RT-DETR).
        All before any run directory is created.
    """
    from ultralytics import YOLO

    from .policy import check_mode, is_auto, layout_of, resolve
    from .trainer import trainer_for

    overrides = parse_train_args(args)
    task = overrides.pop("task", None)
    if task is not None:
        trainer_for(task)  # unsupported task: fail before building anything
    model = YOLO(overrides.pop("model", None) or f"yolo11n{MODEL_SUFFIX.get(task or 'detect', '')}.yaml", task=task)
    trainer = trainer_for(model.task)
    check_mode(overrides.get("recompute_mode", DEFAULTS["recompute_mode"]))
    if "recompute" in overrides and not is_auto(overrides["recompute"]):
        resolve(overrides["recompute"], layout_of(model.model.yaml))
    if overrides.get("data") is None and not overrides.get("resume"):
        from .synthetic import synthetic_dataset

        overrides["data"] = str(synthetic_dataset(model.task))
    return model, trainer, overrides


def _estimate_setup(args: list[str]):
    """Parse profile/plan arguments; build the (detection) model from model= without downloading."""
    from ultralytics import YOLO

    from .memory import optimizer_for
    from .policy import check_mode

    defaults = {"model": "yolo11n.yaml", "imgsz": 640, "batch": 8, "amp": False, "format": "text", **ESTIMATE_KEYS}
    opts = {**defaults, **parse_train_args(args, ESTIMATE_KEYS)}
    opts["amp"] = opts["amp"] not in {False, None, "fp32"}  # estimate with 2-byte activations
    opts["optimizer"] = optimizer_for(opts.get("optimizer", "auto"))  # auto: AdamW, as for runs up to 10k steps
    check_mode(opts.get("recompute_mode", DEFAULTS["recompute_mode"]))
    if opts["format"] not in {"text", "json"}:
        raise ValueError(f"format={opts['format']!r} is not valid here; valid: text, json")
    yolo = YOLO(opts["model"])
    if yolo.task != "detect":
        raise ValueError(f"profile and plan estimate detection models; model={opts['model']} is a {yolo.task} model")
    model = yolo.model.train()
    model.args = DEFAULT_CFG  # the loss's hyperparameters: their values do not change its memory
    return model, opts


def profile_table(profile, policy) -> "pandas.DataFrame":
    """Per-layer rows of a ``recompute=none`` :class:`~yolo_ckpt.memory.StepProfile` (MiB, GFLOPs), the layers of
    ``policy`` marked (the final head's row when ``policy.head``: its branches), and a total row: the saved-for-backward column adds up to the total."""
    import pandas as pd

    rows = [
        {
            "layer": r.index,
            "type": r.type,
            "output_MiB": r.output_bytes / 2**20,
            "saved_MiB": r.saved_bytes / 2**20,
            "freed_if_recomputed_MiB": r.freeable_bytes / 2**20,
            "forward_GFLOPs": r.forward_flops / 1e9,
            "recompute": policy.mode if r.index in policy.indices or (policy.head and r is profile.layers[-1]) else "",
        }
        for r in profile.layers
    ]
    table = pd.DataFrame(rows)
    total = table.drop(columns=["layer", "type", "recompute"]).sum()
    return pd.concat([table, pd.DataFrame([{"layer": "total", "type": "", **total, "recompute": ""}])], ignore_index=True)


def profile(args: list[str]) -> dict:
    """``yolo-ckpt profile``: estimate one training step for none and for ``recompute=`` (default: backbone)."""
    import json

    from ultralytics.utils import TQDM

    from .estimate import calibrate_loss, estimate_step
    from .policy import ModelLayout, resolve

    model, opts = _estimate_setup(args)
    spec, mode = opts.get("recompute", DEFAULTS["recompute"]), opts.get("recompute_mode", DEFAULTS["recompute_mode"])
    policy = resolve(spec, ModelLayout.from_model(model), mode=mode)
    steps = TQDM(total=3, desc="yolo-ckpt profile: calibrating the loss, estimating none, estimating the policy")
    loss_model = calibrate_loss(model)
    steps.update()
    results = {}
    for name, recompute in (("none", "none"), ("policy", spec)):
        results[name] = estimate_step(model, opts["imgsz"], opts["batch"], opts["objects"], recompute, mode, opts["optimizer"], opts["amp"], loss_model)
        steps.update()
    steps.close()
    table = profile_table(results["none"], policy)
    summary = {
        "model": opts["model"], "imgsz": opts["imgsz"], "batch": opts["batch"], "objects": opts["objects"], "amp": opts["amp"],
        "recompute": policy.spec, "recompute_mode": mode, "recomputed_layers": policy.layers(), "recomputed_regions": policy.regions(),
        "estimated_peak_bytes": {"none": results["none"].peak_bytes, "policy": results["policy"].peak_bytes},
        "phase_peak_bytes": {k: r.phase_peak_bytes for k, r in results.items()},
        "loss_bytes": results["none"].loss_bytes, "static_bytes": results["none"].static_bytes,
        "layers": table.to_dict("records"),
    }
    if opts["format"] == "json":
        print(json.dumps(summary, indent=2))
    else:
        print(table.to_string(index=False, float_format=lambda v: f"{v:.2f}"))
        none, pol = results["none"], results["policy"]
        print(f"\nparameters, buffers, optimizer state and the batch: {none.static_bytes / 2**20:.1f} MiB")
        print(f"loss/assigner ({opts['objects']} objects per image): {none.loss_bytes / 2**20:.1f} MiB at its peak")
        print(f"estimated peak, recompute=none: {none.peak_bytes / 2**20:.1f} MiB")
        print(f"estimated peak, {policy}: {pol.peak_bytes / 2**20:.1f} MiB ({pol.peak_bytes / none.peak_bytes:.2f}x)")
    return summary


def plan(args: list[str]) -> list[dict]:
    """``yolo-ckpt plan``: for none, backbone, all and auto, the largest imgsz (at ``batch=``) and batch (at
    ``imgsz=``) that fit ``memory_budget=``, and each policy's recompute cost at ``imgsz`` and ``batch``."""
    import json

    import pandas as pd
    from ultralytics.utils import TQDM

    from .planner import MemoryModel, parse_budget
    from .policy import ModelLayout, resolve

    model, opts = _estimate_setup(args)
    if opts.get("memory_budget") is None:
        raise ValueError("plan needs memory_budget= (bytes with a unit, e.g. memory_budget=16GB)")
    budget = parse_budget(opts["memory_budget"], None)
    imgsz, batch = opts["imgsz"], opts["batch"]
    stride = int(max(model.stride))
    layout = ModelLayout.from_model(model)
    with TQDM(total=2, desc="yolo-ckpt plan: estimating the model, planning auto") as steps:
        memory = MemoryModel(model, imgsz, batch, opts["objects"], opts["optimizer"], opts["amp"])
        steps.update()
        try:
            auto = memory.plan(budget, batch, imgsz).indices
        except ValueError:
            auto = None  # even 'all' does not fit at this imgsz and batch
        steps.update()
    rows = []
    for name in ("none", "backbone", "all", "auto"):
        indices = resolve(name, layout).indices if name != "auto" else (auto if auto is not None else memory.candidates)
        cost = memory.as_plan(indices, memory.peak(indices, batch, imgsz), budget, batch, imgsz)
        rows.append({
            "recompute": name if name != "auto" else f"auto ({','.join(map(str, indices)) or 'none'})",
            f"max_imgsz_at_batch_{batch}": memory.largest_imgsz(indices, budget, batch, stride),
            f"max_batch_at_imgsz_{imgsz}": memory.largest_batch(indices, budget, imgsz),
            "fits": cost.estimated_peak_bytes <= budget if name != "auto" else auto is not None,
            "recompute_GFLOPs": cost.recompute_flops / 1e9,
            "recompute_pct_of_step": 100 * cost.recompute_cost,
        })
    if opts["format"] == "json":
        print(json.dumps({"model": opts["model"], "memory_budget_bytes": budget, "imgsz": imgsz, "batch": batch, "policies": rows}, indent=2))
    else:
        print(f"{opts['model']}, memory_budget={budget / 2**30:.2f} GiB, {opts['objects']} objects per image")
        print(pd.DataFrame(rows).to_string(index=False, float_format=lambda v: f"{v:.1f}"))
    return rows


def compare(args: list[str]):
    """``yolo-ckpt compare RUN_DIR_A RUN_DIR_B ... [out=DIR]``: print the delta table of the runs' reports against
    the first and write it as ``compare.csv`` and ``compare.md`` into ``out=`` (default: a new
    ``<runs_dir>/compare/compare<N>``, so nothing is overwritten)."""
    from ultralytics.utils import SETTINGS
    from ultralytics.utils.files import increment_path

    from .report import compare_runs

    dirs = [a for a in args if "=" not in a]
    options = dict(a.split("=", 1) for a in args if "=" in a)
    if set(options) - {"out"}:
        raise SyntaxError(f"compare takes run directories and out=; unknown keys {sorted(set(options) - {'out'})}")
    table = compare_runs(dirs)
    markdown = table.to_markdown(index=False, floatfmt=".3g")
    print(markdown)
    out = Path(options["out"]) if "out" in options else increment_path(Path(SETTINGS["runs_dir"]) / "compare" / "compare")
    out.mkdir(parents=True, exist_ok=True)
    table.to_csv(out / "compare.csv", index=False)
    (out / "compare.md").write_text(markdown + "\n")
    print(f"written to {out}")
    return table


def bench(args: list[str]):
    """``yolo-ckpt bench matrix=FILE [out=DIR] [setting=value ...]``: run a benchmark matrix (see
    ``yolo_ckpt_bench.matrix``); other ``key=value`` pairs replace the matrix's settings (``epochs=10``). Cells
    already in ``out``'s results.csv with the same settings are skipped."""
    from yolo_ckpt_bench.matrix import run_matrix

    bare = [a for a in args if "=" not in a]
    options = dict(parse_key_value_pair(a) for a in args if "=" in a)
    if bare or "matrix" not in options:
        raise SyntaxError(f"bench takes matrix=FILE, optionally out=DIR and settings as key=value; got {' '.join(args) or 'nothing'}")
    matrix, out = str(options.pop("matrix")), options.pop("out", None)
    return run_matrix(matrix, out, command=" ".join(["yolo-ckpt bench", *args]), overrides=options)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``yolo-ckpt`` console script; returns the exit status (2 for bad input)."""
    args = sys.argv[1:] if argv is None else list(argv)
    command = args[0].lstrip("-") if args else "help"
    if command in {"help", "h"} or {"help", "-h", "--help"} & set(args[1:]):
        print(help_text())
        return 0
    if command not in COMMANDS:
        print(f"yolo-ckpt: unknown command '{args[0]}'; commands: {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    try:
        if command == "train":
            model, trainer, overrides = prepare_train(args[1:])
        else:
            {"profile": profile, "plan": plan, "compare": compare, "bench": bench}[command](args[1:])
            return 0
    except (SyntaxError, ValueError, AssertionError, FileNotFoundError, NotImplementedError) as e:
        print(f"yolo-ckpt: error: {e}", file=sys.stderr)
        return 2
    model.train(trainer=trainer, **overrides)
    return 0


if __name__ == "__main__":
    sys.exit(main())
