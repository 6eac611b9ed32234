"""The Ultralytics rules yolo_ckpt.memory.ultralytics_rules mirror (and yolo_ckpt.memory.runspec reads), checked against
Ultralytics itself: its trainer's set-up is run up to the point where it has applied the rule, and what it decided is
compared; or its function is called."""

import numpy as np
import pytest
import torch
from helpers import TRAIN
from ultralytics.cfg import get_cfg
from ultralytics.engine import trainer as engine_trainer
from ultralytics.models.yolo.detect import DetectionTrainer
from ultralytics.utils import DEFAULT_CFG, autobatch as ultralytics_autobatch

from yolo_ckpt.checkpointing.assigner import DECODE_CHUNK_PIXELS
from yolo_ckpt.memory.runspec import DataCounts, RunSpec, count_data, objects_rule, optimizer_rule
from yolo_ckpt.memory.ultralytics_rules import (
    OPTIMIZERS,
    TASKS,
    amp_enabled,
    anchors,
    augment_factors,
    autobatch_fraction,
    autobatch_imgsz,
    autocast_for,
    device_type,
    frozen_layers,
    grid_size,
    input_channels,
    largest_scale,
    mask_ratio,
    mosaic,
    optimizer_for,
    trainable_as_trained,
)

pytestmark = pytest.mark.usefixtures("one_thread")


class Reached(Exception):
    """Raised by a stand-in for the next step of Ultralytics' set-up: the rule under test has been applied."""


def reached(*args, **kwargs):
    raise Reached


def stock_trainer(synthetic, tmp_path, **overrides) -> DetectionTrainer:
    """Ultralytics' own DetectionTrainer on the synthetic detection data, nothing run yet."""
    return DetectionTrainer(
        overrides={**TRAIN, "model": "yolo11n.yaml", "data": synthetic(), "project": str(tmp_path), "name": "stock", **overrides}
    )


def set_up_until_pipeline(trainer: DetectionTrainer) -> DetectionTrainer:
    """``BaseTrainer._setup_train`` up to ``_build_train_pipeline``: the model built, frozen and AMP decided."""
    trainer._build_train_pipeline = reached
    with pytest.raises(Reached):
        trainer._setup_train()
    return trainer


@pytest.mark.filterwarnings("ignore:torch.cuda.amp.GradScaler is enabled, but CUDA is not available")
@pytest.mark.parametrize(
    "freeze, amp",
    [(3, True), (True, False), (False, "fp32"), ([0, "2", "04", "6.m", 8.0, 22], "fp16"), ((0, 1, 2), "bf16"), (None, True)],
)
def test_freeze_and_amp_as_setup_train_decides(freeze, amp, synthetic, tmp_path, monkeypatch):
    """frozen_layers(freeze=) are exactly the layers whose every parameter Ultralytics' _setup_train freezes (a bool
    is an int there, a tuple freezes nothing, "04" and "6.m" no whole layer), and amp_enabled(amp=) on an
    accelerator is the AMP _setup_train decides where the accelerator passes check_amp."""
    monkeypatch.setattr(engine_trainer, "check_amp", lambda model: True)  # an accelerator that passes the AMP check
    trainer = set_up_until_pipeline(stock_trainer(synthetic, tmp_path, freeze=freeze, amp=amp))
    layers = trainer.model.model
    frozen = [i for i, m in enumerate(layers) if any(True for _ in m.parameters()) and not any(p.requires_grad for p in m.parameters())]
    assert frozen_layers(freeze) == frozen
    assert amp_enabled(amp, "cuda") == trainer.amp


@pytest.mark.parametrize("amp", [True, "fp16"])
def test_amp_off_on_the_cpu_as_check_amp_decides(amp, synthetic, tmp_path):
    """On the CPU Ultralytics' own check_amp turns AMP off, as amp_enabled says."""
    trainer = set_up_until_pipeline(stock_trainer(synthetic, tmp_path, amp=amp))
    assert trainer.amp is False and amp_enabled(amp, trainer.device.type) is False


def test_autobatch_imgsz_and_mosaic_objects_as_auto_batch_sizes_them(synthetic, tmp_path, monkeypatch):
    """AutoBatch is sized for autobatch_imgsz (imgsz=100 rounds to 128, x 1.5 for multi_scale=0.5 -> 192) and for
    count_data's images and most objects x 4, as DetectionTrainer.auto_batch passes them to check_train_batch_size."""
    trainer = set_up_until_pipeline(stock_trainer(synthetic, tmp_path, imgsz=100, multi_scale=0.5))
    seen = {}
    monkeypatch.setattr(engine_trainer, "check_train_batch_size", lambda **kw: seen.update(kw) or 2)
    assert DetectionTrainer.auto_batch(trainer) == 2
    counts = count_data(trainer.args, trainer.data, trainer.stride)
    assert seen["imgsz"] == autobatch_imgsz(100, 0.5, trainer.stride) == 192
    assert (seen["max_num_obj"], seen["dataset_size"]) == (counts.planned_objects, counts.images) == (4 * counts.max_objects, counts.images)
    assert counts.max_objects > 1


@pytest.mark.parametrize(
    "stride, gs",
    [(torch.tensor([8.0, 16.0, 32.0]), 32), (torch.tensor([8.0, 16.0, 32.0, 64.0]), 64), ([8.0, 16.0, 32.0], 32), (torch.tensor([1.0]), 32),
     (16, 32), (64, 64)],
)
def test_grid_size_is_ultralytics_gs(stride, gs):
    """Issue 32: the one copy of BaseTrainer._setup_train's gs, the largest stride and at least 32 (a classifier's
    stride 1 too), quoted from stock's source as it is mirrored."""
    import inspect

    from ultralytics.engine.trainer import BaseTrainer

    stock = 'gs = max(int(self.model.stride.max() if hasattr(self.model, "stride") else 32), 32)'
    assert grid_size(stride) == gs and stock in inspect.getsource(BaseTrainer._setup_train)


def test_grid_size_is_the_trainers(synthetic, tmp_path):
    """A stock trainer's own gs (trainer.stride, set by _setup_train) is grid_size of its model's strides."""
    trainer = set_up_until_pipeline(stock_trainer(synthetic, tmp_path))
    assert grid_size(trainer.model.stride) == trainer.stride == 32


@pytest.mark.parametrize("batch", [-1, 0.7, 0.0, 1.0])
def test_autobatch_fraction_as_check_train_batch_size_reads_it(batch, monkeypatch):
    seen = {}
    monkeypatch.setattr(ultralytics_autobatch, "autobatch", lambda model, imgsz, fraction, **kw: seen.update(fraction=fraction) or 1)
    ultralytics_autobatch.check_train_batch_size(torch.nn.Conv2d(3, 1, 1), 64, amp=False, batch=batch)
    assert seen["fraction"] == autobatch_fraction(batch)


@pytest.mark.parametrize("epochs", [2500, 2501])
def test_optimizer_auto_as_build_train_pipeline_picks_it(epochs, synthetic, tmp_path):
    """optimizer=auto: optimizer_rule counts the iterations as _build_train_pipeline does (8 images / batch 2 x
    epochs: 10000 and 10004) and names the optimizer Ultralytics' build_optimizer then builds (AdamW, MuSGD)."""
    trainer = stock_trainer(synthetic, tmp_path, epochs=epochs, optimizer="auto")
    built, build = [], trainer.build_optimizer

    def build_and_stop(**kw):
        built.append((kw["iterations"], type(build(**kw)).__name__))
        raise Reached

    trainer.build_optimizer = build_and_stop
    with pytest.raises(Reached):
        trainer._setup_train()
    counts = count_data(trainer.args, trainer.data, trainer.stride)
    iterations, name = built[0]
    picked, rule = optimizer_rule("auto", counts.images, trainer.args.batch, trainer.args.nbs, epochs)
    assert picked == name == optimizer_for("auto", iterations) == ("AdamW" if epochs == 2500 else "MuSGD")
    assert f"for {iterations} iterations" in rule


def test_augment_factors_bound_what_the_training_augmentation_makes(synthetic_cache):
    """Objects per training image as Ultralytics' augmentation makes them (v8_transforms): mosaic x 4 (as AutoBatch
    counts), none without mosaic, copy-paste x 2 where labels have segments, mixup and cutmix one more mosaic each.
    Drawn samples with mixup (scale 0: a mosaic's crop holds about one image's objects) hold more objects than any
    labelled image, and never more than planned."""
    from ultralytics.data import build_yolo_dataset
    from ultralytics.data.utils import check_det_dataset

    from yolo_ckpt.data.small_objects import small_object_dataset

    cases = [({}, (("mosaic", 4),)), ({"mosaic": 0.0}, ()), ({"task": "detect", "copy_paste": 0.5}, (("mosaic", 4),)),
             ({"task": "segment", "copy_paste": 0.5, "mixup": 0.1, "cutmix": 0.1}, (("mosaic", 4), ("copy_paste", 2), ("mixup+cutmix", 3))),
             ({"rect": True, "mixup": 0.5, "cutmix": 0.5}, ())]
    for overrides, factors in cases:
        assert augment_factors(get_cfg(DEFAULT_CFG, overrides)) == factors
    data = check_det_dataset(str(small_object_dataset(train=16, val=1)))  # 5 px crosses: none too small to keep at 320
    args = get_cfg(DEFAULT_CFG, {"imgsz": 320, "mixup": 1.0, "scale": 0.0})
    dataset = build_yolo_dataset(args, data["train"], 2, data, mode="train")
    counts = DataCounts(len(dataset), max(len(label["cls"]) for label in dataset.labels), augment_factors(args))
    drawn = max(len(dataset[i]["cls"]) for i in range(len(dataset)) for _ in range(3))
    assert counts.max_objects < drawn <= counts.planned_objects == 8 * counts.max_objects
    assert objects_rule(counts, 20)[1] == f"the data's most in one image, {counts.max_objects}, x 4 for mosaic, x 2 for mixup"


@pytest.mark.parametrize(("task", "counts", "expected"), [
    ("detect", DataCounts(4, 300), (1200, "the data's most in one image, 300, x 4 for mosaic")),
    ("detect", DataCounts(4, 300, ()), (300, "the data's most in one image, 300 (no mosaic, mixup or cutmix)")),
    ("segment", None, (20, "objects=20")),
    ("classify", DataCounts(4, 0), (0, "a classify batch has none")),
    ("semantic", None, (0, "a semantic batch has none")),
    ("depth", None, (0, "a depth batch has none")),
])
def test_objects_per_image_by_task(task, counts, expected):
    assert objects_rule(counts, 20, task) == expected
    line = RunSpec("cpu", False, "AdamW", "optimizer=AdamW", *expected, 2).describe()
    assert ("no objects (" if expected[0] == 0 else f"{expected[0]} objects per image (") + expected[1] + ")" in line


def test_trainable_as_trained_as_setup_train_sets_requires_grad(synthetic, tmp_path):
    """trainable_as_trained(freeze=) leaves a fresh model's parameters trainable, or not, exactly as Ultralytics'
    _setup_train leaves its own model's (the first 3 layers and the DFL frozen)."""
    from ultralytics.nn.tasks import DetectionModel

    trainer = set_up_until_pipeline(stock_trainer(synthetic, tmp_path, freeze=3))
    model = DetectionModel("yolo11n.yaml", nc=trainer.model.nc, verbose=False)
    for p in model.parameters():
        p.requires_grad = False  # as a trained best.pt stores them
    trainable_as_trained(model, 3)
    assert [(n, p.requires_grad) for n, p in model.named_parameters()] == [
        (n, p.requires_grad) for n, p in trainer.model.named_parameters()
    ]


@pytest.mark.parametrize("imgsz", [32, 320, 640, 1024])
def test_anchors_are_make_anchors_points(imgsz):
    """anchors() counts the points Ultralytics' make_anchors lays on the head's feature maps at strides 8, 16, 32."""
    from ultralytics.utils.tal import make_anchors

    strides = torch.tensor([8.0, 16.0, 32.0])
    points, _ = make_anchors([torch.empty(1, 1, imgsz // int(s), imgsz // int(s)) for s in strides], strides)
    assert anchors(imgsz, strides.tolist()) == len(points)


def test_optimizer_names_as_build_optimizer_reads_them():
    """OPTIMIZERS are BaseTrainer.build_optimizer's names (its set, less auto); each name, in any case, is the
    optimizer Ultralytics' own builder builds, and a name it refuses optimizer_for refuses."""
    import ast
    import inspect
    import re
    from types import SimpleNamespace

    from ultralytics.engine.trainer import BaseTrainer

    source = inspect.getsource(BaseTrainer.build_optimizer)
    stock = set(ast.literal_eval(re.search(r"optimizers = (\{[^}]*\})", source).group(1)))
    assert set(OPTIMIZERS) == stock - {"auto"}
    model = torch.nn.Module()
    model.model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4))  # MuSGD reads model.model[-1]
    trainer = SimpleNamespace(args=SimpleNamespace(**vars(DEFAULT_CFG)), data={})
    for name in (*OPTIMIZERS, *(n.lower() for n in OPTIMIZERS), *(n.upper() for n in OPTIMIZERS)):
        built = BaseTrainer.build_optimizer(trainer, model, name)
        assert type(built).__name__ == optimizer_for(name)
    with pytest.raises(NotImplementedError):
        BaseTrainer.build_optimizer(trainer, model, "Adagrad")
    with pytest.raises(ValueError, match="not an Ultralytics optimizer"):
        optimizer_for("Adagrad")


def test_tasks_are_ultralytics_tasks():
    """The tasks the memory model knows are Ultralytics' (ultralytics.cfg.TASKS)."""
    from ultralytics.cfg import TASKS as STOCK_TASKS

    assert set(TASKS) <= set(STOCK_TASKS)


def test_device_type_as_select_device_selects(monkeypatch):
    """On this machine Ultralytics' select_device gives the device type device_type says, for the values it can
    select here (a CUDA device only where torch sees one)."""
    from ultralytics.utils.torch_utils import select_device

    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)  # select_device sets the threads for the CPU
    values = ["cpu", "CPU", "", None] + (["0"] if torch.cuda.is_available() else [])
    for value in values:
        assert select_device("" if value is None else value, verbose=False).type == device_type(value)


@pytest.mark.filterwarnings("ignore:CUDA is not available")
def test_autocast_for_cuda_is_ultralytics_autocast():
    """On CUDA a step runs under the autocast type Ultralytics' own autocast(self.amp, device=...) gives (fp16)."""
    from ultralytics.utils.torch_utils import autocast

    assert autocast_for(True, "cuda")().fast_dtype == autocast(True, device="cuda").fast_dtype == torch.float16


def test_decode_chunk_is_the_mask_scoring_assigners():
    """DECODE_CHUNK_PIXELS is the chunk SegTaskAlignedAssigner.pair_overlaps decodes at once (it computes it inline),
    quoted from stock's source as it is mirrored."""
    import inspect

    from ultralytics.utils.tal import SegTaskAlignedAssigner

    assert DECODE_CHUNK_PIXELS == 1 << 27 and "(1 << 27) // (m * mh * mw)" in inspect.getsource(SegTaskAlignedAssigner.pair_overlaps)


@pytest.mark.parametrize("scale", [0.5, 0.9, (0.3, 1.7)])
def test_largest_scale_is_random_perspectives_largest_draw(scale, monkeypatch):
    """largest_scale is the scale RandomPerspective._compute_affine_matrix draws when every uniform draw is its upper
    end (``1 + scale``, a range's upper end)."""
    import random

    from ultralytics.data.augment import RandomPerspective

    monkeypatch.setattr(random, "uniform", lambda a, b: b)
    _, drawn = RandomPerspective(scale=scale)._compute_affine_matrix(np.zeros((32, 32, 3), np.uint8), (32, 32))
    assert drawn == largest_scale(scale)


def test_mask_ratio_is_the_runs_or_ultralytics_default():
    from types import SimpleNamespace

    from ultralytics.utils import DEFAULT_CFG

    assert mask_ratio(SimpleNamespace()) == DEFAULT_CFG.mask_ratio == 4
    assert mask_ratio(SimpleNamespace(args=SimpleNamespace(mask_ratio=2))) == 2


@pytest.mark.parametrize("channels", [1, 3, 10])
def test_input_channels_are_the_models_first_convolutions(channels):
    """input_channels reads what Ultralytics built the model for (the data's channels: key, or the YAML's): the first
    convolution's input channels; the synthetic training batch has as many (issue 43: it had 3 whatever the model)."""
    from ultralytics.nn.tasks import DetectionModel

    from yolo_ckpt.memory.synthetic_batch import training_batch

    model = DetectionModel("yolo11n.yaml", ch=channels, nc=1, verbose=False)
    assert input_channels(model) == model.model[0].conv.in_channels == channels
    assert training_batch(model, 2, 64, 3)["img"].shape == (2, channels, 64, 64)


def test_rect_turns_mosaic_off_and_its_dataset_is_counted(synthetic, tmp_path):
    """rect=True: YOLODataset.build_transforms builds its Mosaic, MixUp and CutMix with p=0, as mosaic() and
    augment_factors() read it; count_data counts a rect run's training set (a rect dataset pops its
    labels' image shapes, which the box sizes read: issue 43's KeyError) as the same set without rect."""
    from ultralytics.data import build_yolo_dataset
    from ultralytics.data.utils import check_det_dataset

    data = check_det_dataset(synthetic())
    args = get_cfg(DEFAULT_CFG, {"rect": True, "mixup": 0.5, "imgsz": 64})
    assert mosaic(args) == 0.0 and augment_factors(args) == () and args.mosaic == 1.0
    transforms = build_yolo_dataset(args, data["train"], 2, data, mode="train", stride=32).transforms.transforms
    drawn = {type(t).__name__: t.p for t in [*transforms[0].transforms, *transforms] if type(t).__name__ in {"Mosaic", "MixUp", "CutMix"}}
    assert drawn == {"Mosaic": 0.0, "MixUp": 0.0, "CutMix": 0.0}
    rect, square = count_data(args, data, 32), count_data(get_cfg(DEFAULT_CFG, {"mosaic": 0.0, "imgsz": 64}), data, 32)
    assert (rect.images, rect.max_objects, rect.augment) == (square.images, square.max_objects, square.augment) == (8, rect.max_objects, ())
    assert rect.sizes.per_image(64, [8, 16, 32], 10) == square.sizes.per_image(64, [8, 16, 32], 10) > 0
