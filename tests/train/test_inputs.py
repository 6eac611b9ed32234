"""Hostile train inputs (issue 22 point 5): one line naming the key or file, exit 2, before any write, so an existing
run folder stays byte-identical; and the run folder put back after any failure between the first write and the first
epoch, whatever raised it."""

from pathlib import Path

import pytest
import torch
from helpers import folder_state
from ultralytics import YOLO
from ultralytics.models.yolo.detect import DetectionTrainer

from yolo_ckpt import checkpointed
from yolo_ckpt.cli import main
from yolo_ckpt.errors import ConfigError
from yolo_ckpt.train.inputs import check_imgsz

TRAIN = ["epochs=1", "imgsz=32", "batch=2", "workers=0", "plots=False", "exist_ok=True"]


@pytest.fixture
def earlier_run(tmp_path):
    """An earlier run's folder, ``runs/run`` with args.yaml, results.csv and weights/last.pt."""
    run = tmp_path / "runs" / "run"
    (run / "weights").mkdir(parents=True)
    (run / "args.yaml").write_text("from: the earlier run\n")
    (run / "results.csv").write_text("epoch,time\n1,2.0\n")
    (run / "results.csv").chmod(0o640)  # not the umask's: the restore keeps it
    (run / "weights" / "last.pt").write_bytes(b"earlier weights")
    return run


def hostile(tmp_path: Path) -> dict:
    (tmp_path / "afile").write_text("a file, not a folder\n")
    torch.save({"weights": [1, 2]}, tmp_path / "notackpt.pt")
    (tmp_path / "junk.pt").write_bytes(b"\x00 not a pickle")
    (tmp_path / "adir").mkdir()
    return {
        "imgsz=abc": ("imgsz='abc' is not a training size", []),
        "imgsz=fit": ("imgsz='fit' is not a training size", []),
        "imgsz=0": ("imgsz=0 is not a training size", []),
        "imgsz=-64": ("imgsz=-64 is not a training size", []),
        "device=abc": ("device='abc': Invalid CUDA 'device=abc' requested", []),
        "device=cuda:0": ("device='cuda:0': Invalid CUDA", []),
        "project=FILE": (f"project={tmp_path / 'afile'}: {tmp_path / 'afile'} is a file", [f"project={tmp_path / 'afile'}"]),
        "model=DIR": (f"model={tmp_path / 'adir'} is a folder", [f"model={tmp_path / 'adir'}"]),
        "model=notackpt.pt": (
            f"model={tmp_path / 'notackpt.pt'} is not a loadable Ultralytics checkpoint",
            [f"model={tmp_path / 'notackpt.pt'}"],
        ),
        "model=junk.pt": (f"model={tmp_path / 'junk.pt'} is not a loadable Ultralytics checkpoint", [f"model={tmp_path / 'junk.pt'}"]),
    }


@pytest.mark.parametrize(
    "case",
    [
        "imgsz=abc",
        "imgsz=fit",
        "imgsz=0",
        "imgsz=-64",
        "device=abc",
        "device=cuda:0",
        "project=FILE",
        "model=DIR",
        "model=notackpt.pt",
        "model=junk.pt",
    ],
)
def test_hostile_input_is_one_line_exit_2_and_the_run_folder_stays(case, earlier_run, synthetic, tmp_path, capsys):
    if case == "device=cuda:0" and torch.cuda.is_available():
        pytest.skip("device=cuda:0 is valid here")
    message, args = hostile(tmp_path)[case]
    args = args or [case]
    before, afile = folder_state(earlier_run), (tmp_path / "afile").read_bytes()
    argv = ["train", f"data={synthetic()}", f"project={earlier_run.parent}", "name=run", *TRAIN, *args]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("yolo-ckpt: error: ") and message in err[-1], err[-1]
    assert not [line for line in err if "Traceback" in line]
    assert folder_state(earlier_run) == before and (tmp_path / "afile").read_bytes() == afile
    assert sorted(p.name for p in earlier_run.parent.iterdir()) == ["run"]


def test_imgsz_rule():
    """Positive sizes, lists of them and check_imgsz's numeric strings pass (rounding stays Ultralytics'); the rest is refused."""
    for good in (640, 333, 64.0, [640, 480], "640"):
        check_imgsz(good)
    for bad in ("abc", "fit", 0, -1, [640, 0], [], True, None):
        with pytest.raises(ConfigError, match="is not a training size"):
            check_imgsz(bad)


def test_resume_of_a_finished_run_from_python_is_one_line_before_any_write(tmp_path):
    """YOLO(...).train(trainer=..., resume=path/to/last.pt) of a finished run (a stripped last.pt, best.pt beside it):
    the CLI's one-line ConfigError, from the trainer's key check, before any run folder is written (stock fails in
    resume_training, after writing into the finished run's folder)."""
    weights = tmp_path / "runs" / "run" / "weights"
    weights.mkdir(parents=True)
    last, best = weights / "last.pt", weights / "best.pt"
    train_args = {"model": "yolo11n.yaml", "data": "my/data.yaml", "epochs": 3, "save_dir": str(weights.parent)}
    torch.save({"model": None, "epoch": -1, "optimizer": None, "train_args": train_args}, last)  # strip_optimizer's form
    best.write_bytes(last.read_bytes())
    before = folder_state(tmp_path)
    with pytest.raises(ConfigError) as e:
        YOLO("yolo11n.yaml").train(trainer=checkpointed(DetectionTrainer), resume=str(last), project=str(tmp_path / "runs"), name="new")
    assert str(e.value) == (
        f"resume: the run {weights.parent} is finished ({last} has no optimizer state to resume); "
        f"start a new run from its weights: yolo-ckpt train model={best} data=my/data.yaml"
    )
    assert folder_state(tmp_path) == before and sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["run"]


class FailingSetup(DetectionTrainer):
    """A trainer whose set-up fails after BaseTrainer.__init__ wrote the run folder (any exception, any place)."""

    def get_dataloader(self, *args, **kwargs):
        raise OSError("the disk went away")


class FailingFirstEpoch(DetectionTrainer):
    """A trainer that fails once its first epoch started: the run folder is this run's from then on."""

    def _model_train(self):
        raise OSError("the disk went away")


@pytest.mark.slow
@pytest.mark.parametrize("existing", [True, False])
def test_any_failure_before_the_first_epoch_puts_the_run_folder_back(existing, earlier_run, synthetic, tmp_path):
    """An OSError from Ultralytics' set-up (dataloaders, after args.yaml was written and results.csv removed): the
    earlier run's folder byte-identical, or a new run's folder gone."""
    name = "run" if existing else "new"
    before = folder_state(earlier_run)
    with pytest.raises(OSError, match="the disk went away"):
        YOLO("yolo11n.yaml").train(data=synthetic(), trainer=checkpointed(FailingSetup), project=str(earlier_run.parent), name=name,
                                   epochs=1, imgsz=32, batch=2, workers=0, plots=False, exist_ok=True, device="cpu")
    assert folder_state(earlier_run) == before
    assert sorted(p.name for p in earlier_run.parent.iterdir()) == ["run"]


def test_a_failure_after_the_first_epoch_started_keeps_the_run_folder(synthetic, tmp_path):
    """Once the first epoch starts, the folder is this run's: a failure then leaves it (args.yaml of this run)."""
    with pytest.raises(OSError, match="the disk went away"):
        YOLO("yolo11n.yaml").train(data=synthetic(), trainer=checkpointed(FailingFirstEpoch), project=str(tmp_path), name="run",
                                   epochs=1, imgsz=32, batch=2, workers=0, plots=False, device="cpu", estimate=False)
    assert (tmp_path / "run" / "args.yaml").is_file()


def test_messages_name_the_key_or_the_file(tmp_path, capsys):
    """bench objects=abc names the setting (not "invalid literal for int()"), and compare of a truncated
    ckpt_report.json names the file (not "Expecting value: line 1 column 36"); both exit 2 and write nothing."""
    assert main(["bench", "matrix=cpu-step", "objects=abc", f"out={tmp_path / 'bench'}"]) == 2
    assert "objects='abc' is not valid; valid: an int >= 1" in capsys.readouterr().err
    run = tmp_path / "run"
    run.mkdir()
    (run / "ckpt_report.json").write_text('{"schema": 3, "task": ')
    assert main(["compare", str(run), str(run), f"out={tmp_path / 'compare'}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"yolo-ckpt: error: {run / 'ckpt_report.json'} is not a readable run report") and len(err.splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_bench_out_a_run_folder_or_a_file(earlier_run, tmp_path, capsys):
    """bench out= a training run's folder (its results.csv is Ultralytics', not a bench table: once KeyError
    'status') or a file: one line naming out=, exit 2, the folder and the file as they were."""
    (tmp_path / "afile").write_text("keep me\n")
    before = folder_state(earlier_run)
    for out, message in ((earlier_run, "its results.csv is not a bench results table"), (tmp_path / "afile", "is a file")):
        assert main(["bench", "matrix=cpu-step", f"out={out}"]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"yolo-ckpt: error: out={out}") and message in err and len(err.splitlines()) == 1
    assert folder_state(earlier_run) == before and (tmp_path / "afile").read_text() == "keep me\n"


@pytest.mark.parametrize("command", ["train", "plan", "profile"])
def test_a_checkpoint_to_download_offline_is_one_line_naming_where_to_get_it(command, tmp_path, capsys, monkeypatch):
    """Offline (YOLO_OFFLINE=1, set by conftest), model=yolo11n.pt with no such file here: one line naming the file, its
    download and the YAML to train from scratch, exit 2, before any write (stock: a 102-line download traceback, exit
    1); model= a missing .pt that is no Ultralytics asset (train resume model=<missing>): one line, and no network
    check (stock asks GitHub for the release's assets twice first)."""
    from ultralytics.utils import SETTINGS, downloads

    monkeypatch.chdir(tmp_path)
    if (Path(SETTINGS["weights_dir"]) / "yolo11n.pt").is_file():
        pytest.skip(f"yolo11n.pt is in Ultralytics' weights folder {SETTINGS['weights_dir']}")
    asked = []
    monkeypatch.setattr(downloads, "get_github_assets", lambda *args, **kwargs: asked.append(args) or ("", []))
    runs = tmp_path / "runs"
    assert main([command, "model=yolo11n.pt", *TRAIN, f"project={runs}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "yolo-ckpt: error: model=yolo11n.pt is not on this machine, and offline (YOLO_OFFLINE=1 or no network) Ultralytics "
        "cannot download it: download https://github.com/ultralytics/assets/releases/download/v8.4.0/yolo11n.pt where there is a "
        f"network and give its path (or put it in {SETTINGS['weights_dir']}), or train from scratch with model=yolo11n.yaml"
    ]
    missing = tmp_path / "runs" / "gone" / "weights" / "last.pt"
    assert main([command, *(["resume"] if command == "train" else []), f"model={missing}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"yolo-ckpt: error: model={missing}: no such file (a checkpoint .pt or a model YAML .yaml)"]
    assert asked == [] and sorted(p.name for p in tmp_path.iterdir()) == []


def test_damaged_reports_and_matrices_are_one_line(tmp_path, capsys):
    """compare of a report of random bytes, a JSON list, an object lacking the report's fields, or with out= a file;
    bench of a matrix with a !!python tag (never built) or that is a list: each one line naming the file, exit 2,
    nothing written."""
    import json

    from yolo_ckpt.report.record import REPORT_NAME

    reports = {"bytes": bytes(range(256)) * 4, "list": b"[1, 2]", "fields": json.dumps({"schema_version": 4, "task": "detect"}).encode()}
    lines = {
        "bytes": "is not a readable run report (not UTF-8 text: byte 128): the file is damaged",
        "list": "not a run report (a JSON list, not an object)",
        "fields": "not a complete run report: it lacks ['amp', 'batch', 'batch_at_start', 'data', 'device', 'epochs',",
    }
    for case, content in reports.items():
        run = tmp_path / case
        run.mkdir()
        (run / REPORT_NAME).write_bytes(content)
        assert main(["compare", str(run), str(run), f"out={tmp_path / 'cmp'}"]) == 2, case
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"yolo-ckpt: error: {run / REPORT_NAME}") and lines[case] in err[0], err
    (tmp_path / "afile").write_text("keep me\n")
    assert main(["compare", str(tmp_path / "list"), str(tmp_path / "list"), f"out={tmp_path / 'afile'}"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"yolo-ckpt: error: out={tmp_path / 'afile'} is a file: give a folder for compare.csv and compare.md (made if missing)"
    ]
    assert (tmp_path / "afile").read_text() == "keep me\n"
    matrices = {
        "tag.yaml": ("kind: step\ngrid: !!python/object/apply:os.system ['touch pwned']\n", "could not determine a constructor"),
        "list.yaml": ("- kind: step\n", f"'{tmp_path / 'list.yaml'}' is not a valid YAML mapping"),
    }
    for name, (text, line) in matrices.items():
        (tmp_path / name).write_text(text)
        assert main(["bench", f"matrix={tmp_path / name}", f"out={tmp_path / 'bench'}"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"yolo-ckpt: error: {tmp_path / name}: not a readable matrix YAML: {line}"), err
    assert not (tmp_path / "cmp").exists() and not (tmp_path / "bench").exists() and not (tmp_path / "pwned").exists()


@pytest.mark.parametrize("command", ["plan", "profile"])
def test_plan_and_profile_refuse_what_train_refuses(command, tmp_path, capsys, monkeypatch):
    """plan and profile refuse a bad imgsz= (abc, 0: once a traceback and a plan of a 32 px floor), a device= of no form
    Ultralytics takes (7x: once planned as CUDA) and a recompute= the model lacks (bogus: once a budget error that never
    named it), each in one line naming the value, exit 2, before any fake pass; device=0 still plans a GPU from here."""
    monkeypatch.chdir(tmp_path)
    lines = {
        "imgsz=abc": "imgsz='abc' is not a training size",
        "imgsz=0": "imgsz=0 is not a training size",
        "device=7x": "device='7x' is not a device the memory model plans for; valid: cpu, mps, a CUDA index or list",
        "recompute=bogus": "recompute='bogus': unknown layer name or section 'bogus'",
    }
    for word, line in lines.items():
        assert main([command, "model=yolo11n.yaml", "batch=1", *(["memory_budget=1GB"] if command == "plan" else []), word]) == 2, word
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"yolo-ckpt: error: {line}"), (word, err)
    from yolo_ckpt.memory.ultralytics_rules import device_type

    assert [device_type(d) for d in ("0", "cuda:0", "0,1", "[0, 1]", "-1", "cpu", "mps")] == ["cuda"] * 5 + ["cpu", "mps"]
    assert sorted(p.name for p in tmp_path.iterdir()) == []
