"""Head branches and nested inner blocks (yolo_ckpt.checkpointing.engine): exact against stock, each recomputed once per backward.

Models are built from YAML (no download), 64 px images; a target-free surrogate loss over every training output
reaches every branch (the trainer-level tests in test_trainer.py use the real losses).
"""

import copy
import pickle

import pytest
import torch
import ultralytics
from helpers import assert_grads_equal, assert_state_equal, build_model, sgd_steps, surrogate_step
from torch import nn

import yolo_ckpt.checkpointing.engine as engine
from yolo_ckpt import apply_checkpointing, checkpointed_layers, count_recomputations, remove_checkpointing
from yolo_ckpt.checkpointing.engine import checkpointed_modules, head_branches
from yolo_ckpt.memory.synthetic_batch import detect_batch
from yolo_ckpt.memory.tracker import LiveTensorTracker

pytestmark = pytest.mark.usefixtures("one_thread")

LEVELS = ("0", "1", "2")
# The branches of each head class, by attribute, as head_branches() must find them.
HEADS = {
    "yolo11n.yaml": ("Detect", ("cv2", "cv3")),
    "yolov10n.yaml": ("v10Detect", ("cv2", "cv3", "one2one_cv2", "one2one_cv3")),
    "yolo26n.yaml": ("Detect", ("cv2", "cv3", "one2one_cv2", "one2one_cv3")),
    "yolo11n-seg.yaml": ("Segment", ("cv2", "cv3", "cv4", "proto")),
    "yolo26n-seg.yaml": ("Segment26", ("cv2", "cv3", "one2one_cv2", "one2one_cv3", "cv4", "one2one_cv4", "proto")),
    "yolo11n-obb.yaml": ("OBB", ("cv2", "cv3", "cv4")),
    "yolo26n-obb.yaml": ("OBB26", ("cv2", "cv3", "one2one_cv2", "one2one_cv3", "cv4", "one2one_cv4")),
    "yolo11n-pose.yaml": ("Pose", ("cv2", "cv3", "cv4")),
    "yolo26n-pose.yaml": (
        "Pose26",
        (
            "cv2",
            "cv3",
            "one2one_cv2",
            "one2one_cv3",
            "cv4",
            "cv4_kpts",
            "cv4_sigma",
            "one2one_cv4",
            "one2one_cv4_kpts",
            "one2one_cv4_sigma",
        ),
    ),
    "yolo11n-cls.yaml": ("Classify", ("conv",)),
}


def expected_branches(yaml_name, model):
    head = len(model.model) - 1
    names = []
    for attr in HEADS[yaml_name][1]:
        names += [f"{head}.{attr}"] if attr in engine.HEAD_BRANCHES else [f"{head}.{attr}.{j}" for j in LEVELS]
    return names


@pytest.mark.parametrize("yaml_name", list(HEADS))
def test_head_branches_recomputed_once_and_exact(yaml_name):
    """recompute=head on every head class: its branches (and only those) are patched, each recomputed once per
    backward; gradients and BN buffers (num_batches_tracked once per forward) equal stock."""
    stock, patched = build_model(yaml_name), build_model(yaml_name)
    head = patched.model[-1]
    assert type(head).__name__ == HEADS[yaml_name][0]
    policy = apply_checkpointing(patched, "head")
    assert policy.head and policy.indices == ()
    branches = expected_branches(yaml_name, patched)
    assert sorted(checkpointed_modules(patched)) == sorted(branches)
    assert sorted(f"{head.i}.{n}" for n, _ in head_branches(head)) == sorted(branches)
    assert checkpointed_layers(patched) == [] and type(head).__module__.startswith("ultralytics")
    img = torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    with count_recomputations() as counter:
        for _ in range(2):
            assert torch.equal(surrogate_step(stock, img), surrogate_step(patched, img))
    assert dict(counter.per_module) == {name: 2 for name in branches}
    assert dict(counter.per_layer) == {}
    assert_grads_equal(stock, patched)
    assert_state_equal(stock, patched)
    bns = [m for m in head.modules() if isinstance(m, nn.BatchNorm2d)]
    assert bns and all(int(bn.num_batches_tracked) == 2 for bn in bns)


def test_head_with_layers_in_selective_mode_exact():
    """recompute=all, recompute_mode=selective on YOLO26n-pose (end2end, Pose26): every layer and branch counted."""
    stock, patched = build_model("yolo26n-pose.yaml"), build_model("yolo26n-pose.yaml")
    apply_checkpointing(patched, "all", mode="selective")
    assert type(patched.model[-1].cv4[0]).__name__ == "SelectiveRecomputedSequential"
    assert type(patched.model[-1].cv4_kpts[0]).__name__ == "SelectiveRecomputedConv2d"
    img = torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(2))
    with count_recomputations() as counter:
        assert torch.equal(surrogate_step(stock, img), surrogate_step(patched, img))
    assert dict(counter.per_module) == {name: 1 for name in checkpointed_modules(patched)}
    assert len(counter.per_module) == 17 + 30
    assert_grads_equal(stock, patched)
    assert_state_equal(stock, patched)


def test_branches_copy_pickle_remove_and_reapply(tmp_path):
    """Deepcopies keep the branches patched and named; pickles hold stock classes and no yolo_ckpt attribute;
    remove_checkpointing restores every module; applying twice patches once."""
    model = build_model("yolo11n-seg.yaml")
    stock_types = [type(m) for m in model.modules()]
    apply_checkpointing(model, "all")
    names = checkpointed_modules(model)
    assert "23.proto" in names and "23.cv4.2" in names
    clone = copy.deepcopy(model)
    assert checkpointed_modules(clone) == names
    blob = pickle.dumps(model)
    assert b"yolo_ckpt" not in blob and b"Recomputed" not in blob and b"_recompute_name" not in blob
    loaded = pickle.loads(blob)
    assert [type(m) for m in loaded.modules()] == stock_types
    assert checkpointed_modules(model) == names  # pickling left the live model patched

    apply_checkpointing(model, "all")
    assert checkpointed_modules(model) == names
    assert type(model.model[-1].proto).__bases__ == (engine.RecomputedLayer, type(loaded.model[-1].proto))
    with count_recomputations() as counter:
        surrogate_step(model, torch.rand(1, 3, 64, 64))
    assert set(counter.per_module.values()) == {1}
    apply_checkpointing(model, "backbone")  # replaces: the head's branches are stock again
    assert checkpointed_modules(model) == [str(i) for i in range(11)]
    remove_checkpointing(model)
    assert [type(m) for m in model.modules()] == stock_types
    assert not any("_recompute_name" in vars(m) for m in model.modules())


# --------------------------------------------------------------------------------------------- nested blocks


def test_a2c2f_blocks_nested_exact_and_counted():
    """Recomputing YOLO12n's A2C2f layer 6 recomputes each of its four ABlocks on its own inside it, in both modes:
    gradients and BN buffers equal stock after 2 training steps, each block counted once per backward,
    num_batches_tracked once per forward."""
    batch = detect_batch(2, 64, 3)
    for mode in ("full", "selective"):
        stock, patched = build_model("yolo12n.yaml"), build_model("yolo12n.yaml")
        policy = apply_checkpointing(patched, "6", mode=mode)
        assert policy.indices == (6,) and engine.NESTED_BLOCKS["A2C2f"] == "m"
        blocks = ["6.m.0.0", "6.m.0.1", "6.m.1.0", "6.m.1.1"]  # each ABlock of the two m[j]
        assert checkpointed_modules(patched) == ["6", *blocks]
        assert all(type(patched.model[6].m[j]) is nn.Sequential for j in (0, 1))
        with count_recomputations() as counter:
            for _ in range(2):
                for m in (stock, patched):
                    m.loss(batch)[0].sum().backward()
        assert dict(counter.per_module) == {"6": 2, **{b: 2 for b in blocks}}, mode
        assert dict(counter.per_layer) == {6: 2}
        assert_grads_equal(stock, patched)
        assert_state_equal(stock, patched)
        bns = [m for m in patched.model[6].m.modules() if isinstance(m, nn.BatchNorm2d)]
        assert len(bns) == 20 and all(int(bn.num_batches_tracked) == 2 for bn in bns)


def test_nested_blocks_lower_the_recompute_peak(monkeypatch):
    """The point of nesting: with every layer recomputed, rebuilding YOLO12n's A2C2f layers block by block needs
    less memory than all at once (measured at imgsz 320: 0.95x the peak; 512: 0.83x)."""
    batch = detect_batch(1, 320, 5)
    peaks = {}
    for nested in (True, False):
        if not nested:
            monkeypatch.setattr(engine, "NESTED_BLOCKS", {})
        model = build_model("yolo12n.yaml")
        apply_checkpointing(model, "all")
        with LiveTensorTracker() as tracker:
            tracker.track(list(model.parameters()), batch)
            model.loss(batch)[0].sum().backward()
        peaks[nested] = tracker.peak_bytes
    assert peaks[True] < 0.97 * peaks[False], peaks


# A small model with an A2C2f layer (two area-attention blocks) and a one-level Detect head: compiles in seconds.
TINY_A2 = {  # with an Upsample and a Concat, folded into the recomputed Conv after them
    "nc": 3,  # detect_batch draws classes 0-2
    "backbone": [[-1, 1, "Conv", [32, 3, 2]], [-1, 1, "Conv", [64, 3, 2]], [-1, 2, "A2C2f", [64, True, 1]]],
    "head": [
        [-1, 1, "Conv", [64, 3, 2]], [-1, 1, "nn.Upsample", [None, 2, "nearest"]], [[-1, 2], 1, "Concat", [1]],
        [-1, 1, "Conv", [64, 3, 1]], [[6], 1, "Detect", ["nc"]],
    ],
}


@pytest.mark.slow
def test_compile_aot_eager_both_modes(saved_for_backward_bytes):
    """Compiled (aot_eager) training with the layers, the A2C2f's nested blocks and the head's branches recomputed, an
    Upsample and a Concat folded into the region after them, in both modes: one graph, no graph break, BN updated once
    per forward, weights and BN buffers after 2 optimizer steps equal eager training without recomputation (tolerance
    0), and less saved for backward (full < selective < none: selective keeps the convolutions' and attention's
    outputs). One eager reference serves both modes."""
    import torch._dynamo
    from torch._dynamo.utils import counters
    from ultralytics.nn.tasks import DetectionModel

    batch = detect_batch(2, 64, 3)
    states, saved = {}, {}
    for mode in ("none", "full", "selective"):
        torch._dynamo.reset()
        counters.clear()
        torch.manual_seed(0)
        model = DetectionModel(copy.deepcopy(TINY_A2), verbose=False).train()
        model.args = ultralytics.utils.DEFAULT_CFG
        apply_checkpointing(model, "none" if mode == "none" else "all", mode="full" if mode == "none" else mode)
        forward = model if mode == "none" else torch.compile(model, backend="aot_eager")
        sgd_steps(model, forward, batch)
        bns = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
        assert all(bn.num_batches_tracked.item() == 2 for bn in bns)
        states[mode] = copy.deepcopy(model.state_dict())
        saved[mode] = saved_for_backward_bytes(lambda: forward(batch["img"]))
        if mode != "none":
            blocks = ["2.m.0.0", "2.m.0.1", "2.m.1.0", "2.m.1.1"]
            assert checkpointed_modules(model) == ["0", "1", "2", *blocks, "3", "6", "7.cv2.0", "7.cv3.0"]
            assert [type(m).__name__ for m in model.model[4:6]] == ["FoldedUpsample", "FoldedConcat"]
            assert type(model.model[2].m[0][0]).__name__ == ("SelectiveRecomputedABlock" if mode == "selective" else "RecomputedABlock")
            assert not counters["graph_break"] and counters["stats"]["unique_graphs"] == 1, mode
            assert all(torch.equal(states["none"][k], states[mode][k]) for k in states["none"]), mode
    assert saved["full"] < 0.5 * saved["none"] and saved["full"] < saved["selective"] < 0.9 * saved["none"], saved
