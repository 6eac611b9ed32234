"""Exactness of the attention region (:mod:`yolo_ckpt.checkpointing.attention`) against stock Ultralytics, on the
shapes YOLO trains: the output and every gradient (input, parameters) of an ``Attention``/``AAttn`` module with its
class swapped, ``torch.equal`` to the stock module's, per ``attn_chunk`` (including sizes the key refuses, to
report their deviation), float32 on the CPU.

    python -m benchmarks.mechanism.attention_exactness [out=benchmarks/results/attention-exactness]

Shapes: yolo11n's C2PSA ``Attention(128, heads 2)`` (layer 10; YOLO26n's layers 10 and 22 are the same) at stride 32,
yolo12n's ``AAttn(64, heads 2, area 4)`` at stride 16 (layer 6) and ``AAttn(128, heads 4, area 1)`` at stride 32
(layer 8), at imgsz 256-1024 and batch 1 and 2. Writes one row per (module, imgsz, batch, chunk): the largest
absolute difference of the output and of all gradients (0 where bit-equal) and the seconds of forward+backward. With
``out=`` (a folder) the rows go to ``exactness.csv`` there, ``result.md`` sums them up per module and chunk and
``record.json`` ties the run to its commit.
"""

from __future__ import annotations

import copy
import csv
import sys
import time
from pathlib import Path

import torch

from yolo_ckpt.bench.results_io import provenance, publish
from yolo_ckpt.cli.args import parse_keys
from yolo_ckpt.cli.main import run_command

SHAPES = {  # name -> (module factory, stride)
    "yolo11n.10.Attention": (lambda: __import__("ultralytics").nn.modules.block.Attention(128, 2, 0.5), 32),
    "yolo12n.6.AAttn(area 4)": (lambda: __import__("ultralytics").nn.modules.block.AAttn(64, 2, 4), 16),
    "yolo12n.8.AAttn(area 1)": (lambda: __import__("ultralytics").nn.modules.block.AAttn(128, 4, 1), 32),
}
IMGSZ = (256, 320, 640, 1024)
CHUNKS = (7, 16, 32, 48, 64, 100, 256, 1024)
KEYS = ("out",)  # the key=value words main takes


def _run(module, x):
    x = x.clone().requires_grad_()
    t = time.perf_counter()
    out = module(x)
    out.backward(torch.linspace(-1, 1, out.numel()).view_as(out))
    seconds = time.perf_counter() - t
    return [out.detach(), x.grad, *(p.grad for p in module.parameters())], seconds


def deviation(a: list, b: list) -> float:
    """The largest absolute difference between two lists of tensors (0.0 where all are bit-equal)."""
    return max((x - y).abs().max().item() for x, y in zip(a, b))


def main(argv: list[str]) -> dict:
    out = parse_keys(argv, KEYS, "benchmarks.mechanism.attention_exactness").get("out")
    from yolo_ckpt.checkpointing import attention

    rows = []
    for name, (factory, stride) in SHAPES.items():
        for imgsz in IMGSZ:
            for batch in (1, 2):
                torch.manual_seed(0)
                stock = factory().train()
                side = imgsz // stride
                x = torch.randn(batch, stock.qkv.conv.in_channels, side, side)
                ref, t_stock = _run(stock, x)
                for chunk in CHUNKS:
                    patched = copy.deepcopy(stock)
                    patched.zero_grad(set_to_none=True)
                    # the class set directly: the study also measures chunk sizes check_attn_chunk refuses
                    patched.__class__ = attention.chunked_class(type(stock), chunk)
                    got, t = _run(patched, x)
                    dev = deviation(got, ref)
                    tokens = side * side // getattr(stock, "area", 1)
                    rows.append({
                        "module": name, "imgsz": imgsz, "batch": batch, "tokens": tokens, "attn_chunk": chunk, "chunked": chunk < tokens,
                        "max_abs_diff": dev, "seconds": round(t, 3), "stock_seconds": round(t_stock, 3),
                    })
                    print(rows[-1], flush=True)
    result = provenance(["python -m benchmarks.mechanism.attention_exactness", *argv], seeds=[0])
    if out:
        result["csv"] = ["exactness.csv"]
        Path(out).mkdir(parents=True, exist_ok=True)
        with open(Path(out) / "exactness.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    publish(result, summary(rows), out)
    return result


def summary(rows: list[dict]) -> list[str]:
    """``result.md``'s lines: per module and ``attn_chunk``, the cases, those chunked, those bit-equal among them and
    the largest absolute difference (``rows`` as :func:`main` measures them or ``exactness.csv`` holds them)."""
    lines = [
        "Chunked attention against stock Ultralytics: output, input and parameter gradients, float32 on the CPU, "
        f"imgsz {', '.join(map(str, IMGSZ))}, batch 1 and 2 (every case in `exactness.csv`).",
        "",
        "| module | attn_chunk | cases | chunked | bit-equal of chunked | largest abs difference |",
        "|---|---|---|---|---|---|",
    ]
    for key in dict.fromkeys((r["module"], int(r["attn_chunk"])) for r in rows):
        group = [r for r in rows if (r["module"], int(r["attn_chunk"])) == key]
        chunked = [r for r in group if str(r["chunked"]) == "True"]
        equal = sum(float(r["max_abs_diff"]) == 0 for r in chunked)
        largest = max(float(r["max_abs_diff"]) for r in group)
        lines.append(f"| {key[0]} | {key[1]} | {len(group)} | {len(chunked)} | {equal} | {largest:.3g} |")
    return lines


if __name__ == "__main__":
    sys.exit(run_command(main, sys.argv[1:], "benchmarks.mechanism.attention_exactness"))
