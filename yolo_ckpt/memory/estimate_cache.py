"""A disk cache of the memory model's costly figures across processes: loss calibrations
(:func:`yolo_ckpt.memory.loss_calibration.calibrate_loss`) and fake passes (:class:`yolo_ckpt.memory.memory_model.MemoryModel`'s), so that
``yolo-ckpt plan`` asked again for the same model (another budget, another imgsz), ``profile``, and a run's
``recompute=auto``, ``batch=-1`` or set-up estimate reuse what an earlier process computed.

A figure is keyed by everything it depends on: the code that made it (a hash of the package's source files, and the
torch and Ultralytics versions), the model (its YAML, classes, which parameters train and their dtypes) and the
step's arguments. Entries are JSON files written atomically (a temporary file, then ``os.replace``): a reader sees a
whole entry or none, and nothing in the cache is executed (no pickle). The folder is ``$YOLO_CKPT_ESTIMATE_CACHE``,
else ``estimates/`` in yolo-ckpt's cache folder (``$YOLO_CKPT_CACHE``, else ``~/.cache/yolo_ckpt``);
``YOLO_CKPT_ESTIMATE_CACHE=0`` turns it off. The folder can be deleted at any time.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import tempfile
from pathlib import Path

ENV = "YOLO_CKPT_ESTIMATE_CACHE"


@functools.cache
def code_fingerprint() -> str:
    """SHA-256 of the package's Python sources and the torch and Ultralytics versions: a figure is reused only by
    the code that computed it."""
    from importlib.metadata import version

    digest = hashlib.sha256()
    root = Path(__file__).parents[1]  # the whole package
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    for package in ("torch", "ultralytics"):
        digest.update(version(package).encode())
    return digest.hexdigest()


def architecture(model) -> str:
    """``model``'s YAML dictionary as text, less the file it was read from (``yaml_file``: the same layers from
    another path, or a checkpoint's copy, are the same model; the scale the file's name gave is kept as ``scale``)."""
    return repr({k: v for k, v in model.yaml.items() if k != "yaml_file"})


def model_key(model) -> tuple:
    """What of ``model`` a fake pass or a calibration depends on: its YAML (:func:`architecture`), the head's
    classes, and each parameter's dtype and whether it trains (frozen layers save less)."""
    head = model.model[-1]
    params = tuple((str(p.dtype), p.requires_grad) for p in model.parameters())
    return architecture(model), getattr(head, "nc", None), hashlib.sha256(repr(params).encode()).hexdigest()


def folder() -> Path | None:
    """The cache folder, or None when ``YOLO_CKPT_ESTIMATE_CACHE=0``."""
    value = os.environ.get(ENV)
    if value == "0":
        return None
    if value:
        return Path(value).expanduser()
    root = os.environ.get("YOLO_CKPT_CACHE") or Path.home() / ".cache" / "yolo_ckpt"
    return Path(root).expanduser() / "estimates"


def _path(kind: str, key) -> Path | None:
    where = folder()
    if where is None:
        return None
    name = hashlib.sha256(repr((code_fingerprint(), kind, key)).encode()).hexdigest()
    return where / kind / f"{name}.json"


def load(kind: str, key) -> dict | None:
    """The entry of ``kind`` (``"loss"``, ``"step"``) stored under ``key`` (a repr-able tuple), or None (absent,
    unreadable, or the cache off)."""
    path = _path(kind, key)
    if path is None or not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):  # a partial copy from elsewhere, a full disk: compute it again
        return None


def store(kind: str, key, value: dict) -> None:
    """Store ``value`` (JSON-serialisable) under ``key``, atomically; a folder that cannot be written is skipped
    (the cache is an optimisation, never a reason to fail)."""
    path = _path(kind, key)
    if path is None:
        return
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(value, f)
            os.replace(tmp, path)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
