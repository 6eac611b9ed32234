"""The chunked task-aligned assigners (yolo_ckpt.checkpointing.assigner) against Ultralytics' stock ones: every output bit for bit
on crafted batches, at chunk sizes 1, 7 and all, for every assigner variant (detect, obb, pose, YOLO26 seg; the
end-to-end losses' topk 10, 7/1 and 1); then the loss and its gradients through the stock loss classes."""

import copy
from types import SimpleNamespace

import pytest
import torch
from helpers import large_box_dataset, train
from torch.utils._pytree import tree_leaves, tree_map
from ultralytics.cfg import get_cfg
from ultralytics.nn.tasks import DetectionModel, OBBModel, PoseModel, SegmentationModel
from ultralytics.utils.loss import E2EDetectLoss, E2ELoss
from ultralytics.utils.tal import (
    PoseTaskAlignedAssigner,
    RotatedTaskAlignedAssigner,
    SegTaskAlignedAssigner,
    TaskAlignedAssigner,
    make_anchors,
)

from yolo_ckpt import CheckpointDetectionTrainer, count_recomputations
from yolo_ckpt.checkpointing import assigner as assigner_module, engine, patching
from yolo_ckpt.checkpointing.assigner import assigners, chunk_assigners
from yolo_ckpt.checkpointing.chunks import check_assign_chunk

IMGSZ, N, NC, K, NM = 128, 12, 3, 5, 8
STRIDES = (8, 16, 32)
CHUNKS = (1, 7, N)
CASES = ("random", "overlapping", "identical", "tied_zero", "one_object", "small", "nan", "nested", "whole_image", "edge")
PIECES = (97, assigner_module.PAIR_PIECE)  # candidate pairs per piece of the pair stage: many pieces a chunk, and one
# The assigners of 8.4's losses: v8DetectionLoss and E2ELoss's one-to-many (topk 10), E2ELoss's one-to-one (7/1),
# E2EDetectLoss's one-to-one (topk 1); v8OBBLoss's rotated one; PoseLoss26's and SegmentLoss26's.
VARIANTS = {
    "detect": (TaskAlignedAssigner, dict(topk=10)),
    "detect_o2o": (TaskAlignedAssigner, dict(topk=7, topk2=1)),
    "detect_topk1": (TaskAlignedAssigner, dict(topk=1)),
    "obb": (RotatedTaskAlignedAssigner, dict(topk=10)),
    "obb_o2o": (RotatedTaskAlignedAssigner, dict(topk=7, topk2=1)),
    "pose": (PoseTaskAlignedAssigner, dict(topk=10, sigmas=torch.full((K,), 0.1))),
    "pose_o2o": (PoseTaskAlignedAssigner, dict(topk=7, topk2=1, sigmas=torch.full((K,), 0.1))),
    "seg": (SegTaskAlignedAssigner, dict(topk=10)),
    "seg_o2o": (SegTaskAlignedAssigner, dict(topk=7, topk2=1)),
}


def crafted(case: str, kind: type) -> dict:
    """Assigner inputs for 3 images of IMGSZ px: the first with N objects, the second none (an empty image), the
    third N // 2 (padded rows, mask_gt 0), as ``v8DetectionLoss`` passes them (pixels, sigmoid scores)."""
    g = torch.Generator().manual_seed(CASES.index(case))

    def rand(*shape):
        return torch.rand(*shape, generator=g)

    feats = [torch.zeros(1, 1, IMGSZ // s, IMGSZ // s) for s in STRIDES]
    anchors, stride = make_anchors(feats, torch.tensor(STRIDES, dtype=torch.float))
    anc, na, bs = anchors * stride, len(anchors), 3
    counts = [1, 0, 1] if case == "one_object" else [N, 0, N // 2]
    n = max(counts)
    lo, hi = {"small": (2, 10), "overlapping": (30, 60), "whole_image": (IMGSZ, IMGSZ), "edge": (20, 60)}.get(case, (10, 50))
    centre = 54 + 20 * rand(bs, n, 2) if case == "overlapping" else 8 + (IMGSZ - 16) * rand(bs, n, 2)
    wh = lo + (hi - lo) * rand(bs, n, 2)
    if case == "nested":  # a crowd: boxes inside boxes about one point, from 8 px to the whole image
        centre = 64 + 4 * rand(bs, n, 2)
        wh = torch.linspace(8, IMGSZ, n)[None, :, None].expand(bs, n, 2).clone()
    if case == "whole_image":  # every box the whole image: every anchor a candidate of every object
        centre = torch.full((bs, n, 2), IMGSZ / 2)
    if case == "edge":  # centres on the image's edges: boxes half outside it
        centre = torch.where(rand(bs, n, 2) > 0.5, float(IMGSZ), 0.0) * (rand(bs, n, 1) > 0.5) + centre * (rand(bs, n, 1) > 0.5)
    labels = torch.randint(0, NC, (bs, n, 1), generator=g).float()
    if case == "identical":  # the second half repeats the first: tied overlaps and metrics
        centre[:, n // 2 :], wh[:, n // 2 :], labels[:, n // 2 :] = centre[:, : n - n // 2], wh[:, : n - n // 2], labels[:, : n - n // 2]
    valid = (torch.arange(n)[None] < torch.tensor(counts)[:, None])[..., None].float()
    scores = torch.zeros(bs, na, NC) if case == "tied_zero" else rand(bs, na, NC)
    pd_wh = 8 + 40 * rand(bs, na, 2)
    pd_centre = anc + 8 * (rand(bs, na, 2) - 0.5)
    if kind is RotatedTaskAlignedAssigner:
        gt = torch.cat([centre, wh, rand(bs, n, 1) * 3.14], -1) * valid
        pd = torch.cat([pd_centre, pd_wh, rand(bs, na, 1) * 3.14], -1)
    else:
        gt = torch.cat([centre - wh / 2, centre + wh / 2], -1) * valid
        pd = torch.cat([pd_centre - pd_wh / 2, pd_centre + pd_wh / 2], -1)
    if case == "nan":  # NaN scores and boxes: the NaN guard of the running maxima
        scores[0, :40] = float("nan")
        pd[0, 40:90] = float("nan")
    inputs = dict(pd_scores=scores, pd_bboxes=pd, anc_points=anc, gt_labels=labels * valid, gt_bboxes=gt, mask_gt=valid)
    if kind is PoseTaskAlignedAssigner:
        spread = 3.0 if case == "edge" else 1.0  # keypoints outside their boxes (and the image) on the edge case
        kpts = centre[:, :, None] + (rand(bs, n, K, 2) - 0.5) * spread * wh[:, :, None]
        visible = (rand(bs, n, K, 1) > 0.3).float() * 2
        if case == "tied_zero":  # no visible keypoints: the box IoU
            visible.zero_()
        inputs.update(
            anc_strides=stride.view(-1),
            pd_kpts=anc[None, :, None] + 10 * (rand(bs, na, K, 2) - 0.5),
            gt_kpts=torch.cat([kpts, visible], -1) * valid[..., None],
        )
    if kind is SegTaskAlignedAssigner:
        mh = IMGSZ // 4
        ys, xs = torch.arange(mh)[:, None] + 0.5, torch.arange(mh)[None] + 0.5
        x1, y1, x2, y2 = (gt / 4)[..., None, None].unbind(2)
        masks = (xs >= x1) & (xs < x2) & (ys >= y1) & (ys < y2) & (rand(bs, n, mh, mh) > 0.2)
        inputs.update(
            pd_coef=rand(bs, na, NM) - 0.5,
            mask_scale=torch.full((bs, 1), 0.25),
            proto=rand(bs, NM, mh, mh) - 0.5,
            gt_masks=masks & valid[..., None].bool(),
        )
    return inputs


def assert_same(a: torch.Tensor, b: torch.Tensor) -> None:
    """Bit-identical tensors, NaN where the other has NaN (torch.equal is False for any NaN)."""
    assert a.dtype == b.dtype and a.shape == b.shape
    if a.is_floating_point():
        assert torch.equal(a.isnan(), b.isnan())
        a, b = a.nan_to_num(0.0), b.nan_to_num(0.0)
    assert torch.equal(a, b), (a != b).nonzero()[:5]


def chunked(assigner, chunk: int):
    """A copy of ``assigner`` with its class swapped for the chunked one (through :func:`chunk_assigners`)."""
    copied = copy.copy(assigner)
    chunk_assigners(SimpleNamespace(assigner=copied), chunk)
    return copied


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("variant", VARIANTS)
def test_outputs_equal_stock(variant, case, one_thread, monkeypatch):
    kind, kw = VARIANTS[variant]
    stock = kind(num_classes=NC, alpha=0.5, beta=6.0, stride=list(STRIDES), **kw)
    inputs = crafted(case, kind)
    expected = stock(**inputs)
    # Some positives, except where a final top-1 picks among tied zero metrics an anchor outside the box (as stock)
    assert expected[3].any() or (case == "tied_zero" and stock.topk2 == 1)
    for chunk in CHUNKS:
        for piece in PIECES:
            monkeypatch.setattr(assigner_module, "PAIR_PIECE", piece)
            with count_recomputations() as counter:
                got = chunked(stock, chunk)(**inputs)
            assert counter.assignments == 1
            assert len(got) == len(expected) == 5
            for a, b in zip(got, expected):
                assert_same(a, b)


def test_crafted_layouts_reach_many_pairs():
    """The large-box layouts give far more candidate pairs than anchors (the pair stage's memory), and more than one
    piece of the pair stage per chunk at the test's small piece size."""
    anchors = sum((IMGSZ // s) ** 2 for s in STRIDES)
    for case, at_least in (("whole_image", N * anchors), ("nested", 3 * anchors), ("edge", PIECES[0] + 1)):
        x = crafted(case, TaskAlignedAssigner)
        stock = TaskAlignedAssigner(topk=10, num_classes=NC, stride=list(STRIDES))
        pairs = stock.select_candidates_in_gts(x["anc_points"], x["gt_bboxes"], x["mask_gt"]) & x["mask_gt"].bool()
        assert pairs[0].sum() >= at_least > PIECES[0], (case, int(pairs[0].sum()))


def test_crafted_cases_hold_conflicts_and_ties():
    """The crafted batches reach the paths that need care: anchors claimed by several objects (select_highest_overlaps'
    argmax), and in-box alignment metrics all exactly 0 (top-k among tied zeros)."""
    stock = TaskAlignedAssigner(topk=10, num_classes=NC, alpha=0.5, beta=6.0, stride=list(STRIDES))
    for case in ("overlapping", "identical", "tied_zero"):
        x = crafted(case, TaskAlignedAssigner)
        stock.bs, stock.n_max_boxes = x["gt_bboxes"].shape[:2]
        mask_pos, align_metric, _ = stock.get_pos_mask(
            x["pd_scores"], x["pd_bboxes"], x["gt_labels"], x["gt_bboxes"], x["anc_points"], x["mask_gt"]
        )
        if case == "tied_zero":
            assert mask_pos.any() and not align_metric.any()
        else:
            assert (mask_pos.sum(-2) > 1).any()


def test_class_pickles_as_stock_and_restores():
    """The chunked class pickles as the stock one; ``chunk=None`` restores it; a bad chunk is refused."""
    import pickle

    stock = TaskAlignedAssigner(num_classes=NC)
    copied = chunked(stock, 7)
    assert type(copied).__name__ == "ChunkedTaskAlignedAssigner" and copied.assign_chunk == 7
    assert type(pickle.loads(pickle.dumps(copied))) is TaskAlignedAssigner
    chunk_assigners(SimpleNamespace(assigner=copied), None)
    assert type(copied) is TaskAlignedAssigner
    for bad in (0, -1, 1.5, True, "8"):
        with pytest.raises(ValueError, match="assign_chunk="):
            check_assign_chunk(bad)


def detection_batch(task: str, objects: int = 40, seed: int = 0, large: bool = False) -> dict:
    """A training batch of 3 images at IMGSZ: ``objects`` small boxes (with ``large``, of 40-100% of the side: they
    overlap) in the first, none in the second, one in the third; obb boxes with an angle, pose keypoints (17, 3)."""
    g = torch.Generator().manual_seed(seed)
    n = objects + 1
    centre = 0.1 + 0.8 * torch.rand(n, 2, generator=g)
    wh = (0.4 + 0.6 * torch.rand(n, 2, generator=g)) if large else (0.03 + 0.2 * torch.rand(n, 2, generator=g))
    batch = {
        "img": torch.rand(3, 3, IMGSZ, IMGSZ, generator=g),
        "batch_idx": torch.tensor([0.0] * objects + [2.0]),
        "cls": torch.zeros(n, 1),
        "bboxes": torch.cat([centre, wh], 1),
    }
    if task == "obb":
        batch["bboxes"] = torch.cat([batch["bboxes"], torch.rand(n, 1, generator=g)], 1)
    if task == "pose":
        kpts = centre[:, None] + (torch.rand(n, 17, 2, generator=g) - 0.5) * wh[:, None]
        batch["keypoints"] = torch.cat([kpts, torch.full((n, 17, 1), 2.0)], -1)
    return batch


# (model class, YAML, loss kind): every assigner-bearing criterion of 8.4 a YAML builds, and E2EDetectLoss built
# by hand (a YOLOv10 head with topk 10 and 1).
LOSSES = {
    "v8DetectionLoss": (DetectionModel, "yolo11n.yaml", "detect"),
    "v8OBBLoss": (OBBModel, "yolo11n-obb.yaml", "obb"),
    "v8PoseLoss": (PoseModel, "yolo11n-pose.yaml", "pose"),
    "E2ELoss-detect": (DetectionModel, "yolo26n.yaml", "detect"),
    "E2ELoss-obb": (OBBModel, "yolo26n-obb.yaml", "obb"),
    "E2ELoss-PoseLoss26": (PoseModel, "yolo26n-pose.yaml", "pose"),
    "E2ELoss-SegmentLoss26": (SegmentationModel, "yolo26n-seg.yaml", "segment"),
    "E2EDetectLoss": (DetectionModel, "yolov10n.yaml", "detect"),
}


def loss_and_grads(model, preds, batch, criterion):
    """The loss, its items and the gradients of every head output, and the chunked assignments counted."""
    leaves = tree_map(lambda t: t.detach().clone().requires_grad_() if torch.is_tensor(t) else t, preds)
    with count_recomputations() as counter:
        loss, items = criterion(leaves, batch)
        loss.sum().backward()
    grads = [t.grad for t in tree_leaves(leaves) if torch.is_tensor(t) and t.grad is not None]
    return [loss.detach(), *tree_leaves(items), *grads], counter.assignments


@pytest.mark.parametrize("layout", ["small", "large"])
@pytest.mark.parametrize("name", LOSSES)
def test_loss_and_gradients_equal_stock(name, layout, one_thread, monkeypatch):
    """Small boxes, and large ones that overlap (every anchor a candidate of many objects, over several pieces of the
    pair stage: PAIR_PIECE 97)."""
    cls, cfg, task = LOSSES[name]
    torch.manual_seed(0)
    model = cls(cfg, nc=1, verbose=False).train()
    model.args = get_cfg()
    batch = detection_batch(task, large=layout == "large")
    if layout == "large":
        monkeypatch.setattr(assigner_module, "PAIR_PIECE", PIECES[0])
    if task == "segment":
        from yolo_ckpt.data.dense import dense_segment_batch
        from yolo_ckpt.memory.synthetic_batch import training_batch

        large = training_batch(model, 2, IMGSZ, 30, sides=(0.4, 1.0))  # masks fill their boxes
        batch = large if layout == "large" else dense_segment_batch(2, IMGSZ, 30)
    with torch.no_grad():
        preds = model(batch["img"])

    def criterion():
        return E2EDetectLoss(model) if name == "E2EDetectLoss" else model.init_criterion()

    expected, stock_count = loss_and_grads(model, preds, batch, criterion())
    assert stock_count == 0
    assert isinstance(criterion(), E2ELoss) == name.startswith("E2ELoss")
    parts = assigners(criterion())
    assert len(parts) == (2 if name.startswith("E2E") else 1)
    for chunk in CHUNKS:
        got, count = loss_and_grads(model, preds, batch, chunk_assigners(criterion(), chunk))
        assert count == len(parts)
        assert len(got) == len(expected)
        for a, b in zip(got, expected):
            assert torch.equal(a, b)


@pytest.mark.slow
def test_run_probe_uses_the_runs_chunks(synthetic, tmp_path, monkeypatch, one_thread):
    """The run report's CPU probe re-applies the run's policy with the run's loss_chunk and assign_chunk (not the
    defaults); the run's assigner ran chunked."""
    seen = []
    original = engine.apply_checkpointing

    def spy(model, *args, **kwargs):  # the probe's apply_checkpointing (the trainer's own is bound at import)
        policy = original(model, *args, **kwargs)
        inner = type(patching.model_layers(model))
        seen.append((policy.spec, inner.loss_chunk, inner.assign_chunk))
        return policy

    monkeypatch.setattr(engine, "apply_checkpointing", spy)
    trainer, counter = train(
        "yolo11n.yaml", synthetic(), tmp_path, "probe", trainer=CheckpointDetectionTrainer, fraction=0.5, loss_chunk=7, assign_chunk=3
    )
    assert trainer.ckpt_state.train_probe is not None and seen == [("backbone,loss", 7, 3)]
    assert type(trainer.model.criterion.assigner).assign_chunk == 3 and counter.assignments > 0


@pytest.mark.slow
@pytest.mark.parametrize(
    "task, model", [("detect", "yolo11n.yaml"), ("segment", "yolo11n-seg.yaml"), ("pose", "yolo11n-pose.yaml"), ("obb", "yolo11n-obb.yaml")]
)
def test_training_equals_stock_on_large_overlapping_boxes(task, model, tmp_path, one_thread, monkeypatch):
    """Ultralytics' trainer, stock against recompute=all (every layer, the head and the loss region) with the assigner
    in chunks of 3 objects and pieces of 97 candidate pairs, on large boxes that overlap: the weights, BatchNorm buffers
    and EMA after training are bit-identical, and the layers were recomputed."""
    from helpers import assert_state_equal
    from ultralytics.utils.torch_utils import unwrap_model

    from yolo_ckpt import trainer_for

    data = large_box_dataset(tmp_path / "data", task)
    stock, _ = train(model, data, tmp_path, "stock")
    monkeypatch.setattr(assigner_module, "PAIR_PIECE", PIECES[0])
    full, counter = train(model, data, tmp_path, "all", trainer=trainer_for(task), recompute="all", assign_chunk=3)
    assert full.ema.updates == stock.ema.updates >= 2 and counter.total > 0 and full.policy.loss
    assert_state_equal(unwrap_model(stock.model), unwrap_model(full.model))
    assert_state_equal(stock.ema.ema, full.ema.ema)
