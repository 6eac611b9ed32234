"""The run folder put back as it was when a run fails before its first epoch: the state Ultralytics will change
(:func:`run_dir_state`), its restore (:func:`restore_run_dir`) and the block that does both for a trainer
(:func:`restored_on_failure`)."""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path

from ultralytics.cfg import get_cfg, get_save_dir
from ultralytics.utils import RANK

from .atomic import atomic_write_bytes

RUN_DIR_FILES = ("args.yaml", "results.csv")  # what BaseTrainer.__init__ rewrites (args.yaml) or unlinks (results.csv)


def run_dir_state(cfg, overrides: dict):
    """``(run dir, whether it exists, {name: (bytes, mode)} of its files in RUN_DIR_FILES)`` as ``BaseTrainer.__init__`` will
    pick the run dir (Ultralytics' ``get_cfg`` and ``get_save_dir``); None for a resumed run, whose folder is the
    resumed one."""
    args = get_cfg(cfg, overrides)
    if args.resume:
        return None
    run_dir = get_save_dir(args)
    files = [run_dir / n for n in RUN_DIR_FILES if (run_dir / n).is_file()]
    return run_dir, run_dir.exists(), {p.name: (p.read_bytes(), p.stat().st_mode & 0o7777) for p in files}


def restore_run_dir(run_dir: Path, existed: bool, files: dict[str, tuple[bytes, int]]) -> None:
    """Put a run directory back as :func:`run_dir_state` found it: remove it if it did not exist, else restore its
    ``args.yaml`` and ``results.csv`` (the run rewrote or removed them) and remove the ``weights`` folder the run made
    if it is empty."""
    if not existed:
        shutil.rmtree(run_dir, ignore_errors=True)
        return
    for name, (data, mode) in files.items():
        atomic_write_bytes(run_dir / name, data)
        (run_dir / name).chmod(mode)  # results.csv was removed: a new file would get the umask's mode
    with contextlib.suppress(OSError):  # not empty, or not there: leave it
        (run_dir / "weights").rmdir()


@contextlib.contextmanager
def restored_on_failure(trainer):
    """Put the run directory back as it was before this run (``trainer.ckpt_state.run_dir_before``, from :func:`run_dir_state`;
    :func:`restore_run_dir`) when the block raises, anything, before the first epoch starts (``on_train_start``
    clears the saved state: from then on the folder holds this run's results). Not for a resumed run (its folder is
    the resumed one) nor a DDP launcher, whose workers train."""
    try:
        yield
    except BaseException:
        before = trainer.ckpt_state.run_dir_before
        if RANK in {-1, 0} and before and not getattr(trainer, "ddp", False) and before[0] == getattr(trainer, "save_dir", before[0]):
            restore_run_dir(*before)
        raise
