"""The loss region's chunk sizes: ``loss_chunk=`` (:mod:`yolo_ckpt.checkpointing.losses`, anchors per chunk of the mask
loss) and ``assign_chunk=`` (:mod:`yolo_ckpt.checkpointing.assigner`, objects per chunk of the assigner), their defaults
and their checks. Without torch: :class:`yolo_ckpt.config.CkptConfig` checks the keys with them before anything heavy
loads, and the mechanism checks what a training loop passes it with the same functions."""

from __future__ import annotations

from ..errors import ConfigError

DEFAULT_CHUNK = 256  # anchors per forward chunk: 256 x 65536 mask pixels (imgsz 1024) x 4 B = 64 MiB per temporary
DEFAULT_ASSIGN_CHUNK = 64  # objects per chunk: 64 x 21504 anchors (imgsz 1024) x 4 B = 5.5 MB per float row block


def check_chunk(key: str, chunk, unit: str, default: int) -> int:
    """Return ``chunk`` if it is a valid value of the chunk key ``key`` (``unit`` per chunk, ``default`` when unset).

    Raises:
        ConfigError: unless ``chunk`` is a positive int (a bool is not), naming the key, the value and its default.
    """
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise ConfigError(f"{key}={chunk!r} is not valid; give a positive int ({unit} per chunk, default {default})")
    return chunk


def check_loss_chunk(chunk) -> int:
    """``loss_chunk=``: anchors per forward chunk of the segmentation mask loss region (:func:`check_chunk`)."""
    return check_chunk("loss_chunk", chunk, "anchors", DEFAULT_CHUNK)


def check_assign_chunk(chunk) -> int:
    """``assign_chunk=``: objects per chunk of the loss region's task-aligned assigner (:func:`check_chunk`)."""
    return check_chunk("assign_chunk", chunk, "objects", DEFAULT_ASSIGN_CHUNK)
