"""Checkpoints a kill cannot corrupt: ``last.pt``, ``best.pt`` and ``epochN.pt`` written atomically.

Ultralytics writes them twice per run: ``BaseTrainer.save_model`` (engine/trainer.py, 8.4.190) serialises the
checkpoint once, then writes it with ``Path.write_bytes``; at the end ``BaseTrainer.final_eval`` rewrites ``last.pt``
and ``best.pt`` with ``strip_optimizer`` (utils/torch_utils.py), which ``torch.save``-s over the same path. Both
truncate the file before writing: a ``kill -9``, an out-of-memory kill or a preempted instance in between leaves a
truncated checkpoint, and the previous one is already gone. :func:`atomic_saves` makes those writes atomic, with the
bytes stock writes: each goes to a temporary file ``.<name>.XXXXXXXX.tmp`` in the same folder, is flushed and
``fsync``-ed, given the mode stock would give the file, then ``os.replace``-d over the target (atomic on POSIX and
Windows within one file system), so a reader finds either the previous complete file or the new complete file.

What this needs: room on the disk (and under the file-size limit) for a second copy of the checkpoint while it is
written. Where the disk has none (``ENOSPC`` while writing the temporary copy) but the file exists and the new one
fits in its place, the write falls back to stock's in-place write with a one-line warning, so a run that stock
finishes still finishes. Otherwise (no earlier file, a new file larger than the room its old one leaves, or the
file-size limit, ``EFBIG``: an in-place write would fail the same way and leave a torn file) nothing is written: the
partial temporary file is removed and :class:`~yolo_ckpt.errors.NoRoomError` says how many bytes the save needs. A
killed save leaves its temporary file; :func:`remove_stale_temporaries` removes those wherever a command touches the
run (a trainer's start, ``resume`` and its refusal, a command loading a ``.pt`` beside them), sparing a temporary
file whose writer is alive (it holds an ``flock`` on it while it writes).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
from ultralytics.utils import LOGGER

from ..errors import NoRoomError

try:  # POSIX: a writer's lock tells a live temporary file from a killed save's
    import fcntl
except ImportError:  # Windows: an open file cannot be removed anyway (the unlink fails and it is left)
    fcntl = None

# a temporary copy that does not fit: the disk is full (ENOSPC) or the file-size limit is reached (EFBIG, ulimit -f)
NO_ROOM = (errno.ENOSPC, errno.EFBIG)
# tempfile.mkstemp's names for a checkpoint "x.pt": ".x.pt." + 8 random characters + ".tmp"
STALE = re.compile(r"\..+\.pt\.[a-z0-9_]{8}\.tmp")


def stock_mode(path: Path) -> int:
    """The permission bits stock's write leaves ``path`` with: the replaced file's, else ``0o666 & ~umask`` (what
    ``open(path, "wb")`` creates; ``mkstemp``'s 0600 would make a checkpoint unreadable to the group)."""
    with contextlib.suppress(FileNotFoundError):
        return stat.S_IMODE(os.stat(path).st_mode)
    return 0o666 & ~_umask()


def _umask() -> int:
    """The process's umask: Linux's /proc/self/status, else set and put back (a moment another thread could see)."""
    with contextlib.suppress(OSError, StopIteration, IndexError, ValueError):
        status = Path("/proc/self/status").read_text().splitlines()
        return int(next(line for line in status if line.startswith("Umask:")).split()[1], 8)
    umask = os.umask(0)
    os.umask(umask)
    return umask


def atomic_write(path: str | Path, write: Callable, in_place: Callable | None = None) -> None:
    """Write ``path`` atomically: ``write(f)`` into a temporary file in the same folder (locked while it is written:
    :func:`remove_stale_temporaries` spares it), flushed, ``fsync``-ed, given :func:`stock_mode`, then
    ``os.replace``-d over ``path``.

    Args:
        write: writes the content to the open binary file it is given (only ``write`` and ``flush`` are called on it).
        in_place: stock's in-place write of ``path``, taken with a one-line warning where the temporary copy does not
            fit on the disk (``ENOSPC``) but ``path`` exists and the new content fits in the room it leaves; None:
            never.

    Raises:
        NoRoomError: where the temporary copy does not fit (:data:`NO_ROOM`) and no in-place write is taken: one
            line with the bytes the save needs and the free bytes (or the file-size limit); the temporary file is
            removed, ``path`` keeps its old content, or stays absent.
        OSError: as the write raises it otherwise; the temporary file is removed and ``path`` keeps its old content.
    """
    path = Path(path)
    mode, tmp, recorded, old_size = stock_mode(path), None, None, path.stat().st_size if path.is_file() else None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "wb") as f:
            if fcntl is not None:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX)  # released when the file closes, or the process dies
            write(recorded := _Recorded(f))
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException as e:  # KeyboardInterrupt too: never leave the temporary file behind
        if tmp:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        # torch.save's writer turns the file's OSError into a RuntimeError ("basic_ios::clear: iostream error")
        error = e if isinstance(e, OSError) else getattr(recorded, "error", None)
        if not (isinstance(error, OSError) and error.errno in NO_ROOM):
            raise
        e = error
        needed, free = _size(write), _free_bytes(path.parent)
        if in_place is not None and e.errno == errno.ENOSPC and old_size is not None and needed <= free + old_size:
            LOGGER.warning(
                f"{path}: no room for an atomic save's temporary copy ({e.strerror}); writing it in place as Ultralytics does (a "
                "kill during this write corrupts it)"
            )
            in_place()
            return
        raise _no_room(path, e, needed, free, old_size is not None) from e


class _Recorded:
    """A binary file, the last OSError its ``write`` and ``flush`` raised kept as ``error``; its other attributes
    (``name``, ``fileno``) are the file's."""

    def __init__(self, f):
        self.f, self.error = f, None

    def __getattr__(self, name):
        return getattr(self.f, name)

    def write(self, data) -> int:
        try:
            return self.f.write(data)
        except OSError as e:
            self.error = e
            raise

    def flush(self) -> None:
        try:
            self.f.flush()
        except OSError as e:
            self.error = e
            raise


def _size(write: Callable) -> int:
    """The bytes ``write`` writes, counted without storing them."""

    class Counter:
        n = 0

        def write(self, data) -> int:
            n = memoryview(data).nbytes
            self.n += n
            return n

        def flush(self) -> None:
            pass

    counter = Counter()
    write(counter)
    return counter.n


def _free_bytes(folder: Path) -> int:
    """The bytes an unprivileged write may still take on ``folder``'s file system (0 where it cannot be read)."""
    with contextlib.suppress(OSError, AttributeError):  # AttributeError: no os.statvfs (Windows)
        st = os.statvfs(folder)
        return st.f_bavail * st.f_frsize
    return 0


def _no_room(path: Path, e: OSError, needed: int, free: int, existed: bool) -> NoRoomError:
    """The one-line :class:`NoRoomError` of a save of ``needed`` bytes that did not fit."""
    def mib(n: int) -> str:
        return f"{n / 2**20:.1f} MiB ({n} bytes)"

    if e.errno == errno.EFBIG:  # the file-size limit: POSIX, where the resource module is
        import resource

        limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
        room = f"the file-size limit (ulimit -f) is {mib(limit) if limit != resource.RLIM_INFINITY else 'unlimited'}"
    else:
        room = f"{mib(free)} free on its disk"
    kept = f"{path.name} keeps its previous content" if existed else f"no {path.name} was written"
    err = NoRoomError(f"{path}: no room to save it ({e.strerror}): the save needs {mib(needed)}, {room}; {kept}")
    err.errno = e.errno  # not strerror: OSError.__str__ would print "[Errno 28] ..." instead of the message
    return err


def atomic_write_bytes(path: str | Path, data: bytes) -> int:
    """:func:`atomic_write` of ``data``; returns the number of bytes written (as ``Path.write_bytes`` returns)."""
    atomic_write(path, lambda f: f.write(data))
    return len(data)


def remove_stale_temporaries(folder: str | Path) -> list[Path]:
    """Remove the temporary checkpoints (``.last.pt.XXXXXXXX.tmp``, :data:`STALE`) that killed saves left in
    ``folder``, sparing those a live writer still holds locked (:func:`atomic_write`); returns those removed."""
    folder = Path(folder)
    removed = []
    for p in folder.glob(".*.tmp") if folder.is_dir() else []:
        if not STALE.fullmatch(p.name) or _being_written(p):
            continue
        with contextlib.suppress(OSError):  # gone meanwhile, or (Windows) open in another process
            p.unlink()
            removed.append(p)
    return removed


def _being_written(path: Path) -> bool:
    """Whether a live :func:`atomic_write` holds ``path`` locked (never, where there are no locks)."""
    if fcntl is None:
        return False
    try:
        with open(path, "rb") as f:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)  # released as the file closes
    except BlockingIOError:
        return True
    except OSError:  # gone meanwhile
        return False
    return False


@contextlib.contextmanager
def atomic_saves(folder: str | Path):
    """While active, ``Path.write_bytes`` and ``torch.save`` to a file directly inside ``folder`` are
    :func:`atomic_write` (with stock's in-place write as the fallback); writes to anything else go through unchanged.

    Wraps ``BaseTrainer.save_model`` (``Path.write_bytes``) and ``BaseTrainer.final_eval`` (``strip_optimizer``'s
    ``torch.save``, which ``torch_utils`` reads from the ``torch`` module at call time).
    """
    folder = Path(folder).resolve()
    stock_write_bytes, stock_save = Path.write_bytes, torch.save

    def inside(f) -> bool:
        return isinstance(f, (str, os.PathLike)) and Path(f).resolve().parent == folder

    def write_bytes(self: Path, data) -> int:
        if not inside(self):
            return stock_write_bytes(self, data)
        data = bytes(data)
        atomic_write(self, lambda f: f.write(data), lambda: stock_write_bytes(self, data))
        return len(data)

    def save(obj, f, *args, **kwargs):
        if not inside(f):
            return stock_save(obj, f, *args, **kwargs)
        atomic_write(f, lambda file: stock_save(obj, file, *args, **kwargs), lambda: stock_save(obj, f, *args, **kwargs))

    Path.write_bytes, torch.save = write_bytes, save
    try:
        yield
    finally:
        Path.write_bytes, torch.save = stock_write_bytes, stock_save
