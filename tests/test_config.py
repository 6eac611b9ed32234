"""yolo-ckpt's typed config: defaults from the YAMLs, every key checked once with an error naming it, budget and
headroom forms."""

import dataclasses

import pytest
import yaml

from yolo_ckpt.checkpointing.chunks import DEFAULT_ASSIGN_CHUNK
from yolo_ckpt.config import (
    DEFAULTS_PATH,
    ESTIMATE_DEFAULTS_PATH,
    NO_HEADROOM,
    Budget,
    CkptConfig,
    EstimateOptions,
    Headroom,
)

GiB = 2**30


def test_defaults_are_the_yamls():
    """Every default comes from cfg/default.yaml and cfg/estimate.yaml (read here with PyYAML, not the module's loader)."""
    train, estimate = (yaml.safe_load(p.read_text()) for p in (DEFAULTS_PATH, ESTIMATE_DEFAULTS_PATH))
    config = CkptConfig.from_args({})
    assert set(train) == {f.name for f in dataclasses.fields(CkptConfig)}
    assert (config.recompute, config.recompute_mode, config.memory_budget, config.loss_chunk, config.assign_chunk) == (
        train["recompute"], train["recompute_mode"], train["memory_budget"], train["loss_chunk"], train["assign_chunk"])
    assert train["assign_chunk"] == DEFAULT_ASSIGN_CHUNK  # the YAML key's default and the Python API's agree
    assert config.memory_headroom == Headroom.parse(train["memory_headroom"]) == Headroom(1.15, 500 * 2**20)
    assert config.probe is train["probe"] is True and CkptConfig.from_args({"probe": False}).probe is False
    expected = {"objects": 20, "object_size": None, "format": "text", "plot": False}
    assert dataclasses.asdict(EstimateOptions.from_args({})) == estimate == expected


def test_task_default_given_values_and_other_keys():
    """Detect, obb, pose and segment default to their loss region; a given value wins; Ultralytics' keys are left alone; a
    recompute= value is kept in its canonical string form (what the CLI parser makes of 'none', '6', '0,1,2')."""
    assert CkptConfig.from_args({}, "segment").recompute == "backbone,loss"
    for task in ("detect", "obb", "pose"):  # the loss region of every task with a task-aligned assigner
        assert CkptConfig.from_args({}, task).recompute == "backbone,loss"
    assert CkptConfig.from_args({}, "classify").recompute == "backbone"
    assert CkptConfig.from_args({"recompute": "all", "imgsz": "bogus", "bogus": 1}, "segment").recompute == "all"
    assert [CkptConfig.from_args({"recompute": v}).recompute for v in (None, 6, (0, 1, 2), "auto")] == ["none", "6", "0,1,2", "auto"]
    config = CkptConfig.from_args(
        {"memory_budget": "12GB", "memory_headroom": "1.2x", "loss_chunk": 7, "assign_chunk": 3, "recompute_mode": "selective"}
    )
    assert (config.memory_budget, config.memory_headroom, config.loss_chunk, config.assign_chunk, config.recompute_mode) == (
        Budget(12 * 10**9),
        Headroom(1.2),
        7,
        3,
        "selective",
    )


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("recompute", "4-2", r"recompute='4-2': range '4-2' is empty"),
        ("recompute", True, r"recompute=True is not a valid value; valid choices"),
        ("recompute_mode", "partial", r"recompute_mode='partial' is not valid; valid modes: full, selective"),
        ("memory_budget", "12XB", r"memory_budget='12XB': unknown unit 'XB'"),
        ("memory_headroom", "0.5x", r"memory_headroom='0.5x': the factor 0.5 is below 1"),
        ("loss_chunk", 0, r"loss_chunk=0 is not valid; give a positive int"),
        ("loss_chunk", True, r"loss_chunk=True is not valid"),
        ("assign_chunk", 0, r"assign_chunk=0 is not valid; give a positive int \(objects per chunk"),
        ("assign_chunk", 2.5, r"assign_chunk=2.5 is not valid"),
        ("probe", "sometimes", r"probe='sometimes' is not valid; valid: True, False"),
    ],
)
def test_bad_key_names_it(key, value, message):
    with pytest.raises(ValueError, match=message):
        CkptConfig.from_args({key: value})


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("objects", 0, "objects=0 is not valid; give a positive int"),
        ("objects", "many", "objects='many'"),
        ("format", "xml", "format='xml' is not valid here; valid: text, json"),
        ("plot", 1, "plot=1 is not valid; valid: True, False"),
        ("object_size", 0, r"object_size=0 is not valid; give a number in \(0, 1\]"),
        ("object_size", 1.5, r"object_size=1.5 is not valid"),
        ("object_size", "big", r"object_size='big' is not valid"),
        ("object_size", True, r"object_size=True is not valid"),
    ],
)
def test_bad_estimate_option_names_it(key, value, message):
    with pytest.raises(ValueError, match=message):
        EstimateOptions.from_args({key: value})


def test_object_size_is_a_fraction_of_the_side():
    """object_size= (the largest box side / the image side, for the assigner's candidate pairs): a number in (0, 1]."""
    assert EstimateOptions.from_args({"object_size": 0.3}).object_size == 0.3
    assert EstimateOptions.from_args({"object_size": 1}).object_size == 1.0 and EstimateOptions.from_args({}).object_size is None


@pytest.mark.parametrize(
    "value, expected",
    [("12GB", 12_000_000_000), ("16GiB", 16 * GiB), ("500MiB", 500 * 2**20), ("1.5 GB", 1_500_000_000)],
)
def test_budget_units(value, expected):
    budget = Budget.parse(value)
    assert budget.bytes(None) == budget.bytes(80 * GiB) == expected and not budget.is_fraction and str(budget) == value
    assert budget == Budget(expected) and str(Budget(expected)) == f"{expected}B"  # built directly: no given text


def test_budget_fraction_needs_cuda():
    """A number without a unit is a fraction of the CUDA memory: parsed anywhere, resolved only with a CUDA device."""
    budget = Budget.parse(0.5)
    assert budget.is_fraction and budget == Budget.parse("0.5") and budget.bytes(80 * GiB) == 40 * GiB
    with pytest.raises(ValueError, match=r"memory_budget='0.5': a fraction needs a CUDA device"):
        Budget.parse("0.5").bytes(None)


@pytest.mark.parametrize(
    "value, message",
    [
        ("12", "must be a fraction in"),
        ("12XB", "unknown unit"),
        ("-3GB", "is not valid"),
        ("0GB", "more than 0"),
        (True, "not valid"),
        ("lots", "not valid"),
        (None, "not valid"),
    ],
)
def test_bad_budgets(value, message):
    """Each error names the value and, but for a non-positive size, the valid forms."""
    with pytest.raises(ValueError, match=message) as error:
        Budget.parse(value)
    assert str(error.value).startswith(f"memory_budget={value!r}") and ("16GiB" in str(error.value) or message == "more than 0")


@pytest.mark.parametrize(
    "value, expected",
    [
        ("1.15x+500MiB", Headroom(1.15, 500 * 2**20)),
        ("1.2x", Headroom(1.2)),
        ("800MiB", Headroom(1.0, 800 * 2**20)),
        (1, NO_HEADROOM),
        ("1.1 x + 1GB", Headroom(1.1, 10**9)),
    ],
)
def test_headroom_forms(value, expected):
    assert Headroom.parse(value) == expected


@pytest.mark.parametrize(
    "value, message",
    [("0.5x", "below 1"), ("lots", "not valid"), ("1.1x+5apples", "not bytes with a unit"), (True, "not valid"), (0.5, "not valid")],
)
def test_bad_headroom(value, message):
    with pytest.raises(ValueError, match=message):
        Headroom.parse(value)


def test_headroom_only_on_cuda_against_bytes():
    """The headroom is kept on CUDA against a byte budget; a fraction is a margin already (and so is no budget:
    batch=-1's default fraction); the CPU counts it all."""
    def headroom_on(device, budget):
        return CkptConfig.from_args({"memory_headroom": "1.2x+100MiB", "memory_budget": budget}).headroom_on(device)

    assert headroom_on("cuda", "12GB") == Headroom(1.2, 100 * 2**20)
    assert headroom_on("cuda", 0.7) == headroom_on("cuda", None) == headroom_on("cpu", "12GB") == headroom_on("mps", "12GB") == NO_HEADROOM
    assert Headroom(1.15, 500 * 2**20).need(1000 * 2**20) == 1650 * 2**20
