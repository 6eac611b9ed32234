"""What every benchmark script records beside its figures, and how it writes them (result.json, result.md)."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path

import torch

import yolo_ckpt


def provenance(command: str) -> dict:
    """The machine (CPU model, cores, GPU if any), package versions and ``command``, the one that produced a result."""
    cpu = platform.processor() or platform.machine()
    if Path("/proc/cpuinfo").exists():
        names = [line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")]
        cpu = names[0] if names else cpu
    import ultralytics

    return {
        "machine": {
            "cpu": cpu,
            "cores": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        },
        "versions": {"yolo_ckpt": yolo_ckpt.__version__, "ultralytics": ultralytics.__version__, "torch": torch.__version__},
        "command": command,
    }


def publish(result: dict, lines: list[str], out: str | None) -> None:
    """Print the Markdown ``lines``; with ``out``, write ``result.json`` and ``result.md`` (machine named) there."""
    text = "\n".join(lines)
    print(text)
    if out:
        folder = Path(out)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "result.json").write_text(json.dumps(result, indent=2))
        m = result["machine"]
        footer = f"\n\nMachine: {m['cpu']}, {m['cores']} cores, GPU: {m['gpu'] or 'none'}. Command: `{result['command']}`\n"
        (folder / "result.md").write_text(text + footer)
