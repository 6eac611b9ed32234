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
written. Where there is none (``ENOSPC``/``EFBIG`` while writing the temporary copy) the write falls back to stock's
in-place write with a one-line warning, so a run that stock finishes still finishes. A killed save leaves its
temporary file; :func:`remove_stale_temporaries` removes those at the next start or resume of the run.
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
    """Write ``path`` atomically: ``write(f)`` into a temporary file in the same folder, flushed, ``fsync``-ed, given
    :func:`stock_mode`, then ``os.replace``-d over ``path``.

    Args:
        write: writes the content to the open binary file it is given.
        in_place: stock's in-place write of ``path``, taken with a one-line warning where the temporary copy does not
            fit (:data:`NO_ROOM`); None: such an error is raised.

    Raises:
        OSError: as the write raises it; the temporary file is removed and ``path`` keeps its old content.
    """
    path = Path(path)
    mode, tmp = stock_mode(path), None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException as e:  # KeyboardInterrupt too: never leave the temporary file behind
        if tmp:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        if in_place is None or not (isinstance(e, OSError) and e.errno in NO_ROOM):
            raise
        LOGGER.warning(
            f"{path}: no room for an atomic save's temporary copy ({e.strerror}); writing it in place as Ultralytics does (a kill "
            "during this write corrupts it)"
        )
        in_place()


def atomic_write_bytes(path: str | Path, data: bytes) -> int:
    """:func:`atomic_write` of ``data``; returns the number of bytes written (as ``Path.write_bytes`` returns)."""
    atomic_write(path, lambda f: f.write(data))
    return len(data)


def remove_stale_temporaries(folder: str | Path) -> list[Path]:
    """Remove the temporary checkpoints (``.last.pt.XXXXXXXX.tmp``, :data:`STALE`) that killed saves left in
    ``folder``; returns them."""
    folder = Path(folder)
    stale = [p for p in folder.glob(".*.tmp") if STALE.fullmatch(p.name)] if folder.is_dir() else []
    for p in stale:
        with contextlib.suppress(FileNotFoundError):
            p.unlink()
    return stale


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
