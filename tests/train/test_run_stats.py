"""The run's CUDA peaks: training's and validation's banked apart (``yolo_ckpt.train.run_stats.cuda_peak``); the run's
picture (``yolo_ckpt.train.run_stats.run_picture``)."""

import pickle
from types import SimpleNamespace

import pytest
import torch
from helpers import logged_messages

from yolo_ckpt.checkpointing.policy import RecomputePolicy
from yolo_ckpt.memory.layer_accounting import LayerRow
from yolo_ckpt.memory.step import StepProfile
from yolo_ckpt.report.layer_plot import write_layer_plot
from yolo_ckpt.train import run_stats
from yolo_ckpt.train.run_stats import LAYER_PLOT_NAME, cuda_peak
from yolo_ckpt.train.state import RunState

MiB = 2**20


@pytest.mark.cuda
def test_cuda_peaks_of_training_and_validation_banked_apart():
    """A 64 MiB tensor before the validation block counts as training's peak; the 16 MiB one inside it as
    validation's, which the training peak does not reach (the allocator's peak is reset between them)."""
    device = torch.device("cuda")
    trainer = SimpleNamespace(device=device, ckpt_state=RunState())
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    train = torch.empty(64 * MiB, dtype=torch.uint8, device=device)
    del train
    with cuda_peak(trainer, "val"):
        val = torch.empty(16 * MiB, dtype=torch.uint8, device=device)
        del val
    stats = trainer.ckpt_state
    assert stats.train_peak["allocated"] >= base + 64 * MiB
    assert base + 16 * MiB <= stats.val_peak["allocated"] < base + 64 * MiB
    assert stats.val_peak["reserved"] >= stats.val_peak["allocated"]


def _step(recompute: str, phases: dict, saved: tuple) -> StepProfile:
    """A step of three layers (the last the head) with these phase peaks and saved bytes (MiB)."""
    layers = [LayerRow(i, t, 0, int(b * MiB), 0, 0, None) for i, (t, b) in enumerate(zip(("Conv", "C3k2", "Detect"), saved))]
    phases = {p: int(v * MiB) for p, v in phases.items()}
    return StepProfile("composed_estimate", recompute, "full", 2, 64, 20, 10 * MiB, phases, MiB, max(phases.values()), layers)


def test_run_picture_draws_the_policy_beside_none(tmp_path, monkeypatch):
    """With the set-up estimate the run's picture is profile's: none's layers, marked as the run's policy recomputes
    them, and the policy's phases with none's beside them, both from the estimate; without it (estimate=False) the
    CPU probe's step alone, its title saying why; with neither, no picture and a line saying so."""
    drawn = []
    monkeypatch.setattr(run_stats, "write_layer_plot", lambda data, path: drawn.append((data, path)))
    none = _step("none", {"forward": 40, "loss": 50, "backward": 60, "optimizer": 20}, (8, 16, 4))
    policy = _step("0", {"forward": 30, "loss": 45, "backward": 35, "optimizer": 20}, (8, 16, 4))
    trainer = SimpleNamespace(
        args=SimpleNamespace(model="yolo11n.yaml", plots=True), save_dir=tmp_path, device=torch.device("cpu"),
        policy=RecomputePolicy("0", (0,), ("Conv",)),
        ckpt_state=RunState(estimated_steps={"none": none, "policy": policy}, estimated_step={"batch": 2, "imgsz": 64}),
    )
    record = SimpleNamespace(recompute="0", write=lambda folder: folder / "ckpt_report.json", headline=lambda: "headline", attention=None)
    trainer.run_report = lambda not_measured: record
    run_stats._on_train_end(trainer)
    ((data, path),) = drawn
    assert path == tmp_path / LAYER_PLOT_NAME and "the set-up estimate: recompute=none's layers" in data.title
    assert [(r["saved_bytes"], r["recomputed"]) for r in data.layers] == [(8 * MiB, True), (16 * MiB, False), (4 * MiB, False)]
    assert (data.phase_peak_bytes, data.none_phase_peak_bytes) == (policy.phase_peak_bytes, none.phase_peak_bytes)
    assert (data.peak_bytes, data.peak_phase, data.phases_of) == (45 * MiB, "loss", "recompute=0")
    assert write_layer_plot(data, tmp_path / "both.png").stat().st_size > 10_000  # the side-by-side bars draw

    trainer.ckpt_state = RunState(estimate_skipped="estimate=False", train_probe=policy)
    run_stats._on_train_end(trainer)
    data = drawn[-1][0]
    assert data.none_phase_peak_bytes is None and "its estimate was skipped (estimate=False)" in data.title
    trainer.ckpt_state.train_probe = None
    with logged_messages() as messages:
        run_stats._on_train_end(trainer)
    assert len(drawn) == 2 and any(f"no {LAYER_PLOT_NAME}: no set-up estimate (estimate=False)" in m for m in messages)


def test_run_state_is_plain_data():
    """The run's state (``trainer.ckpt_state``) starts empty, each its own, says the planned run's spec, and pickles."""
    state, other = RunState(), RunState()
    assert state == other and state.step_s is not other.step_s and state.estimated_peaks is not other.estimated_peaks
    assert state.run_spec is None and state.plan is None and state.estimate_skipped is None
    state.planned, state.step_s = SimpleNamespace(spec="the run assumed"), [0.5]
    assert state.run_spec == "the run assumed" and pickle.loads(pickle.dumps(state)) == state


def test_one_report_builder(tmp_path):
    """The trainer's report (run_report) and the one of a run `resume` finishes (finished_run_report) were twin
    builders of RunReport, free to drift: one builder (build_report) makes both. The finished one, from a last.pt's
    model and the run's args, holds the policy resolved on the saved model, the median step after the warm-up steps,
    the task's metrics, and what was not measured."""
    import inspect
    import re

    from helpers import tiny_yaml
    from ultralytics import YOLO

    assert len(re.findall(r"\bRunReport\(", inspect.getsource(run_stats))) == 1
    args = {"task": "detect", "model": tiny_yaml(tmp_path), "data": "data.yaml", "recompute": "backbone", "imgsz": 64, "batch": 2,
            "epochs": 3, "device": "cpu", "amp": False}
    ckpt = {"model": YOLO(args["model"]).model}
    report = run_stats.finished_run_report(ckpt, args, {"metrics/mAP50-95(B)": 0.25}, [9.0, 9.0, 9.0, 1.0, 2.0, 4.0])
    assert (report.recompute, [r["index"] for r in report.recomputed_layers], report.recomputed_regions) == ("backbone", [0, 1, 2, 3], [])
    assert (report.train_step_time_median_s, report.train_steps_timed) == (2.0, 3)
    assert report.metrics == {"box_mAP50-95": 0.25} and report.ultralytics_metrics == {"metrics/mAP50-95(B)": 0.25}
    assert (report.memory_source, report.not_measured, report.epochs, report.task) == ("not_measured", ["memory_probe"], 3, "detect")
    assert run_stats.finished_run_report({}, {**args, "recompute": "auto"}, {}, None).not_measured == ["memory_probe", "step_times"]


def test_a_finished_runs_report_names_its_device_and_attention():
    """A run `resume` finished wrote device "None" (no device= given) and no attention chunking, where the trainer's
    report of the same run says cpu and the chunking of its attention region (yolo11n's C2PSA, 2 x 2 tokens at 64 px)."""
    from ultralytics import YOLO

    args = {"task": "detect", "model": "yolo11n.yaml", "data": "data.yaml", "recompute": "all", "imgsz": 64, "batch": 2,
            "epochs": 1, "device": None, "amp": False, "attn_chunk": 64}
    report = run_stats.finished_run_report({"model": YOLO("yolo11n.yaml").model}, args, {}, None)
    assert report.device == "cpu" and report.recomputed_regions == ["head", "loss", "attention"]
    assert report.attention == run_stats.attention_tokens(YOLO("yolo11n.yaml").model, 64, 64)
    assert report.attention["modules"][0]["tokens"] == 4
    assert run_stats.finished_run_report({}, {**args, "device": "7x"}, {}, None).device == "7x"  # not on this machine: as given
