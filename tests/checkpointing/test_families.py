"""Every model family and variant whose YAML Ultralytics ships (``ultralytics/cfg/models``): the sections resolve on
each file, and recompute=all trains one step exactly as stock on the smallest scale of one YAML per family and
variant (gradients, BatchNorm buffers, every recomputed layer counted once)."""

import copy
from pathlib import Path

import pytest
import torch
import ultralytics
from helpers import assert_grads_equal, assert_state_equal, build_model, surrogate_step
from ultralytics.nn.tasks import yaml_model_load
from ultralytics.utils import YAML

from yolo_ckpt import apply_checkpointing, count_recomputations
from yolo_ckpt.checkpointing.model_file import yaml_layout
from yolo_ckpt.checkpointing.policy import resolve

pytestmark = pytest.mark.usefixtures("one_thread")

MODELS = Path(ultralytics.__file__).parent / "cfg" / "models"
# The model tested for each shipped YAML: its smallest scale ("n" inserted as Ultralytics' guess_model_scale reads
# it), or, for files that are one scale of a family (v9, v10, RT-DETR's l/x and ResNet depths), the smallest one.
# None: not built here, with the reason.
TESTED = {
    "v3/yolov3-tiny.yaml": "yolov3-tiny.yaml",
    "v3/yolov3.yaml": "yolov3-spp.yaml",  # the same layers but one (a 1x1 Conv where -spp has SPP): 104M parameters
    "v3/yolov3-spp.yaml": "yolov3-spp.yaml",
    "v5/yolov5.yaml": "yolov5n.yaml",
    "v5/yolov5-p6.yaml": "yolov5n-p6.yaml",
    "v6/yolov6.yaml": "yolov6n.yaml",
    "v8/yolov8.yaml": "yolov8n.yaml",
    "v8/yolov8-p2.yaml": "yolov8n-p2.yaml",
    "v8/yolov8-p6.yaml": "yolov8n-p6.yaml",
    "v8/yolov8-ghost.yaml": "yolov8n-ghost.yaml",
    "v8/yolov8-ghost-p2.yaml": "yolov8n-ghost-p2.yaml",
    "v8/yolov8-ghost-p6.yaml": "yolov8n-ghost-p6.yaml",
    "v8/yolov8-seg.yaml": "yolov8n-seg.yaml",
    "v8/yolov8-seg-p6.yaml": "yolov8n-seg-p6.yaml",
    "v8/yolov8-pose.yaml": "yolov8n-pose.yaml",
    "v8/yolov8-pose-p6.yaml": "yolov8n-pose-p6.yaml",
    "v8/yolov8-obb.yaml": "yolov8n-obb.yaml",
    "v8/yolov8-cls.yaml": "yolov8n-cls.yaml",
    "v8/yolov8-cls-resnet50.yaml": "yolov8n-cls-resnet50.yaml",
    "v8/yolov8-cls-resnet101.yaml": "yolov8n-cls-resnet50.yaml",
    "v8/yolov8-rtdetr.yaml": "yolov8n-rtdetr.yaml",
    "v8/yolov8-world.yaml": "yolov8n-world.yaml",
    "v8/yolov8-worldv2.yaml": "yolov8n-worldv2.yaml",
    "v8/yoloe-v8.yaml": "yoloe-v8n.yaml",
    "v8/yoloe-v8-seg.yaml": "yoloe-v8n-seg.yaml",
    **{f"v9/yolov9{s}.yaml": "yolov9t.yaml" for s in "tsmce"},
    **{f"v9/yolov9{s}-seg.yaml": "yolov9c-seg.yaml" for s in "ce"},
    **{f"v10/yolov10{s}.yaml": "yolov10n.yaml" for s in "nsmblx"},
    "11/yolo11.yaml": "yolo11n.yaml",
    "11/yolo11-seg.yaml": "yolo11n-seg.yaml",
    "11/yolo11-pose.yaml": "yolo11n-pose.yaml",
    "11/yolo11-obb.yaml": "yolo11n-obb.yaml",
    "11/yolo11-cls.yaml": "yolo11n-cls.yaml",
    "11/yolo11-cls-resnet18.yaml": None,  # its TorchVision backbone downloads ResNet-18 weights when built
    "11/yoloe-11.yaml": "yoloe-11n.yaml",
    "11/yoloe-11-seg.yaml": "yoloe-11n-seg.yaml",
    "12/yolo12.yaml": "yolo12n.yaml",
    "12/yolo12-seg.yaml": "yolo12n-seg.yaml",
    "12/yolo12-pose.yaml": "yolo12n-pose.yaml",
    "12/yolo12-obb.yaml": "yolo12n-obb.yaml",
    "12/yolo12-cls.yaml": "yolo12n-cls.yaml",
    "26/yolo26.yaml": "yolo26n.yaml",
    "26/yolo26-p2.yaml": "yolo26n-p2.yaml",
    "26/yolo26-p6.yaml": "yolo26n-p6.yaml",
    "26/yolo26-seg.yaml": "yolo26n-seg.yaml",
    "26/yolo26-sem.yaml": "yolo26n-sem.yaml",
    "26/yolo26-depth.yaml": "yolo26n-depth.yaml",
    "26/yolo26-pose.yaml": "yolo26n-pose.yaml",
    "26/yolo26-obb.yaml": "yolo26n-obb.yaml",
    "26/yolo26-cls.yaml": "yolo26n-cls.yaml",
    "26/yoloe-26.yaml": "yoloe-26n.yaml",
    "26/yoloe-26-seg.yaml": "yoloe-26n-seg.yaml",
    "rt-detr/rtdetr-l.yaml": "rtdetr-l.yaml",
    "rt-detr/rtdetr-x.yaml": "rtdetr-l.yaml",
    "rt-detr/rtdetr-resnet50.yaml": "rtdetr-resnet50.yaml",
    "rt-detr/rtdetr-resnet101.yaml": "rtdetr-resnet50.yaml",
}
BUILT = sorted({name for name in TESTED.values() if name})
# A YAML without scales is built at its width_multiple; narrowed here (the same layers and types, a fraction of the
# channels) where the full width costs the most: yolov3-spp has 63M parameters.
NARROWED = {"yolov3-spp.yaml": 0.25}


def model_yaml(name: str, folder: Path) -> str:
    """``name``, or for a :data:`NARROWED` one a copy in ``folder`` with its width_multiple."""
    if name not in NARROWED:
        return name
    cfg = yaml_model_load(name)
    assert "scales" not in cfg and cfg["width_multiple"] == 1.0  # parse_model reads width_multiple only without scales
    YAML.save(folder / name, {**cfg, "width_multiple": NARROWED[name]})
    return str(folder / name)


def test_every_shipped_yaml_is_covered():
    """A YAML a new Ultralytics release adds fails here until it is given a tested model (or a reason)."""
    shipped = {str(p.relative_to(MODELS)) for p in MODELS.glob("*/*.yaml")}
    assert shipped == set(TESTED)


@pytest.mark.parametrize("path", sorted(TESTED))
def test_sections_resolve_on_every_yaml(path):
    """backbone and all select layers of every shipped YAML, never its head, and all is backbone plus neck; classifiers
    have no neck and say so."""
    layout = yaml_layout(yaml_model_load(MODELS / path))
    backbone, every = (set(resolve(s, layout).indices) for s in ("backbone", "all"))
    assert backbone and backbone <= every and layout.head not in every
    if layout.types[layout.head] == "Classify":
        assert every == backbone
        with pytest.raises(ValueError, match="this model has no neck"):
            resolve("neck", layout)
    else:
        neck = set(resolve("neck", layout).indices)
        assert neck and every == backbone | neck and not backbone & neck


@pytest.mark.slow
@pytest.mark.parametrize("name", BUILT)
def test_recompute_all_equals_stock_on_every_family(name, tmp_path):
    """One forward/backward with recompute=all: loss, gradients and BatchNorm buffers bit-identical to stock, and
    each recomputed layer recomputed exactly once. imgsz 64 (128 for P6 models, twice their largest
    stride): at one cell per image YOLO12's area attention cannot split its rows. :data:`NARROWED` models at
    their narrowed width."""
    stock = build_model(model_yaml(name, tmp_path))
    patched = copy.deepcopy(stock)
    policy = apply_checkpointing(patched, "all")
    assert len(policy.indices) >= 5
    imgsz = max(64, 2 * int(stock.stride.max()))  # classifiers' stride is 1
    img = torch.rand(2, 3, imgsz, imgsz, generator=torch.Generator().manual_seed(1))
    expected = surrogate_step(stock, img)
    with count_recomputations() as counter:
        loss = surrogate_step(patched, img)
    assert dict(counter.per_layer) == dict.fromkeys(policy.indices, 1)
    assert torch.equal(expected, loss)
    assert_grads_equal(stock, patched)
    assert_state_equal(stock, patched)
