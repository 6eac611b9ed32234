"""The run folder of a run that fails before its first epoch, put back as it was, and only this run's writes undone:
what the folder held and what this run wrote into it (:class:`RunDirState`, :func:`run_dir_state`,
:func:`noted_writes`), the restore (:func:`restore_run_dir`) and the block that does it for a trainer
(:func:`restored_on_failure`); and the lock that refuses a second live yolo-ckpt run in one folder (:func:`lock_run_dir`,
:func:`claim_run_dir`).

Another run may write into the same folder meanwhile (``exist_ok=True`` and the same ``name=``, or two runs started
together that both picked ``runs/detect/train``: Ultralytics' ``get_save_dir`` creates nothing). So a file is this
run's only where this run wrote it, noted with its identity (inode, mtime in ns, size) right after the write, and it
is removed or put back only while that identity holds: a file another run wrote or rewrote since is left as it is,
and so is a folder that is not empty.
"""

from __future__ import annotations

import contextlib
import errno
import os
from dataclasses import dataclass, field
from pathlib import Path

from ultralytics.cfg import get_cfg, get_save_dir
from ultralytics.utils import RANK

from ..errors import ConfigError
from .atomic import atomic_write_bytes

RUN_DIR_FILES = ("args.yaml", "results.csv")  # what BaseTrainer.__init__ rewrites (args.yaml) or unlinks (results.csv)
LOCK_NAME = ".yolo_ckpt.lock"  # the pid of the live yolo-ckpt run that trains into the folder
# "<lock file>:<pid>" of the lock this process holds, inherited by the processes it starts (Ultralytics' DDP workers run
# its trainer again, from a generated file): theirs too
LOCK_ENV = "YOLO_CKPT_RUN_LOCK"


def identity(path: Path) -> tuple[int, int, int] | None:
    """``(inode, mtime in ns, size in bytes)`` of the file at ``path``, None where there is none: a file rewritten in
    place changes its mtime, a file replaced (``os.replace``) its inode."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


def files_in(folder: Path) -> dict[str, tuple]:
    """``{path relative to folder: identity}`` of every file under ``folder`` (its lock file aside)."""
    if not folder.is_dir():
        return {}
    files = (p for p in folder.rglob("*") if not p.name.startswith(LOCK_NAME))
    return {str(p.relative_to(folder)): i for p in files if (i := identity(p)) and p.is_file()}


@dataclass
class RunDirState:
    """A run folder before a new run and what that run wrote into it.

    Attributes:
        run_dir: the folder (Ultralytics' ``get_save_dir``); made: the folders of ``run_dir``'s path (``weights`` in
            it, itself and its missing parents) that did not exist, deepest first.
        kept: ``{name: (bytes, mode)}`` of the :data:`RUN_DIR_FILES` it held, to put back; existed: the paths (relative
            to ``run_dir``) of every file it held.
        written: ``{path relative to run_dir: identity}`` of each file this run wrote, right after the write;
            removed: the files this run removed (``results.csv``).
        lock: the folder's lock this run holds (:func:`lock_run_dir`), or None.
    """

    run_dir: Path
    made: list[Path]
    kept: dict[str, tuple[bytes, int]]
    existed: set[str] = field(default_factory=set)
    written: dict[str, tuple] = field(default_factory=dict)
    removed: set[str] = field(default_factory=set)
    lock: Path | None = None


def run_dir_state(cfg, overrides: dict) -> RunDirState | None:
    """The :class:`RunDirState` of the folder ``BaseTrainer.__init__`` will pick (Ultralytics' ``get_cfg`` and
    ``get_save_dir``), before it writes anything; None for a resumed run, whose folder is the resumed one."""
    args = get_cfg(cfg, overrides)
    if args.resume:
        return None
    run_dir = get_save_dir(args)
    made = [p for p in (run_dir / "weights", run_dir, *run_dir.parents) if not p.exists()]
    kept = {n: ((run_dir / n).read_bytes(), (run_dir / n).stat().st_mode & 0o7777) for n in RUN_DIR_FILES if (run_dir / n).is_file()}
    return RunDirState(run_dir, made, kept, set(files_in(run_dir)))


@contextlib.contextmanager
def noted_writes(state: RunDirState | None):
    """Note in ``state`` what the block (this run's own code: ``BaseTrainer.__init__``, a plot) wrote into the run
    folder: the files it created or changed, with their identity at its end, and those it removed. Nothing for None."""
    before = files_in(state.run_dir) if state is not None else {}
    try:
        yield
    finally:
        if state is not None:
            after = files_in(state.run_dir)
            state.written.update({p: i for p, i in after.items() if before.get(p) != i})
            state.removed.update(p for p in before if p not in after)
            state.removed.difference_update(after)


def restore_run_dir(state: RunDirState) -> None:
    """Undo what this run wrote into its folder (:class:`RunDirState`): each file it wrote whose identity still is the
    one it left is put back (``args.yaml`` over an earlier run's), or removed where it is new (one it rewrote without
    its earlier bytes kept, a plot, stays as stock leaves it); a ``results.csv`` it removed is put back
    where no other run wrote one since; the lock is released; the folders it made are removed where empty."""
    for name, ident in state.written.items():
        path = state.run_dir / name
        if identity(path) != ident:  # rewritten by another run since: theirs
            continue
        if name in state.kept:
            _put_back(path, *state.kept[name])
        elif name not in state.existed:
            path.unlink(missing_ok=True)
    for name in state.removed:
        if name in state.kept and not (state.run_dir / name).exists():
            _put_back(state.run_dir / name, *state.kept[name])
    unlock_run_dir(state.lock)
    for folder in state.made:
        with contextlib.suppress(OSError):  # not empty (another run's files), or gone: leave it
            folder.rmdir()


def _put_back(path: Path, data: bytes, mode: int) -> None:
    atomic_write_bytes(path, data)
    path.chmod(mode)  # a new file would get the umask's mode


class RunDirBusyError(ConfigError):
    """A run folder another live yolo-ckpt run holds (:func:`lock_run_dir`)."""


def claim_run_dir(cfg, overrides: dict) -> tuple[RunDirState | None, dict]:
    """:func:`run_dir_state` of a new run with the folder's lock taken (:func:`lock_run_dir`), and ``overrides`` with
    its ``save_dir=`` (the folder exists now: with ``exist_ok=False`` Ultralytics' ``get_save_dir`` would pick the
    next name; a DDP worker is given it the same way); ``(None, overrides)`` for a resumed run. With ``exist_ok=False``
    a new folder another run took first (two runs started together, both picking ``runs/detect/train``) is passed
    over for the next name, as Ultralytics' ``increment_path`` passes over a folder that exists.

    Raises:
        ConfigError: as :func:`lock_run_dir` raises (with ``exist_ok=True``, :class:`RunDirBusyError`).
    """
    while True:
        state = run_dir_state(cfg, overrides)
        if state is None:
            return None, overrides
        try:
            state.lock = lock_run_dir(state.run_dir)
            return state, {**overrides, "save_dir": str(state.run_dir)}
        except RunDirBusyError:
            if get_cfg(cfg, overrides).exist_ok:
                raise
            # exist_ok=False: the folder exists now, get_save_dir picks the next name


def lock_run_dir(run_dir: Path, key: str = "name") -> Path | None:
    """Take the lock of the run folder ``run_dir`` (made here if missing): ``.yolo_ckpt.lock`` holding this process's
    pid, made whole at once (written beside it, then ``os.link``-ed: never seen empty); a lock whose pid is dead (a
    killed run) or this process's is taken over. Only in a run's own process (``RANK == -1``: not a DDP worker, whose
    launcher holds it; not under torchrun), and not where a process that started this one holds it (:data:`LOCK_ENV`:
    the DDP launcher of a worker run without torchrun). Returns the lock file, None where none was taken.

    Raises:
        RunDirBusyError: where another live process holds the lock (two runs would mix their files), naming the
            folder, the pid and what to do.
        ConfigError: where the folder cannot be written (a read-only folder or disk), naming the folder and ``key``
            (``name=``, or ``model=`` for a resumed run).
    """
    if RANK != -1:
        return None
    lock = Path(run_dir) / LOCK_NAME
    mine = lock.with_name(f"{LOCK_NAME}.{os.getpid()}.tmp")
    try:
        lock.parent.mkdir(parents=True, exist_ok=True)
        with os.fdopen(os.open(mine, os.O_CREAT | os.O_TRUNC | os.O_WRONLY, 0o644), "w") as f:
            f.write(f"{os.getpid()}\n")
        while True:
            try:
                os.link(mine, lock)
                os.environ[LOCK_ENV] = f"{lock}:{os.getpid()}"
                return lock
            except FileExistsError:
                pid = _holder(lock)
                if os.environ.get(LOCK_ENV) == f"{lock}:{pid}" and pid != os.getpid():  # the launcher's, of this same run
                    return None
                if pid is not None and pid != os.getpid() and _alive(pid):
                    raise RunDirBusyError(
                        f"{lock.parent} is in use by a live yolo-ckpt run (pid {pid}, {lock}): two runs in one folder mix their "
                        f"files; give another {key}=, or wait for that run to end"
                    ) from None
                lock.unlink(missing_ok=True)  # a killed run's, or this process's: taken over
    except OSError as e:
        if not (isinstance(e, PermissionError) or e.errno in {errno.EROFS, errno.EACCES}):
            raise
        raise ConfigError(
            f"the run folder {lock.parent} cannot be written ({e.strerror}): give a writable project= or {key}="
        ) from None
    finally:
        with contextlib.suppress(OSError):
            mine.unlink()


def unlock_run_dir(lock: Path | None) -> None:
    """Release the lock :func:`lock_run_dir` took: the file removed where it still holds this process's pid."""
    if lock is not None and _holder(lock) == os.getpid():
        lock.unlink(missing_ok=True)
        if os.environ.get(LOCK_ENV) == f"{lock}:{os.getpid()}":
            del os.environ[LOCK_ENV]


def _holder(lock: Path) -> int | None:
    """The pid in the lock file, None where it cannot be read (gone, or torn by a kill while it was written)."""
    try:
        return int(lock.read_text().strip())
    except (OSError, ValueError):
        return None


def _alive(pid: int) -> bool:
    """Whether process ``pid`` exists (``kill(pid, 0)``; a process of another user exists too)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextlib.contextmanager
def restored_on_failure(trainer):
    """Undo this run's writes into its folder (``trainer.ckpt_state.run_dir_before``, :func:`restore_run_dir`) when the
    block raises, anything, before the first epoch starts (``on_train_start`` clears the saved state: from then on the
    folder holds this run's results). Not for a resumed run (its folder is the resumed one) nor a DDP launcher, whose
    workers train."""
    try:
        yield
    except BaseException:
        before = trainer.ckpt_state.run_dir_before
        ours = before is not None and before.run_dir == getattr(trainer, "save_dir", before.run_dir)
        if RANK in {-1, 0} and ours and not getattr(trainer, "ddp", False):
            restore_run_dir(before)
        raise


@contextlib.contextmanager
def held_run_dir(trainer):
    """The run folder for the length of ``trainer.train()``: a resumed run's lock taken (:func:`lock_run_dir`; a new
    run's was, before its first write: :func:`claim_run_dir`), this run's writes undone where the block raises before
    the first epoch (:func:`restored_on_failure`), the lock released at the end, however it ends."""
    state = trainer.ckpt_state
    if trainer.args.resume and state.lock is None:
        state.lock = lock_run_dir(trainer.save_dir, "model")
    try:
        with restored_on_failure(trainer):
            yield
    finally:
        unlock_run_dir(state.lock)


class RunFolder:
    """The trainer's hooks of the run folder's restore (a base of :class:`~yolo_ckpt.train.trainer.CheckpointTrainerMixin`)."""

    def get_model(self, *args, **kwargs):
        """Ultralytics' ``get_model`` (``Model.train`` calls it between building the trainer and training), this run's
        writes into the run folder undone if it fails (:func:`restored_on_failure`)."""
        with restored_on_failure(self):
            return super().get_model(*args, **kwargs)

    def plot_training_labels(self):
        """Ultralytics' plots of the training labels, their files noted as this run's (:func:`noted_writes`): a set-up
        that fails afterwards removes them."""
        with noted_writes(self.ckpt_state.run_dir_before):
            return super().plot_training_labels()
