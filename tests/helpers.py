"""Assertions and steps shared by the test modules (tests/ is on sys.path under pytest's default import mode)."""

import torch
from torch.utils._pytree import tree_leaves


def assert_state_equal(a: torch.nn.Module, b: torch.nn.Module) -> None:
    """Every tensor of the two modules' state_dicts (weights and BatchNorm buffers) is bit-identical."""
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    different = [k for k in sa if not torch.equal(sa[k], sb[k])]
    assert not different, f"{len(different)} tensors differ, e.g. {different[:5]}"


def assert_grads_equal(a: torch.nn.Module, b: torch.nn.Module) -> None:
    """The two modules' parameters have bit-identical gradients (None where the other's is None), at least one set."""
    ga, gb = dict(a.named_parameters()), dict(b.named_parameters())
    assert ga.keys() == gb.keys()
    n = 0
    for k in ga:
        if ga[k].grad is None:
            assert gb[k].grad is None, k
            continue
        assert gb[k].grad is not None, k
        assert torch.equal(ga[k].grad, gb[k].grad), k
        n += 1
    assert n > 0


def surrogate_step(model: torch.nn.Module, img: torch.Tensor) -> torch.Tensor:
    """Forward in training mode and backward of a target-free loss over every floating output tensor (any task's
    head); returns the detached loss."""
    out = model(img)
    loss = sum(t.float().square().mean() for t in tree_leaves(out) if isinstance(t, torch.Tensor) and t.is_floating_point())
    loss.backward()
    return loss.detach()


# Trainer-level equality runs: one optimizer step per batch of 2 (batch == nbs), small images, no plots.
TRAIN = dict(epochs=1, batch=2, nbs=2, imgsz=64, workers=0, device="cpu", plots=False, exist_ok=True, seed=0)


def train(model, data, project, name, trainer=None, callbacks=(), **kw):
    """Train ``model`` (a YAML or .pt name, or an Ultralytics ``Model`` such as ``RTDETR(...)``) with ``TRAIN`` and
    ``kw``; return ``(trainer, recompute counter)``."""
    from ultralytics import YOLO
    from ultralytics.engine.model import Model

    from yolo_ckpt import count_recomputations

    m = model if isinstance(model, Model) else YOLO(model)
    for event, fn in callbacks:
        m.add_callback(event, fn)
    with count_recomputations() as counter:
        m.train(data=data, trainer=trainer, project=str(project), name=name, **{**TRAIN, **kw})
    return m.trainer, counter
