"""The index of ``benchmarks/results/`` (``index.yaml``): for each results folder the question it answers, the study
or matrix that made it, the modules it measures, where the README and docs cite it, its quality and its status.

A folder's entry (``index.yaml`` says how to add one)::

    equal-memory-bccd-seed0:
      question: equal-memory          # one of QUESTIONS: the results page's group
      answers: one line               # the question this folder answers
      matrix: equal-memory-bccd       # or study: benchmarks/<study>.py
      measures: [yolo_ckpt/...py]     # the modules whose change can change its figures
      cited_in: [README.md, ...]      # where the README and docs cite it (kept equal to citations())
      quality: free text              # how far to trust it: timings under load, one seed, ...
      status: current                 # or {superseded_by: folder}, {stale: commit}, {holds: commit or folder}

``status``: ``current`` (made at or after the last commit that changed ``measures``: :func:`changes_since`),
``stale: <commit>`` (the first commit after the record's that changed what it measures), ``superseded_by: <folder>``,
or ``holds: <commit or folder>`` (current although ``measures`` changed later: the re-measurement or commit that
shows the figures still hold). tests/bench/test_results_index.py keeps every entry true.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
INDEX = RESULTS / "index.yaml"
QUESTIONS = {  # the results page's groups, in its order
    "equal-memory": "Accuracy at equal memory",
    "memory-model": "Memory-model accuracy",
    "dense-scenes": "Dense scenes",
    "high-resolution": "High resolution",
    "mechanism": "Mechanism and speed",
}
CITING = ("README.md", "docs")  # where citations() looks (the generated results page aside)
_CITE = re.compile(r"(?:results/|results\.md#)([a-z0-9][a-z0-9-]*)")


def load() -> dict[str, dict]:
    """``index.yaml``: folder name -> its entry."""
    return yaml.safe_load(INDEX.read_text())["results"]


def folders() -> list[str]:
    """Every results folder's name (a folder holding a ``record.json``)."""
    return sorted(p.parent.name for p in RESULTS.glob("*/record.json"))


def citations() -> dict[str, list[str]]:
    """Folder name -> the README and docs pages (repository paths) that cite it: a link into
    ``benchmarks/results/<folder>`` or an anchor ``results.md#<folder>...`` (a longer folder name wins)."""
    names = sorted(folders(), key=len, reverse=True)
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    cited: dict[str, set] = {}
    for page in pages:
        if page == ROOT / "docs" / "benchmarks" / "results.md":
            continue
        for ref in _CITE.findall(page.read_text()):
            name = next((n for n in names if ref == n or ref.startswith(n + "-")), None)
            if name:
                cited.setdefault(name, set()).add(page.relative_to(ROOT).as_posix())
    return {n: sorted(p) for n, p in cited.items()}


def git(*args: str) -> str:
    """``git args`` in the repository, its stdout stripped (CalledProcessError where git fails)."""
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True).stdout.strip()


def changes_since(commit: str, paths: list[str]) -> list[str]:
    """The commits after ``commit`` (not in its history) up to HEAD that changed any of ``paths``, oldest first."""
    return git("log", "--reverse", "--format=%H", f"{commit}..HEAD", "--", *paths).splitlines()
