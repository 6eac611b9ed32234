"""Checkpoints a kill cannot corrupt: ``last.pt``, ``best.pt`` and ``epochN.pt`` written atomically.

Ultralytics' ``BaseTrainer.save_model`` (engine/trainer.py, 8.4.190) serialises the checkpoint once, then writes it
with ``Path.write_bytes``, which truncates the file before writing. A ``kill -9``, an out-of-memory kill or a
preempted instance between the two leaves a truncated ``last.pt``, and the previous epoch's checkpoint is already
gone. :func:`atomic_saves` makes those writes atomic, with the bytes stock writes: each goes to a temporary file in
the same folder, is flushed and ``fsync``-ed, then ``os.replace``-d over the target (atomic on POSIX and Windows
within one file system), so a reader finds either the previous complete file or the new complete file.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def atomic_write_bytes(path: str | Path, data: bytes) -> int:
    """Write ``data`` to ``path`` atomically: a temporary file in the same folder, flushed, then ``os.replace``.

    Returns:
        The number of bytes written (as ``Path.write_bytes`` returns).

    Raises:
        OSError: as the write raises it; the temporary file is removed and ``path`` keeps its old content.
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:  # KeyboardInterrupt too: never leave the temporary file behind
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return len(data)


@contextlib.contextmanager
def atomic_saves(folder: str | Path):
    """While active, ``Path.write_bytes`` of a file directly inside ``folder`` is :func:`atomic_write_bytes`.

    Wraps ``BaseTrainer.save_model``, whose own code writes ``last.pt``/``best.pt``/``epochN.pt`` with
    ``Path.write_bytes``; writes to any other path go through unchanged.
    """
    folder = Path(folder).resolve()
    stock = Path.write_bytes

    def write_bytes(self: Path, data) -> int:
        if Path(self).resolve().parent == folder:
            return atomic_write_bytes(self, bytes(data))
        return stock(self, data)

    Path.write_bytes = write_bytes
    try:
        yield
    finally:
        Path.write_bytes = stock
