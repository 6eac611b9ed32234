"""What every benchmark script records beside its figures, and how it writes them (result.json, result.md)."""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from pathlib import Path

import torch

import yolo_ckpt


def provenance(command: str) -> dict:
    """The machine (CPU model, cores, GPU if any), package versions and ``command``, the one that produced a result.
    The CPU model is Ultralytics' own, ``ultralytics.utils.torch_utils.get_cpu_info`` (the first ``model name`` of
    ``/proc/cpuinfo`` on Linux, without ``(R)`` and ``(TM)``; the platform's processor or machine elsewhere)."""
    import ultralytics
    from ultralytics.utils import torch_utils

    return {
        "machine": {
            "cpu": torch_utils.get_cpu_info(),
            "cores": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        },
        "versions": {"yolo_ckpt": yolo_ckpt.__version__, "ultralytics": ultralytics.__version__, "torch": torch.__version__},
        "command": command,
    }


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
    """Print the Markdown ``lines``; with ``out``, write ``result.json`` and ``result.md`` (machine named) there."""
    text = "\n".join(lines)
    print(text)
    if out:
        folder = Path(out)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "result.json").write_text(json.dumps(result, indent=2))
        footer = f"\n\nMachine: {machine_text(result['machine'])}. Command: `{result['command']}`\n"
        (folder / "result.md").write_text(text + footer)
