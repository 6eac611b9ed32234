"""The ``yolo-ckpt`` command (:func:`main`; one function per command in :mod:`.commands`) and its one
``key=value`` parser (:mod:`.args`), shared with the bench scripts."""

from .commands import main

__all__ = ["main"]
