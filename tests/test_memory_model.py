"""The memory model: fake-tensor estimates against CPU measurements, per-layer rows, plans that fit, budgets."""

import json
import subprocess
import sys

import pytest
import torch
from ultralytics import YOLO
from ultralytics.nn.tasks import DetectionModel
from ultralytics.utils import DEFAULT_CFG

from yolo_ckpt import trainer_for
from yolo_ckpt.estimate import calibrate_loss, estimate_step
from yolo_ckpt.memory import detect_batch, profile_step
from yolo_ckpt.planner import MemoryModel, parse_budget
from yolo_ckpt.report import REPORT_NAME

pytestmark = pytest.mark.usefixtures("one_thread")
GiB = 2**30


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    m = DetectionModel("yolo11n.yaml", verbose=False)
    m.args = DEFAULT_CFG
    return m


@pytest.fixture(scope="module")
def measured(model):
    """CPU measurements of one real step (forward, loss, backward, AdamW step): imgsz 320 and 640, batch 2."""
    return {
        (imgsz, policy): profile_step(model, detect_batch(2, imgsz, 20), policy)
        for imgsz in (320, 640)
        for policy in ("none", "backbone", "all")
    }


@pytest.mark.parametrize("imgsz", [320, 640])
@pytest.mark.parametrize("policy", ["none", "backbone", "all"])
def test_estimate_within_2_percent_of_cpu_measurement(model, measured, imgsz, policy):
    real = measured[imgsz, policy]
    fake = estimate_step(model, imgsz, 2, 20, policy, flops=False)
    assert abs(fake.peak_bytes / real.peak_bytes - 1) < 0.02, (fake.peak_bytes, real.peak_bytes)
    assert abs(fake.static_bytes - real.static_bytes) < 2**14  # parameters, buffers, AdamW state, the images
    assert abs(fake.loss_bytes / real.loss_bytes - 1) < 0.10  # the loss share, estimated by its own formula
    assert real.loss_bytes > 0.04 * real.peak_bytes  # and it is a real share, reported apart


def test_estimate_knows_selective_mode_and_sgd(model):
    """recompute_mode=selective and an SGD optimizer (1 state per parameter) are estimated like they measure."""
    real = profile_step(model, detect_batch(2, 320, 20), "all", mode="selective", optimizer="SGD")
    fake = estimate_step(model, 320, 2, 20, "all", mode="selective", optimizer="SGD", flops=False)
    assert abs(fake.peak_bytes / real.peak_bytes - 1) < 0.02, (fake.peak_bytes, real.peak_bytes)
    adamw = estimate_step(model, 320, 2, 20, "all", mode="selective", flops=False)
    params = sum(p.numel() * 4 for p in model.parameters() if p.requires_grad)
    assert adamw.static_bytes - fake.static_bytes == pytest.approx(params, rel=0.01)


def test_per_layer_rows_add_up(model, measured, saved_for_backward_bytes):
    """The saved-for-backward rows add up to what autograd saves in the whole forward (counted independently)."""
    prof = measured[640, "none"]
    probe = DetectionModel("yolo11n.yaml", verbose=False).train()
    outs = []
    total = saved_for_backward_bytes(lambda: outs.append(probe(detect_batch(2, 640, 20)["img"])))
    out = outs[0]
    assert sum(r.saved_bytes for r in prof.layers) == total
    assert prof.layers[-1].output_bytes == sum(
        t.untyped_storage().nbytes() for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)
    )
    assert all(r.freeable_bytes <= r.saved_bytes for r in prof.layers)
    assert sum(r.forward_flops for r in prof.layers) == pytest.approx(2 * 6.5e9, rel=0.02)  # YOLO11n: 6.5 GFLOPs/img
    recomputed = measured[640, "all"].layers
    assert [r.index for r in recomputed if r.recompute] == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 13, 16, 17, 19, 20, 22, 23]  # 23: the head's branches


def test_plan_fits_when_measured(model, measured):
    """A budget between the 'all' and 'none' peaks: the plan chosen fits it when the step is measured."""
    low, high = measured[640, "all"].peak_bytes, measured[640, "none"].peak_bytes
    budget = (low + high) // 2
    memory = MemoryModel(model, 640, 2, 20)
    plan = memory.plan(budget, 2, 640)
    assert 0 < len(plan.indices) < 17 and plan.estimated_peak_bytes <= budget
    assert profile_step(model, detect_batch(2, 640, 20), plan.recompute).peak_bytes <= budget
    named = {n: memory.estimate(n, 2, 640).peak_bytes <= budget for n in ("backbone", "all")}
    cheapest_named = min((memory.flops_of(n) for n, fits in named.items() if fits), default=float("inf"))
    assert plan.recompute_flops <= cheapest_named  # auto never costs more than a named policy that fits
    with pytest.raises(ValueError, match=r"below the smallest plan's need .* recompute=all needs"):
        memory.plan(low // 2, 2, 640)
    assert memory.largest_batch(memory.candidates, budget, 640) >= 2 > memory.largest_batch((), budget, 640)


@pytest.mark.parametrize(
    "value, expected",
    [("12GB", 12_000_000_000), ("16GiB", 16 * GiB), ("500MiB", 500 * 2**20), ("1.5 GB", 1_500_000_000)],
)
def test_budget_units(value, expected):
    assert parse_budget(value) == expected


def test_budget_fraction_needs_cuda():
    assert parse_budget(0.5, cuda_available_bytes=80 * GiB) == 40 * GiB
    with pytest.raises(ValueError, match="a fraction needs a CUDA device"):
        parse_budget("0.5")


@pytest.mark.parametrize(
    "value, message",
    [("12", "must be a fraction in"), ("12XB", "unknown unit"), ("-3GB", "is not valid"), ("0GB", "more than 0"), (True, "not valid"), ("lots", "not valid")],
)
def test_bad_budgets(value, message):
    with pytest.raises(ValueError, match=message):
        parse_budget(value)


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"batch": -1}, "batch=-1 on the CPU needs memory_budget="),
        ({"recompute": "auto"}, "recompute=auto on the CPU needs memory_budget="),
        ({"recompute": "auto", "memory_budget": "7 apples"}, "unknown unit .apples."),
    ],
)
def test_planning_errors_before_run_dir(kw, message, synthetic, tmp_path):
    with pytest.raises(ValueError, match=message):
        YOLO("yolo11n.yaml").train(data=synthetic(), trainer=trainer_for("detect"), device="cpu", project=str(tmp_path), **kw)
    assert list(tmp_path.iterdir()) == []


def test_trainer_auto_plan_and_batch(synthetic, tmp_path):
    """recompute=auto picks layers for the budget; batch=-1 the largest batch; both written in the report."""
    kw = dict(epochs=1, imgsz=160, workers=0, device="cpu", plots=False, val=False, project=str(tmp_path))
    YOLO("yolo11n.yaml").train(data=synthetic(), trainer=trainer_for("detect"), recompute="auto", memory_budget="60MB", batch=2, name="auto", **kw)
    report = json.loads((tmp_path / "auto" / REPORT_NAME).read_text())
    assert report["plan"]["budget_bytes"] == 60_000_000 and report["plan"]["estimated_peak_bytes"] <= 60_000_000
    assert report["recompute"] == report["plan"]["recompute"] != "none" and report["recomputed_layers"]
    YOLO("yolo11n.yaml").train(data=synthetic(), trainer=trainer_for("detect"), recompute="all", memory_budget="200MB", batch=-1, name="batch", **kw)
    report = json.loads((tmp_path / "batch" / REPORT_NAME).read_text())
    assert report["batch"] == report["plan"]["batch"] > 2 and report["plan"]["estimated_peak_bytes"] <= 200_000_000


def test_cli_profile_and_plan_json():
    run = lambda *a: subprocess.run([sys.executable, "-m", "yolo_ckpt.cli", *a], capture_output=True, text=True, timeout=600)  # noqa: E731
    out = run("profile", "model=yolo11n.yaml", "imgsz=320", "batch=2", "recompute=all", "format=json")
    assert out.returncode == 0, out.stderr[-2000:]
    prof = json.loads(out.stdout[out.stdout.index("{"):])
    assert prof["estimated_peak_bytes"]["policy"] < 0.7 * prof["estimated_peak_bytes"]["none"]
    assert prof["layers"][-1]["layer"] == "total" and len(prof["recomputed_layers"]) == 17
    out = run("plan", "model=yolo11n.yaml", "memory_budget=300MB", "imgsz=320", "batch=2", "format=json")
    assert out.returncode == 0, out.stderr[-2000:]
    rows = {r["recompute"].split(" ")[0]: r for r in json.loads(out.stdout[out.stdout.index("{"):])["policies"]}
    assert rows["all"]["max_imgsz_at_batch_2"] >= rows["backbone"]["max_imgsz_at_batch_2"] > rows["none"]["max_imgsz_at_batch_2"]
    assert rows["all"]["max_batch_at_imgsz_320"] > rows["none"]["max_batch_at_imgsz_320"]
    assert rows["none"]["recompute_GFLOPs"] == 0 and 15 < rows["all"]["recompute_pct_of_step"] < 35
    assert run("plan", "memory_budget=12").returncode == 2
