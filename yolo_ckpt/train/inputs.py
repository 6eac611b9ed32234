"""Early checks of the ``train`` inputs that Ultralytics checks only while it sets a run up, after it has written the
run folder: ``imgsz=``, ``device=``, ``project=``, ``model=`` and ``data=`` of the task's kind, each refused with one
line naming the key and the valid choices (:class:`ConfigError`), before any file is written.

Ultralytics refuses these values too (``check_imgsz``, ``select_device``, ``mkdir``, ``torch_load``), but only inside
``BaseTrainer.__init__``/``_setup_train``: as a traceback, after ``args.yaml`` was written and ``results.csv``
removed. The checks here take the same rules, so a value they pass is one Ultralytics takes.
"""

from __future__ import annotations

import inspect
import logging
import numbers
from pathlib import Path

from ultralytics.utils import LOGGER

from ..errors import ConfigError, MissingFileError
from .resume import check_resumable


def check_imgsz(imgsz) -> None:
    """A training size is a positive number of pixels, or a list of them (Ultralytics trains at the largest).

    Ultralytics' ``check_imgsz`` rounds other values to the stride with a warning (``imgsz=333`` -> 352), and turns
    ``imgsz=0`` into its floor of 32 px: those keep its rounding, while ``abc``, ``fit`` (a predict size) and sizes
    <= 0 are refused here.

    Raises:
        ConfigError: naming the value.
    """
    sizes = imgsz if isinstance(imgsz, (list, tuple)) else [imgsz]
    sizes = [int(s) if isinstance(s, str) and s.isnumeric() else s for s in sizes]  # check_imgsz's "640"
    if not sizes or not all(isinstance(s, numbers.Real) and not isinstance(s, bool) and s > 0 for s in sizes):
        raise ConfigError(
            f"imgsz={imgsz!r} is not a training size: imgsz= takes a number of pixels > 0 (e.g. imgsz=640), or a list of them"
        )


def check_device(device) -> None:
    """``device=`` as Ultralytics' ``select_device`` takes it (``cpu``, ``0``, ``0,1``, ``cuda:0``, ``mps``, ...).

    ``select_device`` is called with ``verbose=False``; its one side effect on a valid request, making that GPU the
    current CUDA device, is undone (the trainer makes it again).

    Raises:
        ConfigError: naming the value, with Ultralytics' reason (no CUDA device, an index beyond the devices).
    """
    import torch
    from ultralytics.utils.torch_utils import select_device

    if device is None or str(device).strip().lower() in {"", "cpu"}:
        return
    current = torch.cuda.current_device() if torch.cuda.is_available() else None
    level = LOGGER.level
    LOGGER.setLevel(logging.ERROR)  # select_device logs its banner before it raises
    try:
        select_device(device, verbose=False)
    except (ValueError, TypeError) as e:
        first = str(e).strip().splitlines()[0]
        raise ConfigError(f"device={device!r}: {first} (CUDA devices visible: {torch.cuda.device_count()})") from None
    finally:
        LOGGER.setLevel(level)
        if current is not None:
            torch.cuda.set_device(current)


def check_project(project) -> None:
    """``project=`` is the folder runs are saved under: it, or its nearest existing parent, must be a folder.

    Raises:
        ConfigError: for a path that is, or lies under, a file.
    """
    if project is None:
        return
    path = Path(str(project)).expanduser()
    existing = next((p for p in (path, *path.parents) if p.exists()), None)
    if existing is not None and not existing.is_dir():
        raise ConfigError(
            f"project={project}: {existing} is a file; project= is the folder runs are saved under (a new or existing folder)"
        )


def check_model_path(model) -> None:
    """``model=`` names a model file (``.pt`` checkpoint or ``.yaml``), not a folder; offline (``YOLO_OFFLINE=1``, or
    no network: Ultralytics' ``ONLINE``), a checkpoint that is on this machine. Ultralytics looks for a ``.pt`` (a
    name it completes, ``yolo11n`` -> ``yolo11n.pt``) where it is named, then in its weights folder, then downloads it
    from its GitHub release, asking GitHub for the release's assets first where the name is not one it knows
    (``Model._load`` and ``attempt_download_asset``, ``engine/model.py`` line 250, ``utils/downloads.py`` lines
    602-628, read): offline that is a download traceback, or network checks before a missing file's error.

    Raises:
        ConfigError: for a folder; offline, for a checkpoint that is not here (a :class:`MissingFileError`), naming
            where to get it.
    """
    if not isinstance(model, (str, Path)):
        return
    if Path(model).is_dir():
        raise ConfigError(f"model={model} is a folder; model= takes a checkpoint (.pt) or a model YAML (.yaml)")
    from ultralytics.utils import ONLINE, SETTINGS
    from ultralytics.utils.checks import REMOTE_FILE_PREFIXES, check_model_file_from_stem, check_yolov5u_filename
    from ultralytics.utils.downloads import GITHUB_ASSETS_NAMES, GITHUB_ASSETS_REPO, attempt_download_asset

    name = str(check_model_file_from_stem(str(model)))
    if ONLINE or not name.lower().endswith(".pt"):
        return
    remote = name.lower().startswith(REMOTE_FILE_PREFIXES)
    file = Path(check_yolov5u_filename(name)) if not remote else None
    if file is not None and (file.is_file() or (Path(SETTINGS["weights_dir"]) / file).is_file()):
        return
    if remote or file.name in GITHUB_ASSETS_NAMES:
        release = inspect.signature(attempt_download_asset).parameters["release"].default  # the release it downloads from
        url = name if remote else f"https://github.com/{GITHUB_ASSETS_REPO}/releases/download/{release}/{file.name}"
        raise MissingFileError(
            f"model={model} is not on this machine, and offline (YOLO_OFFLINE=1 or no network) Ultralytics cannot download it: "
            f"download {url} where there is a network and give its path (or put it in {SETTINGS['weights_dir']})"
            + (f", or train from scratch with model={file.stem}.yaml" if file is not None else "")
        )
    raise MissingFileError(f"model={model}: no such file (a checkpoint .pt or a model YAML .yaml)")


def check_data_for_task(data, task: str | None) -> None:
    """``data=`` of ``classify`` is not a data YAML: Ultralytics' ``check_cls_dataset`` reads a folder of class
    folders (or a name without a suffix, ``mnist160``, that it downloads), and stock refuses a YAML only when the
    trainer reads the dataset, after it has built the model and printed its arguments. (The other tasks'
    ``check_det_dataset`` takes a YAML, or a folder holding one.)

    Raises:
        ConfigError: naming the value, the task and what the task reads.
    """
    if data is None or task is None:
        return
    if task == "classify" and Path(str(data)).suffix.lower() in {".yaml", ".yml"}:
        raise ConfigError(
            f"data={data}: task=classify reads a folder of class folders (train/<class>/*.jpg, val/<class>/...), not a data "
            "YAML; a data YAML is a detect, segment, obb or pose dataset"
        )


def check_train_inputs(overrides: dict) -> None:
    """:func:`check_imgsz`, :func:`check_device`, :func:`check_project` and :func:`check_model_path` of the values
    ``overrides`` gives (a key not given keeps Ultralytics' default, which passes).

    Raises:
        ConfigError: for the first bad value.
    """
    if overrides.get("imgsz") is not None:
        check_imgsz(overrides["imgsz"])
    check_device(overrides.get("device"))
    check_project(overrides.get("project"))
    check_model_path(overrides.get("model"))


def _model_source(overrides: dict):
    """The checkpoint or YAML the trainer will build its model from: the resumed ``last.pt``, else ``model=``."""
    resume = overrides.get("resume")
    if isinstance(resume, (str, Path)) and Path(resume).is_file():
        return resume
    return overrides.get("model")


def check_model_keys(trainer_cls: type, overrides: dict, config, given: dict) -> None:
    """Check ``recompute=`` (``config``, a :class:`~yolo_ckpt.config.CkptConfig`; ``given``: yolo-ckpt's keys as given)
    against the model that ``model=`` names where reading it costs nothing: a YAML, or the loaded model's YAML dict
    the CLI passes; and against a resumed ``last.pt`` (``resume=path/to/last.pt``: Ultralytics' resume reads it
    several times anyway, and its run folder is not put back on a failure), which must be of an unfinished run. A
    ``model=`` ``.pt`` is not unpickled again here (Ultralytics loaded it once: its policy is resolved when the model
    is set up, the run folder put back if that fails).

    Raises:
        ConfigError: for a ``recompute=`` the model does not have (:func:`yolo_ckpt.checkpointing.policy.resolve`),
            an RT-DETR model given to a trainer other than RTDETRTrainer's, or a resumed ``last.pt`` of a finished run
            (:func:`yolo_ckpt.train.resume.check_resumable`: one line naming the run and the command of a new run).
    """
    from ultralytics.models.rtdetr.train import RTDETRTrainer

    from ..checkpointing.model_file import layout_of
    from ..checkpointing.policy import is_auto, resolve

    source = _model_source(overrides)
    resumed = source is not None and source is overrides.get("resume")
    if resumed:  # stock fails on a finished run's last.pt only in resume_training, after writing its run folder
        check_resumable(source)
    read = resumed or isinstance(source, dict) or Path(str(source)).suffix.lower() in {".yaml", ".yml"}  # a YAML: cheap to read
    layout = layout_of(source) if source is not None and read else None
    if layout is not None and layout.types[-1] == "RTDETRDecoder" and not issubclass(trainer_cls, RTDETRTrainer):
        # stock would fail at the first loss: v8DetectionLoss reads the head's stride, which RTDETRDecoder has not
        raise ConfigError(
            f"model={source if isinstance(source, (str, Path)) else 'the model'} is an RT-DETR model (RTDETRDecoder head), which "
            f"{trainer_cls.__name__} cannot train; use trainer_for('detect', model) with the RTDETR model (the checkpointed RTDETRTrainer)"
        )
    if layout is not None and "recompute" in given and not is_auto(config.recompute):  # the model's own errors, before any write
        resolve(config.recompute, layout)
