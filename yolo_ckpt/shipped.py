"""yolo-ckpt's shipped YAML files, by name or by path: benchmark matrices (``bench``) and example policies
(``policies``, for ``cfg=``).

They are package data in ``yolo_ckpt/cfg/<kind>/``, installed or in a checkout alike. ``matrix=cpu-step`` and
``cfg=heavy-blocks`` name them; a path that exists wins over a name.
"""

from __future__ import annotations

from pathlib import Path

from .config import CFG_DIR
from .errors import ConfigError, MissingFileError

KINDS = ("bench", "policies")


def shipped_dir(kind: str) -> Path:
    """The folder of the shipped ``kind`` files: ``yolo_ckpt/cfg/<kind>``.

    Raises:
        ValueError: for a ``kind`` not in :data:`KINDS`.
    """
    if kind not in KINDS:
        raise ConfigError(f"kind={kind!r} is not valid; valid: {', '.join(KINDS)}")
    return CFG_DIR / kind


def shipped(kind: str) -> dict[str, Path]:
    """The shipped ``kind`` files by name (the file's stem), sorted: ``{"cpu-step": .../cpu-step.yaml, ...}``."""
    return {p.stem: p for p in sorted(shipped_dir(kind).glob("*.yaml"))}


def resolve_yaml(value, kind: str, key: str) -> Path:
    """The file ``key=value`` names: ``value`` itself when it is a file, else the shipped ``kind`` file of that name
    (``cpu-step`` or ``cpu-step.yaml``).

    Raises:
        FileNotFoundError: neither a file nor a shipped name; the one-line message lists the shipped names.
    """
    path = Path(str(value))
    if path.is_file():
        return path
    names = shipped(kind)
    name = path.name.removesuffix(".yaml") if path.parent == Path(".") else None
    if name in names:
        return names[name]
    raise MissingFileError(f"{key}={value}: no such file and no shipped file of that name; shipped: {', '.join(names) or 'none'}")
