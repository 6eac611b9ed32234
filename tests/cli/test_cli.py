"""The ``yolo-ckpt`` command: parsing as ``yolo`` does, clear errors, and end-to-end runs on real and built-in data."""

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import tomllib
import yaml
from helpers import SUBPROCESS_TIMEOUT_S

from yolo_ckpt.cli import main
from yolo_ckpt.cli.args import parse_train_args
from yolo_ckpt.cli.plan import plan_setup
from yolo_ckpt.report.record import REPORT_NAME

ROOT = Path(__file__).resolve().parents[2]


def test_parse_like_yolo(tmp_path):
    cfg = tmp_path / "policy.yaml"
    cfg.write_text("recompute: 0-4,SPPF\nimgsz: 1536\n")
    assert parse_train_args(["imgsz=1536", "recompute=none", "segment", "plots", "batch", "=", "4"]) == {
        "imgsz": 1536,
        "recompute": None,  # Ultralytics' smart_value("none")
        "task": "segment",
        "plots": True,
        "batch": 4,
    }
    assert parse_train_args(["recompute=6"])["recompute"] == 6
    assert parse_train_args(["recompute=0,1,2"])["recompute"] == (0, 1, 2)
    assert parse_train_args([f"cfg={cfg}", "imgsz=640"]) == {"recompute": "0-4,SPPF", "imgsz": 640}


def test_unknown_key_suggests(tmp_path, capfd):
    assert main(["train", "recompte=all", "epoch=2", f"project={tmp_path}"]) == 2
    out, err = capfd.readouterr()  # file descriptors: Ultralytics' logger holds its own stream
    assert out == "" and err.count("\n") == 1, (out, err)  # one line, without the yolo CLI's help
    assert "'recompte' is not a valid YOLO argument" in err and "recompute" in err and "'epoch'" in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
@pytest.mark.parametrize(
    "arg, message",
    [
        ("recompute=C3k3", "did you mean 'C3k2'?"),
        ("recompute=30", "layer index 30 is out of range"),
        ("assign_chunk=0", "assign_chunk=0 is not valid"),
        ("recompute=²", "recompute='²': unknown layer name"),
        ("recompute_mode=partial", "valid modes: full, selective"),
        ("memory_budget=12XB", "unknown unit 'XB'"),
        ("memory_headroom=0.5x", "the factor 0.5 is below 1"),
        ("loss_chunk=0", "loss_chunk=0 is not valid"),
        ("task=segmentation", "valid tasks: classify, detect"),
        ("imgsz=", "missing 'imgsz' value"),
    ],
)
def test_bad_values_exit_2_before_run_dir(arg, message, tmp_path, capsys):
    assert main(["train", arg, f"project={tmp_path}", "name=bad"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("yolo-ckpt: error:") and message in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "args, message",
    [
        (["trian"], "unknown command 'trian' (did you mean 'train'?)"),
        (["train", "segmnet"], "'segmnet' is neither a task nor a key (did you mean 'segment' or 'semantic'?)"),
        (["train", "task=detct"], "task='detct' is not an Ultralytics task (did you mean 'detect' or 'depth'?)"),
        (["train", "xyzzy"], "'xyzzy' is not a valid YOLO argument"),  # nothing close: Ultralytics' key check, no hint
    ],
)
def test_did_you_mean_task_and_command(args, message, tmp_path, capfd):
    """A misspelt command or task is one line, exit 2, with the close valid ones (as Ultralytics suggests keys)."""
    assert main([*args, f"project={tmp_path}"]) == 2
    err = capfd.readouterr().err.strip().splitlines()
    assert message in err[-1] and ("did you mean" in err[-1]) == ("did you mean" in message), err
    assert list(tmp_path.iterdir()) == []


def test_resume_of_a_finished_run_exits_2(tmp_path, capfd):
    """resume of a finished run (its last.pt stripped by Ultralytics' strip_optimizer, as a run's end leaves it):
    one line naming the run and the command that starts a new run from its best.pt, exit 2, nothing written (stock
    starts a new run with data=coco8.yaml, which downloads); the same checkpoint before stripping resumes."""
    import torch
    from ultralytics.nn.tasks import DetectionModel
    from ultralytics.utils import DEFAULT_CFG_DICT
    from ultralytics.utils.torch_utils import strip_optimizer

    from yolo_ckpt.train.resume import check_resumable, is_finished

    weights = tmp_path / "run" / "weights"
    weights.mkdir(parents=True)
    last = weights / "last.pt"
    train_args = {**DEFAULT_CFG_DICT, "model": "yolo11n.yaml", "data": "my/data.yaml", "epochs": 3}
    ckpt = {
        "model": DetectionModel("yolo11n.yaml", nc=3, verbose=False),
        "ema": None,
        "epoch": 0,
        "optimizer": {"state": {}},
        "train_args": train_args,
    }
    torch.save(ckpt, last)
    check_resumable(last)  # an interrupted run's: epoch 0 of 3, with its optimizer
    assert not is_finished(ckpt) and is_finished({**ckpt, "epoch": 2})  # the last epoch saved: finished too
    shutil.copyfile(last, weights / "best.pt")
    strip_optimizer(last)
    capfd.readouterr()
    for args in (["resume", f"model={last}"], [f"resume={last}"]):
        (weights / ".last.pt.abcd1234.tmp").write_bytes(b"a killed save's")
        assert main(["train", *args, f"project={tmp_path / 'runs'}"]) == 2
        assert sorted(p.name for p in weights.iterdir()) == ["best.pt", "last.pt"]  # the refusal tidied the run
        err = capfd.readouterr().err.strip().splitlines()
        assert err == [
            f"yolo-ckpt: error: resume: the run {tmp_path / 'run'} is finished ({last} has no optimizer state to resume); "
            f"start a new run from its weights: yolo-ckpt train model={weights / 'best.pt'} data=my/data.yaml"
        ], err
    assert main(["train", "resume", f"project={tmp_path / 'runs'}"]) == 2  # no checkpoint named: not a new run either
    assert "resume needs the run's checkpoint" in capfd.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_resume_refusals_are_stock_assertion_errors_after_ultralytics_own_checks(tmp_path, capfd):
    """A finished run's resume raises FinishedRunError, a ConfigError that code written for stock catches as the
    AssertionError stock raises (Ultralytics' test_task); a checkpoint whose saved arguments Ultralytics rejects
    (epochs=0) gets Ultralytics' own error first (a ValueError: "'epochs=0' is an invalid value"), not "finished",
    from Python and on the command line (one line, exit 2)."""
    import torch
    from ultralytics import YOLO
    from ultralytics.nn.tasks import DetectionModel
    from ultralytics.utils import DEFAULT_CFG_DICT

    from yolo_ckpt import CheckpointDetectionTrainer
    from yolo_ckpt.errors import ConfigError, FinishedRunError

    last = tmp_path / "run" / "weights" / "last.pt"
    last.parent.mkdir(parents=True)
    model = DetectionModel("yolo11n.yaml", nc=3, verbose=False)
    for epochs, epoch, optimizer in ((3, -1, None), (0, 0, {"state": {}})):
        train_args = {**DEFAULT_CFG_DICT, "model": "yolo11n.yaml", "data": "my/data.yaml", "epochs": epochs}
        torch.save({"model": model, "ema": None, "epoch": epoch, "optimizer": optimizer, "train_args": train_args}, last)
        with pytest.raises(ValueError) as raised:  # resume=True of a stripped last.pt: stock's Model.train starts a new run
            YOLO(last).train(resume=str(last), trainer=CheckpointDetectionTrainer)
        if epochs:  # stripped: finished
            assert isinstance(raised.value, AssertionError) and isinstance(raised.value, FinishedRunError)
            assert isinstance(raised.value, ConfigError) and "is finished" in str(raised.value)
        else:
            assert not isinstance(raised.value, AssertionError)
            assert str(raised.value) == "'epochs=0' is an invalid value. 'epochs' must be >= 1."
            capfd.readouterr()
            assert main(["train", "resume", f"model={last}"]) == 2
            assert capfd.readouterr().err.strip().splitlines() == [f"yolo-ckpt: error: {raised.value}"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_profile_on_a_runs_pt_removes_its_stale_temporaries(tmp_path, capsys):
    """profile (plan reads the model the same way) on a run's .pt removes the temporary files killed saves left
    beside it, as resume and a trainer's start do; other files stay."""
    import torch
    from helpers import tiny_yaml
    from ultralytics import YOLO

    weights = tmp_path / "run" / "weights"
    weights.mkdir(parents=True)
    torch.save({"model": YOLO(tiny_yaml(tmp_path)).model, "train_args": {}, "epoch": -1, "optimizer": None}, weights / "best.pt")
    for name in (".last.pt.abcd1234.tmp", ".best.pt.efgh5678.tmp", "notes.txt"):
        (weights / name).write_bytes(b"x")
    assert main(["profile", f"model={weights / 'best.pt'}", "imgsz=32", "batch=1", "device=cpu", "format=json"]) == 0
    assert sorted(p.name for p in weights.iterdir()) == ["best.pt", "notes.txt"]


def test_help_lists_commands_and_keys(capsys):
    assert main(["help"]) == 0
    out = capsys.readouterr().out
    assert "train" in out and "yolo11n.yaml" in out
    # the per-task default (issue 43: "recompute: backbone" read as detect's, which is backbone,loss)
    assert "\n  recompute: backbone,loss for detect, obb, pose, segment models with a loss region; backbone otherwise # " in out
    assert "\n  recompute_mode: full # " in out and "\n  memory_budget: # " in out  # the other keys as the file writes them
    assert "  objects: 20 #" in out and "  format: text #" in out and "  plot: false #" in out  # cfg/estimate.yaml's
    assert main(["bogus"]) == 2


@pytest.mark.parametrize(
    "args, message",
    [
        (["plan", "memory_budget=1GB", "format=xml"], "format='xml' is not valid here; valid: text, json"),
        (["profile", "objects=0"], "objects=0 is not valid; give a positive int"),
        (["profile", "recompute_mode=partial"], "valid modes: full, selective"),
        (["plan", "memory_budget=12"], "memory_budget=12: a number without a unit must be a fraction in (0, 1]"),
        (["plan", "memory_budget=1GB", "plot=True"], "'plot' is not a valid YOLO argument"),  # profile's only
        (["plan", "memory_budget=1GB", "mosaic=abc"], "'mosaic=abc' is of invalid type str"),  # Ultralytics' TypeError
        (["train", "epochs=abc"], "'epochs=abc' is of invalid type str"),
    ],
)
def test_profile_and_plan_bad_keys_exit_2(args, message, capsys):
    """profile's and plan's keys are checked before the model is built: exit 2, the error on the last line (an
    unknown key's comes after Ultralytics' own help on its keys)."""
    assert main(args) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("yolo-ckpt: error:") and message in last


@pytest.mark.parametrize("command", ["train", "profile", "plan"])
def test_bad_attn_chunk_one_message(command, tmp_path, capfd):
    """Issue 43: attn_chunk= below 32, 0 and abc get one message naming the value and the valid ones (16 said '>= 32',
    0 and abc 'a positive int'), on train, profile and plan alike: one line, exit 2, no run folder."""
    for bad, shown in (("16", "16"), ("0", "0"), ("abc", "'abc'")):
        assert main([command, f"attn_chunk={bad}", "memory_budget=1GB", f"project={tmp_path}"]) == 2
        out, err = capfd.readouterr()
        assert out == "" and err.splitlines() == [
            f"yolo-ckpt: error: attn_chunk={shown} is not valid; give an int >= 32 (queries per chunk, default 256; "
            "smaller chunks would not give stock's bits)"
        ]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", ["train", "profile", "plan"])
def test_a_misspelt_model_yaml_is_named(command, tmp_path, capfd):
    """Issue 31, item 11: Ultralytics names the scale-less YAML it tried last ('yolo11n.yaml' does not exist, a valid
    name); yolo-ckpt names the typo and the YAMLs close to it."""
    assert main([command, "model=yolo11nn.yaml", "memory_budget=1GB", f"project={tmp_path}"]) == 2
    out, err = capfd.readouterr()
    assert out == "" and err.splitlines() == [
        "yolo-ckpt: error: model=yolo11nn.yaml does not exist, as a file or as an Ultralytics model YAML "
        "(did you mean 'yolo11n.yaml' or 'yolo11.yaml' or 'yoloe-11n.yaml'?)"
    ]


def _corrupt_images(folder) -> str:
    """A detection data.yaml whose 2 training images are random bytes (each with a valid label)."""
    for split in ("images", "labels"):
        (folder / split / "train").mkdir(parents=True)
    for i in range(2):
        (folder / "images" / "train" / f"{i}.jpg").write_bytes(bytes(range(256)) * 2)
        (folder / "labels" / "train" / f"{i}.txt").write_text("0 0.5 0.5 0.2 0.2\n")
    data = folder / "data.yaml"
    data.write_text(yaml.safe_dump({"path": str(folder), "train": "images/train", "val": "images/train", "names": {0: "a"}}))
    return str(data)


@pytest.mark.parametrize(
    ("case", "command", "message"),
    [
        ("string_arg", "train", "model={} layer 0 (Conv ['abc', 3, 2]) cannot be built: '<' not supported between instances"),
        ("string_arg", "profile", "model={} layer 0 (Conv ['abc', 3, 2]) cannot be built: '<' not supported between instances"),
        ("module", "train", "model YAML '{}' layer 1: module 'EvilModule' is not an Ultralytics module, nn.NAME or torchvision.ops.NAME"),
        ("module", "plan", "model YAML '{}' layer 1: module 'EvilModule' is not an Ultralytics module, nn.NAME or torchvision.ops.NAME"),
        ("corrupt_images", "plan", "data={}: all 2 training images are corrupt"),
        ("corrupt_images", "profile", "data={}: all 2 training images are corrupt"),
    ],
)
def test_model_and_data_faults_are_one_line(case, command, message, tmp_path, capfd):
    """Issue 31, item 9: a model YAML's string layer argument (Ultralytics' TypeError in parse_model), an unknown
    module (its bare KeyError: 'EvilModule'), plan and profile on a set whose images are all corrupt (train refused it
    in one line; they raised Ultralytics' RuntimeError): one line naming the file, exit 2, no run folder."""
    import copy

    from helpers import TINY_DETECT

    model, data, named = copy.deepcopy(TINY_DETECT), [], tmp_path / "bad.yaml"
    if case == "string_arg":
        model["backbone"][0][3] = ["abc", 3, 2]
    elif case == "module":
        model["backbone"][1][2] = "EvilModule"
    else:
        data, named = [f"data={_corrupt_images(tmp_path)}"], tmp_path / "data.yaml"
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(model))
    keys = [f"model={tmp_path / 'bad.yaml'}", *data, "imgsz=64", "batch=1", "memory_budget=1GB", f"project={tmp_path / 'runs'}"]
    assert main([command, *keys]) == 2
    out, err = capfd.readouterr()
    ours = [line for line in err.splitlines() if line.startswith("yolo-ckpt")]
    assert out == "" and "Traceback" not in err and len(ours) == 1, err
    assert ours[0].startswith(f"yolo-ckpt: error: {message.format(named)}"), ours[0]
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["profile", "imgsz=576", "batch=-1"], "batch=-1 is not valid here; give an int >= 1 (profile estimates a given batch; plan"),
        (["plan", "imgsz=576", "batch=0.7", "memory_budget=600MB"], "batch=0.7 is not valid here; give an int >= 1, or batch=-1 for the"),
        (["plan", "imgsz=576", "batch=-1"], "plan needs memory_budget="),
        (["plan", "memory_budget=12GBB"], "memory_budget='12GBB': unknown unit 'GBB'"),
        (["train", "memory_budget=12GBB"], "memory_budget='12GBB': unknown unit 'GBB'"),
        (["train", "classify"], "task=classify reads a folder of class folders"),
        (["profile", "classify"], "task=classify reads a folder of class folders"),
    ],
)
def test_checks_that_need_no_model_come_first(args, message, synthetic, tmp_path, monkeypatch, capfd):
    """Issue 31, item 2: a refusal that needs no model, labels or calibration comes before any of them (they took
    minutes on a real set: 568 s for plan batch=-1, 827 s for train classify on a detection set): building the model,
    scanning the labels and planning the run fail the test if they start."""
    import ultralytics

    import yolo_ckpt.memory.planning
    import yolo_ckpt.train.data_check

    def expensive(*a, **k):
        pytest.fail("an expensive step ran before the refusal")  # a BaseException: no 'except Exception' turns it into a refusal

    for owner, name in [(ultralytics.YOLO, "__init__"), (ultralytics.RTDETR, "__init__"), (yolo_ckpt.train.data_check, "scan_labels"),
                        (yolo_ckpt.memory.planning, "planned_run")]:
        monkeypatch.setattr(owner, name, expensive)
    assert main([*args, f"data={synthetic()}", f"project={tmp_path}"]) == 2
    err = [line for line in capfd.readouterr().err.splitlines() if line.startswith("yolo-ckpt")]
    assert len(err) == 1 and err[0].startswith("yolo-ckpt: error:") and message in err[0], err
    assert not any(tmp_path.iterdir())


def _cli(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    """``python -m yolo_ckpt.cli ARGS`` in a child process, offline, on a fresh Ultralytics config folder: a machine's
    first use, where importing Ultralytics writes its settings file and logs a banner."""
    env = {**os.environ, "YOLO_OFFLINE": "1", "YOLO_CONFIG_DIR": str(tmp_path / "first-use-config")}
    return subprocess.run([sys.executable, "-m", "yolo_ckpt.cli", *args], capture_output=True, text=True, cwd=ROOT, env=env,
                          timeout=SUBPROCESS_TIMEOUT_S)


PLAN_ROW_KEYS = ["recompute", "train", "estimated_peak_MiB", "headroom_MiB", "margin_MiB", "fits", "max_imgsz", "max_batch",
                 "recompute_GFLOPs", "recompute_pct_of_step"]


@pytest.mark.slow  # ~10 CPU s: plan's searches of 7 policies
def test_plan_json_row_keys_are_names(tmp_path, capsys):
    """Issue 43: plan format=json's rows named keys by values (max_imgsz_at_batch_2, max_batch_at_imgsz_64): the keys
    are the same names at any size, the sizes in the values (the result's batch and imgsz). The small model of helpers
    in 8 MB: a few fake passes."""
    from helpers import tiny_yaml

    keys = ["plan", f"model={tiny_yaml(tmp_path)}", "imgsz=64", "batch=2", "memory_budget=8MB", "device=cpu"]
    assert main([*keys, "format=json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert (result["imgsz"], result["batch"]) == (64, 2)
    assert [list(row) for row in result["policies"]] == [PLAN_ROW_KEYS] * len(result["policies"])
    assert all(row["max_batch"] >= 2 and row["max_imgsz"] >= 64 for row in result["policies"])  # they fit at 64, batch 2


@pytest.mark.slow  # ~10 CPU s: plan's searches of 7 policies
def test_plan_max_batch_is_capped_as_batch_minus_1_caps(tmp_path, capsys):
    """Issue 43: plan's max_batch, in the JSON as in the table (the same rows), is the largest batch train would take:
    at most the training set's images, as batch=-1's pick is (one rule: MemoryModel.largest_batch); it said 10 for
    backbone,loss on a 3-image set, where batch=-1 picks 3."""
    from helpers import tiny_yaml, write_dataset

    data = write_dataset(tmp_path / "data", {"train": [["0 0.5 0.5 0.4 0.4"]] * 3, "val": [["0 0.5 0.5 0.4 0.4"]]})
    keys = [f"model={tiny_yaml(tmp_path)}", f"data={data}", "imgsz=64", "batch=-1", "memory_budget=8MB", "device=cpu"]
    assert main(["plan", *keys, "format=json"]) == 0
    result = json.loads(capsys.readouterr().out)
    rows = {row["recompute"]: row for row in result["policies"]}
    assert result["batch"] == rows["backbone,loss"]["max_batch"] == 3 and rows["backbone,loss"]["train"]
    assert {row["max_batch"] for row in rows.values()} == {3}  # each fits more than 3 images at 64 px in 8 MB


@pytest.mark.slow
def test_plan_batch_minus_1_answers_trains_batch_and_policy(synthetic, tmp_path, capsys):
    """Issue 31, item 2: plan takes train's keys; with batch=-1 it answers the batch train picks for the same keys (on
    the CPU, by the same function), and plans every policy at it. Issue 43, items 3 and 4: its table holds the policy
    train runs (detect's default backbone,loss, a row of its own) marked as train's, and auto as train makes it under
    batch=-1 (all); every stderr line names the policy; on a machine's first use (a fresh config folder) stdout is the
    JSON alone, Ultralytics' settings banner on stderr. The run's report plans the batch it picked with that batch's fake
    pass, plan's row (it was the composition scaled from the base pass's batch 2: 1.15-1.23x above, a negative margin)."""
    keys = [f"data={synthetic()}", "imgsz=160", "batch=-1", "memory_budget=60MB"]
    assert main(["train", *keys, "epochs=1", "val=False", "probe=False", "plots=False", f"project={tmp_path}", "name=b"]) == 0
    trained = yaml.safe_load((tmp_path / "b" / "args.yaml").read_text())["batch"]  # -1 as given; the report has the pick
    report = json.loads((tmp_path / "b" / REPORT_NAME).read_text())
    picked = report["batch"]
    capsys.readouterr()
    child = _cli(["plan", *keys, "format=json"], tmp_path)
    assert child.returncode == 0, child.stderr
    result = json.loads(child.stdout)
    assert "Creating new Ultralytics Settings" in child.stderr
    assert trained == -1 and result["batch"] == picked == 3  # yolo11n at 160 px, backbone,loss, in 57 MiB: 3 images
    assert f"batch=-1 -> batch={picked} for recompute=backbone,loss: the estimate's largest batch that fits" in child.stderr
    rows = {row["recompute"]: row for row in result["policies"]}
    assert [name for name, row in rows.items() if row["train"]] == ["backbone,loss"] and rows["backbone,loss"]["fits"]
    assert report["plan"]["estimated_peak_bytes"] / 2**20 == pytest.approx(rows["backbone,loss"]["estimated_peak_MiB"], abs=1e-9)
    assert report["plan"]["margin_bytes"] >= 0
    assert "auto (all)" in rows and all(row["max_imgsz"] > 0 for row in rows.values())
    # yolo11n's C2PSA at 160 px: 5 x 5 tokens, below attn_chunk, so the region would run it stock (issue 45: plan names it)
    assert result["attention"] == {"attn_chunk": 256, "modules": [{"layer": 10, "module": "Attention", "tokens": 25, "chunked": False}]}
    # recompute=auto with batch=-1 on a CUDA device: train runs all, at AutoBatch's batch; the line names the policy
    assert main(["plan", *keys[:3], "memory_budget=700MB", "device=0", "recompute=auto", "format=json"]) == 0
    out, err = capsys.readouterr()
    rows = {row["recompute"]: row for row in json.loads(out)["policies"]}
    assert [name for name, row in rows.items() if row["train"]] == ["auto (all)"] and "backbone,loss" not in rows
    assert "for recompute=all: the estimate's largest batch that fits, at most" in err and "measures its own with AutoBatch" in err
    # the table as a person reads it (its fake passes cached): train's row marked; what the headroom stands for (700 MB:
    # 145 MiB past the headroom, so the largest imgsz and batch are searched at small sizes)
    assert main(["plan", *keys[:3], "memory_budget=700MB", "device=0", "recompute=auto"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert [line.split()[:3] for line in lines if " yes " in line] == [["auto", "(all)", "yes"]]
    assert lines[-2] == "attention region, attn_chunk=256: layer 10 1 x Attention of 25 tokens, stock (at most attn_chunk tokens) (in all; auto may take it)"  # noqa: E501
    assert lines[-1].startswith("headroom: memory_headroom=1.15x+500MiB on top of each estimate, for what a CUDA process holds")
    assert lines[-1].endswith("the CUDA and AMP figures are estimates until a run on a GPU measures them (train's report: the allocator's peak)")  # noqa: E501


@pytest.mark.slow
def test_plan_refuses_as_train_where_nothing_fits(synthetic, tmp_path, capsys):
    """Issue 43, item 2: where even recompute=all does not fit at the imgsz and batch asked, plan refuses as train does
    (recompute=auto, the same keys): the same one line, exit 2, the budget rounded once (57.2 MiB), all's need and the
    largest imgsz at that batch that fits; nothing on stdout, on a machine's first use too."""
    keys = [f"data={synthetic()}", "imgsz=640", "batch=2", "memory_budget=60MB", "device=cpu", "recompute=auto"]
    child = _cli(["plan", *keys], tmp_path)
    assert child.returncode == 2 and child.stdout == "", child.stderr
    refusal = child.stderr.strip().splitlines()[-1]
    assert refusal.startswith(
        "yolo-ckpt: error: memory_budget=57.2 MiB is below the smallest plan's need at batch=2 imgsz=640: recompute=all needs "
    )
    assert "; it fits imgsz=" in refusal and refusal.endswith(". Raise the budget, or lower batch or imgsz")
    assert main(["train", *keys, "epochs=1", f"project={tmp_path}", "name=t"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == refusal and not (tmp_path / "t").exists()


def test_plan_refuses_in_one_line_where_one_image_cannot_train(capsys):
    """A budget below every trainable size, at batch 1: the search of the largest imgsz stops at the smallest one that
    can train (one image at 32 px has a 1 x 1 coarsest map, where BatchNorm refuses a training step) and plan refuses
    in one line, exit 2; before, it ran that pass and ended in torch's traceback. Asked at that size, plan says so."""
    keys = ["plan", "model=yolo11n.yaml", "batch=1", "device=cpu"]
    assert main([*keys, "imgsz=320", "memory_budget=10MB"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("yolo-ckpt: error: memory_budget=9.5 MiB is below the smallest plan's need at batch=1 imgsz=320")
    assert "it fits no imgsz at batch=1 nor any batch at imgsz=320" in err[-1] and "Traceback" not in "\n".join(err)
    assert main([*keys, "imgsz=32", "memory_budget=1GB"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "yolo-ckpt: error: batch=1 at imgsz=32 cannot train: the coarsest feature map (stride 32) is 1 x 1, and BatchNorm needs "
        "more than one value per channel in training; give batch>=2 or imgsz>=64"
    )


def test_plan_says_when_trains_policy_does_not_fit(capsys):
    """The policy the keys would train (detect's default backbone,loss) does not fit where all does: plan's table says
    fits False in its row, and a line below it says so, with the rows that fit (it said so in the fits column alone).
    yolo11n at 320 px, batch 2, 90 MB: backbone,loss ~100 MiB, all 73."""
    assert main(["plan", "model=yolo11n.yaml", "imgsz=320", "batch=2", "device=cpu", "memory_budget=90MB"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("train's recompute=backbone,loss does not fit memory_budget=85.8 MiB at batch=2 imgsz=320; these rows do: ")
    assert "all" in last.split("these rows do: ")[1].split(", ") and last.endswith("(give recompute=auto, or recompute= one of them)")


@pytest.mark.parametrize("command", ["plan", "profile"])
def test_plan_and_profile_refuse_data_without_labels_as_train(synthetic, tmp_path, capsys, command):
    """A dataset whose training labels are all missing: plan and profile refuse with train's one line (exit 2), where
    Ultralytics' dataset build raised its ValueError ("No labels found") as a traceback."""
    from helpers import tiny_yaml

    data = _one_class_data(synthetic, tmp_path / "data")
    for label in (tmp_path / "data" / "labels" / "train").iterdir():
        label.unlink()
    keys = [command, f"data={data}", f"model={tiny_yaml(tmp_path)}", "imgsz=64", "batch=2", "device=cpu"]
    assert main([*keys, *(["memory_budget=1GB"] if command == "plan" else [])]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"yolo-ckpt: error: data={data}: no labels at all for the 3 training images (label files are looked for in "
        f"{tmp_path / 'data' / 'labels' / 'train'}: one <image name>.txt per image)"
    )


def test_a_budget_that_chose_nothing_and_is_exceeded_is_said(synthetic, tmp_path):
    """memory_budget= picks recompute=auto's policy and batch=-1's batch; given with a named policy and a batch it chose
    nothing, and the run trained past it without a word. Now one warning line says the estimate is above it."""
    from helpers import logged_messages, tiny_yaml

    data = _one_class_data(synthetic, tmp_path / "data")
    keys = [f"data={data}", f"model={tiny_yaml(tmp_path)}", "imgsz=64", "batch=2", "device=cpu", "recompute=backbone", "epochs=1"]
    with logged_messages() as messages:
        assert main(["train", *keys, "memory_budget=1MB", "val=False", "probe=False", "plots=False", f"project={tmp_path}", "name=r"]) == 0
    lines = [line for line in messages if "memory_budget=1.0 MiB is below this run's estimated need of" in line]
    assert len(lines) == 1 and lines[0].endswith(
        "(recompute=backbone, batch=2): the budget picks recompute=auto's policy and batch=-1's batch, and this run asked for "
        "neither; give recompute=auto or batch=-1 to plan within it"
    )


def test_a_classify_model_refuses_a_data_yaml_before_its_trainer(synthetic, tmp_path, monkeypatch, capfd):
    """The task known from model= only (yolo11n-cls.yaml): refused once the model is built, before the trainer prints its
    arguments and reads the dataset (stock: after both)."""
    import ultralytics.engine.trainer

    monkeypatch.setattr(ultralytics.engine.trainer.BaseTrainer, "__init__", lambda *a, **k: pytest.fail("the trainer was built"))
    assert main(["train", "model=yolo11n-cls.yaml", f"data={synthetic()}", f"project={tmp_path}"]) == 2
    err = [line for line in capfd.readouterr().err.splitlines() if line.startswith("yolo-ckpt")]
    assert err == [
        f"yolo-ckpt: error: data={synthetic()}: task=classify reads a folder of class folders (train/<class>/*.jpg, val/<class>/...), "
        "not a data YAML; a data YAML is a detect, segment, obb or pose dataset"
    ]


def test_console_script_and_dependencies_declared():
    """pyproject's console script is the CLI's entry point, and every declared dependency (the extras' included) is
    met by the versions this suite runs on: a floor or range that excludes the tested versions fails here."""
    from importlib.metadata import version
    from pkgutil import resolve_name

    from packaging.requirements import Requirement

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert resolve_name(project["scripts"]["yolo-ckpt"]) is main
    requirements = [Requirement(r) for r in project["dependencies"] + project["optional-dependencies"]["test"]]
    unmet = {str(r): version(r.name) for r in requirements if not r.specifier.contains(version(r.name), prereleases=True)}
    assert not unmet, unmet
    assert {"ultralytics", "torch", "cloudpickle"} <= {r.name for r in requirements}  # failure mode 23: DDP pickles with cloudpickle


def test_importing_the_cli_runs_nothing(monkeypatch, capfd):
    """Issue 31, item 4: mkdocstrings imports ``yolo_ckpt/cli/__main__.py``; it must not parse ``sys.argv`` then."""
    import importlib

    monkeypatch.setattr(sys, "argv", ["mkdocs", "build", "--strict"])
    sys.modules.pop("yolo_ckpt.cli.__main__", None)
    importlib.import_module("yolo_ckpt.cli.__main__")  # unguarded, this raised SystemExit(2)
    assert capfd.readouterr() == ("", "")


@pytest.mark.slow
def test_builtin_default_offline(tmp_path):
    """No data=, no model=: yolo11n.yaml on the built-in synthetic dataset, with every network call refused (20), run
    as ``python -m yolo_ckpt.cli`` in a process of its own; two steps (fraction=0.5), the set-up estimate and
    validation as a default run makes them."""
    script = textwrap.dedent(f"""
        import runpy, socket, sys
        def refuse(*args, **kwargs):
            raise OSError("network disabled by the test")
        socket.socket.connect = socket.socket.connect_ex = refuse
        socket.create_connection = refuse
        sys.argv = ["yolo-ckpt", "train", "imgsz=96", "epochs=1", "batch=2", "fraction=0.5", "plots=False", "project={tmp_path}",
                    "name=default"]
        runpy.run_module("yolo_ckpt.cli", run_name="__main__")  # python -m yolo_ckpt.cli, as a user runs it
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads((tmp_path / "default" / REPORT_NAME).read_text())
    assert report["model"] == "yolo11n.yaml" and "synthetic-v1-seed0-detect" in report["data"]
    assert report["recompute"] == "backbone,loss" and len(report["recomputed_layers"]) == 11
    assert report["train_peak_allocated_bytes"] > 0 and report["imgsz"] == 96


@pytest.mark.slow
def test_aerial_cars_at_1536(shared_datasets, tmp_path):
    """The main job on real drone images: yolo-ckpt train data=aerial-cars imgsz=1536, 1 epoch on a small fraction (one
    step of 1 image: the run and its end-of-run CPU probe cost per pixel), from a copy (Ultralytics writes its label
    cache beside the labels; ../shared stays as it is). In-process (the command's main) and without the set-up
    estimate: its fake passes cost the same at any imgsz and are tested with the memory model."""
    src = shared_datasets / "aerial-cars"
    for split in ("images", "labels"):  # a 1-image val split: validation of dense 1536 px images dominates CPU time
        shutil.copytree(src / split / "train", tmp_path / split / "train")
        (tmp_path / split / "val").mkdir(parents=True)
        for f in sorted((src / split / "val").iterdir())[:1]:
            shutil.copy(f, tmp_path / split / "val")
    data = yaml.safe_load((src / "data.yaml").read_text())
    data.update(path=str(tmp_path), train="images/train", val="images/val")
    (tmp_path / "data.yaml").write_text(yaml.safe_dump(data))

    args = [f"data={tmp_path / 'data.yaml'}", "imgsz=1536", "epochs=1", "batch=1", "fraction=0.03", "plots=False", "estimate=False"]
    assert main(["train", *args, f"project={tmp_path}", "name=aerial"]) == 0
    report = json.loads((tmp_path / "aerial" / REPORT_NAME).read_text())
    assert report["imgsz"] == 1536 and report["recompute"] == "backbone,loss"
    assert (report["batch"], report["memory_probe_images"]) == (1, 1)  # round(46 * 0.03) = 1 training image
    assert report["train_peak_allocated_bytes"] > 100 * 2**20  # activations of an image at 1536 px
    assert set(report["metrics"]) >= {"box_mAP50", "box_mAP50-95"}
    assert (tmp_path / "aerial" / "weights" / "best.pt").exists()
    assert (tmp_path / "labels" / "train.cache").is_file()  # the cache Ultralytics wrote, in the copy


@pytest.mark.slow
def test_compare_two_runs(synthetic, tmp_path, capsys):
    """compare: the baseline row has delta 0, the other run its deltas; bad input fails before writing."""
    from ultralytics import YOLO

    from yolo_ckpt import trainer_for

    # 4 steps (the run report times the steps after the first 3: a step time to compare); imgsz 128, where recompute=all
    # frees a third of the peak (at 64 the peak is the optimizer step's)
    kw = dict(data=synthetic(), epochs=1, imgsz=224, batch=2, workers=0, device="cpu", plots=False, val=False, estimate=False,
              project=str(tmp_path))
    for name, recompute in (("none", "none"), ("all", "all")):
        YOLO("yolo11n.yaml").train(trainer=trainer_for("detect"), recompute=recompute, name=name, **kw)
    out = tmp_path / "cmp"
    assert main(["compare", str(tmp_path / "none"), str(tmp_path / "all"), f"out={out}"]) == 0
    import pandas as pd

    table = pd.read_csv(out / "compare.csv")
    assert list(table["recompute"]) == ["none", "all"]
    assert table.loc[0, "memory_change_pct"] == 0 and table.loc[0, "time_ratio"] == 1
    assert table.loc[0, "mAP50-95_change_pts"] == 0
    assert table.loc[1, "memory_change_pct"] < -30  # recompute=all frees activations
    printed = capsys.readouterr().out
    assert f"Baseline: {tmp_path / 'none'} (recompute=none)" in printed and "| peak MiB | peak GiB | memory |" in printed
    assert (out / "compare.md").read_text() in printed
    assert main(["compare", str(tmp_path / "none"), str(tmp_path / "missing"), f"out={tmp_path / 'bad'}"]) == 2
    assert main(["compare", str(tmp_path / "none")]) == 2
    assert not (tmp_path / "bad").exists()


def _one_class_data(synthetic, tmp_path, crowded: int = 300) -> Path:
    """A one-class copy of 3 synthetic training images, one of them labelled with ``crowded`` small boxes."""
    src = Path(synthetic()).parent
    for split in ("train", "val"):
        (tmp_path / "images" / split).mkdir(parents=True)
        (tmp_path / "labels" / split).mkdir(parents=True)
        for image in sorted((src / "images" / "train").iterdir())[:3]:
            shutil.copy(image, tmp_path / "images" / split)
            lines = (src / "labels" / "train" / f"{image.stem}.txt").read_text().splitlines()
            (tmp_path / "labels" / split / f"{image.stem}.txt").write_text("".join("0" + line[line.index(" "):] + "\n" for line in lines))
    crowd = "".join(f"0 {0.05 + 0.9 * (i % 20) / 20:.4f} {0.05 + 0.9 * (i // 20) / 20:.4f} 0.01 0.01\n" for i in range(crowded))
    (tmp_path / "labels" / "train" / f"{image.stem}.txt").write_text(crowd)
    (tmp_path / "data.yaml").write_text(
        yaml.safe_dump({"path": str(tmp_path), "train": "images/train", "val": "images/val", "names": {0: "car"}})
    )
    return tmp_path / "data.yaml"


@pytest.mark.slow
def test_profile_and_plan_estimate_the_run_of_the_data(synthetic, tmp_path):
    """profile/plan read data= as train does: the data's classes (1, not the YAML's 80), its most objects per image
    x 4 for mosaic (300 -> 1200) and its images for optimizer=auto; device=cpu estimates fp32; without device= a
    CUDA device with AMP as amp= says; the text output states all of it."""
    from yolo_ckpt.cli.run_setup import estimate_setup

    data = _one_class_data(synthetic, tmp_path)
    run, opts = estimate_setup([f"data={data}", "imgsz=128", "batch=1", "device=cpu", "epochs=20000", "memory_budget=8GB"])
    model, config, spec = run.model, run.config, run.spec
    assert model.yaml["nc"] == spec.nc == 1 and spec.objects == 1200
    assert (spec.device, spec.amp, spec.optimizer, str(config.headroom_on(spec.device))) == ("cpu", False, "MuSGD", "1x+0MiB")
    assert spec.describe() == (
        "assumed: device cpu, AMP off (fp32) as Ultralytics trains on the CPU, optimizer=auto: MuSGD for 20000 iterations "
        "(3 images, 20000 epochs; MuSGD above 10000), 1200 objects per image (the data's most in one image, 300, x 4 for mosaic), "
        "box layout: each label's box at its largest (x 1.5 for scale=, degrees=0.0, shear=0.0, multi_scale=0.0), where it "
        "lies: one image's boxes move on the anchor grid together, a mosaic shows part of its images, 1 classes"
    )
    run, _ = estimate_setup(["objects=7", "optimizer=SGD", "memory_budget=8GB", "device=0"])  # no data=; a GPU from any machine
    config, spec = run.config, run.spec
    assert (spec.device, spec.amp, spec.nc, spec.objects, spec.optimizer, str(config.headroom_on(spec.device))) == (
        "cuda",
        True,
        80,
        7,
        "SGD",
        "1.15x+500MiB",
    )
    assert spec.describe() == (  # the line profile and plan print (their JSON carries the fields)
        "assumed: device cuda, AMP on (2-byte activations), optimizer=SGD, 7 objects per image (objects=7), box layout: every box "
        "the whole image, the worst (give data= to bound it by the labels' box sizes, or object_size= for the largest box side as "
        "a fraction of the image), 80 classes"
    )


@pytest.mark.slow
def test_plan_ultralytics_21100_does_not_fit_12gb():
    """ultralytics#21100: yolo12s at imgsz 2048, batch 1, out of memory on a 12 GB GPU, with AMP on (the user's run
    and plan's default on CUDA). The AMP estimate follows CUDA fp16 autocast, which keeps area attention's softmax in
    fp32 (yolo_ckpt.memory.composed.amp): recompute=none does not fit 12 GB = 11444 MiB with the default headroom (1.15x + 500 MiB),
    and auto and all do. Planned with plan's memory model (its table's rows: test_cli_profile_and_plan_json)."""
    memory, budget, opts, spec = plan_setup(["model=yolo12s.yaml", "imgsz=2048", "batch=1", "memory_budget=12GB", "device=0"])
    assert budget == 12 * 10**9 and spec.device == "cuda" and spec.amp and memory.composed.amp and opts["imgsz"] == 2048
    none = memory.estimate("none", 1, 2048).peak_bytes
    assert memory.headroom.need(none) == pytest.approx(1.15 * none + 500 * 2**20, abs=1)
    assert not memory.fits(none, budget) and budget < memory.headroom.need(none) and memory.largest_batch((), budget, 2048) == 0
    auto = memory.plan(budget, 1, 2048)
    assert auto.fits and auto.recompute != "none" and memory.fits(memory.estimate("all", 1, 2048).peak_bytes, budget)


def test_model_yaml_without_backbone_exits_2(tmp_path, capsys):
    """A model YAML without a backbone: section is named, before Ultralytics' parse_model fails on it."""
    cfg = tmp_path / "nobackbone.yaml"
    cfg.write_text("nc: 2\nhead:\n  - [-1, 1, Conv, [16, 3, 2]]\n")
    assert main(["train", "detect", f"model={cfg}", f"project={tmp_path / 'runs'}"]) == 2
    assert "has no 'backbone:' section" in capsys.readouterr().err and not (tmp_path / "runs").exists()


@pytest.mark.slow
@pytest.mark.parametrize("existing", [False, True])
@pytest.mark.parametrize("bad", ["budget", "data"])
def test_failed_setup_leaves_the_run_dir_as_it_was(bad, existing, synthetic, tmp_path, capsys):
    """recompute=auto with a budget no plan fits, or a data= that does not exist: one line, exit 2, and the run
    folder removed (a new run) or its earlier args.yaml and results.csv back (exist_ok=True over an earlier run)."""
    run = tmp_path / "run"
    if existing:
        run.mkdir()
        (run / "args.yaml").write_text("from: the earlier run\n")
        (run / "results.csv").write_text("epoch,time\n1,2.0\n")
    data = f"data={synthetic()}" if bad == "budget" else f"data={tmp_path / 'nothere.yaml'}"
    args = ["train", data, "recompute=auto", "memory_budget=10MB" if bad == "budget" else "memory_budget=1GB", "device=cpu",
            "epochs=1", "imgsz=64", "batch=2", f"project={tmp_path}", "name=run", "exist_ok=True"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    if bad == "budget":
        assert err[-1].startswith("yolo-ckpt: error: memory_budget=") and "below the smallest plan's need" in err[-1]
    else:
        assert err[-1].startswith("yolo-ckpt: error: Dataset '") and "nothere.yaml' does not exist" in err[-1]
    if existing:
        assert sorted(p.name for p in run.iterdir()) == ["args.yaml", "results.csv"]
        assert (run / "args.yaml").read_text() == "from: the earlier run\n" and (run / "results.csv").read_text() == "epoch,time\n1,2.0\n"
    else:
        assert not run.exists()


@pytest.mark.parametrize(("task", "imgsz", "trained", "objects"), [("classify", "64", 64, 0), ("detect", "[160,128]", 160, None)])
def test_estimate_setup_takes_the_data_of_every_task_and_a_list_imgsz(task, imgsz, trained, objects, synthetic):
    """profile/plan (and recompute=auto, which counts the data the same way) with data=: a classification folder,
    read as ClassificationTrainer reads it (no objects), and a list imgsz (the dataset counted at its largest side,
    the size that trains); both crashed."""
    from yolo_ckpt.cli.run_setup import estimate_setup

    run, opts = estimate_setup([task, f"data={synthetic(task)}", f"imgsz={imgsz}", "batch=2", "device=cpu"])
    spec = run.spec
    labels = (Path(synthetic(task)).parent / "labels" / "train").glob("*.txt")
    assert (opts["imgsz"], spec.nc) == (trained, 3)
    assert spec.objects == (objects if objects is not None else 4 * max(len(f.read_text().splitlines()) for f in labels))


@pytest.mark.slow
def test_plan_and_a_train_refusal_leave_the_dataset_folder_as_they_found_it(synthetic, tmp_path):
    """Issue 43: ``plan data=...`` (``profile`` reads the data by the same estimate_setup) and a train that refuses once it
    has counted the data (recompute=auto under a budget nothing fits) write nothing into the dataset's folder: no
    labels/train.cache (stock's train writes one, as it always has). Every file's bytes hashed before and after; each
    command a process of its own on a fresh YOLO_CONFIG_DIR, as a user's first run."""
    import hashlib
    import os

    from helpers import tiny_yaml

    data = _one_class_data(synthetic, tmp_path / "data", crowded=20)

    def files() -> dict:
        return {str(p.relative_to(data.parent)): hashlib.sha256(p.read_bytes()).hexdigest() for p in data.parent.rglob("*") if p.is_file()}

    before = files()
    env = {**os.environ, "YOLO_CONFIG_DIR": str(tmp_path / "config"), "YOLO_OFFLINE": "1"}
    keys = [f"data={data}", f"model={tiny_yaml(tmp_path)}", "imgsz=64", "batch=2", "device=cpu"]
    commands = {
        "plan": ["plan", *keys, "memory_budget=1GB"],
        "train": ["train", *keys, "recompute=auto", "memory_budget=1MB", "epochs=1", f"project={tmp_path / 'runs'}"],
    }
    for name, args in commands.items():
        out = subprocess.run([sys.executable, "-m", "yolo_ckpt.cli", *args], capture_output=True, text=True, env=env, cwd=ROOT,
                             timeout=SUBPROCESS_TIMEOUT_S)
        assert out.returncode == (2 if name == "train" else 0), out.stderr[-3000:]
        assert files() == before, name
    assert "is below the smallest plan's need" in out.stderr.strip().splitlines()[-1]
    assert not list((tmp_path / "runs").glob("*"))  # the run folder put back (the project folder stays, empty)


@pytest.mark.slow  # ~6 s: profile's two estimates
def test_profile_shows_the_attention_chunking(tmp_path, capsys):
    """Issue 43: with the attention region on, profile names its attn_chunk and each attention module's layer and
    tokens, chunked or not (the result's attention; the text's line is attention_text's, tested with the tokens). The
    small model of helpers with a C2PSA: 8 x 8 = 64 tokens at 64 px, chunked at attn_chunk=32."""
    from helpers import tiny_yaml

    keys = ["profile", f"model={tiny_yaml(tmp_path, 'attention')}", "imgsz=64", "batch=1", "device=cpu", "format=json"]
    assert main([*keys, "recompute=attention", "attn_chunk=32"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["attention"] == {"attn_chunk": 32, "modules": [{"layer": 4, "module": "Attention", "tokens": 64, "chunked": True}]}
    assert result["recomputed_regions"] == ["attention"]
