"""The chunk sizes of the loss and attention regions: ``loss_chunk=`` (:mod:`yolo_ckpt.checkpointing.losses`, anchors
per chunk of the mask loss), ``assign_chunk=`` (:mod:`yolo_ckpt.checkpointing.assigner`, objects per chunk of the
assigner) and ``attn_chunk=`` (:mod:`yolo_ckpt.checkpointing.attention`, queries and keys per chunk), their defaults
and their checks. Without torch: :class:`yolo_ckpt.config.CkptConfig` checks the keys with them before anything heavy
loads, and the mechanism checks what a training loop passes it with the same functions."""

from __future__ import annotations

from ..errors import ConfigError

DEFAULT_CHUNK = 256  # anchors per forward chunk: 256 x 65536 mask pixels (imgsz 1024) x 4 B = 64 MiB per temporary
DEFAULT_ASSIGN_CHUNK = 64  # objects per chunk: 64 x 21504 anchors (imgsz 1024) x 4 B = 5.5 MB per float row block
# queries (and keys) per chunk: 256 x 9216 tokens (imgsz 3072, stride 32) x 4 B = 9 MiB per head and image per float
# temporary; the float64 ones of the exponential's emulation are twice that
DEFAULT_ATTN_CHUNK = 256
# the smallest attn_chunk: chunks are spread evenly over the tokens, so each holds at least half of attn_chunk rows, and
# MKL's sgemm gives the whole product's bits from 16 rows up (1 and 7 rows measured otherwise)
MIN_ATTN_CHUNK = 32
# each chunk key: the recompute= region that reads it, and which policies run that region (for the warning that the
# key has no effect: yolo_ckpt.config.CkptConfig.policy_warnings)
CHUNK_REGIONS = {
    "loss_chunk": ("loss", "loss, or all, on a detect, obb, pose or segment model"),
    "assign_chunk": ("loss", "loss, or all, on a detect, obb, pose or segment model"),
    "attn_chunk": ("attention", "attention, or all, on a model with attention layers"),
}


def check_chunk(key: str, chunk, unit: str, default: int, minimum: int = 1, why: str = "") -> int:
    """Return ``chunk`` if it is a valid value of the chunk key ``key`` (``unit`` per chunk, ``default`` when unset):
    an int (a bool is not) >= ``minimum``. The one check, and the one message, of every chunk key.

    Raises:
        ConfigError: otherwise, naming the key, the value, the valid ones, the default and ``why`` the minimum (if
            given), e.g. ``attn_chunk=16 is not valid; give an int >= 32 (queries per chunk, default 256; smaller chunks
            would not give stock's bits)``.
    """
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < minimum:
        valid = "a positive int" if minimum == 1 else f"an int >= {minimum}"
        raise ConfigError(f"{key}={chunk!r} is not valid; give {valid} ({unit} per chunk, default {default}{f'; {why}' if why else ''})")
    return chunk


def check_loss_chunk(chunk) -> int:
    """``loss_chunk=``: anchors per forward chunk of the segmentation mask loss region (:func:`check_chunk`)."""
    return check_chunk("loss_chunk", chunk, "anchors", DEFAULT_CHUNK)


def check_assign_chunk(chunk) -> int:
    """``assign_chunk=``: objects per chunk of the loss region's task-aligned assigner (:func:`check_chunk`)."""
    return check_chunk("assign_chunk", chunk, "objects", DEFAULT_ASSIGN_CHUNK)


def check_attn_chunk(chunk) -> int:
    """``attn_chunk=``: queries (and keys) per chunk of the attention region (:func:`check_chunk`), at least
    :data:`MIN_ATTN_CHUNK`: smaller chunks would give some matrix products other bits than the whole product.

    Raises:
        ConfigError: for a value that is not an int >= :data:`MIN_ATTN_CHUNK` (0, 16, ``'abc'``, ``True``), naming it,
            the smallest value, the default and why.
    """
    return check_chunk("attn_chunk", chunk, "queries", DEFAULT_ATTN_CHUNK, MIN_ATTN_CHUNK, "smaller chunks would not give stock's bits")
