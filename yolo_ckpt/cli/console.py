"""Where the commands write: their result to stdout, every diagnostic (Ultralytics' log, progress bars) to stderr."""

from __future__ import annotations

import contextlib
import logging
import sys


@contextlib.contextmanager
def diagnostics_to_stderr():
    """Inside the block, Ultralytics' log lines and every progress bar go to stderr, so that stdout holds only the
    result (``format=json | json.load``). Only the console handlers move (Ultralytics' is a plain StreamHandler): a
    FileHandler or a test runner's capture handler (pytest >= 9.2 adds one to Ultralytics' logger) keeps its stream.
    Entering it imports Ultralytics (and torch): check the arguments first. A machine's first import of Ultralytics logs
    its settings banner ("Creating new Ultralytics Settings ...") to the stdout of the time: that goes to stderr too."""
    first = "ultralytics" not in sys.modules
    with contextlib.redirect_stdout(sys.stderr):
        from ultralytics.utils import LOGGER

    handlers = [h for h in LOGGER.handlers if type(h) is logging.StreamHandler]
    streams = [sys.stdout if first else h.stream for h in handlers]  # a first import made them on the redirected stdout
    for h in handlers:
        _set_stream(h, sys.stderr)
    try:
        with contextlib.redirect_stdout(sys.stderr):  # TQDM writes to the sys.stdout of when it is made
            yield
    finally:
        for h, stream in zip(handlers, streams):
            _set_stream(h, stream)


def _set_stream(handler: logging.StreamHandler, stream) -> None:
    """``handler.setStream(stream)``, which flushes the old stream first, but not a closed one (a test runner's capture
    of an earlier test, where Ultralytics was imported): that one is replaced as it is."""
    if getattr(handler.stream, "closed", False):
        handler.stream = stream
    else:
        handler.setStream(stream)
