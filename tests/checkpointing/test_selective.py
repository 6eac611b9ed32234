"""recompute_mode=selective and mixed precision: same results as without recomputation (selective under torch.compile: test_head.py)."""


import pytest
import torch
from helpers import TRAIN, assert_state_equal, build_model
from ultralytics import YOLO

from yolo_ckpt import apply_checkpointing, count_recomputations, trainer_for
from yolo_ckpt.checkpointing.engine import SELECTIVE_SAVE_OP_NAMES, SELECTIVE_SAVE_OPS, _save_ops, checkpointed_modules
from yolo_ckpt.memory.synthetic_batch import detect_batch
from yolo_ckpt.memory.tracker import LiveTensorTracker

pytestmark = pytest.mark.usefixtures("one_thread")  # two threads spin on the shared 2-core machine

@pytest.mark.slow
@pytest.mark.parametrize("model, task", [("yolo11n.yaml", "detect"), ("yolo11n-seg.yaml", "segment")])
def test_selective_training_equals_stock(model, task, synthetic, tmp_path, shared_run):
    """Weights, BN buffers and EMA after >= 3 optimizer steps equal stock training (test_trainer.py's stock run of
    the model, shared), recomputation counted."""
    stock, _ = shared_run(model, task)
    ckpt = YOLO(model)
    with count_recomputations() as counter:
        ckpt.train(
            data=synthetic(task),
            trainer=trainer_for(task),
            recompute="all",
            recompute_mode="selective",
            estimate=False,  # the set-up estimate of selective mode: test_memory_model.py
            project=str(tmp_path),
            name="selective",
            **TRAIN,
        )
    steps = ckpt.trainer.ema.updates
    assert steps >= 3 and ckpt.trainer.policy.mode == "selective" and ckpt.trainer.policy.head
    assert type(ckpt.trainer.model.model[2]).__name__ == "SelectiveRecomputedC3k2"
    assert type(ckpt.trainer.model.model[-1].cv2[0]).__name__ == "SelectiveRecomputedSequential"  # head branches
    assert dict(counter.per_layer) == {i: steps + 1 for i in ckpt.trainer.policy.indices}  # +1: the report's probe
    assert dict(counter.per_module) == {n: steps + 1 for n in checkpointed_modules(ckpt.trainer.model)}
    bn = ckpt.trainer.model.model[0].bn
    assert bn.num_batches_tracked.item() == steps
    assert_state_equal(stock.model, ckpt.trainer.model)
    assert_state_equal(stock.ema.ema, ckpt.trainer.ema.ema)


def test_selective_keeps_expensive_outputs_and_saves_less():
    """Selective saves less than none and more than full (it keeps the convolution outputs)."""
    batch = detect_batch(2, 256, 5)
    peaks = {}
    for mode in ("none", "full", "selective"):
        model = build_model()
        if mode != "none":
            apply_checkpointing(model, "all", mode=mode)
        with LiveTensorTracker() as tracker:
            tracker.track(list(model.parameters()), batch)
            loss, _ = model.loss(batch)
            loss.sum().backward()
        peaks[mode] = tracker.peak_bytes
    assert peaks["full"] < peaks["selective"] < 0.85 * peaks["none"]
    assert torch.ops.aten.convolution.default in SELECTIVE_SAVE_OPS
    assert torch.ops.aten.native_batch_norm.default not in SELECTIVE_SAVE_OPS


def test_save_list_built_from_the_ops_this_torch_has(monkeypatch):
    """A torch build without one private attention op, or without its default overload, still imports: the save
    list leaves that op out and keeps the others (this build has all of them)."""
    aten = torch.ops.aten
    assert SELECTIVE_SAVE_OPS == {getattr(aten, name).default for name in SELECTIVE_SAVE_OP_NAMES}

    class NoDefault:  # an op packet whose .default overload this build lacks
        def __getattr__(self, name):
            raise AttributeError(name)

    class Build:  # torch.ops.aten of an older build: no cuDNN attention, mm without .default
        def __getattr__(self, name):
            if name == "_scaled_dot_product_cudnn_attention":
                raise AttributeError(name)
            return NoDefault() if name == "mm" else getattr(aten, name)

    monkeypatch.setattr(torch.ops, "aten", Build())
    assert _save_ops() == SELECTIVE_SAVE_OPS - {aten._scaled_dot_product_cudnn_attention.default, aten.mm.default}


@pytest.mark.parametrize("mode", ["full", "selective"])
def test_bf16_autocast_gradients_equal(mode):
    """Recomputation runs under the forward's autocast state: bf16 gradients equal those without it (6)."""
    batch = detect_batch(2, 64, 5)
    ref, ckpt = build_model(), build_model()
    apply_checkpointing(ckpt, "all", mode=mode)
    with count_recomputations() as counter:
        for model in (ref, ckpt):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss, _ = model.loss(batch)
            loss.sum().backward()
    assert counter.total == 17 + 6  # layers and Detect's branches
    grads = [(a.grad, b.grad) for a, b in zip(ref.parameters(), ckpt.parameters()) if a.grad is not None]
    assert grads and all(torch.equal(a, b) for a, b in grads)
    assert_state_equal(ref, ckpt)


def test_bad_mode_fails_before_run_dir(synthetic, tmp_path):
    with pytest.raises(ValueError, match="recompute_mode='partial' is not valid; valid modes: full, selective"):
        YOLO("yolo11n.yaml").train(
            data=synthetic(), trainer=trainer_for("detect"), recompute_mode="partial", project=str(tmp_path)
        )
    assert list(tmp_path.iterdir()) == []
