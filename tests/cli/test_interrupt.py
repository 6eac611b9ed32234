"""Ctrl-C stops a run (issue 31 item 1): within one step, exit 130, one line naming the last.pt that resumes."""

import signal
import subprocess
import sys
import textwrap

import pytest
import torch
from helpers import tiny_yaml

from yolo_ckpt.cli import main


@pytest.fixture(autouse=True)
def python_signal_handlers():
    """The handlers a user's `yolo-ckpt train` process starts with (Python's SIGINT handler, SIGTERM's default): the
    run installs its own only over those (train/resume.py stop_on_interrupt). In a whole-suite worker an earlier test
    left another SIGINT handler behind (found in CI, 2026-12-06: these three tests ran to exit 0, or the worker died of
    the SIGTERM); the handlers are put back after each test."""
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    yield
    for s, handler in before.items():
        signal.signal(s, handler)

# `yolo-ckpt train` whose second epoch stalls in its first step inside a weakref callback (activation checkpointing
# frees its saved tensors through such callbacks many times a step) until a SIGINT arrives: Python raises the
# KeyboardInterrupt inside the callback, prints "Exception ignored in ..." and drops it, as it did for the run
# that trained to its end. Each training step prints STEP <epoch> <batch>.
STALLED_RUN = textwrap.dedent(
    """
    import sys, time, weakref
    from ultralytics.utils.callbacks import base
    from yolo_ckpt.cli import main

    class Freed:
        pass

    def stall(_):
        print("STALLED", flush=True)
        for _ in range(600):
            time.sleep(0.1)

    def step(trainer):
        print(f"STEP {trainer.epoch} {len(trainer.ckpt_state.step_s)}", flush=True)
        if trainer.epoch == 1 and not getattr(trainer, "stalled", False):
            trainer.stalled, freed = True, Freed()
            ref = weakref.ref(freed, stall)
            del freed  # stall() runs now, as the weakref's callback

    base.default_callbacks["on_train_batch_end"].append(step)
    sys.exit(main(sys.argv[1:]))
    """
)


@pytest.mark.slow
def test_ctrl_c_stops_within_a_step_and_last_pt_resumes(synthetic, tmp_path):
    """SIGINT to a CPU run in its second epoch, where Python drops the KeyboardInterrupt (raised in a weakref
    callback): the run stops before another step (no STEP line after it), exits 130 with one line naming last.pt (epoch
    1 of 3, its optimizer state kept) and the command that resumes it; that command trains epochs 2 and 3."""
    script = tmp_path / "run.py"
    script.write_text(STALLED_RUN)
    keys = [f"model={tiny_yaml(tmp_path)}", f"data={synthetic()}", f"project={tmp_path}", "name=run", "epochs=3", "batch=2",
            "imgsz=32", "fraction=0.5", "plots=False", "val=False", "estimate=False", "recompute=all"]
    proc = subprocess.Popen([sys.executable, str(script), "train", *keys], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = []
    for line in proc.stdout:
        lines.append(line.strip())
        if line.strip() == "STALLED":
            proc.send_signal(signal.SIGINT)
            break
    lines += proc.stdout.read().split()
    err = proc.stderr.read()
    assert proc.wait() == 130, err[-3000:]
    assert "STALLED" in lines and not [s for s in lines[lines.index("STALLED"):] if s.startswith("STEP")]
    assert "Exception ignored in" in err and "KeyboardInterrupt" in err  # where Python dropped it
    last = tmp_path / "run" / "weights" / "last.pt"
    assert err.strip().splitlines()[-1] == (
        f"yolo-ckpt: interrupted: {last} holds epoch 1 of 3; resume: yolo-ckpt train resume model={last}"
    )
    ckpt = torch.load(last, weights_only=False)
    assert ckpt["epoch"] == 0 and ckpt["optimizer"] is not None
    assert main(["train", "resume", f"model={last}"]) == 0
    results = (tmp_path / "run" / "results.csv").read_text().splitlines()
    assert [row.split(",")[0].strip() for row in results[1:]] == ["1", "2", "3"]
    assert torch.load(last, weights_only=False)["epoch"] == -1


def test_the_interrupted_line_says_what_is_left(tmp_path):
    """interrupted()'s line for each state a Ctrl-C can leave last.pt in: none yet, or an earlier run's in the same
    folder (exist_ok=True, older than this run's start): nothing to resume; an epoch's save: the epoch and the resume
    command; saved at the last epoch, unstripped (stopped in the run's end): the command that finishes it; stripped:
    the run finished."""
    import os
    import time

    from yolo_ckpt.train.resume import interrupted

    last = tmp_path / "last.pt"
    nothing = "interrupted before the run saved a checkpoint: nothing to resume"
    assert interrupted(last) == nothing
    args = {"epochs": 3, "data": "my/data.yaml"}
    torch.save({"epoch": 1, "optimizer": {"state": {}}, "train_args": args}, last)
    assert interrupted(last) == f"interrupted: {last} holds epoch 2 of 3; resume: yolo-ckpt train resume model={last}"
    os.utime(last, (time.time() - 60, time.time() - 60))
    assert interrupted(last, since=time.time() - 30) == nothing  # an earlier run's, not this one's
    assert interrupted(last, since=time.time() - 90).startswith("interrupted: ")
    torch.save({"epoch": 2, "optimizer": {"state": {}}, "train_args": args}, last)
    assert interrupted(last) == (
        f"interrupted in the run's end (its final validation and strip); finish it: yolo-ckpt train resume model={last}"
    )
    torch.save({"epoch": -1, "optimizer": None, "train_args": args}, last)
    assert interrupted(last) == f"interrupted after the run finished: {last} is its final checkpoint"


@pytest.mark.slow
def test_every_ending_writes_its_report(tmp_path, monkeypatch, capsys):
    """A run stopped in its end still has its ckpt_report.json, what was not measured said in it: Ctrl-C in the final
    validation (a KeyboardInterrupt raised as it starts: the last epoch's metrics, no probe) and in the end-of-run
    memory probe (the final metrics, no probe); a run killed at its last epoch before its end, and one killed after
    its strip with no report, both finished by `train resume`. compare takes every one of them."""
    import json

    from helpers import Interrupted, large_box_dataset, stop_after, train

    from yolo_ckpt import CheckpointDetectionTrainer
    from yolo_ckpt.report.record import REPORT_NAME
    from yolo_ckpt.train import run_stats

    model, data = tiny_yaml(tmp_path), large_box_dataset(tmp_path / "data", "detect", images=4)

    def final_validation(validator):
        if not validator.training:  # BaseTrainer.final_eval's validation of best.pt (the epochs' run with training=True)
            raise KeyboardInterrupt

    def report(name):
        return json.loads((tmp_path / name / REPORT_NAME).read_text())

    with pytest.raises(KeyboardInterrupt, match="written without its final validation and memory probe"):
        train(model, data, tmp_path, "val", CheckpointDetectionTrainer, callbacks=[("on_val_start", final_validation)], epochs=2)
    assert report("val")["not_measured"] == ["final_validation", "memory_probe"] and report("val")["memory_source"] == "not_measured"
    assert report("val")["ultralytics_metrics"]  # the last epoch's validation

    def probe(trainer):
        raise KeyboardInterrupt

    monkeypatch.setattr(run_stats, "memory_probes", probe)
    with pytest.raises(KeyboardInterrupt, match="written without its memory probe"):
        train(model, data, tmp_path, "probe", CheckpointDetectionTrainer, epochs=2)
    monkeypatch.undo()
    assert report("probe")["not_measured"] == ["memory_probe"] and "box_mAP50-95" in report("probe")["metrics"]

    with pytest.raises(Interrupted):  # killed between its last save and its end
        train(model, data, tmp_path, "killed", CheckpointDetectionTrainer, callbacks=[("on_model_save", stop_after(2))], epochs=3, nbs=2)
    last = tmp_path / "killed" / "weights" / "last.pt"
    assert main(["train", "resume", f"model={last}"]) == 0
    assert f"{tmp_path / 'killed' / REPORT_NAME} written (no memory probe)" in capsys.readouterr().err
    killed = report("killed")
    assert killed["not_measured"] == ["memory_probe"] and killed["train_steps_timed"] == 6 - 3 and killed["epochs"] == 3
    assert killed["recomputed_layers"] and "box_mAP50-95" in killed["metrics"]

    (tmp_path / "val" / REPORT_NAME).unlink()  # stripped, its validation and report never done (a SIGKILL)
    assert main(["train", "resume", f"model={tmp_path / 'val' / 'weights' / 'last.pt'}"]) == 0
    assert report("val")["not_measured"] == ["memory_probe", "step_times"] and "box_mAP50-95" in report("val")["metrics"]
    runs = [str(tmp_path / name) for name in ("val", "probe", "killed")]
    assert main(["compare", *runs, f"out={tmp_path / 'cmp'}"]) == 0
    assert (tmp_path / "cmp" / "compare.csv").read_text().count("\n") == 4


def test_sigterm_stops_a_run_as_ctrl_c_does(synthetic, tmp_path, monkeypatch, capsys):
    """SIGTERM to a training process (sent from inside its second epoch's first step): the run stops there, exit 143,
    the one line of Ctrl-C naming the last.pt that resumes (its first epoch's); SIGTERM's handler is put back."""
    import os

    from ultralytics.utils.callbacks import base

    def terminate(trainer):
        if trainer.epoch == 1:
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setitem(base.default_callbacks, "on_train_batch_end", [*base.default_callbacks["on_train_batch_end"], terminate])
    keys = [f"model={tiny_yaml(tmp_path)}", f"data={synthetic()}", f"project={tmp_path}", "name=run", "epochs=2", "batch=2",
            "imgsz=32", "fraction=0.5", "plots=False", "val=False", "estimate=False", "probe=False"]
    assert main(["train", *keys]) == 143
    last = tmp_path / "run" / "weights" / "last.pt"
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"yolo-ckpt: interrupted: {last} holds epoch 1 of 2; resume: yolo-ckpt train resume model={last}"
    )
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL and torch.load(last, weights_only=False)["epoch"] == 0


def test_ctrl_c_in_the_save_waits_for_the_resume_state(synthetic, tmp_path, monkeypatch, capsys):
    """SIGINT while last.pt is being written (sent from inside Ultralytics' save_model, before resume_state.pt): the run
    stops after both are written, so the state holds last.pt's epoch and the resume is exact (a new user's Ctrl-C once
    left last.pt of epoch 4 beside the state of epoch 3, and the resume fell back to stock's)."""
    import os

    from ultralytics.engine.trainer import BaseTrainer

    from yolo_ckpt.train.exact_resume import state_path

    save = BaseTrainer.save_model

    def interrupted_save(self):
        if self.epoch == 0:
            os.kill(os.getpid(), signal.SIGINT)
        return save(self)

    monkeypatch.setattr(BaseTrainer, "save_model", interrupted_save)
    keys = [f"model={tiny_yaml(tmp_path)}", f"data={synthetic()}", f"project={tmp_path}", "name=run", "epochs=3", "batch=2",
            "imgsz=32", "fraction=0.5", "plots=False", "val=False", "estimate=False", "probe=False"]
    assert main(["train", *keys]) == 130
    last = tmp_path / "run" / "weights" / "last.pt"
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith(f"yolo-ckpt: interrupted: {last} holds epoch 1 of 3")
    state = torch.load(state_path(last.parent), weights_only=True)
    assert state["epoch"] == torch.load(last, weights_only=False)["epoch"] == 0
