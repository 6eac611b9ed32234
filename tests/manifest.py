"""A manifest of a folder's files, to prove that the suite left ../shared as it found it (conftest's session hooks):
no torch, so the xdist controller starts without importing it."""

import hashlib
import os
from pathlib import Path


def tree_manifest(root) -> dict:
    """``{relative path: (size, mtime_ns, SHA-256 of the content or None)}`` of every file under ``root``; the
    content is hashed for files under 64 KiB only (labels, YAMLs: what a run could rewrite at the same size), so the
    shared datasets' ~1700 files take about a second."""
    root = Path(root)
    manifest = {}
    for folder, _, files in os.walk(root):
        for name in files:
            path = Path(folder) / name
            stat = path.stat()
            digest = hashlib.sha256(path.read_bytes()).hexdigest() if stat.st_size < 2**16 else None
            manifest[str(path.relative_to(root))] = (stat.st_size, stat.st_mtime_ns, digest)
    return manifest


def manifest_changes(before: dict, after: dict) -> list[str]:
    """The differences of two :func:`tree_manifest` s, one line per path: ``added``, ``removed`` or ``changed``."""
    return [
        f"{kind}: {path}"
        for kind, paths in (("added", after.keys() - before.keys()), ("removed", before.keys() - after.keys()),
                            ("changed", {p for p in before.keys() & after.keys() if before[p] != after[p]}))
        for path in sorted(paths)
    ]
