"""Exactness of the attention region (:mod:`yolo_ckpt.checkpointing.attention`) against stock Ultralytics, on the
shapes YOLO trains: the output and every gradient (input, parameters) of an ``Attention``/``AAttn`` module with its
class swapped, ``torch.equal`` to the stock module's, per ``attn_chunk`` (including sizes the key refuses, to
report their deviation), float32 on the CPU.

    python -m benchmarks.attention_exactness [out=benchmarks/results/attention-exactness/exactness.csv]

Shapes: yolo11n's C2PSA ``Attention(128, heads 2)`` (layer 10; YOLO26n's layers 10 and 22 are the same) at stride 32,
yolo12n's ``AAttn(64, heads 2, area 4)`` at stride 16 (layer 6) and ``AAttn(128, heads 4, area 1)`` at stride 32
(layer 8), at imgsz 256-1024 and batch 1 and 2. Writes one row per (module, imgsz, batch, chunk): the largest
absolute difference of the output and of all gradients (0 where bit-equal) and the seconds of forward+backward.
"""

from __future__ import annotations

import copy
import csv
import platform
import sys
import time
from pathlib import Path

import torch

SHAPES = {  # name -> (module factory, stride)
    "yolo11n.10.Attention": (lambda: __import__("ultralytics").nn.modules.block.Attention(128, 2, 0.5), 32),
    "yolo12n.6.AAttn(area 4)": (lambda: __import__("ultralytics").nn.modules.block.AAttn(64, 2, 4), 16),
    "yolo12n.8.AAttn(area 1)": (lambda: __import__("ultralytics").nn.modules.block.AAttn(128, 4, 1), 32),
}
IMGSZ = (256, 320, 640, 1024)
CHUNKS = (7, 16, 32, 48, 64, 100, 256, 1024)


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


def main(out: str = "benchmarks/results/attention-exactness/exactness.csv") -> None:
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
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    (Path(out).parent / "machine.txt").write_text(
        f"{platform.processor() or platform.machine()}, torch {torch.__version__}, capability "
        f"{torch.backends.cpu.get_cpu_capability()}, threads {torch.get_num_threads()}\n"
    )


if __name__ == "__main__":
    main(*[a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("out=")])
