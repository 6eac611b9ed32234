"""Exact resume (yolo_ckpt/train/exact_resume.py): a run interrupted after every epoch and resumed each time ends
with the weights, EMA and per-epoch losses of the same run trained without a stop; stock's resume does not."""

import csv

import pytest
from helpers import Interrupted, assert_state_equal, large_box_dataset, logged_messages, stop_after, tiny_yaml, train
from ultralytics import YOLO

from yolo_ckpt import CheckpointDetectionTrainer
from yolo_ckpt.train.exact_resume import STATE_NAME

pytestmark = pytest.mark.usefixtures("one_thread")

# 8 images of 8 large overlapping boxes, batch 2: 4 batches an epoch; nbs 6: an optimizer step every 3 batches after
# warmup (to batch 6, inside epoch 2); mosaic closes for the last 2 of 4 epochs (at epoch 3: resumed before, at and
# after its closing); validation only at the end
RUN = dict(epochs=4, nbs=6, warmup_epochs=1.5, close_mosaic=2, val=False)
# (the run's batch index of its last optimizer step, optimizer steps): steps at batches 0, 1, 3 (warmup's cadence),
# then every 3: 6, 9, 12, 15; so epochs 2 and 3 end with gradients pending (of batches 7, and 10 and 11)
STEPS = (15, 7)


def losses(run_dir):
    """The per-epoch training losses and learning rates of ``run_dir/results.csv`` (not its times)."""
    with open(run_dir / "results.csv") as f:
        return [{k: v for k, v in row.items() if "loss" in k or k.startswith("lr/")} for row in csv.DictReader(f)]


def resume(last, stop=None, **kw):
    """Resume the run of ``last`` (``kw``: the arguments a resume may change), stopped after epoch ``stop`` (0-based) if
    given; the trainer and the log."""
    model = YOLO(last)
    if stop is not None:
        model.add_callback("on_model_save", stop_after(stop))
    with logged_messages() as log:
        if stop is None:
            model.train(resume=True, trainer=CheckpointDetectionTrainer, **kw)
        else:
            with pytest.raises(Interrupted):
                model.train(resume=True, trainer=CheckpointDetectionTrainer)
    return model.trainer, log


@pytest.mark.slow
def test_interrupted_every_epoch_trains_as_uninterrupted(tmp_path):
    """Stopped after epochs 1, 2 and 3 of 4 and resumed each time (in warmup, before, at and after mosaic's closing,
    with gradients pending each time): the final model, EMA, optimizer step count and every epoch's losses and
    learning rates equal the uninterrupted run's. The same run resumed as stock resumes (its state removed) does not."""
    model, data = tiny_yaml(tmp_path), large_box_dataset(tmp_path / "data", "detect", images=8)

    def interrupted(name):
        with pytest.raises(Interrupted):
            train(model, data, tmp_path, name, CheckpointDetectionTrainer, callbacks=[("on_model_save", stop_after(0))], **RUN)
        return tmp_path / name / "weights" / "last.pt"

    whole = train(model, data, tmp_path, "whole", CheckpointDetectionTrainer, **RUN)[0]
    assert (whole.ckpt_state.last_step, whole.ema.updates) == STEPS
    assert not (whole.wdir / STATE_NAME).exists()  # removed at the run's end

    last = interrupted("exact")
    assert (last.parent / STATE_NAME).is_file()
    for epoch, pending in ((1, False), (2, True), (None, True)):
        trainer, log = resume(last, epoch)
        exact = [m for m in log if "resume: exact from resume_state.pt (" in m]
        assert len(exact) == 1 and ("the gradients accumulated since the last step" in exact[0]) == pending, log
    assert trainer.start_epoch == 3 and trainer.epoch == 3
    assert_state_equal(whole.model, trainer.model)
    assert_state_equal(whole.ema.ema, trainer.ema.ema)
    assert (trainer.ckpt_state.last_step, trainer.ema.updates) == STEPS
    assert len(trainer.ckpt_state.step_s) == len(whole.ckpt_state.step_s) == 16  # every step timed, 4 legs in one report
    assert len(trainer.ckpt_state.val_s) == len(whole.ckpt_state.val_s) == 2  # val=False: the last epoch's and the final one
    assert trainer.ckpt_state.best_epoch == whole.ckpt_state.best_epoch == 4  # val=False: best.pt written every epoch
    assert losses(whole.save_dir) == losses(trainer.save_dir) and all(float(r["train/box_loss"]) > 0 for r in losses(whole.save_dir))
    assert not (last.parent / STATE_NAME).exists()

    stock = interrupted("stock")
    (stock.parent / STATE_NAME).unlink()
    trainer, log = resume(stock)
    assert any(f"resume as Ultralytics resumes (no {STATE_NAME} of epoch 1)" in m for m in log), log
    assert losses(whole.save_dir)[0] == losses(trainer.save_dir)[0] and losses(whole.save_dir)[1] != losses(trainer.save_dir)[1]


@pytest.mark.slow
def test_a_state_of_another_run_or_batch_is_not_used(tmp_path):
    """A resume_state.pt of another run with the same schedule (same epoch and step count, another seed), or a resume
    that changes batch= (Ultralytics' resume allows it), resumes as stock does and says why in one line."""
    model, data = tiny_yaml(tmp_path), large_box_dataset(tmp_path / "data", "detect", images=8)
    run = dict(RUN, epochs=2)
    weights = {}
    for name, seed in (("a", 0), ("b", 7)):
        with pytest.raises(Interrupted):
            train(model, data, tmp_path, name, CheckpointDetectionTrainer, callbacks=[("on_model_save", stop_after(0))], seed=seed, **run)
        weights[name] = tmp_path / name / "weights"
    kept = {f: (weights["a"] / f).read_bytes() for f in ("last.pt", STATE_NAME)}
    (weights["a"] / STATE_NAME).write_bytes((weights["b"] / STATE_NAME).read_bytes())
    log = resume(weights["a"] / "last.pt")[1]
    assert any(f"resume as Ultralytics resumes ({STATE_NAME} is not this checkpoint's: its EMA differs at" in m for m in log), log
    for f, content in kept.items():
        (weights["a"] / f).write_bytes(content)
    with logged_messages() as log:
        YOLO(weights["a"] / "last.pt").train(resume=True, trainer=CheckpointDetectionTrainer, batch=4)
    assert any("resume as Ultralytics resumes (batch=4 (was 2) at the resume)" in m for m in log), log
    assert not any("resume: exact" in m for m in log)


class Payload:
    """What a pickle may carry besides tensors: torch.load(weights_only=True) refuses to build it."""


@pytest.mark.slow
def test_a_damaged_state_or_changed_data_resumes_as_stock(tmp_path):
    """A resume_state.pt that is truncated, a pickle of other objects, a dict of something else, or a folder, and a
    resume after the training images changed (data= a copy of the dataset elsewhere; as many, one of them another;
    fewer): each resumes as Ultralytics does,
    one warning saying why, the run trains to its end (no traceback, no IndexError from the mosaic buffer, no "exact")."""
    import cv2
    import numpy as np
    import torch

    model, data = tiny_yaml(tmp_path), large_box_dataset(tmp_path / "data", "detect", images=6)
    with pytest.raises(Interrupted):
        train(model, data, tmp_path, "run", CheckpointDetectionTrainer, callbacks=[("on_model_save", stop_after(0))], **dict(RUN, epochs=2))
    weights = tmp_path / "run" / "weights"
    kept = {f: (weights / f).read_bytes() for f in ("last.pt", STATE_NAME)}
    images = tmp_path / "data" / "images" / "train"

    def truncated(state):
        state.write_bytes(kept[STATE_NAME][: len(kept[STATE_NAME]) // 2])

    def fewer(state):
        another(state)  # and one image fewer
        (images / "5.png").unlink()
        (tmp_path / "data" / "labels" / "train" / "5.txt").unlink()

    def another(state):  # as many images, one of them another picture
        cv2.imwrite(str(images / "0.png"), np.zeros((64, 64, 3), np.uint8))

    other = large_box_dataset(tmp_path / "other", "detect", images=6)  # the same images and labels, in another folder
    cases = {
        "data=": (lambda state: None, "the training images changed since resume_state.pt was saved (another list of them)"),
        "truncated": (truncated, f"{STATE_NAME} is not readable: "),
        "pickle": (lambda state: torch.save({"epoch": Payload()}, state), f"{STATE_NAME} is not readable: Weights only load failed"),
        "dict": (lambda state: torch.save({"epoch": 0}, state), f"{STATE_NAME} is not an exact resume state"),
        "folder": (lambda state: (state.unlink(), state.mkdir()), f"{STATE_NAME} is a folder"),
        "another": (another, "the training images changed since resume_state.pt was saved (another list of them)"),
        "fewer": (fewer, "the training images changed since resume_state.pt was saved (5 training images, were 6)"),
    }
    for case, (damage, why) in cases.items():
        if (weights / STATE_NAME).is_dir():
            (weights / STATE_NAME).rmdir()
        for f, content in kept.items():
            (weights / f).write_bytes(content)
        damage(weights / STATE_NAME)
        trainer, log = resume(weights / "last.pt", **({"data": other} if case == "data=" else {}))
        warned = [m for m in log if "resume as Ultralytics resumes (" in m]
        assert len(warned) == 1 and why in warned[0] and len(warned[0].splitlines()) == 1, (case, log)
        assert not any("resume: exact" in m for m in log), case
        assert trainer.epoch == 1 and torch.load(weights / "last.pt", weights_only=False)["epoch"] == -1, case  # trained to its end
        assert (weights / STATE_NAME).is_dir() == (case == "folder")  # a folder is not ours to remove; a file is removed at the end
