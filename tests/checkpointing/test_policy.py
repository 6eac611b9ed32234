"""Tests of yolo_ckpt.checkpointing.policy: recompute= specs -> validated layer indices (no training, fast)."""

import functools
import re

import pytest
import torch
from ultralytics.cfg import smart_value
from ultralytics.nn.tasks import (
    ClassificationModel,
    DetectionModel,
    OBBModel,
    PoseModel,
    SegmentationModel,
    yaml_model_load,
)

from yolo_ckpt.checkpointing import policy
from yolo_ckpt.checkpointing.model_file import layout_of, yaml_layout
from yolo_ckpt.checkpointing.policy import ModelLayout, RecomputePolicy, check_spec, resolve, spec_string

pytestmark = pytest.mark.usefixtures("one_thread")

MODELS = {
    "yolo11n.yaml": DetectionModel,
    "yolo11n-seg.yaml": SegmentationModel,
    "yolo11n-obb.yaml": OBBModel,
    "yolo11n-pose.yaml": PoseModel,
    "yolo11n-cls.yaml": ClassificationModel,
    "yolov8n.yaml": DetectionModel,
    "yolo12n.yaml": DetectionModel,
    "yolo26n.yaml": DetectionModel,
}

# yolo11n detect, as built: 11 backbone layers, Upsample/Concat at 11, 12, 14, 15, 18, 21, Detect at 23.
Y11_PARAM_FREE = {11, 12, 14, 15, 18, 21}
Y11_BACKBONE = tuple(range(11))
Y11_NECK = (13, 16, 17, 19, 20, 22)
Y11_ALL = Y11_BACKBONE + Y11_NECK
Y11_C3K2 = (2, 4, 6, 8, 13, 16, 19, 22)


@functools.cache
def built(yaml_name):
    torch.manual_seed(0)
    return MODELS[yaml_name](yaml_name, verbose=False)


@functools.cache
def layout(yaml_name="yolo11n.yaml"):
    return ModelLayout.from_model(built(yaml_name))


def has_params(m):
    return any(True for _ in m.parameters())


# --------------------------------------------------------------------------------------------- layouts


def test_layout_from_model_yolo11n():
    lay = layout()
    assert lay.n_backbone == 11
    assert len(lay.types) == 24
    assert lay.head == 23
    assert lay.types[23] == "Detect"
    assert lay.types[9] == "SPPF" and lay.types[10] == "C2PSA"
    assert lay.param_free == frozenset(Y11_PARAM_FREE)
    assert {lay.types[i] for i in lay.param_free} == {"Upsample", "Concat"}


@pytest.mark.parametrize("yaml_name", list(MODELS))
def test_layout_of_yaml_equals_built_model(yaml_name):
    model = built(yaml_name)
    from_model = ModelLayout.from_model(model)
    from_file = layout_of(yaml_name)
    assert from_file.types == from_model.types
    assert from_file.n_backbone == from_model.n_backbone == len(model.yaml["backbone"])
    assert len(from_model.types) == len(model.model)
    assert from_model.types == tuple(str(m.type).rsplit(".", 1)[-1] for m in model.model)
    # param_free of a built model is exactly the layers without parameters
    assert from_model.param_free == frozenset(i for i, m in enumerate(model.model) if not has_params(m))
    # a YAML alone knows no parameters
    assert from_file.param_free == frozenset()
    # a dict gives the same as the path
    assert layout_of(yaml_model_load(yaml_name)) == from_file


def test_yaml_layout_of_a_dict():
    cfg = {
        "backbone": [[-1, 1, "Conv", [16, 3, 2]], [-1, 1, "nn.Upsample", [None, 2, "nearest"]]],
        "head": [[-1, 1, "ultralytics.nn.modules.C3k2", [16]], [[-1], 1, "Detect", ["nc"]]],
    }
    lay = yaml_layout(cfg)
    assert lay.types == ("Conv", "Upsample", "C3k2", "Detect")
    assert lay.n_backbone == 2
    assert lay.head == 3
    assert resolve("backbone", lay).indices == (0, 1)  # no param info from a YAML
    assert resolve("neck", lay).indices == (2,)
    assert resolve("all", lay).indices == (0, 1, 2)


def test_layout_of_missing_pt():
    with pytest.raises(FileNotFoundError):
        layout_of("definitely_missing_weights_xyz.pt")


# --------------------------------------------------------------------------------------------- valid specs


def test_backbone_is_yaml_backbone_minus_param_free_all_models():
    for name in MODELS:
        lay = layout(name)
        model = built(name)
        expected = tuple(
            i for i in range(len(model.yaml["backbone"])) if i != lay.head and has_params(model.model[i])
        )
        assert resolve("backbone", lay).indices == expected, name
        assert len(expected) > 0


def test_backbone_neck_all_yolo11n():
    lay = layout()
    assert resolve("backbone", lay).indices == Y11_BACKBONE
    assert resolve("neck", lay).indices == Y11_NECK
    assert resolve("all", lay).indices == Y11_ALL
    assert resolve("backbone,neck", lay).indices == Y11_ALL
    p = resolve("all", lay)
    assert p.types == tuple(lay.types[i] for i in Y11_ALL)
    assert not set(p.indices) & Y11_PARAM_FREE
    assert lay.head not in p.indices


@pytest.mark.parametrize("name", ["yolo11n.yaml", "yolov8n.yaml", "yolo12n.yaml", "yolo26n.yaml", "yolo11n-seg.yaml"])
def test_all_is_every_layer_but_head_minus_param_free(name):
    lay, model = layout(name), built(name)
    expected = tuple(i for i in range(len(model.model) - 1) if has_params(model.model[i]))
    assert resolve("all", lay).indices == expected
    neck = tuple(i for i in range(len(model.yaml["backbone"]), len(model.model) - 1) if has_params(model.model[i]))
    assert resolve("neck", lay).indices == neck
    assert len(neck) > 0


def test_indices_and_ranges():
    lay = layout()
    assert resolve("0-4,6", lay).indices == (0, 1, 2, 3, 4, 6)
    assert resolve(" 0-4 , 6 ", lay).indices == (0, 1, 2, 3, 4, 6)
    assert resolve("4-4", lay).indices == (4,)
    assert resolve("0-4,2-6", lay).indices == tuple(range(7))
    assert resolve("22", lay).indices == (22,)
    assert resolve("0-22", lay).indices == Y11_ALL  # param-free dropped from ranges too
    p = resolve("0-4,6", lay)
    assert p.spec == "0-4,6"
    assert p.types == ("Conv", "Conv", "C3k2", "Conv", "C3k2", "C3k2")


def test_module_names():
    lay = layout()
    p = resolve("C3k2,SPPF", lay)
    assert p.indices == tuple(sorted(Y11_C3K2 + (9,)))
    assert set(p.types) == {"C3k2", "SPPF"}
    assert resolve("C2PSA", lay).indices == (10,)
    assert resolve("Conv", lay).indices == (0, 1, 3, 5, 7, 17, 20)
    # names and sections and indices mix
    assert resolve("SPPF,neck", lay).indices == (9,) + Y11_NECK
    assert resolve(["C3k2", 9], lay).indices == tuple(sorted(Y11_C3K2 + (9,)))


@pytest.mark.parametrize(
    "spec, expected",
    [
        ("c3k2,sppf", tuple(sorted(Y11_C3K2 + (9,)))),
        ("C3K2", Y11_C3K2),
        ("BACKBONE", Y11_BACKBONE),
        ("Neck", Y11_NECK),
        ("ALL", Y11_ALL),
        ("c2psa", (10,)),
    ],
)
def test_case_insensitive(spec, expected):
    assert resolve(spec, layout()).indices == expected


@pytest.mark.parametrize("spec", ["none", "None", "NONE", None, False])
def test_none_selects_nothing(spec):
    p = resolve(spec, layout())
    assert p.indices == ()
    assert p.types == ()
    assert p.spec.lower() == "none"  # the spec as given, as a string
    check_spec(spec)  # no error


def test_cli_parser_values():
    assert smart_value("6") == 6 and isinstance(smart_value("6"), int)
    assert smart_value("0,1,2") == (0, 1, 2)
    assert smart_value("none") is None
    lay = layout()
    assert resolve(smart_value("6"), lay).indices == (6,)
    assert resolve(6, lay).spec == "6"
    assert resolve(smart_value("0,1,2"), lay).indices == (0, 1, 2)
    assert resolve((0, 1, 2), lay).spec == "0,1,2"
    assert resolve([0, 1, 2], lay).indices == (0, 1, 2)
    assert resolve(smart_value("none"), lay).indices == ()
    assert resolve(smart_value("backbone"), lay).indices == Y11_BACKBONE
    assert resolve(smart_value("0-4,6"), lay).indices == (0, 1, 2, 3, 4, 6)


def test_spec_string():
    assert spec_string(None) == "none"
    assert spec_string(False) == "none"
    assert spec_string((0, 1, 2)) == "0,1,2"
    assert spec_string(["C3k2", 9]) == "C3k2,9"
    assert spec_string(6) == "6"
    assert spec_string("backbone") == "backbone"


def test_classify_all_is_backbone_and_head_and_neck_errors():
    lay = layout("yolo11n-cls.yaml")
    assert lay.types[lay.head] == "Classify"
    p = resolve("all", lay)
    assert p.indices == resolve("backbone", lay).indices == tuple(range(10))
    assert p.head and not p.loss and not resolve("backbone", lay).head
    with pytest.raises(ValueError, match="no neck") as e:
        resolve("neck", lay)
    assert "Classify" in str(e.value)
    with pytest.raises(ValueError, match="no neck"):
        resolve("backbone,neck", lay)
    for spec in ("Classify", "10", "head"):
        p = resolve(spec, lay)
        assert p.head and p.indices == (), spec


def test_frozen_layers_dropped():
    lay = layout()
    assert resolve("backbone", lay, frozen=range(3)).indices == tuple(range(3, 11))
    assert resolve("all", lay, frozen=[0, 1, 2, 13]).indices == tuple(i for i in Y11_ALL if i not in (0, 1, 2, 13))
    assert resolve("0-4", lay, frozen=(0, 1, 2, 3, 4)).indices == ()
    assert resolve("C3k2", lay, frozen={2, 4}).indices == (6, 8, 13, 16, 19, 22)
    p = resolve("backbone", lay, frozen=range(3))
    assert p.types == tuple(lay.types[i] for i in range(3, 11))


def test_param_free_never_selected():
    lay = layout()
    for spec in ["all", "neck", "0-22", "Upsample", "Concat", "Upsample,Concat,C3k2", "11,12,14"]:
        p = resolve(spec, lay)
        assert not set(p.indices) & Y11_PARAM_FREE, spec
        assert "Upsample" not in p.types and "Concat" not in p.types
    assert resolve("Upsample,Concat", lay).indices == ()


def test_policy_str_and_layers():
    p = resolve("0-1,SPPF", layout())
    assert isinstance(p, RecomputePolicy)
    assert p.layers() == [{"index": 0, "type": "Conv"}, {"index": 1, "type": "Conv"}, {"index": 9, "type": "SPPF"}]
    assert p.regions() == []
    assert str(p).startswith("recompute=0-1,SPPF")
    assert str(p).endswith("-> 3 layers [0:Conv, 1:Conv, 9:SPPF]")
    assert str(resolve("none", layout())).endswith("-> 0 layers [no layers]")
    assert str(resolve("SPPF,head", layout())).endswith("-> 1 layers [9:SPPF] + head")
    seg = resolve("all", layout("yolo11n-seg.yaml"))
    assert seg.regions() == ["head", "loss", "attention"] and str(seg).endswith(" + head + loss + attention")
    assert seg.layers() == resolve("all", layout()).layers()  # layers only: the head and the loss are regions


# --------------------------------------------------------------------------------------------- head and loss


@pytest.mark.parametrize("spec", ["head", "HEAD", "23", 23, "Detect", "detect", "DETECT"])
def test_head_by_token_index_or_name(spec):
    p = resolve(spec, layout())
    assert p.head and not p.loss
    assert p.indices == () and p.types == ()  # indices are layers: the planner's candidates


@pytest.mark.parametrize("name", ["yolo11n-seg.yaml", "yolo11n-obb.yaml", "yolo11n-pose.yaml"])
def test_head_by_name_other_tasks(name):
    lay = layout(name)
    head_type = lay.types[lay.head]
    assert head_type in {"Segment", "OBB", "Pose"}
    for spec in (head_type, lay.head):
        p = resolve(spec, lay)
        assert p.head and p.indices == () and not p.loss  # the loss is its own region, even for Segment


@pytest.mark.parametrize(
    "spec, indices",
    [("20-23", (20, 22)), ("0-23", Y11_ALL), ("all,23", Y11_ALL), ((1, 23), (1,)), ("Conv,Detect", (0, 1, 3, 5, 7, 17, 20))],
)
def test_head_in_ranges_and_lists(spec, indices):
    p = resolve(spec, layout())
    assert p.head and p.indices == indices


@pytest.mark.parametrize("name", list(MODELS))
def test_all_means_layers_head_and_loss_where_there_is_one(name):
    lay = layout(name)
    p = resolve("all", lay)
    assert p.head
    assert p.loss == (lay.types[lay.head] in policy.LOSS_HEADS) == (name != "yolo11n-cls.yaml")
    assert p.indices == resolve("backbone,neck" if len(lay.section("neck")) else "backbone", lay).indices
    assert not resolve("backbone,neck" if len(lay.section("neck")) else "backbone", lay).head


def test_loss_token():
    assert policy.LOSS_HEADS == ("Detect", "v10Detect", "OBB", "OBB26", "Pose", "Pose26", "Segment", "Segment26")
    assert policy.MASK_LOSS_HEADS == ("Segment", "Segment26")
    for name in ("yolo11n.yaml", "yolo11n-obb.yaml", "yolo11n-pose.yaml", "yolo26n.yaml"):  # the chunked assigner
        lay = layout(name)
        assert resolve("loss", lay).loss and lay.has_loss_region and not lay.has_mask_loss
    seg = layout("yolo11n-seg.yaml")
    p = resolve("loss", seg)
    assert p.loss and not p.head and p.indices == ()
    assert resolve("backbone,loss", seg).indices == Y11_BACKBONE
    seg26 = yaml_layout(yaml_model_load("yolo26n-seg.yaml"))
    assert seg26.types[seg26.head] == "Segment26" and resolve("loss", seg26).loss and resolve("all", seg26).loss


@pytest.mark.parametrize("name", ["yolo11n-cls.yaml", "yolo26n-sem.yaml", "yolo26n-depth.yaml"])
def test_loss_without_loss_region_names_the_heads_that_have_one(name):
    lay = yaml_layout(yaml_model_load(name))
    with pytest.raises(ValueError, match=f"the final head {lay.types[lay.head]} has no loss region") as e:
        resolve("loss", lay)
    assert "detect, obb, pose and segment models" in str(e.value) and "Detect, v10Detect" in str(e.value)
    with pytest.raises(ValueError, match="no loss region"):
        resolve("backbone,loss", lay)


def test_frozen_head_drops_head():
    lay = layout()
    assert not resolve("all", lay, frozen=range(24)).head
    assert resolve("all", lay, frozen=range(23)).head


# --------------------------------------------------------------------------------------------- invalid specs


def test_unknown_name_suggests_close_match():
    with pytest.raises(ValueError) as e:
        resolve("C3k3", layout())
    msg = str(e.value)
    assert "unknown layer name or section 'C3k3'" in msg
    assert re.search(r"(?i)did you mean[^;]*'C3k2'", msg)
    # the message lists the model's sections and valid choices
    assert "backbone (layers 0-10)" in msg
    assert "neck (layers 11-22)" in msg
    assert "layer 23, Detect: 'head' recomputes its branches" in msg
    assert "with a loss region ('loss')" in msg
    assert "'C3k2'" in msg and "'SPPF'" in msg


@pytest.mark.parametrize(
    "spec, suggestion",
    [("bakbone", "backbone"), ("Nek", "neck"), ("SPPFF", "SPPF"), ("haed", "head"), ("los", "loss"), ("Detec", "Detect")],
)
def test_unknown_name_suggestions(spec, suggestion):
    with pytest.raises(ValueError, match=f"(?i)did you mean [^;]*'{suggestion}'"):
        resolve(spec, layout())


@pytest.mark.parametrize("spec, suggestion", [("sppff", "SPPF"), ("BAKBONE", "backbone"), ("c2psaa", "C2PSA")])
def test_unknown_name_suggestion_case_insensitive(spec, suggestion):
    with pytest.raises(ValueError, match=f"(?i)did you mean [^;]*'{suggestion}'"):
        resolve(spec, layout())


def test_unknown_name_without_close_match():
    with pytest.raises(ValueError, match="unknown layer name or section 'zzzz'") as e:
        resolve("zzzz", layout())
    assert "did you mean" not in str(e.value).lower()
    with pytest.raises(ValueError, match="unknown layer name or section '-1'"):
        resolve("-1", layout())


@pytest.mark.parametrize("spec, bad", [("24", 24), ("100", 100), ("20-30", 30), ((0, 99), 99)])
def test_index_out_of_range(spec, bad):
    with pytest.raises(ValueError, match=f"layer index {bad} is out of range") as e:
        resolve(spec, layout())
    assert "within 0-23" in str(e.value)


@pytest.mark.parametrize("spec", ["none,backbone", "backbone,none", "None,3", "none,none"])
def test_none_combined(spec):
    with pytest.raises(ValueError, match="combines 'none' with other layers"):
        resolve(spec, layout())
    with pytest.raises(ValueError, match="combines 'none'"):
        check_spec(spec)


def test_reversed_range():
    with pytest.raises(ValueError, match=r"range '4-2' is empty \(start > end\)[^;]*'2-4'"):
        resolve("4-2", layout())
    with pytest.raises(ValueError, match="range '4-2'"):
        check_spec("0,4-2")


@pytest.mark.parametrize("spec", [True, 1.5, 6.0, {"a": 1}, object()])
def test_invalid_types(spec):
    with pytest.raises(ValueError, match="is not a valid value"):
        resolve(spec, layout())
    with pytest.raises(ValueError, match="is not a valid value"):
        check_spec(spec)


@pytest.mark.parametrize("spec", ["", " ", ",", (), []])
def test_empty(spec):
    with pytest.raises(ValueError, match="is empty"):
        resolve(spec, layout())


def test_check_spec_accepts_valid_forms_without_model():
    for spec in ["backbone", "neck", "all", "head", "loss", "0-4,6", "C3k2,SPPF", "none", None, False, 6, (0, 1, 2), "Whatever"]:
        check_spec(spec)  # form only: names are checked against a model by resolve


def test_every_section_and_region_offered_resolves():
    """Each token of SECTIONS and REGIONS is offered by the error message's choices and resolves on yolo11n-seg to
    what its name says; regions() lists the regions in REGIONS' order."""
    offered = re.findall(r"[a-z]+", policy.CHOICES.split("layer indices")[0])
    assert set(policy.SECTIONS + policy.REGIONS) <= set(offered)
    got = {token: resolve(token, layout("yolo11n-seg.yaml")) for token in policy.SECTIONS + policy.REGIONS}
    assert got["backbone"].indices == Y11_BACKBONE and got["neck"].indices == Y11_NECK and got["all"].indices == Y11_ALL
    assert got["all"].regions() == ["head", "loss", "attention"] and not got["backbone"].regions() and not got["neck"].regions()
    assert got["head"].regions() == ["head"] and got["loss"].regions() == ["loss"] and got["attention"].regions() == ["attention"]
    assert got["head"].indices == got["loss"].indices == got["attention"].indices == ()
