"""The estimate-accuracy study's cases: the default grid, or the steps named on its command line."""

import pytest

from benchmarks.memory_model.estimate_accuracy import MODELS, STEPS, cases
from yolo_ckpt.errors import ConfigError


def test_cases_default_and_named():
    assert cases(None) == {cfg: list(STEPS) for cfg in MODELS}
    assert cases(("yolo11n.yaml:1:3072:20", "yolo12n.yaml:1:2048:20", "yolo11n.yaml:2:1536:5")) == {
        "yolo11n.yaml": [(1, 3072, 20), (2, 1536, 5)],
        "yolo12n.yaml": [(1, 2048, 20)],
    }
    assert cases("yolo26n-seg.yaml:1:640:400") == {"yolo26n-seg.yaml": [(1, 640, 400)]}


@pytest.mark.parametrize("word", ["yolo11n.yaml:1:3072", "yolo11n.yaml:0:640:20", "yolo11n.yaml:1:640:x", "yolo11n-cls.yaml:1:64:1"])
def test_a_bad_case_is_refused_by_name(word):
    with pytest.raises(ConfigError, match=f"cases='{word}'"):
        cases(word)
