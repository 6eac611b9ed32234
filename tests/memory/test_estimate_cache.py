"""The estimate cache (yolo_ckpt.memory.estimate_cache): a second process asking for the same plan reads the loss
calibrations and fake passes an earlier one stored, and gets the same figures. In a process, one fake copy of a model
serves all its fake passes, with the figures of a fresh copy each."""

import pytest
import torch
from helpers import build_model, tiny_yaml

import yolo_ckpt.memory.composed as composed
import yolo_ckpt.memory.estimate as estimate
import yolo_ckpt.memory.fake_copy as fake_copies
import yolo_ckpt.memory.loss_calibration as calibration
from yolo_ckpt.cli.plan import plan_setup
from yolo_ckpt.memory import estimate_cache


def test_a_second_plan_reads_the_first_ones_figures(tmp_path, monkeypatch):
    monkeypatch.setenv(estimate_cache.ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(calibration, "_LOSS_MODELS", {})  # another test of this worker may have calibrated it in memory
    keys = [f"model={tiny_yaml(tmp_path)}", "imgsz=96", "batch=2", "device=cpu", "memory_budget=1GB", "objects=30"]

    def planned():
        memory, budget, _, _ = plan_setup(keys)
        auto = memory.plan(budget, 2, 96)
        base = memory.composed.base
        return memory, (base.peak_bytes, memory.estimate("all", 2, 96).peak_bytes, auto.recompute, auto.estimated_peak_bytes)

    monkeypatch.setattr(calibration, "_PREDICTION_SPECS", {})
    passes, specs = [], calibration._fake_prediction_specs
    monkeypatch.setattr(calibration, "_fake_prediction_specs", lambda *a: passes.append(a[1:]) or specs(*a))
    first_memory, first = planned()
    stored = sorted(p.parent.name for p in (tmp_path / "cache").rglob("*.json"))
    assert stored.count("loss") == 2 and stored.count("step") >= 2  # stock loss and loss region; the base pass and checks
    assert len(passes) == 1  # the two calibrations read the predictions' shapes of one fake pass
    calibration._LOSS_MODELS.clear()  # a new process: nothing in memory
    calls = []
    monkeypatch.setattr(composed, "estimate_step", lambda *a, **k: calls.append(a) or pytest.fail("a fake pass ran again"))
    monkeypatch.setattr(calibration, "_calibrate", lambda *a, **k: pytest.fail("the loss was calibrated again"))
    second_memory, second = planned()
    assert second == first and calls == []
    assert second_memory.composed.base == first_memory.composed.base  # the whole profile, per-layer rows included


def test_the_cache_can_be_turned_off_and_a_bad_entry_is_recomputed(tmp_path, monkeypatch):
    monkeypatch.setenv(estimate_cache.ENV, "0")
    assert estimate_cache.folder() is None and estimate_cache.load("step", ("k",)) is None
    estimate_cache.store("step", ("k",), {"a": 1})  # off: nothing written, no error
    monkeypatch.setenv(estimate_cache.ENV, str(tmp_path))
    estimate_cache.store("step", ("k",), {"a": 1})
    assert estimate_cache.load("step", ("k",)) == {"a": 1} and estimate_cache.load("step", ("other",)) is None
    next(tmp_path.rglob("*.json")).write_text('{"a": ')  # truncated (a copy from elsewhere, a full disk)
    assert estimate_cache.load("step", ("k",)) is None


def test_one_fake_copy_serves_every_pass_of_a_model_as_a_fresh_copy_would(tmp_path, monkeypatch):
    model = build_model(tiny_yaml(tmp_path))  # a small model: what is tested is the copy
    loss = estimate.LossModel("detect", (8.0,), 4, (), (0.0,) * 4, (0.0,) * 4)  # the network's passes alone
    monkeypatch.setattr(fake_copies, "_FAKE_COPIES", type(fake_copies._FAKE_COPIES)())
    step = lambda policy: estimate.estimate_step(model, 96, 2, 5, policy, loss_model=loss, flops=False)  # noqa: E731
    kept, copies = [], []
    for policy in ("all", "none", "all"):
        kept.append(step(policy))
        copies.append(id(fake_copies._FAKE_COPIES[model][2]))
    assert len(set(copies)) == 1  # one copy for the three passes
    fresh = []
    for policy in ("none", "all"):
        fake_copies._FAKE_COPIES.clear()
        fresh.append(step(policy))
    assert kept[1:] == fresh and kept[0] == kept[2]  # per-layer rows included
    assert kept[0].phase_peak_bytes["forward"] < kept[1].phase_peak_bytes["forward"]
    (fake,) = {fake_copies._FAKE_COPIES[model][2]}
    assert all(p.grad is None for p in fake.parameters()) and type(fake.model[2]) is type(model.model[2])  # no policy left

    model.model[0].conv.weight.requires_grad_(False)  # freeze=: another layout, another copy (no gradient for it)
    frozen = step("none")
    assert fake_copies._FAKE_COPIES[model][2] is not fake and frozen.peak_bytes < kept[1].peak_bytes

    apply = estimate.apply_checkpointing  # a pass that leaves something behind (a cached tensor) discards its copy
    leaves = lambda fake, *a, **k: setattr(fake.model[-1], "grid", torch.empty(1)) or apply(fake, *a, **k)  # noqa: E731
    monkeypatch.setattr(estimate, "apply_checkpointing", leaves)
    step("none")
    assert model not in fake_copies._FAKE_COPIES
