"""``yolo_ckpt.bench`` in a source checkout: the repository's ``benchmarks/`` folder, whose modules this package
loads. An install maps that folder here instead (pyproject's ``package-dir``), and this file is not installed."""

from pathlib import Path

__path__ = [str(Path(__file__).resolve().parents[2] / "benchmarks")]  # its submodules come from benchmarks/
