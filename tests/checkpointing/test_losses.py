"""The loss region (yolo_ckpt.checkpointing.losses) against Ultralytics' stock segmentation losses: the same loss value and
gradients bit for bit at every chunk size, counted per recomputed image, inert without grad, pickled as stock.

Dense batches (150 nuclei per image at imgsz 256, hence ~64 x 64 mask pixels and hundreds of foreground anchors per
image) so that a small chunk runs several chunks and leaves a remainder.
"""

import copy
import pickle

import pytest
import torch
from helpers import Interrupted, assert_state_equal, stop_after, train
from torch.utils._pytree import tree_leaves, tree_map
from ultralytics import YOLO
from ultralytics.cfg import get_cfg
from ultralytics.nn.tasks import ClassificationModel, SegmentationModel
from ultralytics.utils.loss import v8SegmentationLoss
from ultralytics.utils.tal import TaskAlignedAssigner

from yolo_ckpt import CheckpointDetectionTrainer, count_recomputations, trainer_for
from yolo_ckpt.checkpointing import losses
from yolo_ckpt.checkpointing.chunks import DEFAULT_ASSIGN_CHUNK, DEFAULT_CHUNK
from yolo_ckpt.checkpointing.engine import checkpointed_modules
from yolo_ckpt.checkpointing.losses import (
    LossRegionModel,
    RecomputedMaskLoss,
    _MaskLoss,
    apply_loss_region,
    recompute_criterion,
    remove_loss_region,
)
from yolo_ckpt.config import DEFAULTS
from yolo_ckpt.data.dense import dense_segment_batch, dense_segment_dataset
from yolo_ckpt.memory.step import probe_training_step

IMGSZ, OBJECTS = 256, 150


def without_image(batch: dict, image: int, overlap: bool) -> dict:
    """``batch`` with every object of ``image`` removed (its image stays: an image without objects)."""
    keep = batch["batch_idx"] != image
    out = {k: batch[k][keep] for k in ("batch_idx", "cls", "bboxes")}
    masks = batch["masks"].clone()
    if overlap:
        masks[image] = 0
    else:
        masks = masks[keep]
    return {**batch, **out, "masks": masks}


@pytest.fixture(scope="module")
def heads(one_thread):
    """``heads(cfg, overlap)`` -> (model, head outputs, batch): one forward of a fresh model on a dense batch."""
    cache = {}

    def make(cfg, overlap=True):
        if (cfg, overlap) not in cache:
            torch.manual_seed(0)
            model = SegmentationModel(cfg, nc=1, verbose=False).train()
            model.args = get_cfg(overrides={"overlap_mask": overlap})
            batch = dense_segment_batch(2, IMGSZ, OBJECTS, overlap=overlap)
            with torch.no_grad():
                cache[cfg, overlap] = model, model(batch["img"]), batch
        return cache[cfg, overlap]

    return make


def loss_and_grads(model, preds, batch, chunk=None, **autocast):
    """Loss items, the loss and the gradients of every head output (coefficients, prototypes, boxes, scores) of a
    fresh criterion, patched with ``chunk`` unless it is None; and the number of recomputed images."""
    leaves = tree_map(lambda t: t.detach().clone().requires_grad_() if torch.is_tensor(t) else t, preds)
    criterion = model.init_criterion()
    if chunk is not None:
        recompute_criterion(criterion, chunk)
    with count_recomputations() as counter:
        with torch.autocast("cpu", **autocast) if autocast else torch.enable_grad():
            loss, items = criterion(leaves, batch)
        loss.sum().backward()
    grads = [t.grad for t in tree_leaves(leaves) if torch.is_tensor(t) and t.grad is not None]
    return [loss.detach(), *items.values(), *grads], counter.loss_images


def assert_all_equal(a, b):
    assert len(a) == len(b)
    different = [i for i, (x, y) in enumerate(zip(a, b)) if not torch.equal(x, y)]
    assert not different, f"tensors {different} differ"


@pytest.mark.slow
@pytest.mark.parametrize("overlap", [True, False])
def test_v8_mask_loss_bit_exact_at_every_chunk(heads, overlap, monkeypatch):
    """Loss value and every gradient equal stock's for chunks of 7 and 64 anchors (with remainders), one chunk for
    all anchors, and with one image without objects; each image with objects recomputed once per backward. Small
    backward tiles (~150-anchor tiles, 7 pixel tiles of 9-10 rows) so that they, too, leave remainders."""
    monkeypatch.setattr(losses, "ANCHOR_TILE", 150)
    monkeypatch.setattr(losses, "PIXEL_TILE", 440_000)
    model, preds, batch = heads("yolo11n-seg.yaml", overlap)
    criterion = model.init_criterion()
    fg = criterion.get_assigned_targets_and_loss(criterion.parse_output(preds), batch)[0][0].sum(1)
    assert fg.min() > 64 * 2 and (fg % 64).min() > 0 and (fg % 7).min() > 0  # several chunks and a remainder
    stock, none = loss_and_grads(model, preds, batch)
    assert none == 0
    for chunk in (7, 64, 10**6):
        out, images = loss_and_grads(model, preds, batch, chunk)
        assert_all_equal(stock, out)
        assert images == 2
    sparse = without_image(batch, 1, overlap)
    stock, _ = loss_and_grads(model, preds, sparse)
    out, images = loss_and_grads(model, preds, sparse, 64)
    assert_all_equal(stock, out)
    assert images == 1  # the empty image takes stock's path


@pytest.mark.parametrize("n, side, objects", [(2500, 64, 300), (3100, 32, 400)])
def test_mask_loss_tiles_exact(n, side, objects, one_thread):
    """One image's mask loss against stock's single_mask_loss on shapes whose backward products are tiled with the
    default anchor tiles (2500 anchors: two of 1250 rows; 3100: three of 1033-1034), at chunks with remainders.
    (Pixel tiles hold up to 2^24 anchor-pixels by default: the model-level test shrinks them.)"""
    g = torch.Generator().manual_seed(n)
    pred, proto = torch.randn(n, 32, generator=g), torch.randn(32, side, side, generator=g)
    masks = torch.randint(0, objects + 1, (1, side, side), generator=g).float()
    idx = torch.randint(0, objects, (n,), generator=g)
    lo = torch.rand(n, 2, generator=g) * side * 0.8
    xyxy = torch.cat([lo, lo + torch.rand(n, 2, generator=g) * side * 0.2 + 1], 1)
    area = (xyxy[:, 2:] - xyxy[:, :2]).prod(1) / side**2

    def run(fn):
        p, q = pred.clone().requires_grad_(), proto.clone().requires_grad_()
        loss = fn(p, q)
        loss.backward()
        return [loss.detach(), p.grad, q.grad]

    gt = (masks[0] == (idx + 1).view(-1, 1, 1)).float()
    stock = run(lambda p, q: v8SegmentationLoss.single_mask_loss(gt, p, q, xyxy, area))
    for chunk in (100, 333):
        assert_all_equal(stock, run(lambda p, q: _MaskLoss.apply(p, q, masks, idx, xyxy, area, 0, True, chunk).sum()))


def test_yolo26_mask_loss_bit_exact(heads):
    """YOLO26 (E2ELoss holding two SegmentLoss26): both branches' mask losses recomputed, exactly."""
    model, preds, batch = heads("yolo26n-seg.yaml")
    stock, _ = loss_and_grads(model, preds, batch)
    for chunk in (64, 100):
        out, images = loss_and_grads(model, preds, batch, chunk)
        assert_all_equal(stock, out)
        assert images == 2 * 2  # two images, one-to-many and one-to-one


@pytest.mark.slow
def test_bf16_autocast_bit_exact(heads):
    """Under autocast the forward and the backward's recomputation run in the forward's autocast state."""
    model, preds, batch = heads("yolo11n-seg.yaml")
    stock, _ = loss_and_grads(model, preds, batch, dtype=torch.bfloat16)
    out, images = loss_and_grads(model, preds, batch, 100, dtype=torch.bfloat16)
    assert_all_equal(stock, out)
    assert images == 2


def test_inert_without_grad(heads):
    """Validation runs model.loss under inference_mode: the stock loss, nothing recomputed."""
    model, preds, batch = heads("yolo11n-seg.yaml")
    criterion = recompute_criterion(model.init_criterion(), 64)
    stock = model.init_criterion()
    for mode in (torch.inference_mode, torch.no_grad):
        with count_recomputations() as counter, mode():
            assert_all_equal(list(criterion(preds, batch)[1].values()), list(stock(preds, batch)[1].values()))
        assert counter.loss_images == 0


@pytest.mark.slow
def test_model_hook_copies_pickles_and_removes(heads):
    """init_criterion builds the recomputed criterion (also on deepcopies: EMA); the chunk travels with the class;
    pickles hold stock classes only; remove_loss_region restores the stock classes; a torch.compile wrapper is
    seen through."""
    model, _, _ = heads("yolo11n-seg.yaml")
    model = copy.deepcopy(model)
    apply_loss_region(model, 32, 5)
    assert isinstance(model, LossRegionModel) and isinstance(model, SegmentationModel)
    ema = copy.deepcopy(model)
    for m in (model, ema):
        criterion = m.init_criterion()
        assert isinstance(criterion, RecomputedMaskLoss) and criterion.loss_chunk == 32
        assert type(criterion.assigner).__name__ == "ChunkedTaskAlignedAssigner" and criterion.assigner.assign_chunk == 5
        m.criterion = criterion
    apply_loss_region(model, 16, 3)  # again: the built criterion follows
    assert model.criterion.loss_chunk == 16 and ema.criterion.loss_chunk == 32
    assert model.criterion.assigner.assign_chunk == 3 and ema.criterion.assigner.assign_chunk == 5
    data = pickle.dumps(model)
    assert b"yolo_ckpt" not in data and b"Recomputed" not in data and b"Chunked" not in data
    loaded = pickle.loads(data)
    assert type(loaded) is SegmentationModel and type(loaded.criterion).__name__ == "v8SegmentationLoss"
    assert type(loaded.criterion.assigner) is TaskAlignedAssigner
    remove_loss_region(model)
    assert type(model) is SegmentationModel and type(model.criterion).__name__ == "v8SegmentationLoss"
    assert type(model.criterion.assigner) is TaskAlignedAssigner
    compiled = torch.compile(model)  # lazy: nothing compiles here; Ultralytics runs the loss on the inner model
    apply_loss_region(compiled, 8)
    assert isinstance(model, LossRegionModel) and model.loss_chunk == 8


def test_bad_model_and_chunk():
    with pytest.raises(ValueError, match="only detect, obb, pose and segment models"):
        apply_loss_region(ClassificationModel("yolo11n-cls.yaml", verbose=False))
    model = SegmentationModel("yolo11n-seg.yaml", verbose=False)
    for bad in (0, -1, 2.5, True, "64"):
        with pytest.raises(ValueError, match=rf"loss_chunk={bad!r} is not valid; give a positive int"):
            apply_loss_region(model, bad)
        with pytest.raises(ValueError, match=rf"assign_chunk={bad!r} is not valid; give a positive int"):
            apply_loss_region(model, 8, bad)
    assert type(model) is SegmentationModel


@pytest.mark.slow
def test_memory_floor(heads):
    """A dense step (yolo11n-seg, imgsz 256, batch 2, 150 objects, chunk 64): the loss region alone lowers the
    peak by >= 12%."""
    model, _, batch = heads("yolo11n-seg.yaml")
    stock = probe_training_step(model, batch)
    patched = copy.deepcopy(model)
    apply_loss_region(patched, 64)
    with count_recomputations() as counter:
        peak = probe_training_step(patched, batch)
    assert counter.loss_images == 2
    assert peak <= 0.88 * stock, f"{peak / 2**20:.0f} MiB against {stock / 2**20:.0f} MiB"


# Trainer level: dense nuclei (150 per image at 256 px, augmentation that drops objects off), batch 2 == nbs,
# half of the 4 images (fraction=0.5): 1 optimizer step per epoch. Each run is interrupted after its first epoch's
# checkpoint and resumed, so one pair of runs proves a fresh run and a resume: 2 steps in all.
DENSE = dict(imgsz=IMGSZ, epochs=2, fraction=0.5, mosaic=0.0, scale=0.0, translate=0.0, val=False)


def interrupted_and_resumed(model, data, project, name, trainer=None, resume_with=None, **kw):
    """Train 2 epochs, interrupted after the first; resume (with the yolo-ckpt keys ``resume_with``, if given).
    Returns the resumed trainer and the two halves' recompute counters."""
    with count_recomputations() as first, pytest.raises(Interrupted):
        train(model, data, project, name, trainer=trainer, callbacks=[("on_model_save", stop_after(0))], **DENSE, **kw)
    resumed = YOLO(project / name / "weights" / "last.pt")
    with count_recomputations() as second:
        resumed.train(resume=True, trainer=trainer, **(resume_with or {}))
    return resumed.trainer, first, second


@pytest.fixture(scope="module")
def dense_data(synthetic_cache):
    return str(dense_segment_dataset(objects=OBJECTS, size=IMGSZ, images=4))


@pytest.mark.slow
@pytest.mark.parametrize("model", ["yolo11n-seg.yaml", "yolo26n-seg.yaml"])
def test_trainer_all_equals_stock_fresh_and_resumed(model, dense_data, tmp_path, one_thread):
    """recompute=all (layers, head branches, loss) trains exactly as stock does without a stop, through an exact
    resume (YOLO26's end-to-end head builds its criterion in resume_training), with the chunk sizes changed at the
    resume (loss_chunk 64, then 100; assign_chunk 1, then the default 64: all give stock's bits), every layer, block
    and head branch recomputed once per step and every image's mask loss in each training backward (and the report's
    probe), none in validation. The segmentation models' trainer-level equality test (test_trainer.py has the other tasks')."""
    stock = train(model, dense_data, tmp_path, "stock", **DENSE)[0]
    segment = trainer_for("segment")
    ckpt, first, second = interrupted_and_resumed(
        model, dense_data, tmp_path, "all", segment, {"loss_chunk": 100, "assign_chunk": 64}, recompute="all", loss_chunk=64,
        assign_chunk=1,
    )
    branches = 2 if model.startswith("yolo26") else 1  # E2ELoss: one-to-many and one-to-one
    assert stock.ema.updates == ckpt.ema.updates == 2
    assert ckpt.policy.loss and ckpt.policy.head and (ckpt.args.loss_chunk, ckpt.args.assign_chunk) == (100, 64)
    modules = checkpointed_modules(ckpt.model)
    assert len(ckpt.policy.indices) >= 8 and any(m.startswith(f"{len(ckpt.model.model) - 1}.") for m in modules)  # head branches
    assert dict(first.per_module) == dict.fromkeys(modules, 1) and dict(second.per_module) == dict.fromkeys(modules, 2)  # + the probe
    assert first.loss_images == 1 * 2 * branches  # 1 step of 2 images, no report probe (interrupted)
    assert second.loss_images == (1 + 1) * 2 * branches  # 1 step and the report's probe
    # the chunked assigner (150 objects: 150 chunks of 1, then 3 of 64) in each step and the probe
    assert first.assignments >= 1 * branches and second.assignments >= (1 + 1) * branches
    assert_state_equal(stock.model, ckpt.model)
    assert_state_equal(stock.ema.ema, ckpt.ema.ema)


@pytest.mark.slow
def test_trainer_segmentation_default_and_bad_input(synthetic, dense_data, tmp_path):
    """The segmentation and detection trainers default to backbone,loss (classify: backbone) with the default chunks;
    recompute=loss on a classification model and a bad loss_chunk fail before any folder is written."""
    with pytest.raises(ValueError, match="the final head Classify has no loss region"):
        YOLO("yolo11n-cls.yaml").train(
            data=synthetic("classify"), trainer=trainer_for("classify"), recompute="loss", project=str(tmp_path)
        )
    with pytest.raises(ValueError, match="loss_chunk=0 is not valid"):
        YOLO("yolo11n-seg.yaml").train(
            data=dense_data, trainer=trainer_for("segment"), loss_chunk=0, project=str(tmp_path)
        )
    assert list(tmp_path.iterdir()) == []
    settings = dict(data=dense_data, project=str(tmp_path), device="cpu")
    segment = trainer_for("segment")(overrides={"model": "yolo11n-seg.yaml", **settings})
    detect = CheckpointDetectionTrainer(overrides={"model": "yolo11n.yaml", **settings, "data": synthetic()})
    assert DEFAULTS["loss_chunk"] == DEFAULT_CHUNK  # the YAML key's default and the Python API's agree
    assert (segment.args.recompute, segment.args.loss_chunk) == ("backbone,loss", DEFAULT_CHUNK)
    assert (detect.args.recompute, detect.args.assign_chunk) == ("backbone,loss", DEFAULT_ASSIGN_CHUNK)
