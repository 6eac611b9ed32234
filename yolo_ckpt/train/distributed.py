"""Training beyond one machine: yolo-ckpt's trainers as ``torchrun`` workers, on GPUs (NCCL) or CPUs (gloo).

Ultralytics' own launcher is single-node: with ``device=0,1`` it spawns ``torch.distributed.run --nproc_per_node``
on this machine. Under ``torchrun --nnodes N`` each worker is already a rank (``LOCAL_RANK`` set), and three things in
``BaseTrainer`` (engine/trainer.py, 8.4.190) stand in the way, which :class:`~yolo_ckpt.train.trainer.CheckpointTrainerMixin`
mends with the functions here:

- ``BaseTrainer.__init__`` counts the devices of ``device=`` on this node as the world size; the process group needs
  the whole job's (``WORLD_SIZE``, set by torchrun): :func:`torchrun_world_size`.
- On the CPU the world size is 0, and ``_setup_ddp`` is CUDA/NPU/XPU-only: :func:`init_cpu_process_group` starts a
  gloo group instead.
- ``_setup_train`` wraps the model in ``DistributedDataParallel(device_ids=[device.index])``, which DDP rejects for a
  CPU module (``[None]``): :func:`cpu_ddp` lets the same call build a CPU DDP (``device_ids=None``).
- ``BaseValidator.__call__`` (engine/validator.py) puts a DDP rank's final validation of ``best.pt`` on its current
  CUDA device: :func:`cpu_validation` keeps it on the CPU.

``batch=`` stays the global batch, split over all ranks, as Ultralytics splits it over one node's GPUs. PyTorch's
torchrun docs: https://pytorch.org/docs/stable/elastic/run.html
"""

from __future__ import annotations

import contextlib
import os
from datetime import timedelta

import torch
from torch import distributed as dist


def torchrun_world_size() -> int:
    """The whole job's number of ranks when this process is a ``torchrun`` worker (``LOCAL_RANK`` set), else 0."""
    if os.environ.get("LOCAL_RANK") is None:
        return 0
    return int(os.environ.get("WORLD_SIZE", "1"))


def init_cpu_process_group(world_size: int) -> None:
    """Join the job's gloo process group (rank and rendezvous from torchrun's environment), as ``_setup_ddp`` does
    for GPUs, with its 3-hour timeout; a no-op when this process already joined it (a second training in one
    torchrun script)."""
    if dist.is_initialized():
        return
    dist.init_process_group("gloo", timeout=timedelta(hours=3), rank=int(os.environ["RANK"]), world_size=world_size)


class _CPUDistributedDataParallel(torch.nn.parallel.DistributedDataParallel):
    """DDP that takes ``device_ids=[None]`` (a CPU device's index) as a CPU module's ``device_ids=None``."""

    def __init__(self, module, device_ids=None, *args, **kwargs):
        super().__init__(module, None if device_ids == [None] else device_ids, *args, **kwargs)


@contextlib.contextmanager
def cpu_ddp():
    """While active, ``torch.nn.parallel.DistributedDataParallel`` builds CPU modules with ``device_ids=[None]``; the
    module it builds is a DDP subclass, so Ultralytics' ``unwrap_model`` and ``isinstance`` checks still see DDP."""
    stock = torch.nn.parallel.DistributedDataParallel
    torch.nn.parallel.DistributedDataParallel = _CPUDistributedDataParallel
    try:
        yield
    finally:
        torch.nn.parallel.DistributedDataParallel = stock


@contextlib.contextmanager
def cpu_validation():
    """While active, Ultralytics' validator builds its model on the CPU for a DDP rank's final validation, where it
    would take the rank's CUDA device (``BaseValidator.__call__`` passes ``torch.device("cuda", current_device())``
    to ``AutoBackend`` whenever ``RANK != -1``); the ranks still validate their shards and gather as on GPUs."""
    from ultralytics.engine import validator

    stock = validator.AutoBackend, validator.get_torch_device_backend
    validator.get_torch_device_backend = lambda device_type: _NoAccelerator  # the argument is built first
    validator.AutoBackend = lambda *args, **kwargs: stock[0](*args, **{**kwargs, "device": torch.device("cpu")})
    try:
        yield
    finally:
        validator.AutoBackend, validator.get_torch_device_backend = stock


class _NoAccelerator:
    """Stands in for ``torch.cuda`` where the validator asks a rank's current device (replaced by the CPU)."""

    @staticmethod
    def current_device() -> int:
        return 0
