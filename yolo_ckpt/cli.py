"""The ``yolo-ckpt`` command: ``yolo-ckpt train key=value ...`` and ``yolo-ckpt help``.

``train`` takes every ``yolo train`` argument with the same syntax and defaults (parsed with Ultralytics' own
helpers from ``ultralytics.cfg``), plus yolo-ckpt's keys (``yolo_ckpt/cfg/default.yaml``). Two offline-safe
exceptions to ``yolo train``'s defaults: with no ``data=`` it trains on the built-in synthetic dataset of the task,
and with no ``model=`` it builds ``yolo11n.yaml`` (``yolo11n-seg.yaml``, ...) instead of downloading weights.
"""

from __future__ import annotations

import sys

from ultralytics.cfg import TASKS, check_dict_alignment, merge_equals_args, parse_key_value_pair
from ultralytics.utils import DEFAULT_CFG_DICT, YAML

from .trainer import DEFAULTS, DEFAULTS_PATH

COMMANDS = {"train": "train a model with activation checkpointing", "help": "show this help"}
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
        "example:\n  yolo-ckpt train data=path/to/data.yaml model=yolo11s.yaml imgsz=1536 recompute=backbone\n\n"
        "train takes every 'yolo train' argument (see 'yolo cfg'), with the same syntax and defaults, except:\n"
        "  data   default: the built-in synthetic dataset of the task (1600 px aerial-like scenes)\n"
        "  model  default: yolo11n.yaml (yolo11n-seg.yaml, ...) built from scratch, nothing is downloaded\n\n"
        f"yolo-ckpt's keys (defaults from {DEFAULTS_PATH.name}):\n{keys}\n"
    )


def parse_train_args(args: list[str]) -> dict:
    """``["data=x.yaml", "imgsz=1536", "segment", "cfg=my.yaml"]`` -> overrides dict, the way ``yolo`` parses them.

    Raises:
        SyntaxError: for an unknown key (with Ultralytics' suggestions of similar keys) or a bare word that is
            neither a task nor a boolean key.
    """
    valid = {**DEFAULT_CFG_DICT, **DEFAULTS}
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

    from .policy import check_mode, layout_of, resolve
    from .trainer import trainer_for

    overrides = parse_train_args(args)
    task = overrides.pop("task", None)
    if task is not None:
        trainer_for(task)  # unsupported task: fail before building anything
    model = YOLO(overrides.pop("model", None) or f"yolo11n{MODEL_SUFFIX.get(task or 'detect', '')}.yaml", task=task)
    trainer = trainer_for(model.task)
    check_mode(overrides.get("recompute_mode", DEFAULTS["recompute_mode"]))
    if "recompute" in overrides:
        resolve(overrides["recompute"], layout_of(model.model.yaml))
    if overrides.get("data") is None and not overrides.get("resume"):
        from .synthetic import synthetic_dataset

        overrides["data"] = str(synthetic_dataset(model.task))
    return model, trainer, overrides


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``yolo-ckpt`` console script; returns the exit status (2 for bad input)."""
    args = sys.argv[1:] if argv is None else list(argv)
    command = args[0].lstrip("-") if args else "help"
    if command in {"help", "h"} or {"help", "-h", "--help"} & set(args[1:]):
        print(help_text())
        return 0
    if command != "train":
        print(f"yolo-ckpt: unknown command '{args[0]}'; commands: {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    try:
        model, trainer, overrides = prepare_train(args[1:])
    except (SyntaxError, ValueError, AssertionError, FileNotFoundError, NotImplementedError) as e:
        print(f"yolo-ckpt: error: {e}", file=sys.stderr)
        return 2
    model.train(trainer=trainer, **overrides)
    return 0


if __name__ == "__main__":
    sys.exit(main())
