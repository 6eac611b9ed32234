"""The ``yolo-ckpt`` command (:func:`main`, in :mod:`.main`; a module per command: :mod:`.train`, :mod:`.profile`,
:mod:`.plan`, :mod:`.compare`, :mod:`.bench`) and its one ``key=value`` parser (:mod:`.args`), shared with the studies
in ``benchmarks/``. Importing it imports neither torch nor Ultralytics."""

from .main import main

__all__ = ["main"]
