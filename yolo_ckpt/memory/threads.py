"""torch's intra-op threads for the estimate's own real tensor work: one.

The estimate computes little on real tensors, all of it small or memory-bound: the loss calibration's steps
(imgsz <= 160), copies of the model (``copy.deepcopy``) and Ultralytics' stride probe while it builds a model (one
forward of a 256 px image, ``DetectionModel.__init__`` in ``ultralytics/nn/tasks.py``). More threads there only wait on
each other, and on a busy host a waiting OpenMP thread spins: measured on a 2-core host under a load of 3, at 2 threads
against 1, ``YOLO("yolo11x.yaml")`` took 8.55 against 1.07 CPU s (and as long in wall time), a deepcopy of its model 1.1
against 0.17, yolo11n's two loss calibrations 9.4 against 4.5. The results do not depend on the thread count: the same
model (``tests/memory/test_threads.py``), the same fits (measured on yolo11n, yolo12n and yolo11n-seg). Fake passes
compute nothing: their cost is the same at any count (``yolo-ckpt plan`` on yolo11x took as long at
``OMP_NUM_THREADS=1`` as at 2 once this was in: ``benchmarks/results/plan-time-one-thread``).
"""

from __future__ import annotations

import contextlib

import torch


@contextlib.contextmanager
def one_thread():
    """torch's intra-op threads set to 1 inside, restored after (module docstring)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
