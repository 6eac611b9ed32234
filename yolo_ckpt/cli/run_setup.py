"""What ``yolo-ckpt profile`` and ``plan`` share: their keys (:func:`estimate_keys`), the run their words describe
(:func:`estimate_setup`, planned by :meth:`yolo_ckpt.memory.planning.PlannedRun.from_keys` with train's checks of
the data), and the size their output names (:func:`trained_at`)."""

from __future__ import annotations

from ..config import ESTIMATE_DEFAULTS
from .args import parse_train_args

PROFILE_ONLY = ("plot",)  # keys of cfg/estimate.yaml that plan does not take


def estimate_keys(command: str) -> dict:
    """``command``'s (``profile`` or ``plan``) own keys and their defaults, from ``cfg/estimate.yaml``: plan does not
    take profile's ``plot=``."""
    return {k: v for k, v in ESTIMATE_DEFAULTS.items() if command == "profile" or k not in PROFILE_ONLY}


def estimate_setup(args: list[str], command: str = "plan", early=None):
    """Parse the arguments of ``command`` (``profile`` or ``plan``) into the run ``yolo-ckpt train`` would make of the
    same keys (:meth:`~yolo_ckpt.memory.planning.PlannedRun.from_keys`: the model and data loaded as the trainer
    loads them, the device train would use), refusing what train refuses: a ``data=`` of the wrong form for the task
    (:func:`yolo_ckpt.train.inputs.check_data_for_task`), a training set train's checks refuse
    (:func:`yolo_ckpt.train.data_check.check_labels`: no labels, all images corrupt, ...), a ``model=`` train refuses
    (:func:`yolo_ckpt.train.inputs.check_model_path`: a folder; offline, a checkpoint that is not here), an ``imgsz=``
    train refuses (:func:`yolo_ckpt.train.inputs.check_imgsz`: abc, 0, -5), a ``recompute=`` the model lacks, a
    ``device=`` of no form Ultralytics takes (:func:`yolo_ckpt.memory.ultralytics_rules.device_type`). The temporary files killed
    saves left beside a ``model=`` checkpoint are removed first (:func:`yolo_ckpt.cli.train.tidy_beside`).
    ``early(config)``: the command's own checks of yolo-ckpt's keys, made before the model is built (plan's budget).

    Returns:
        ``(run, opts)``: the :class:`~yolo_ckpt.memory.planning.PlannedRun` (model, spec, trained imgsz, config), and
        the keys with defaults (:attr:`~yolo_ckpt.memory.planning.PlannedRun.keys`) where ``imgsz`` is the largest
        size a step trains at, ``imgsz_given`` the value given and ``autobatch`` whether plan picks the batch
        (``batch=-1``).

    Raises:
        SyntaxError: for unknown keys (before torch is imported).
        ConfigError: as ``PlannedRun.from_keys`` raises (keys, model, data, a task the estimate does not cover; the
            keys' errors before the model is built) and as train's checks of the data raise.
    """
    given = parse_train_args(args, estimate_keys(command))
    from ..memory import PlannedRun
    from ..train.data_check import CHECKED_TASKS, check_labels
    from ..train.inputs import check_data_for_task, check_imgsz, check_model_path
    from .train import tidy_beside

    def labels(data: dict, task: str, cfg) -> None:  # train's checks of the training set, for the tasks it checks
        if task in CHECKED_TASKS:
            check_labels(data, task, cfg.fraction, cfg.single_cls)

    if given.get("imgsz") is not None:
        check_imgsz(given["imgsz"])  # as train checks it: abc, 0 and -5 are no training size
    check_model_path(given.get("model"))  # as train checks it: a folder, or offline a checkpoint that is not here
    tidy_beside(given.get("model"))
    run = PlannedRun.from_keys(given, plans_batch=command == "plan", early=early, check_task=check_data_for_task, check_labels=labels)
    opts = {**run.keys, "imgsz_given": run.keys["imgsz"], "imgsz": run.imgsz, "autobatch": command == "plan" and run.keys["batch"] == -1}
    return run, opts


def trained_at(opts: dict) -> str:
    """`` (imgsz=333 trains at 352)`` where the size estimated is not the ``imgsz=`` given, else empty."""
    if str(opts["imgsz_given"]) == str(opts["imgsz"]):
        return ""
    scale = f" with multi_scale={opts['multi_scale']}" if opts["multi_scale"] else ""
    return f" (imgsz={opts['imgsz_given']}{scale} trains at up to {opts['imgsz']})"
