"""The index of ``benchmarks/results/`` (``index.yaml``): for each results folder the question it answers, the study
or matrix that made it, the modules it measures, where the README and docs cite it, its quality and its status.

A folder's entry (``index.yaml`` says how to add one)::

    equal-memory-bccd-seed0:
      question: equal-memory          # one of QUESTIONS: the results page's group
      answers: one line               # the question this folder answers
      matrix: equal-memory-bccd       # or study: benchmarks/<question>/<study>.py
      measures: [yolo_ckpt/...py]     # the modules whose change can change its figures
      cited_in: [README.md, ...]      # where the README and docs cite it (kept equal to citations())
      quality: free text              # how far to trust it: timings under load, one seed, ...
      status: current                 # or {superseded_by: folder}, {stale: commit}, {holds: commit or folder}

``status``: ``current`` (the code of ``measures`` is the same at HEAD as at the record's commit, docstrings and
comments aside, a file moved since read under its former name: :func:`code_changed`, :func:`former_path`),
``stale: <commit>`` (a commit after the record's that changed that code), ``superseded_by: <folder>``, or
``holds: <commit or folder>`` (current although ``measures`` changed later: the re-measurement or commit that shows
the figures still hold). tests/bench/test_results_index.py keeps every entry true.
"""

from __future__ import annotations

import ast
import functools
import json
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


@functools.cache
def renames() -> list[tuple[str, str, str]]:
    """Every rename in HEAD's history as ``(commit, old path, new path)``, newest first (``git log -M``)."""
    found, commit = [], None
    for line in git("log", "-M", "--diff-filter=R", "--name-status", "--format=%H", "HEAD").splitlines():
        if re.fullmatch(r"[0-9a-f]{40}", line):
            commit = line
        elif line.startswith("R"):
            found.append((commit, *line.split("\t")[1:3]))
    return found


@functools.cache
def former_path(commit: str, path: str) -> str:
    """The name at ``commit`` of the file that is ``path`` at HEAD: ``path`` where it exists there under that name,
    else its name before the renames after ``commit`` (:func:`renames`, newest first): a moved module keeps its
    history, and a move alone changes no code (a study moved into its question's sub-package, a module of the
    package renamed)."""
    if subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{commit}:{path}"], capture_output=True).returncode == 0:
        return path
    after = set(git("rev-list", f"{commit}..HEAD").split())
    for rename, old, new in renames():
        if new == path and rename in after:
            path = old
    return path


@functools.cache
def code_of(commit: str, path: str) -> str | None:
    """The code at ``commit`` of the file that is ``path`` at HEAD, under its name there (:func:`former_path`; None
    where it did not exist): a Python file's syntax tree without docstrings (a change of wording or comments is no
    change of the code it measures), any other file's text."""
    try:
        text = git("show", f"{commit}:{former_path(commit, path)}")
    except subprocess.CalledProcessError:
        return None
    if not path.endswith(".py"):
        return text
    tree = ast.parse(text)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
            if isinstance(body[0].value.value, str):
                node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree)


def code_changed(before: str, after: str, paths: list[str]) -> bool:
    """Whether the code of any of ``paths`` (:func:`code_of`) differs between the commits ``before`` and ``after``."""
    return any(code_of(before, p) != code_of(after, p) for p in paths)


def changes_since(commit: str, paths: list[str]) -> list[str]:
    """The commits after ``commit`` (not in its history) up to HEAD that changed the code of any of ``paths`` (named as
    at HEAD, their former names followed: :func:`former_path`), by :func:`code_changed` against their first parent,
    oldest first."""
    names = sorted({former_path(commit, p) for p in paths} | set(paths))
    touched = git("log", "--reverse", "--format=%H", f"{commit}..HEAD", "--", *names).splitlines()
    return [c for c in touched if code_changed(f"{c}^", c, paths)]


def history_status(folder: str, entry: dict) -> str | dict:
    """The status git history gives ``folder``: ``current`` where the code it measures is the same at HEAD as at its
    record's commit, else ``{"stale": <first later commit that changed it>}``; an entry that ``holds`` keeps its status
    until that code changes after the commit (or re-measured folder's commit) it cites, then turns stale from there
    (``superseded_by`` and ``holds`` are a person's to give)."""
    status = entry.get("status")
    holds = isinstance(status, dict) and "holds" in status
    since = str(status["holds"]) if holds else folder  # a results folder (its record's commit) or a commit
    record = RESULTS / since / "record.json"
    commit = json.loads(record.read_text())["commit"] if record.is_file() else git("rev-parse", since)
    if not code_changed(commit, "HEAD", entry["measures"]):
        return status if holds else "current"
    changes = changes_since(commit, entry["measures"])
    return {"stale": changes[0][:12]} if changes or not holds else status


def refresh(write: bool = False) -> list[str]:
    """The entries whose ``status`` (current, stale, or holds where the code changed after what it cites) or
    ``cited_in`` disagree with git history and a grep, as lines
    ``name: field: old -> new``; with ``write``, ``index.yaml`` rewritten with the new values (its header kept)."""
    text = INDEX.read_text()
    index, cited, lines = yaml.safe_load(text), citations(), []
    for name, entry in index["results"].items():
        status = entry["status"]
        if (isinstance(status, str) or "stale" in status or "holds" in status) and (given := history_status(name, entry)) != status:
            lines.append(f"{name}: status: {status} -> {given}")
            entry["status"] = given
        if entry.get("cited_in") != cited.get(name, []):
            lines.append(f"{name}: cited_in: {entry.get('cited_in')} -> {cited.get(name, [])}")
            entry["cited_in"] = cited.get(name, [])
    if write and lines:
        header = text[: text.index("questions:")]
        INDEX.write_text(header + yaml.safe_dump(index, sort_keys=False, width=120, allow_unicode=True))
    return lines


if __name__ == "__main__":  # python -m benchmarks.results_index [--write]: what git history and a grep say differs
    import sys

    print("\n".join(refresh(write="--write" in sys.argv[1:])) or "index.yaml agrees with git history and the docs")
