"""Ultralytics' trainers beyond the five classic tasks, checkpointed, against stock training (same seed, same data):
knowledge distillation (``distill_model=``, interrupted and resumed), semantic segmentation, depth and RT-DETR;
and the CLI's model and trainer for each, and planning refused where its loss model does not apply.

Each run takes >= 2 optimizer steps (batch == nbs == 2); weights, BatchNorm buffers and the EMA are compared with
``torch.equal``, and the recomputations are counted.
"""

import shutil

import pytest
import torch
import yaml
from helpers import Interrupted, assert_state_equal, stop_after, train
from ultralytics import YOLO
from ultralytics.nn.tasks import DetectionModel

from yolo_ckpt import checkpointed_layers, trainer_for
from yolo_ckpt.checkpointing.engine import RecomputedLayer

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.slow
def test_distillation_interrupted_and_resumed_as_stock(synthetic, tmp_path):
    """distill_model= (a teacher .pt made here): the student's layers are recomputed, the teacher's never; the run,
    interrupted after its first epoch's checkpoint and resumed (its policy restored from last.pt, its state exactly),
    trains as stock does without a stop."""
    torch.manual_seed(1)
    teacher = tmp_path / "teacher.pt"
    torch.save({"model": DetectionModel("yolo11n.yaml", nc=3, verbose=False)}, teacher)
    seen = {}

    def patched_models(trainer):
        seen["student"] = checkpointed_layers(trainer.model)
        seen["teacher"] = [m for m in trainer.model.teacher_model.modules() if isinstance(m, RecomputedLayer)]

    run = dict(epochs=2, val=False, fraction=0.5, distill_model=str(teacher))
    stock = train("yolo11n.yaml", synthetic(), tmp_path, "stock", **run)[0]
    with pytest.raises(Interrupted):
        train("yolo11n.yaml", synthetic(), tmp_path, "ckpt", trainer=trainer_for("detect"), recompute="all",
              callbacks=[("on_model_save", stop_after(0))], **run)
    # resumable still: the resume below finishes last.pt
    interrupted = shutil.copyfile(tmp_path / "ckpt" / "weights" / "last.pt", tmp_path / "ckpt-interrupted.pt")
    m = YOLO(tmp_path / "ckpt" / "weights" / "last.pt")
    m.add_callback("on_pretrain_routine_end", patched_models)
    ckpt, counter = train(m, None, tmp_path, "ckpt", trainer=trainer_for("detect"), resume=True)
    assert type(ckpt.model).__name__ == "DistillationModel" and ckpt.start_epoch == 1
    assert ckpt.args.recompute == "all" and seen["student"] == list(ckpt.policy.indices) and seen["teacher"] == []
    steps = ckpt.ema.updates - ckpt.start_epoch * len(ckpt.train_loader)  # the resumed epoch's optimizer steps
    # once a step; the run report does not probe a distillation step (its harness measures one model)
    assert steps >= 2 and dict(counter.per_layer) == dict.fromkeys(ckpt.policy.indices, steps)
    assert_state_equal(stock.model, ckpt.model)
    assert_state_equal(stock.ema.ema, ckpt.ema.ema)
    # recompute= given at resume is checked against the student of the distillation checkpoint, before any write
    resumed = trainer_for("detect")(overrides={"resume": str(interrupted), "recompute": "0-4"})
    assert resumed.args.recompute == "0-4"


@pytest.mark.slow
def test_synthetic_dense_targets(synthetic):
    """The semantic and depth datasets hold the detect dataset's scenes (the same JPEG bytes) with full-resolution
    targets: a class id of SEMANTIC_NAMES per pixel (all six in the train split), metric depths of the drone view
    (40 m at the centre, the ground sloping up to 16 m per image side, roofs up to 20 m nearer)."""
    from pathlib import Path

    import cv2
    import numpy as np

    from yolo_ckpt.data.aerial import IMAGE_SIZE
    from yolo_ckpt.data.synthetic import DEPTH_SCALE, SEMANTIC_NAMES

    detect, semantic, depth = (Path(synthetic(task)).parent for task in ("detect", "semantic", "depth"))
    images = sorted((detect / "images" / "train").glob("*.jpg"))
    assert all((d / "images" / "train" / f.name).read_bytes() == f.read_bytes() for d in (semantic, depth) for f in images)

    def read(folder, name):
        return np.stack([cv2.imread(str(folder / name / "train" / f"{f.stem}.png"), cv2.IMREAD_UNCHANGED) for f in images])

    masks, metres = read(semantic, "masks"), read(depth, "depth") / DEPTH_SCALE
    assert masks.dtype == np.uint8 and masks.shape == metres.shape == (len(images), IMAGE_SIZE, IMAGE_SIZE)
    assert set(np.unique(masks).tolist()) == set(range(len(SEMANTIC_NAMES)))
    corner = 16 / 2**0.5  # the largest tilt offset from the centre: at a corner, on the diagonal slope
    assert 40 - corner - 20 <= metres.min() and metres.max() <= 40 + corner
    assert metres[masks == SEMANTIC_NAMES.index("building")].mean() < metres[masks == SEMANTIC_NAMES.index("road")].mean() - 4


@pytest.mark.slow
@pytest.mark.parametrize("task, model", [("semantic", "yolo26n-sem.yaml"), ("depth", "yolo26n-depth.yaml")])
def test_dense_task_trains_as_stock(task, model, synthetic, tmp_path):
    """Semantic segmentation (full-resolution class masks) and depth (metric depth maps) on the built-in synthetic
    scenes: recompute=all trains as the task's stock trainer (both subclass DetectionTrainer)."""
    stock, _ = train(model, synthetic(task), tmp_path, "stock", fraction=0.5)
    ckpt, counter = train(model, synthetic(task), tmp_path, "ckpt", trainer=trainer_for(task), recompute="all", fraction=0.5)
    assert type(ckpt).__bases__[1] is type(stock) and ckpt.args.task == task
    steps = ckpt.ema.updates
    assert steps >= 2 and stock.ema.updates == steps and len(ckpt.policy.indices) >= 10
    assert dict(counter.per_layer) == dict.fromkeys(ckpt.policy.indices, steps + 1)  # + the report's memory probe
    assert_state_equal(stock.model, ckpt.model)
    assert_state_equal(stock.ema.ema, ckpt.ema.ema)


@pytest.mark.slow
def test_rtdetr_trains_as_stock_with_the_same_denoising_queries(synthetic, tmp_path, monkeypatch):
    """yolov8n-rtdetr.yaml (its decoder made small: 2 layers of width 64, 30 queries; the decoder's cost dominates a
    step and is not recomputed) through RTDETRTrainer: recompute=all (backbone and neck; the decoder stays stock) trains
    as stock, with the same contrastive denoising queries (random noise drawn in the decoder) and the same global
    torch RNG state after every step: recomputation neither draws from nor moves the RNG. imgsz 128: at 64 the
    augmentation drops every (sub-2-pixel) vehicle, and without boxes the decoder draws no denoising queries; 3 steps
    (fraction=0.75): of 2 (fraction=0.5) one batch holds no box."""
    from ultralytics import RTDETR
    from ultralytics.models.utils import ops
    from ultralytics.nn.tasks import yaml_model_load

    cfg = yaml_model_load("yolov8n-rtdetr.yaml")
    assert cfg["head"][-1][2] == "RTDETRDecoder"
    cfg["head"][-1][3] = ["nc", 64, 30, 4, 4, 2]  # hidden dim, queries, decoder points, heads, decoder layers
    small = tmp_path / "yolov8n-rtdetr-small.yaml"  # the name keeps scale n
    small.write_text(yaml.safe_dump(cfg))

    drawn, stock_cdn = [], ops.get_cdn_group

    def recorded_cdn(*args, **kwargs):
        out = stock_cdn(*args, **kwargs)
        if out[0] is not None:
            drawn.append([t.detach().clone() for t in out[:3]])
        return out

    monkeypatch.setattr(ops, "get_cdn_group", recorded_cdn)  # head.py imports it at each call
    runs = {}
    for name, extra in (("stock", {}), ("ckpt", {"recompute": "all"})):
        drawn.clear()
        model = RTDETR(str(small))
        states = []
        model.add_callback("on_train_batch_end", lambda trainer: states.append(torch.get_rng_state()))
        trainer_cls = trainer_for("detect", model) if extra else None
        trainer, counter = train(model, synthetic(), tmp_path, name, trainer=trainer_cls, imgsz=128, fraction=0.75, **extra)
        runs[name] = trainer, counter, list(drawn), states
    (stock, _, stock_drawn, stock_states), (ckpt, counter, ckpt_drawn, ckpt_states) = runs["stock"], runs["ckpt"]
    assert type(ckpt).__bases__[1] is type(stock) and type(stock).__name__ == "RTDETRTrainer"
    steps = ckpt.ema.updates
    assert steps >= 3 and stock.ema.updates == steps and len(stock_drawn) == steps == len(ckpt_states)
    assert all(torch.equal(a, b) for s, c in zip(stock_drawn, ckpt_drawn) for a, b in zip(s, c))
    assert all(torch.equal(a, b) for a, b in zip(stock_states, ckpt_states))
    assert dict(counter.per_layer) == dict.fromkeys(ckpt.policy.indices, steps + 1)  # + the report's memory probe
    assert_state_equal(stock.model, ckpt.model)
    assert_state_equal(stock.ema.ema, ckpt.ema.ema)


@pytest.mark.slow
@pytest.mark.parametrize(
    "args, model_cls, trainer_name, data",
    [
        (["task=semantic"], "SemanticSegmentationModel", "SemanticSegmentationTrainer", "semantic"),
        (["depth", "recompute=neck"], "DepthModel", "DepthTrainer", "depth"),
        (["model=rtdetr-resnet50.yaml"], "RTDETRDetectionModel", "RTDETRTrainer", "detect"),
    ],
)
def test_cli_builds_each_task_as_yolo_train_does(args, model_cls, trainer_name, data):
    """yolo-ckpt train: the task's default YAML (YOLO26n for semantic and depth), RT-DETR YAMLs through the RTDETR
    class, the checkpointed trainer of the model's task table and the task's built-in synthetic dataset."""
    from yolo_ckpt.cli.train import prepare_train

    model, trainer_cls, overrides = prepare_train(args)
    assert type(model.model).__name__ == model_cls and trainer_cls.__bases__[1].__name__ == trainer_name
    assert f"synthetic-v1-seed0-{data}" in overrides["data"]


@pytest.mark.slow
def test_semantic_planned_under_a_budget_fits_when_measured(synthetic, tmp_path):
    """recompute=auto on YOLO26n-sem (the synthetic scenes' 6 classes, imgsz 160, batch 2; the estimate says 49.4 MiB
    without recomputation, 33.9 MiB with all): a 45 MB budget gives a policy between the extremes whose measured
    step (forward, loss over full-resolution logits, backward, AdamW step) fits it."""
    from yolo_ckpt.checkpointing.model_file import layout_of
    from yolo_ckpt.checkpointing.policy import resolve
    from yolo_ckpt.memory.step import profile_step
    from yolo_ckpt.memory.synthetic_batch import training_batch

    budget = 45_000_000
    overrides = dict(model="yolo26n-sem.yaml", data=synthetic("semantic"), imgsz=160, batch=2, device="cpu", project=str(tmp_path))
    trainer = trainer_for("semantic")(overrides={**overrides, "recompute": "auto", "memory_budget": "45MB"})
    trainer.setup_model()
    all_layers = resolve("all", layout_of("yolo26n-sem.yaml")).indices
    assert 0 < len(trainer.ckpt_state.plan.indices) < len(all_layers) and trainer.ckpt_state.plan.estimated_peak_bytes <= budget
    trainer.model.args = trainer.args  # as BaseTrainer._setup_train's set_model_attributes does (the loss reads it)
    measured = profile_step(trainer.model, training_batch(trainer.model, 2, 160, 0), None, flops=False)
    assert measured.recompute == ",".join(map(str, trainer.ckpt_state.plan.indices)) and measured.peak_bytes <= budget


def test_planning_refused_for_losses_it_does_not_model(tmp_path):
    """recompute=auto's memory model knows the YOLO detect, segment, pose, obb, classify, semantic and depth models
    and losses: RT-DETR (whose task is detect, planning.NOT_PLANNED) takes a named policy, told so before any folder
    is written."""
    from ultralytics import RTDETR

    trainer_cls = trainer_for("detect", RTDETR("rtdetr-l.yaml"))
    overrides = dict(model="rtdetr-l.yaml", recompute="auto", memory_budget="1GB", device="cpu", project=str(tmp_path))
    with pytest.raises(
        ValueError, match=r"which exists for YOLO models of the tasks detect, segment, .*semantic, depth; for \w*RTDETRTrainer"
    ):
        trainer_cls(overrides=overrides)
    assert list(tmp_path.iterdir()) == []


def test_rtdetr_model_to_detection_trainer_says_which_trainer(tmp_path):
    """An RT-DETR model handed to the detection trainer (stock fails at the first loss: 'RTDETRDecoder' object has no
    attribute 'stride'): one line naming trainer_for('detect', model), before the run folder is made; the trainer
    trainer_for picks for it takes the same model."""
    from ultralytics import RTDETR

    from yolo_ckpt import CheckpointDetectionTrainer

    model = RTDETR("rtdetr-l.yaml")
    with pytest.raises(ValueError, match=r"^model=rtdetr-l.yaml is an RT-DETR model .*use trainer_for\('detect', model\)") as e:
        # a data= that does not exist: the model is refused first (a missing dataset is Ultralytics' RuntimeError)
        model.train(
            trainer=CheckpointDetectionTrainer,
            data=str(tmp_path / "absent.yaml"),
            epochs=1,
            imgsz=64,
            device="cpu",
            project=str(tmp_path / "runs"),
        )
    assert "\n" not in str(e.value)
    assert not (tmp_path / "runs").exists()
    trainer = trainer_for("detect", model)
    assert trainer.check_keys({"model": "rtdetr-l.yaml", "recompute": "backbone"})[1] == {"recompute": "backbone"}  # the keys given
