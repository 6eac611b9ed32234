"""The model file ``model=`` names, read into a :class:`~yolo_ckpt.checkpointing.policy.ModelLayout` without building
the model: a model YAML (a path, an Ultralytics name such as ``yolo11n.yaml``, or its dict), its rows checked as
Ultralytics' ``parse_model`` reads them, or a ``.pt`` checkpoint. The policy grammar (:mod:`yolo_ckpt.checkpointing.policy`)
reads a layout and never a file; a built model's layout is :meth:`~yolo_ckpt.checkpointing.policy.ModelLayout.from_model`.
"""

from __future__ import annotations

import re
from pathlib import Path

from ..errors import ConfigError, MissingFileError, user_input
from ..suggest import did_you_mean
from .policy import ModelLayout

# Layer types that hold Ultralytics' Attention or AAttn (yolo_ckpt.checkpointing.attention), read from a model YAML row
# [from, repeats, module, args]: always, or where the args' flag at that index is true (A2C2f's a2, C3k2's attn).
ATTENTION_LAYERS = {"C2PSA": None, "C2fPSA": None, "PSA": None, "A2C2f": 1, "C3k2": 3}


def yaml_layout(cfg: dict) -> ModelLayout:
    """Layout of a model YAML dict (rows ``[from, repeats, module, args]``) without building the model.

    Raises:
        ConfigError: for a YAML without a ``backbone:`` or ``head:`` list of rows (Ultralytics' parse_model
            would fail on it with a KeyError), naming what it has.
    """
    missing = [k for k in ("backbone", "head") if not isinstance(cfg.get(k), list) or not cfg[k]]
    if missing:
        raise ConfigError(
            f"model YAML {cfg.get('yaml_file', '')!r} has no {' and no '.join(repr(k + ':') for k in missing)} section "
            f"(keys: {sorted(cfg)}); an Ultralytics model YAML lists its layers under backbone: and head:"
        )
    rows = list(cfg["backbone"]) + list(cfg["head"])
    types = tuple(str(r[2]).rsplit(".", 1)[-1] for r in rows)

    def attends(t: str, row) -> bool:
        flag = ATTENTION_LAYERS[t]
        args = row[3] if len(row) > 3 and isinstance(row[3], list) else []
        return flag is None or (len(args) > flag and bool(args[flag]))

    has_attention = any(t in ATTENTION_LAYERS and attends(t, r) for t, r in zip(types, rows))
    return ModelLayout(types=types, n_backbone=len(cfg["backbone"]), has_attention=has_attention)


def layer_modules() -> set[str]:
    """The module names a model YAML row may give bare, as Ultralytics' ``parse_model`` looks them up: the
    ``torch.nn.Module`` classes in ``ultralytics.nn.tasks``' namespace (``Conv``, ``C3k2``, ``Detect``, ...)."""
    import torch
    from ultralytics.nn import tasks

    return {k for k, v in vars(tasks).items() if isinstance(v, type) and issubclass(v, torch.nn.Module)}


def _torch_module(module: str) -> bool:
    """Whether ``module`` is a model YAML row's ``nn.NAME`` or ``torchvision.ops.NAME`` that exists (``parse_model``
    takes these from torch and torchvision)."""
    import torch

    if module.startswith("nn."):
        return hasattr(torch.nn, module[3:])
    if module.startswith("torchvision.ops."):
        import torchvision

        return hasattr(torchvision.ops, module.removeprefix("torchvision.ops."))
    return False


def check_rows(cfg: dict) -> None:
    """Each layer row of a model YAML dict is ``[from, repeats, module, args]`` with a module Ultralytics'
    ``parse_model`` finds (:func:`layer_modules`, ``nn.NAME``, ``torchvision.ops.NAME``).

    Raises:
        ConfigError: naming the YAML, the layer and the modules close to an unknown one (``parse_model`` raises a bare
            ``KeyError: 'EvilModule'``).
    """
    name = cfg.get("yaml_file", "")
    for i, row in enumerate(list(cfg.get("backbone") or []) + list(cfg.get("head") or [])):
        if not isinstance(row, list) or len(row) != 4:
            raise ConfigError(f"model YAML {name!r} layer {i}: {row!r} is not a row [from, repeats, module, args]")
        if str(row[2]) not in (modules := layer_modules()) and not _torch_module(str(row[2])):
            raise ConfigError(
                f"model YAML {name!r} layer {i}: module {row[2]!r} is not an Ultralytics module, nn.NAME or torchvision.ops.NAME"
                f"{did_you_mean(str(row[2]), modules)}"
            )


def model_yaml_names() -> set[str]:
    """The model YAML names Ultralytics builds (``ultralytics/cfg/models``): each file's, and for a name with a version
    number and no scale each scale's, as ``yolo11.yaml`` builds ``yolo11n.yaml`` ... ``yolo11x.yaml`` (``yaml_model_load``;
    ``yolov10n.yaml`` is a file of its own)."""
    import ultralytics

    names = set()
    for f in (Path(ultralytics.__file__).parent / "cfg" / "models").rglob("*.yaml"):
        names.add(f.name)
        if version := re.fullmatch(r"(.*?\d+)(-.*)?", f.stem):  # yolo11-seg -> yolo11n-seg, ...
            names |= {f"{version[1]}{scale}{version[2] or ''}{f.suffix}" for scale in "nslmx"}
    return names


def layout_of(model_arg) -> ModelLayout:
    """Layout from what ``model=`` names, without building the model: a YAML path or dict, or a ``.pt`` file (of a
    distillation run: its student's).

    Raises:
        MissingFileError: for a path that does not exist (a YAML name: naming it, with the Ultralytics model YAMLs close
            to it). ConfigError: for a file Ultralytics cannot read as a model, a YAML row :func:`check_rows` refuses.
    """
    if isinstance(model_arg, dict):
        return yaml_layout(model_arg)
    path = str(model_arg)
    if Path(path).suffix.lower() in {".yaml", ".yml"}:
        from ultralytics.nn.tasks import yaml_model_load

        try:
            with user_input():
                cfg = yaml_model_load(path)
        except MissingFileError:  # Ultralytics names the scale-less YAML it tried last: 'yolo11n.yaml' for yolo11nn.yaml
            hint = did_you_mean(Path(path).name, model_yaml_names(), key=lambda name: Path(name).stem)
            raise MissingFileError(f"model={path} does not exist, as a file or as an Ultralytics model YAML{hint}") from None
        layout = yaml_layout(cfg)
        check_rows(cfg)  # before Ultralytics builds the model: its KeyError for an unknown module names only the module
        return layout
    from ultralytics.nn.tasks import load_checkpoint

    with user_input():
        model = load_checkpoint(path)[0]
    return ModelLayout.from_model(getattr(model, "student_model", model))  # a distill_model= run's last.pt
