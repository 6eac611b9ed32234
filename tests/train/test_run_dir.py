"""Two runs into one run folder (issue 44 point 1): a set-up that fails undoes only its own writes, never another
run's files that arrived meanwhile; a second live yolo-ckpt run into a folder is refused in one line, a killed run's
lock taken over. The other run writes from inside the failing run's set-up (a patched loader), so no timing plays."""

import errno
import os
import subprocess
import sys

import pytest
from helpers import folder_state, tiny_yaml
from ultralytics import YOLO
from ultralytics.models.yolo.detect import DetectionTrainer

from yolo_ckpt import checkpointed
from yolo_ckpt.cli import main
from yolo_ckpt.train.run_dir import LOCK_NAME

OTHER_RUN = {"weights/best.pt": b"the other run's best", "weights/last.pt": b"the other run's last",
             "ckpt_report.json": b'{"other": "run"}', "results.csv": b"epoch,time\n1,3.0\n2,6.0\n", "args.yaml": b"from: the other run\n"}


class OtherRunMeanwhile(DetectionTrainer):
    """A set-up that fails in its data loaders, after another run wrote its files into the same folder (all of
    :data:`OTHER_RUN`: its weights, report and results, and its args.yaml over this run's)."""

    def get_dataloader(self, *args, **kwargs):
        for name, data in OTHER_RUN.items():
            (self.save_dir / name).write_bytes(data)
        raise OSError("the disk went away")


def fail_beside_another_run(project, name, data, model):
    with pytest.raises(OSError, match="the disk went away"):
        YOLO(model).train(data=data, trainer=checkpointed(OtherRunMeanwhile), project=str(project), name=name, epochs=1, imgsz=32,
                          batch=2, workers=0, plots=False, exist_ok=True, device="cpu", estimate=False)


@pytest.mark.parametrize("existed", [False, True])
def test_a_failed_set_up_keeps_another_runs_files(existed, synthetic, tmp_path):
    """A run's set-up fails after another run wrote its best.pt, last.pt, ckpt_report.json, results.csv and args.yaml
    into the same folder (exist_ok=True, the same name=): every one of them stays as that run wrote it, whether the
    folder was new or an earlier run's (whose results.csv this run removed: not written back over the other run's), and
    no lock is left."""
    run = tmp_path / "runs" / "run"
    if existed:
        run.mkdir(parents=True)
        (run / "results.csv").write_text("epoch,time\n1,2.0\n")
        (run / "args.yaml").write_text("from: the earlier run\n")
    fail_beside_another_run(run.parent, "run", synthetic(), tiny_yaml(tmp_path))
    assert {p: (run / p).read_bytes() for p in OTHER_RUN} == OTHER_RUN
    assert sorted(str(p.relative_to(run)) for p in run.rglob("*")) == sorted([*OTHER_RUN, "weights"])


def test_a_failed_set_up_alone_undoes_its_writes(synthetic, tmp_path):
    """Without another run, a failure after set-up plotted the training labels (plots=True) leaves an earlier run's
    folder byte-identical (its args.yaml and results.csv put back, modes kept) but for the labels.jpg this run drew
    over the earlier one (its bytes were not kept: left as stock leaves it), and removes a new folder, labels.jpg and
    all, with the project it created."""
    run = tmp_path / "runs" / "run"
    (run / "weights").mkdir(parents=True)
    (run / "results.csv").write_text("epoch,time\n1,2.0\n")
    (run / "results.csv").chmod(0o640)
    (run / "args.yaml").write_text("from: the earlier run\n")
    (run / "weights" / "last.pt").write_bytes(b"earlier weights")
    (run / "labels.jpg").write_bytes(b"the earlier run's plot")
    before = folder_state(run)

    class Failing(DetectionTrainer):
        def resume_training(self, ckpt):  # after plot_training_labels
            assert (self.save_dir / "labels.jpg").is_file()
            raise OSError("the disk went away")

    for project, name in ((run.parent, "run"), (tmp_path / "new" / "project", "run")):
        with pytest.raises(OSError, match="the disk went away"):
            YOLO(tiny_yaml(tmp_path)).train(data=synthetic(), trainer=checkpointed(Failing), project=str(project), name=name, epochs=1,
                                            imgsz=32, batch=2, workers=0, plots=True, exist_ok=True, device="cpu", estimate=False)
    after = folder_state(run)
    assert after.pop("labels.jpg") != before.pop("labels.jpg") and after == before  # the plot it redrew stays, as stock's
    assert not (tmp_path / "new").exists()


def test_a_live_runs_folder_is_refused_a_killed_runs_taken_over(synthetic, tmp_path, capsys):
    """A lock held by a live process: `train` into that folder is one line naming the folder and the pid, exit 2, the
    folder untouched. A lock of a dead process (a killed run): taken over, the run trains, and its lock is gone at its
    end."""
    run = tmp_path / "run"
    run.mkdir()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        (run / LOCK_NAME).write_text(f"{live.pid}\n")
        argv = ["train", f"model={tiny_yaml(tmp_path)}", f"data={synthetic()}", f"project={tmp_path}", "name=run", "exist_ok=True",
                "epochs=1", "imgsz=32", "batch=2", "workers=0", "plots=False", "val=False", "estimate=False", "probe=False"]
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [f"yolo-ckpt: error: {run} is in use by a live yolo-ckpt run (pid {live.pid}, {run / LOCK_NAME}): two runs in one "
                       "folder mix their files; give another name=, or wait for that run to end"]
        assert sorted(p.name for p in run.iterdir()) == [LOCK_NAME]
    finally:
        live.kill()
        live.wait()
    assert main(argv) == 0  # the pid is dead now: a killed run's lock
    assert (run / "weights" / "last.pt").is_file() and not (run / LOCK_NAME).exists()


def test_a_read_only_project_is_one_line(synthetic, tmp_path, monkeypatch, capsys):
    """project= a folder on a read-only disk (EROFS from every write under it; as root, chmod 555 does not stop a
    write): one line naming the run folder, exit 2, nothing written."""
    project = tmp_path / "ro"
    project.mkdir()
    stock_open = os.open

    def read_only(path, flags, *args, **kwargs):
        if str(path).startswith(str(project)) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return stock_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", read_only)
    assert main(["train", f"data={synthetic()}", f"project={project}", "name=run", "epochs=1", "imgsz=32", "estimate=False"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (
        f"yolo-ckpt: error: the run folder {project / 'run'} cannot be written (Read-only file system): give a writable project= or name="
    )
    assert not [p for p in project.rglob("*") if p.is_file()]


def test_two_new_runs_started_together_take_two_folders(tmp_path, monkeypatch):
    """Two runs with exist_ok=False that both picked runs/run (each before the other made it): the one that finds it
    locked by the other, live, takes the next name, as Ultralytics' increment_path passes over a folder that exists;
    with exist_ok=True it is refused."""
    from ultralytics.utils import DEFAULT_CFG

    from yolo_ckpt.errors import ConfigError
    from yolo_ckpt.train import run_dir

    (tmp_path / "run").mkdir()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        (tmp_path / "run" / LOCK_NAME).write_text(f"{live.pid}\n")
        picked = iter([tmp_path / "run"])  # the first pick: before the other run made the folder
        stock = run_dir.get_save_dir
        monkeypatch.setattr(run_dir, "get_save_dir", lambda args: next(picked, None) or stock(args))
        state, overrides = run_dir.claim_run_dir(DEFAULT_CFG, {"project": str(tmp_path), "name": "run"})
        assert overrides["save_dir"] == str(state.run_dir)  # what BaseTrainer.__init__ will take
        assert state.run_dir.parent == tmp_path and state.run_dir.name.startswith("run") and state.run_dir.name != "run"  # run-2
        assert (state.run_dir / LOCK_NAME).read_text() == f"{os.getpid()}\n"
        run_dir.unlock_run_dir(state.lock)
        assert not (state.run_dir / LOCK_NAME).exists() and (tmp_path / "run" / LOCK_NAME).read_text() == f"{live.pid}\n"
        with pytest.raises(ConfigError, match=f"is in use by a live yolo-ckpt run \\(pid {live.pid}"):
            run_dir.claim_run_dir(DEFAULT_CFG, {"project": str(tmp_path), "name": "run", "exist_ok": True})
    finally:
        live.kill()
        live.wait()
