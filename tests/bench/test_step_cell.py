"""``step`` cells' proofs (issue 45 item 4): the attention region's chunk passes counted where it runs and 0 where it
does not, ``same_gradients`` true for an exact policy and false when the cell's batch differs, the FLOP bound counting
the region's backward (cross-checked against the count of its products), and the pair-ratio interval around the
median ratio."""

import pytest
import torch
from helpers import tiny_yaml
from ultralytics import YOLO

from yolo_ckpt.bench import step_cell
from yolo_ckpt.bench.cells import CELL_KEYS, SETTINGS
from yolo_ckpt.memory.attention_shapes import attention_modules

SETTINGS_2 = {**SETTINGS["step"], "objects": 2, "pairs": 2}


def cells(model: str, imgsz: int, policies: list[str]) -> list[dict]:
    return [{**CELL_KEYS, "model": model, "imgsz": imgsz, "batch": 1, "recompute": p} for p in policies]


@pytest.mark.slow
def test_attention_region_counted_exact_and_in_the_flop_bound(tmp_path, one_thread):
    """The tiny C2PSA model at 256 px: 1024 tokens, 4 chunks of the default 256. ``all`` without the attention region
    (backbone,head,loss) runs no chunk pass; ``all`` runs 2 passes x 4 chunks in its one attention module's backward;
    both give none's gradients and BatchNorm buffers bit for bit, and the region's FLOPs above the other are its
    backward's rebuilt products: per image, head and N x N matrix 4 x key_dim + 2 x head_dim FLOPs an element (the
    scores twice, the probabilities' gradient once more)."""
    model = tiny_yaml(tmp_path, "attention")
    none, before, after = step_cell.measure(cells(model, 256, ["none", "backbone,head,loss", "all"]), SETTINGS_2)
    assert [r["status"] for r in (none, before, after)] == ["ok"] * 3
    assert none["attention_chunks_per_step"] == before["attention_chunks_per_step"] == 0
    assert after["attention_chunks_per_step"] == 2 * 4
    assert none["same_gradients"] is before["same_gradients"] is after["same_gradients"] is True
    net = YOLO(model).model
    (shape,) = attention_modules(net)
    (module,) = [m for m in net.modules() if type(m).__name__ == "Attention"]
    tokens = shape.tokens(256)
    extra = shape.groups * shape.heads * tokens**2 * (4 * shape.key_dim + 2 * module.head_dim)
    assert (after["flop_bound"] - before["flop_bound"]) * after["step_GFLOPs"] * 1e9 == pytest.approx(extra, rel=1e-9)
    assert none["flop_bound"] == 1 < before["flop_bound"]
    assert none["time_ratio_low"] == none["time_ratio_high"] == 1
    for row in (before, after):  # each of 2 pairs' ratio, and their median (of two: their mean) between them
        assert 0 < row["time_ratio_low"] < row["time_ratio_high"]
        assert row["time_ratio"] == pytest.approx((row["time_ratio_low"] + row["time_ratio_high"]) / 2, rel=1e-12)


def test_same_gradients_fails_on_another_batch(tmp_path, one_thread, monkeypatch):
    """The check can fail: a cell whose batch is not the baseline's (its images mirrored) is not ``same_gradients``
    (``backbone`` alone gives none's bits: the exactness tests); its chunk count is 0 (the small model has no
    attention)."""
    calls, real = [], step_cell.training_batch

    def mirrored_after_first(*args):
        batch = real(*args)
        calls.append(1)
        return batch if len(calls) == 1 else {**batch, "img": batch["img"].flip(-1)}

    monkeypatch.setattr(step_cell, "training_batch", mirrored_after_first)
    base, other = step_cell.measure(cells(tiny_yaml(tmp_path), 64, ["none", "backbone"]), {**SETTINGS_2, "pairs": 1})
    assert base["same_gradients"] is True and other["same_gradients"] is False
    assert base["attention_chunks_per_step"] == other["attention_chunks_per_step"] == 0


def test_same_state_compares_names_and_bits():
    a = {"grad:w": torch.ones(3), "buffer:running_mean": torch.zeros(2)}
    assert step_cell.same_state(a, {k: v.clone() for k, v in a.items()})
    assert not step_cell.same_state(a, {**a, "grad:w": torch.ones(3).nextafter(torch.tensor(2.0))})  # one ulp
    assert not step_cell.same_state(a, {"grad:w": a["grad:w"]})  # a missing buffer
