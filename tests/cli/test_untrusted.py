"""Untrusted files run no more often than stock makes them run: a crafted .pt (code on unpickling) is unpickled once
per command, as `yolo train` unpickles it once; plan and profile never run a data.yaml's download: code."""

from pathlib import Path

import pytest
import torch
import yaml
from helpers import tiny_yaml
from ultralytics import YOLO

from yolo_ckpt.cli import main


class _Tally:
    """Appends a line to ``path`` each time it is unpickled (what a crafted checkpoint could do)."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return exec, (f"open({self.path!r}, 'a').write('unpickled\\n')",)


@pytest.fixture(scope="module")
def crafted(tmp_path_factory):
    """A loadable Ultralytics checkpoint (of a small detection model: the commands' fake passes cost per op) that
    tallies its unpickles in ``tally.txt`` beside it."""
    folder = tmp_path_factory.mktemp("crafted")
    yolo = YOLO(tiny_yaml(folder))
    path = folder / "crafted.pt"
    torch.save({"model": yolo.model, "train_args": {}, "date": None, "version": None, "tally": _Tally(folder / "tally.txt")}, path)
    return path, folder / "tally.txt"


def _unpickles(tally: Path) -> int:
    n = len(tally.read_text().splitlines()) if tally.exists() else 0
    tally.unlink(missing_ok=True)
    return n


@pytest.mark.parametrize("command", ["plan", "profile"])
def test_plan_and_profile_unpickle_a_pt_once(command, crafted):
    path, tally = crafted
    _unpickles(tally)
    # plan: a budget nothing fits, so that no policy's largest imgsz or batch is searched (the fake passes that check them);
    # it refuses, exit 2, as train does (issue 43), after loading the model once
    keys = [f"model={path}", "imgsz=64", "batch=1", "device=cpu", "format=json"] + (["memory_budget=1MB"] if command == "plan" else [])
    assert main([command, *keys]) == (2 if command == "plan" else 0)
    assert _unpickles(tally) == 1


@pytest.mark.slow
def test_train_unpickles_a_pt_once_as_stock(crafted, synthetic, tmp_path):
    """recompute=all on a .pt: the policy is checked against the loaded model, not by unpickling the file again."""
    path, tally = crafted
    _unpickles(tally)
    keys = [f"model={path}", f"data={synthetic()}", "epochs=1", "imgsz=64", "batch=2", "device=cpu", "recompute=all",
            "plots=False", "val=False", "estimate=False", f"project={tmp_path}", "name=run"]
    assert main(["train", *keys]) == 0
    assert _unpickles(tally) == 1


def test_plan_never_runs_a_datasets_download(tmp_path, capsys):
    """A data.yaml whose images are not on disk and whose download: is Python: plan says so in one line, runs nothing."""
    marker = tmp_path / "downloaded"
    data = tmp_path / "data.yaml"
    data.write_text(yaml.safe_dump({"path": str(tmp_path / "nowhere"), "train": "images/train", "val": "images/val", "names": {0: "a"},
                                    "download": f"open({str(marker)!r}, 'w').write('ran')"}))
    assert main(["plan", f"data={data}", "imgsz=64", "batch=1", "device=cpu", "memory_budget=1GB"]) == 2
    ours = [line for line in capsys.readouterr().err.splitlines() if line.startswith("yolo-ckpt")]  # not the test runner's log lines
    assert len(ours) == 1 and ours[0].startswith("yolo-ckpt: error: data=") and "is not on disk; profile and plan never download" in ours[0]
    assert not marker.exists()


def test_only_the_console_handlers_move_to_stderr(tmp_path, capsys):
    """profile and plan send Ultralytics' console log to stderr; a log file on its logger (or pytest >= 9.2's capture
    handler, which made the test above see 'INFO ultralytics:...' lines on stderr) keeps writing where it wrote."""
    import logging

    from ultralytics.utils import LOGGER

    from yolo_ckpt.cli.console import diagnostics_to_stderr as _diagnostics_to_stderr

    log = logging.FileHandler(tmp_path / "log.txt")
    LOGGER.addHandler(log)
    try:
        with _diagnostics_to_stderr():
            LOGGER.info("to the file and stderr")
    finally:
        LOGGER.removeHandler(log)
        log.close()
    assert (tmp_path / "log.txt").read_text() == "to the file and stderr\n"
    out, err = capsys.readouterr()
    assert out == "" and "to the file and stderr" in err
