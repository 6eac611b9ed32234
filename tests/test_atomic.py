"""Checkpoints a kill cannot corrupt (failure mode 31): last.pt is written atomically, so resume always works."""

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from ultralytics import YOLO

from yolo_ckpt import CheckpointDetectionTrainer
from yolo_ckpt.atomic import atomic_saves, atomic_write_bytes

# A training run that pauses inside its second save of last.pt (epoch 1), where the test kills it with SIGKILL.
# The pause is in os.fsync, after the bytes reached the temporary file and before os.replace; "half" truncates the
# temporary file to half first, as a kill in the middle of the write leaves it.
KILLED_RUN = textwrap.dedent(
    """
    import os, sys, time
    point, data, project = sys.argv[1:4]
    fsync, writes = os.fsync, []

    def paused_fsync(fd):
        fsync(fd)
        if ".last.pt." in os.readlink(f"/proc/self/fd/{fd}"):
            writes.append(fd)
            if len(writes) == 2:
                if point == "half":
                    os.ftruncate(fd, os.fstat(fd).st_size // 2)
                print("PAUSED", flush=True)
                time.sleep(600)

    os.fsync = paused_fsync
    from ultralytics import YOLO
    from yolo_ckpt import CheckpointDetectionTrainer
    YOLO("yolo11n.yaml").train(data=data, trainer=CheckpointDetectionTrainer, project=project, name="run", epochs=2,
                               batch=2, nbs=2, imgsz=32, workers=0, device="cpu", plots=False, val=False, seed=0,
                               recompute="all")
    """
)


def test_atomic_write_keeps_old_file_when_interrupted(tmp_path, monkeypatch):
    """An exception at any point of the write (here: in fsync, and in the write itself) leaves the old bytes and no
    temporary file; a completed write has exactly the new bytes."""
    target = tmp_path / "last.pt"
    target.write_bytes(b"old")
    for where in ("fsync", "replace"):
        def boom(*a, **k):
            raise KeyboardInterrupt(where)

        with monkeypatch.context() as m:
            m.setattr(os, where, boom)
            with pytest.raises(KeyboardInterrupt):
                atomic_write_bytes(target, b"new" * 1000)
        assert target.read_bytes() == b"old" and sorted(p.name for p in tmp_path.iterdir()) == ["last.pt"]
    assert atomic_write_bytes(target, b"new") == 3 and target.read_bytes() == b"new"


def test_atomic_saves_only_inside_the_folder(tmp_path, monkeypatch):
    """Inside the context, writes to the weights folder go through atomic_write_bytes, others do not."""
    calls = []
    monkeypatch.setattr("yolo_ckpt.atomic.atomic_write_bytes", lambda p, d: calls.append(Path(p).name) or len(d))
    (tmp_path / "weights").mkdir()
    with atomic_saves(tmp_path / "weights"):
        (tmp_path / "weights" / "last.pt").write_bytes(b"x")
        (tmp_path / "other.txt").write_bytes(b"y")
    (tmp_path / "weights" / "after.pt").write_bytes(b"z")
    assert calls == ["last.pt"] and (tmp_path / "other.txt").read_bytes() == b"y"


@pytest.mark.slow
@pytest.mark.parametrize("point", ["half", "written"])
def test_kill_during_save_resumes_from_last_complete_checkpoint(point, synthetic, tmp_path):
    """SIGKILL of a real training process while it writes epoch 1's last.pt: the file still holds epoch 0's complete
    checkpoint, and resume trains epoch 1 from it."""
    script = tmp_path / "run.py"
    script.write_text(KILLED_RUN)
    proc = subprocess.Popen([sys.executable, str(script), point, synthetic(), str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        for line in proc.stdout:
            if line.strip() == "PAUSED":
                break
        else:
            pytest.fail(f"the run ended (exit {proc.wait()}) without reaching its second save")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    last = tmp_path / "run" / "weights" / "last.pt"
    assert torch.load(last, weights_only=False)["epoch"] == 0  # complete, and the previous epoch's
    m = YOLO(last)
    m.train(resume=True, trainer=CheckpointDetectionTrainer)
    assert m.trainer.start_epoch == 1 and m.trainer.epoch == 1
    assert torch.load(last, weights_only=False)["epoch"] == -1  # the finished run's stripped checkpoint
