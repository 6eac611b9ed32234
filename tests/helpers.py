"""Assertions and steps shared by the test modules (tests/ is on sys.path under pytest's default import mode)."""

import contextlib
import logging

import torch
from torch.utils._pytree import tree_leaves

# a child process's time limit: a guard against a hang, never a speed test (a child importing torch on a loaded 2-core
# machine took over 120 s); one generous value for every subprocess test
SUBPROCESS_TIMEOUT_S = 3600


def assert_state_equal(a: torch.nn.Module, b: torch.nn.Module) -> None:
    """Every tensor of the two modules' state_dicts (weights and BatchNorm buffers) is bit-identical."""
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    different = [k for k in sa if not torch.equal(sa[k], sb[k])]
    assert not different, f"{len(different)} tensors differ, e.g. {different[:5]}"


def build_model(name: str = "yolo11n.yaml") -> torch.nn.Module:
    """The nn model of ``name`` (a model YAML) as Ultralytics' CLI builds it, RTDETR for an 'rtdetr' name, else YOLO
    (which picks the task's model class, World and YOLOE included): seed 0, the default hyperparameters in
    ``model.args``, training mode."""
    import ultralytics
    from ultralytics import RTDETR, YOLO

    torch.manual_seed(0)
    model = (RTDETR if "rtdetr" in name else YOLO)(name).model
    model.args = ultralytics.utils.DEFAULT_CFG
    return model.train()


def surrogate_step(model: torch.nn.Module, img: torch.Tensor) -> torch.Tensor:
    """Forward in training mode and backward of a target-free loss over every floating-point output tensor (reaches
    every head branch of every task); returns the loss."""
    out = model(img)
    loss = sum(t.float().square().mean() for t in tree_leaves(out) if isinstance(t, torch.Tensor) and t.is_floating_point())
    loss.backward()
    return loss.detach()


def sgd_steps(model: torch.nn.Module, forward, batch: dict, steps: int = 2) -> None:
    """``steps`` training steps of ``model`` with the task loss on ``batch``, predictions from ``forward`` (the
    model itself, or a compiled wrapper of it), SGD with momentum."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    for _ in range(steps):
        optimizer.zero_grad()
        loss, _ = model.loss(batch, forward(batch["img"]))
        loss.sum().backward()
        optimizer.step()


def assert_grads_equal(a: torch.nn.Module, b: torch.nn.Module) -> None:
    """The two modules' parameters have bit-identical gradients (None where the other's is None), at least one."""
    ga = {k: p.grad for k, p in a.named_parameters()}
    gb = {k: p.grad for k, p in b.named_parameters()}
    assert ga.keys() == gb.keys()
    assert all((ga[k] is None) == (gb[k] is None) for k in ga), [k for k in ga if (ga[k] is None) != (gb[k] is None)][:5]
    different = [k for k in ga if ga[k] is not None and not torch.equal(ga[k], gb[k])]
    assert not different, f"{len(different)} gradients differ, e.g. {different[:5]}"
    assert any(g is not None for g in ga.values())


def folder_state(folder) -> dict:
    """Every file under ``folder`` -> (the sha256 of its bytes, its mode) (an empty dict for a missing folder)."""
    import hashlib
    from pathlib import Path

    folder = Path(folder)
    return {
        str(p.relative_to(folder)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mode)
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


class Interrupted(Exception):
    """Raised by a test's callback to stop a run as a crash would."""


def stop_after(epoch: int):
    """An ``on_model_save`` callback that stops the run (:class:`Interrupted`) once ``epoch`` (0-based) is saved: its
    ``last.pt`` holds that epoch and resumes."""

    def stop(trainer):
        if trainer.epoch == epoch:
            raise Interrupted(f"stopped after epoch {epoch + 1}")

    return stop


# Trainer-level equality runs: one optimizer step per batch of 2 (batch == nbs), small images, no plots.
TRAIN = dict(epochs=1, batch=2, nbs=2, imgsz=64, workers=0, device="cpu", plots=False, exist_ok=True, seed=0)


def train(model, data, project, name, trainer=None, callbacks=(), **kw):
    """Train ``model`` (a YAML or .pt name, or an Ultralytics ``Model`` such as ``RTDETR(...)``) with ``TRAIN`` and
    ``kw`` (a yolo-ckpt trainer without its set-up estimate unless ``estimate=True``); return ``(trainer, recompute counter)``."""
    from ultralytics import YOLO
    from ultralytics.engine.model import Model

    from yolo_ckpt import count_recomputations
    from yolo_ckpt.train.trainer import CheckpointTrainerMixin

    if trainer is not None and issubclass(trainer, CheckpointTrainerMixin):
        kw.setdefault("estimate", False)  # the set-up estimate: tested on the runs that plan (they reuse their model)
    m = model if isinstance(model, Model) else YOLO(model)
    for event, fn in callbacks:
        m.add_callback(event, fn)
    with count_recomputations() as counter:
        m.train(data=data, trainer=trainer, project=str(project), name=name, **{**TRAIN, **kw})
    return m.trainer, counter


@contextlib.contextmanager
def logged_messages():
    """The messages Ultralytics' ``LOGGER`` (yolo-ckpt logs through it) emits inside the block, as a list."""
    from ultralytics.utils import LOGGER

    messages = []
    handler = logging.Handler()
    handler.emit = lambda record: messages.append(record.getMessage())
    LOGGER.addHandler(handler)
    try:
        yield messages
    finally:
        LOGGER.removeHandler(handler)


# A small detection model (three strided convolutions, a C3k2 and a Detect head at stride 8, 3 classes): for tests of
# what does not depend on the model (caches, files, the command line), where a nano model's fake passes would cost
# seconds each. At stride 8 its loss sees about as many anchors as a nano model's (at stride 4, four times more).
TINY_DETECT = {
    "nc": 3,
    "backbone": [
        [-1, 1, "Conv", [16, 3, 2]], [-1, 1, "Conv", [32, 3, 2]], [-1, 1, "C3k2", [32, False, 0.25]], [-1, 1, "Conv", [64, 3, 2]],
    ],
    "head": [[[3], 1, "Detect", ["nc"]]],
}


# The same network with a Segment head (32 mask coefficients, 32 prototype channels at stride 4): its loss has the
# mask loss and the loss region of a segmentation model.
TINY_SEGMENT = {**TINY_DETECT, "head": [[[3], 1, "Segment", ["nc", 32, 32]]]}


# The detection network with a C2PSA (one Attention module, 1 head) on its last feature map: 64 tokens at imgsz 64,
# for tests of the attention region's chunking (attn_chunk=32 chunks it).
TINY_ATTENTION = {**TINY_DETECT, "backbone": [*TINY_DETECT["backbone"], [-1, 1, "C2PSA", [64]]], "head": [[[4], 1, "Detect", ["nc"]]]}


def tiny_yaml(folder, task: str = "detect") -> str:
    """:data:`TINY_DETECT` (``task="detect"``), :data:`TINY_SEGMENT` (``"segment"``) or :data:`TINY_ATTENTION`
    (``"attention"``, a detect model) written as ``folder/tiny-<task>.yaml``; returns its path (for ``model=``)."""
    from pathlib import Path

    import yaml

    path = Path(folder) / f"tiny-{task}.yaml"
    path.write_text(yaml.safe_dump({"detect": TINY_DETECT, "segment": TINY_SEGMENT, "attention": TINY_ATTENTION}[task]))
    return str(path)


COCO_FLIP = [0, 2, 1, 4, 3, 6, 5, 8, 7, 10, 9, 12, 11, 14, 13, 16, 15]  # the 17 keypoints' left-right pairs


def write_dataset(folder, labels: dict, images: dict | None = None, names=("object",), **extra) -> str:
    """A YOLO dataset in ``folder``: per split (``train``, ``val``), image i is ``images[split][i]`` (an HxWx3 uint8
    array; default a 64 px grey square) with the label rows ``labels[split][i]`` (strings); ``data.yaml`` names the
    classes ``names`` and adds ``extra`` (``kpt_shape=``, ...). Returns data.yaml's path."""
    from pathlib import Path

    import cv2
    import numpy as np
    import yaml

    folder = Path(folder)
    for split, rows in labels.items():
        (folder / "images" / split).mkdir(parents=True)
        (folder / "labels" / split).mkdir(parents=True)
        for i, image_rows in enumerate(rows):
            image = images[split][i] if images else np.full((64, 64, 3), 120, np.uint8)
            cv2.imwrite(str(folder / "images" / split / f"{i}.png"), image)
            (folder / "labels" / split / f"{i}.txt").write_text("".join(f"{r}\n" for r in image_rows))
    data = {"path": str(folder), "train": "images/train", "val": "images/val", "names": dict(enumerate(names)), **extra}
    (folder / "data.yaml").write_text(yaml.safe_dump(data))
    return str(folder / "data.yaml")


def large_box_dataset(folder, task: str, images: int = 4, objects: int = 8) -> str:
    """A ``task`` dataset of ``images`` 64 px training images (and 2 validation images) of noise, each with ``objects``
    boxes of 40-95% of the side anywhere (they overlap: every anchor is a candidate of several objects): detect boxes,
    segment rectangles' polygons, obb rotated rectangles' corners (partly outside the image), pose boxes with 17
    keypoints anywhere in the image, in or out of their box. Returns its data.yaml (:func:`write_dataset`)."""
    import math

    import numpy as np

    g = np.random.default_rng(0)
    pixels, labels = {}, {}
    for split, count in (("train", images), ("val", 2)):
        pixels[split], labels[split] = [], []
        for _ in range(count):
            pixels[split].append(g.integers(0, 255, (64, 64, 3), dtype=np.uint8))
            rows = []
            for _ in range(objects):
                w, h = g.uniform(0.4, 0.95, 2)
                x, y = g.uniform(w / 2, 1 - w / 2), g.uniform(h / 2, 1 - h / 2)
                if task == "segment":
                    rows.append(f"0 {x - w / 2} {y - h / 2} {x + w / 2} {y - h / 2} {x + w / 2} {y + h / 2} {x - w / 2} {y + h / 2}")
                elif task == "obb":
                    a = g.uniform(0, math.pi)
                    c, s = math.cos(a), math.sin(a)
                    signs = ((-1, -1), (1, -1), (1, 1), (-1, 1))
                    corners = [(x + c * dx * w / 2 - s * dy * h / 2, y + s * dx * w / 2 + c * dy * h / 2) for dx, dy in signs]
                    rows.append("0 " + " ".join(f"{min(max(v, 0), 1)}" for p in corners for v in p))
                elif task == "pose":
                    kpts = " ".join(f"{u} {v} 2" for u, v in g.uniform(0.01, 0.99, (17, 2)))
                    rows.append(f"0 {x} {y} {w} {h} {kpts}")
                else:
                    rows.append(f"0 {x} {y} {w} {h}")
            labels[split].append(rows)
    pose = {"kpt_shape": [17, 3], "flip_idx": COCO_FLIP} if task == "pose" else {}
    return write_dataset(folder, labels, pixels, **pose)
