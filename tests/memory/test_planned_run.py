"""The one builder of a run's memory model (yolo_ckpt.memory.planning): the trainer, `yolo-ckpt plan` and a bench cell
plan the same run for the same keys; plan and profile default to the device train would use. On the small models of
helpers (what is planned does not depend on the model; their fake passes and loss calibrations cost a fraction of a
nano model's)."""

from types import SimpleNamespace

import pytest
import torch
from helpers import tiny_yaml
from ultralytics import YOLO
from ultralytics.data.utils import check_det_dataset

from yolo_ckpt import trainer_for
from yolo_ckpt.bench.cells import CELL_KEYS
from yolo_ckpt.bench.planning import planned_cell
from yolo_ckpt.cli import main
from yolo_ckpt.cli.run_setup import estimate_setup
from yolo_ckpt.config import NO_HEADROOM
from yolo_ckpt.errors import ConfigError
from yolo_ckpt.memory.memory_model import PlanError
from yolo_ckpt.memory.planning import Decision, PlannedRun, decide

AUGMENT = {"detect": {}, "segment": {"copy_paste": 0.5, "mixup": 0.5}}  # mosaic is on by default


def _bench_run(task, model, keys):
    data = check_det_dataset(keys["data"], autodownload=False)
    yolo = YOLO(model, task=task)
    net = yolo.task_map[task]["model"](yolo.model.yaml, nc=data["nc"], ch=data["channels"], verbose=False)
    # train's amp=True
    cell = {
        **CELL_KEYS,
        "model": model,
        "task": task,
        "imgsz": keys["imgsz"],
        "batch": keys["batch"],
        "recompute": "auto",
        "memory_budget": keys["memory_budget"],
        "amp": keys.get("amp", True),
    }
    settings = {k: v for k, v in keys.items() if k in ("device", "epochs", "memory_headroom", *AUGMENT[task])}
    return planned_cell(cell, net, settings, data)


@pytest.mark.slow
@pytest.mark.parametrize("task", ["detect", "segment"])
def test_trainer_plan_and_bench_plan_the_same_run(task, synthetic, tmp_path):
    """Detection with mosaic, segmentation with copy-paste and mixup: the same spec (device, AMP, optimizer, objects
    with the augmentation's factors, classes), imgsz and estimate from the trainer (recompute=auto), plan and a bench
    cell; the bench once counted 4 x the label lines and AdamW for optimizer=auto."""
    model = tiny_yaml(tmp_path, task)
    keys = {
        "model": model,
        "data": synthetic(task),
        "imgsz": 96,
        "batch": 2,
        "device": "cpu",
        "epochs": 3,
        "memory_budget": "2GB",
        **AUGMENT[task],
    }
    trainer = trainer_for(task)(overrides={**keys, "recompute": "auto", "project": str(tmp_path), "plots": False})
    trainer.setup_model()  # recompute=auto plans here
    runs = {
        "train": trainer.ckpt_state.planned,
        "plan": estimate_setup([task, *(f"{k}={v}" for k, v in keys.items())])[0],
        "bench": _bench_run(task, model, keys),
    }
    specs = {name: run.spec for name, run in runs.items()}
    assert specs["train"] == specs["plan"] == specs["bench"], specs
    factor = 4 * (2 * 2 if task == "segment" else 1)  # mosaic; copy-paste x 2 and mixup x 2 (segment)
    assert specs["plan"].objects == factor * runs["plan"].counts.max_objects and specs["plan"].device == "cpu"
    peaks = {name: run.memory_model().peak((), 2, 96) for name, run in runs.items()}
    assert peaks["train"] == peaks["plan"] == peaks["bench"] > 0
    assert trainer.ckpt_state.plan.estimated_peak_bytes == runs["plan"].memory_model().plan(2 * 10**9, 2, 96).estimated_peak_bytes


@pytest.mark.slow
def test_plan_and_bench_agree_on_a_cuda_budget_in_bytes(synthetic, tmp_path):
    """device=0 plans for a GPU from any machine: AMP on and the headroom a byte budget keeps on CUDA, the same in
    plan and in a bench cell, a memory_headroom= given included (the bench's settings once dropped it)."""
    keys = {"model": tiny_yaml(tmp_path), "data": synthetic(), "imgsz": 64, "batch": 2, "device": 0, "epochs": 3, "memory_budget": "4GB",
            "memory_headroom": "1.2x+100MiB"}
    plan = estimate_setup(["detect", *(f"{k}={v}" for k, v in keys.items())])[0]
    bench = _bench_run("detect", keys["model"], keys)
    assert plan.spec == bench.spec and (plan.spec.device, plan.spec.amp) == ("cuda", True)
    assert str(plan.headroom) == str(bench.headroom) == "1.2x+100MiB"
    assert plan.memory_model().peak((), 2, 64) == bench.memory_model().peak((), 2, 64)


def test_plan_and_profile_default_to_the_device_train_uses(capsys, tmp_path):
    """Without device= the estimate is for the device Ultralytics would select: the CPU (fp32) where torch sees no
    CUDA device; the output says so."""
    keys = [f"model={tiny_yaml(tmp_path)}", "imgsz=64", "batch=1", "objects=3"]
    run, _ = estimate_setup(keys)
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert run.spec.device == expected and run.spec.amp == (expected == "cuda")
    assert main(["plan", *keys]) == 2  # no memory_budget=
    assert main(["profile", *keys]) == 0
    assert f"assumed: device {expected}, AMP {'on' if expected == 'cuda' else 'off'}" in capsys.readouterr().out


def test_a_bug_keeps_its_traceback_and_bad_input_is_one_line(monkeypatch, capsys):
    """The CLI turns the input's errors into one line and exit 2, but an internal error is not bad input: it raises."""
    import yolo_ckpt.memory.planning

    assert main(["profile", "imgsz=64", "optimizer=Adamax2"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "yolo-ckpt: error: optimizer='Adamax2' is not an Ultralytics optimizer; valid: auto, Adam, Adamax, AdamW, NAdam, RAdam, "
        "RMSprop, SGD, MuSGD"
    ]

    def broken(*args, **kwargs):
        raise ValueError("a bug")

    monkeypatch.setattr(yolo_ckpt.memory.planning, "planned_run", broken)
    with pytest.raises(ValueError, match="a bug"):
        main(["profile", "imgsz=64", "batch=1"])


def test_a_trained_pt_is_estimated_as_training_runs_it(tmp_path):
    """A stripped checkpoint stores requires_grad=False; plan and profile estimate its training (they crashed:
    'element 0 of tensors does not require grad')."""
    from ultralytics.utils.torch_utils import strip_optimizer

    yolo = YOLO(tiny_yaml(tmp_path))
    path = tmp_path / "best.pt"
    yolo.save(path)
    strip_optimizer(path)
    run, opts = estimate_setup([f"model={path}", "imgsz=64", "batch=1", "device=cpu"])
    trainable = [p.requires_grad for n, p in run.model.named_parameters() if ".dfl" not in n]
    assert trainable and all(trainable) and opts["imgsz"] == 64
    assert main(["profile", f"model={path}", "imgsz=64", "batch=1", "device=cpu", "format=json"]) == 0


class _Memory:
    """A memory model whose step needs 100 bytes an image at any imgsz, and whose plan for auto is layers 0-4."""

    headroom = NO_HEADROOM

    def units(self, recompute):
        return (str(recompute),)

    def largest_batch(self, units, budget, imgsz, images=None):  # capped as MemoryModel.largest_batch caps
        return min(budget // 100, 1024, images or 1024)

    def largest_imgsz(self, units, budget, batch):
        return 0 if budget < 100 * batch else 640

    def estimate(self, spec, batch, imgsz):
        return SimpleNamespace(peak_bytes=100 * batch)

    def spec(self, units):
        return ",".join(units)

    def plan(self, budget, batch, imgsz, images=None):
        return SimpleNamespace(recompute="0-4", batch=batch, images=images)


def test_decide_is_the_one_rule_of_auto_and_batch_minus_1():
    """recompute=auto and batch=-1 as train, plan and the bench decide them (yolo_ckpt.memory.planning.decide)."""
    memory = _Memory()
    assert decide("auto", -1) == Decision("all", -1)  # no estimate needed: auto with batch=-1 recomputes everything
    assert decide("auto", 4) == Decision("auto", 4) and decide("backbone", -1) == Decision("backbone", -1)  # kept as given
    assert decide("auto", -1, memory, 1000, 640, images=7) == Decision("all", 7)  # then the largest batch, of the images
    assert decide("backbone", -1, memory, 1000, 640) == Decision("backbone", 10)
    auto = decide("auto", 2, memory, 1000, 640, images=7)
    assert auto.recompute == "0-4" and auto.batch == 2 and auto.plan.recompute == "0-4" and auto.plan.images == 7
    assert decide("backbone", 2, memory, 1000, 640) == Decision("backbone", 2)
    with pytest.raises(PlanError, match=r"below batch=1's estimated need of 100 bytes at imgsz=640 with recompute=all; it fits no imgsz"):
        decide("auto", -1, memory, 50, 640)


def test_from_keys_loads_the_model_the_keys_name(tmp_path):
    """A study's keys, no words: the model built from model=, the keys read with their defaults, plan's spec."""
    run = PlannedRun.from_keys({"model": tiny_yaml(tmp_path), "imgsz": 64, "batch": 1, "device": "cpu", "objects": 3})
    assert run.keys["model"] == tiny_yaml(tmp_path) and run.keys["epochs"] == 100 and run.keys["format"] == "text"
    assert (run.imgsz, run.batch, run.spec.device, run.spec.objects, run.counts) == (64, 1, "cpu", 3, None)
    with pytest.raises(ConfigError, match="profile estimates a given batch; plan takes batch=-1"):
        PlannedRun.from_keys({"model": tiny_yaml(tmp_path), "batch": -1})  # plans_batch=False: batch=-1 is plan's


def test_a_chunk_key_without_its_region_warns(tmp_path):
    """Issue 43: attn_chunk= with a policy that runs no attention region (backbone; all on a model without attention
    layers) was taken in silence, as assign_chunk= without the loss region: both warn, one line each, naming the key,
    the policy and what runs the region; plan and profile (from_keys) as train (test_trainer). The defaults say nothing."""
    from helpers import logged_messages

    keys = {"model": tiny_yaml(tmp_path), "imgsz": 64, "batch": 1, "device": "cpu", "objects": 3}
    with logged_messages() as messages:
        PlannedRun.from_keys({**keys, "recompute": "backbone", "attn_chunk": 64, "assign_chunk": 8})
    assert [m.split("yolo-ckpt: ")[1] for m in messages if "no effect" in m] == [
        "assign_chunk=8 has no effect: recompute=backbone runs no loss region (loss, or all, on a detect, obb, pose or "
        "segment model runs it)",
        "attn_chunk=64 has no effect: recompute=backbone runs no attention region (attention, or all, on a model with "
        "attention layers runs it)",
    ]
    with logged_messages() as messages:
        PlannedRun.from_keys({**keys, "recompute": "all", "attn_chunk": 64, "assign_chunk": 8})  # the tiny model: no attention
    assert [m.split("yolo-ckpt: ")[1].split(":")[0] for m in messages if "no effect" in m] == ["attn_chunk=64 has no effect"]
    with logged_messages() as messages:
        PlannedRun.from_keys({**keys, "recompute": "backbone"})
    assert not [m for m in messages if "no effect" in m]
