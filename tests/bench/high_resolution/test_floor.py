"""The floor study (benchmarks/high_resolution/floor.py): its groups add up to the training step's peak as the harness
measures it, the held boundaries are the recomputed regions' inputs, and a fold of the parameter-free layers."""

import pytest
import torch
from ultralytics import YOLO
from ultralytics.utils import DEFAULT_CFG

from benchmarks.high_resolution.floor import fold_saving, measure
from yolo_ckpt.memory import training_batch
from yolo_ckpt.memory.step import profile_step

pytestmark = pytest.mark.usefixtures("one_thread")


def test_fold_saving_frees_the_held_outputs_of_regions_not_yet_backpropagated():
    regions = {11: 13, 12: 13, 14: 16, 15: 16, 18: 19, 21: 22}  # yolo11n's (engine.folded_layers)
    sources = {11: [10], 12: [11, 6], 14: [13], 15: [14, 4], 18: [17, 13], 21: [20, 10]}
    outputs = {i: 100 * (i + 1) for i in range(24)}
    # at layer 2's backward every neck region is done: nothing held, nothing saved
    assert fold_saving(2, {0: 1, 1: 1}, regions, sources, outputs) == 0
    # at the head's: 12 and 15 held (1300, 1600 B) free; 10 and 13 (not held) are kept instead, 4 and 6 held anyway
    held = {4: 500, 6: 700, 12: 1300, 15: 1600}
    assert fold_saving(23, held, regions, sources, outputs) == 1300 + 1600 - outputs[10] - outputs[13]
    # region 16's own backward rebuilds 15: only its new input 13 costs (and region 13's 10, not yet backpropagated)
    assert fold_saving(16, held, regions, sources, outputs) == 1300 - outputs[10] - outputs[13]


@pytest.mark.slow
def test_groups_add_up_to_the_harness_peak():
    run = measure("yolo11n.yaml", 256, 1, "all", 256)
    torch.manual_seed(0)
    net = YOLO("yolo11n.yaml").model
    net.args = DEFAULT_CFG
    assert run["peak_bytes"] == profile_step(net, training_batch(net, 1, 256, 20), "all", flops=False).peak_bytes
    assert sum(r["bytes"] for r in run["alive"]) == run["peak_bytes"]
    assert run["recomputations"] >= 17  # the step ran recomputed: every layer with parameters, and the head's branches
    groups = {(r["group"], r["layer"]) for r in run["alive"]}
    assert ("parameters", "") in groups and ("optimizer state", "") in groups and ("input batch", "") in groups
    held = {r["layer"]: r["held_at_peak_MiB"] for r in run["layers"]}
    # the engine folds Upsample and Concat into the region after them: their outputs are not held
    assert run["engine_folds"] and all(held[j] == 0 for j in (11, 12, 14, 15, 18, 21))
