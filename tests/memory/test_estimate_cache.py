"""The estimate cache (yolo_ckpt.memory.estimate_cache): a second process asking for the same plan reads the loss
calibrations and fake passes an earlier one stored, and gets the same figures."""

import pytest

import yolo_ckpt.memory.estimate as estimate
import yolo_ckpt.memory.plan as planner
from yolo_ckpt.cli.commands import plan_setup
from yolo_ckpt.memory import estimate_cache


def test_a_second_plan_reads_the_first_ones_figures(tmp_path, monkeypatch):
    monkeypatch.setenv(estimate_cache.ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(estimate, "_LOSS_MODELS", {})  # another test of this worker may have calibrated yolo11n in memory
    keys = ["model=yolo11n.yaml", "imgsz=96", "batch=2", "device=cpu", "memory_budget=1GB", "objects=30"]

    def planned():
        memory, budget, _, _ = plan_setup(keys)
        auto = memory.plan(budget, 2, 96)
        return memory, (memory.base.peak_bytes, memory.estimate("all", 2, 96).peak_bytes, auto.recompute, auto.estimated_peak_bytes)

    monkeypatch.setattr(estimate, "_PREDICTION_SPECS", {})
    passes, specs = [], estimate._fake_prediction_specs
    monkeypatch.setattr(estimate, "_fake_prediction_specs", lambda *a: passes.append(a[1:]) or specs(*a))
    first_memory, first = planned()
    stored = sorted(p.parent.name for p in (tmp_path / "cache").rglob("*.json"))
    assert stored.count("loss") == 2 and stored.count("step") >= 2  # stock loss and loss region; the base pass and checks
    assert len(passes) == 1  # the two calibrations read the predictions' shapes of one fake pass
    estimate._LOSS_MODELS.clear()  # a new process: nothing in memory
    calls = []
    monkeypatch.setattr(planner, "estimate_step", lambda *a, **k: calls.append(a) or pytest.fail("a fake pass ran again"))
    monkeypatch.setattr(estimate, "_calibrate", lambda *a, **k: pytest.fail("the loss was calibrated again"))
    second_memory, second = planned()
    assert second == first and calls == []
    assert second_memory.base == first_memory.base  # the whole profile, per-layer rows included


def test_the_cache_can_be_turned_off_and_a_bad_entry_is_recomputed(tmp_path, monkeypatch):
    monkeypatch.setenv(estimate_cache.ENV, "0")
    assert estimate_cache.folder() is None and estimate_cache.load("step", ("k",)) is None
    estimate_cache.store("step", ("k",), {"a": 1})  # off: nothing written, no error
    monkeypatch.setenv(estimate_cache.ENV, str(tmp_path))
    estimate_cache.store("step", ("k",), {"a": 1})
    assert estimate_cache.load("step", ("k",)) == {"a": 1} and estimate_cache.load("step", ("other",)) is None
    next(tmp_path.rglob("*.json")).write_text('{"a": ')  # truncated (a copy from elsewhere, a full disk)
    assert estimate_cache.load("step", ("k",)) is None
