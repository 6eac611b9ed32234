"""The record every results folder holds (``record.json``: :data:`RECORD`), and how benchmark scripts write it.

One schema for every folder, matrix or study (MLPerf-style: the code's commit, the date, the system, the exact command):

- ``commit``: ``git rev-parse HEAD`` of the checkout whose code ran (None outside a git checkout); ``commit_inferred``:
  True where it was filled in later from git history (the parent of the last commit that changed the folder's
  figures, ``commit_note`` says which), else False;
- ``dirty``: whether that checkout had changes to tracked files outside ``benchmarks/results/`` when the record was
  made (``git status --porcelain --untracked-files=no``; None where unknown);
- ``date``: UTC, ISO 8601, when the record is made (a matrix run's at its launch, a study's when it writes its figures);
  ``machine``; ``versions``; ``seeds``: the seeds the measurement drew with;
- ``command``: the command line, its paths relative to the repository root, a dataset folder named against a
  ``datasets=$DATASETS`` root (``datasets`` says what the root held) and never an absolute or climbing path;
- a matrix's record adds ``matrix`` and ``kind``; a study's adds its figures (or names its CSV files); a run that adds
  to a folder already holding a record adds ``earlier_runs``, the same fields of each earlier leg (:func:`with_earlier_runs`).
"""

from __future__ import annotations

import json
import os
import subprocess
from datetime import datetime, timezone
from pathlib import Path

import torch

import yolo_ckpt

RECORD = "record.json"  # the one record file of every benchmarks/results/ folder
LEG = ("commit", "commit_inferred", "dirty", "date", "command")  # a run leg's fields (a matrix's earlier_runs)
DATASETS = "$DATASETS"  # a command's datasets= root as recorded: the folder holding <name>/data.yaml


def git_state(where: Path | None = None) -> dict:
    """``{"commit": sha, "commit_inferred": False, "dirty": bool}`` of the git checkout holding ``where`` (default:
    this package's source), or None for both outside a git checkout (an installed wheel). Dirty: a tracked file
    changed outside ``benchmarks/results/`` (what a bench writes while it runs does not count)."""
    where = Path(where or Path(yolo_ckpt.__file__).parent)

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(where), *args], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout if done.returncode == 0 else None

    commit, status = git("rev-parse", "HEAD"), git("status", "--porcelain", "--untracked-files=no")
    if commit is None or status is None:
        return {"commit": None, "commit_inferred": False, "dirty": None}
    changed = [line[3:] for line in status.splitlines() if line[3:] and not line[3:].startswith("benchmarks/results/")]
    return {"commit": commit.strip(), "commit_inferred": False, "dirty": bool(changed)}


def recorded_command(words: list[str], root: Path | None = None) -> str:
    """A command as a record holds it: each ``key=value`` whose value is a path inside the repository ``root``
    (default: this checkout) made relative to it, and a ``datasets=`` value replaced by :data:`DATASETS`.

    >>> recorded_command(["python -m benchmarks.memory_model.epoch_peaks", "datasets=/data/sets", "data=monuseg/data.yaml"])
    'python -m benchmarks.memory_model.epoch_peaks datasets=$DATASETS data=monuseg/data.yaml'
    """
    fixed = []
    for word in words:
        key, _, value = word.partition("=")
        if value and key == "datasets":
            word = f"datasets={DATASETS}"
        elif value:
            word = f"{key}={repo_relative(value, root)}"
        fixed.append(word)
    return " ".join(fixed)


def repo_relative(path, root: Path | None = None) -> str:
    """``path`` relative to the repository ``root`` (default: this checkout) where it is an absolute path inside it,
    else as given: ``/repo/benchmarks/results/x`` -> ``benchmarks/results/x``."""
    root = (root or Path(yolo_ckpt.__file__).parent.parent).resolve()
    inside = Path(path).is_absolute() and Path(path).resolve().is_relative_to(root)
    return Path(path).resolve().relative_to(root).as_posix() if inside else str(path)


def dataset_yaml(data: str, datasets: str | None = None) -> str:
    """A study's ``data=``, read against its ``datasets=`` root when it has one and ``data`` is relative
    (``data=monuseg/data.yaml datasets=/data`` -> ``/data/monuseg/data.yaml``), else as given."""
    return str(Path(datasets) / data) if datasets and not Path(data).is_absolute() else data


def provenance(command: str | list[str], seeds: list[int]) -> dict:
    """The record of a run launched now (see the module's schema): git state, date, machine (CPU model, cores, GPU
    if any), package versions, ``seeds`` and ``command`` (words: made relative by :func:`recorded_command`).
    The CPU model is Ultralytics' own, ``ultralytics.utils.torch_utils.get_cpu_info`` (the first ``model name`` of
    ``/proc/cpuinfo`` on Linux, without ``(R)`` and ``(TM)``; the platform's processor or machine elsewhere).

    Examples:
        >>> record = provenance(["python -m benchmarks.dense_scenes.dense", "out=benchmarks/results/dense"], seeds=[0])
        >>> sorted(record)[:4]
        ['command', 'commit', 'commit_inferred', 'date']
    """
    import ultralytics
    from ultralytics.utils import torch_utils

    return {
        **git_state(),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {
            "cpu": torch_utils.get_cpu_info(),
            "cores": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        },
        "versions": {"yolo_ckpt": yolo_ckpt.__version__, "ultralytics": ultralytics.__version__, "torch": torch.__version__},
        "seeds": list(seeds),
        "command": recorded_command(command.split(" ") if isinstance(command, str) else command),
    }


def read_record(folder: Path) -> dict:
    """``folder``'s :data:`RECORD` ({} where there is none yet)."""
    path = Path(folder) / RECORD
    return json.loads(path.read_text()) if path.is_file() else {}


def with_earlier_runs(record: dict, folder: Path) -> dict:
    """``record`` with ``earlier_runs``: the :data:`LEG` fields of each run that wrote into ``folder`` before this one
    (its :data:`RECORD`'s, after that record's own earlier runs); ``record`` as given where ``folder`` has none."""
    earlier = read_record(folder)
    if earlier:
        record["earlier_runs"] = [*earlier.get("earlier_runs", []), {k: earlier.get(k) for k in LEG}]
    return record


def write_record(folder: Path, record: dict) -> None:
    """Write ``record`` as ``folder``'s :data:`RECORD` (indented JSON)."""
    (Path(folder) / RECORD).write_text(json.dumps(record, indent=2))


def machine_text(machine: dict) -> str:
    """A :func:`provenance` machine as one line: ``AMD EPYC, 2 cores, 1 torch thread, GPU: none``."""
    threads = machine.get("torch_threads")
    return (
        f"{machine['cpu']}, {machine['cores']} cores"
        + (f", {threads} torch thread{'s' if threads != 1 else ''}" if threads else "")
        + f", GPU: {machine['gpu'] or 'none'}"
    )


def versions_text(versions: dict) -> str:
    """A :func:`provenance`'s versions as one line: ``yolo_ckpt 0.1.0, ultralytics 8.4.190, torch 2.14.1``."""
    return ", ".join(f"{k} {v}" for k, v in versions.items())


def measured_on(record: dict, date: str | None = None) -> dict:
    """The columns a result row carries about where it was measured: ``machine`` and ``versions`` of the
    :func:`provenance` ``record`` as one line each, and ``date`` (UTC, ``YYYY-MM-DD``; default: today)."""
    return {
        "machine": machine_text(record["machine"]),
        "versions": versions_text(record["versions"]),
        "date": date or datetime.now(timezone.utc).strftime("%Y-%m-%d"),
    }


def publish(result: dict, lines: list[str], out: str | None) -> None:
    """Print the Markdown ``lines``; with ``out``, write the study's record (``result``: :func:`provenance` and its
    figures) as :data:`RECORD`, and ``result.md`` (machine and command named) there."""
    text = "\n".join(lines)
    print(text)
    if out:
        folder = Path(out)
        folder.mkdir(parents=True, exist_ok=True)
        write_record(folder, result)
        footer = f"\n\nMachine: {machine_text(result['machine'])}. Command: `{result['command']}`\n"
        (folder / "result.md").write_text(text + footer)
