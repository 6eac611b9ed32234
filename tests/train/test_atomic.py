"""Checkpoints a kill cannot corrupt (failure mode 31): last.pt is written atomically, so resume always works."""

import errno
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from helpers import logged_messages
from ultralytics import YOLO

from yolo_ckpt import CheckpointDetectionTrainer
from yolo_ckpt.cli import main
from yolo_ckpt.errors import FinishedRunError, NoRoomError
from yolo_ckpt.train.atomic import atomic_saves, atomic_write_bytes, remove_stale_temporaries
from yolo_ckpt.train.exact_resume import STATE_NAME

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
                               recompute="all", fraction=0.5, estimate=False)
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
    """Inside the context, writes to the weights folder go through atomic_write, others do not."""
    calls = []
    monkeypatch.setattr("yolo_ckpt.train.atomic.atomic_write", lambda p, write, in_place=None: calls.append(Path(p).name))
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
    assert len(list(last.parent.glob(".last.pt.*.tmp"))) == 1  # the killed save's temporary copy
    m = YOLO(last)
    m.train(resume=True, trainer=CheckpointDetectionTrainer)
    assert m.trainer.start_epoch == 1 and m.trainer.epoch == 1
    assert torch.load(last, weights_only=False)["epoch"] == -1  # the finished run's stripped checkpoint
    assert sorted(p.name for p in last.parent.iterdir()) == ["best.pt", "last.pt"]  # the resume removed it


# A training run killed inside the final strip_optimizer rewrite of last.pt or best.pt (BaseTrainer.final_eval): the
# patched torch.save writes half of the stripped checkpoint into whatever file it is given, then SIGKILLs its process.
KILLED_STRIP = textwrap.dedent(
    """
    import io, os, signal, sys
    import torch
    target, data, project = sys.argv[1:4]
    save = torch.save

    def killing_save(obj, f, *args, **kwargs):
        name = str(f) if isinstance(f, (str, os.PathLike)) else os.readlink(f"/proc/self/fd/{f.fileno()}") if hasattr(f, "name") else ""
        if isinstance(obj, dict) and obj.get("epoch") == -1 and os.path.basename(name).lstrip(".").startswith(target):
            buffer = io.BytesIO()
            save(obj, buffer, *args, **kwargs)
            file = open(f, "wb") if isinstance(f, (str, os.PathLike)) else f
            file.write(buffer.getvalue()[: len(buffer.getvalue()) // 2])
            file.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        return save(obj, f, *args, **kwargs)

    torch.save = killing_save
    from ultralytics import YOLO
    from yolo_ckpt import CheckpointDetectionTrainer
    YOLO("yolo11n.yaml").train(data=data, trainer=CheckpointDetectionTrainer, project=project, name="run", epochs=1,
                               batch=2, nbs=2, imgsz=32, workers=0, device="cpu", plots=False, seed=0, fraction=0.5,
                               estimate=False)
    """
)


@pytest.mark.slow
@pytest.mark.parametrize("target", ["last.pt", "best.pt"])
def test_kill_inside_the_final_rewrite_leaves_loadable_checkpoints(target, synthetic, tmp_path, capfd):
    """SIGKILL inside strip_optimizer's rewrite of last.pt, or of best.pt (stock: 3 of 3 and 4 of 4 such kills left a
    truncated file): both files still load as Ultralytics checkpoints, the killed file holds the epoch's complete
    checkpoint. last.pt killed: it still holds its optimizer state at the run's last epoch, so resume (Python) is
    refused saying that, as a FinishedRunError (catchable as stock's AssertionError), and the CLI's resume finishes the
    run's end (both files stripped, best.pt validated, the temporary copy removed); best.pt killed: last.pt is the
    finished run's stripped checkpoint, and a new run of the folder starts from best.pt and removes the temporary copy."""
    script = tmp_path / "run.py"
    script.write_text(KILLED_STRIP)
    proc = subprocess.run([sys.executable, str(script), target, synthetic(), str(tmp_path)], capture_output=True, text=True, timeout=900)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    weights = tmp_path / "run" / "weights"
    ckpts = {name: torch.load(weights / name, weights_only=False) for name in ("last.pt", "best.pt")}
    assert ckpts[target]["epoch"] == 0 and ckpts[target]["optimizer"] is not None  # the complete, unstripped save
    if target == "best.pt":  # last.pt's strip came first and completed
        assert ckpts["last.pt"]["epoch"] == -1
    assert len(list(weights.glob(f".{target}.*.tmp"))) == 1  # the half-written temporary copy, beside the intact file
    if target == "last.pt":  # refused before any write (the key check), saying what is true; the refusal tidies
        with pytest.raises(AssertionError) as refused:
            YOLO(weights / "last.pt").train(resume=True, trainer=CheckpointDetectionTrainer)
        assert isinstance(refused.value, FinishedRunError) and str(refused.value) == (
            f"resume: the run {tmp_path / 'run'} trained all its 1 epochs and was stopped in its end ({weights / 'last.pt'} still "
            "holds its optimizer state; the final validation and strip did not run): no epoch is left to resume; finish it: "
            f"yolo-ckpt train resume model={weights / 'last.pt'}"
        )
        assert sorted(p.name for p in weights.iterdir()) == ["best.pt", "last.pt"]  # the temporary copy removed
        capfd.readouterr()
        assert main(["train", "resume", f"model={weights / 'last.pt'}"]) == 0
        assert capfd.readouterr().err.strip().splitlines()[-1] == (
            f"yolo-ckpt: resume: the run {tmp_path / 'run'} had trained all its 1 epochs; its end, stopped by a kill, is done: "
            f"last.pt and best.pt stripped, best.pt validated, {tmp_path / 'run' / 'ckpt_report.json'} written (no memory probe)"
        )
        assert [torch.load(weights / n, weights_only=False)["epoch"] for n in ("last.pt", "best.pt")] == [-1, -1]
        assert sorted(p.name for p in weights.iterdir()) == ["best.pt", "last.pt"]
    else:  # last.pt is the finished run's stripped checkpoint: a new run of that folder, from best.pt
        YOLO(weights / "best.pt").train(data=synthetic(), trainer=CheckpointDetectionTrainer, project=str(tmp_path), name="run",
                                        exist_ok=True, epochs=1, batch=2, nbs=2, imgsz=32, workers=0, device="cpu", plots=False, val=False,
                                        fraction=0.5, estimate=False)
        assert sorted(p.name for p in weights.iterdir()) == ["best.pt", "last.pt"]  # the temporary copy removed


@pytest.mark.parametrize("umask", [0o022, 0o002], ids=["umask022", "umask002"])
def test_saved_files_get_the_mode_stock_gives_them(umask, tmp_path):
    """Under umask 022 and 002, a new file written through atomic_saves (Path.write_bytes as save_model, torch.save
    as strip_optimizer) or atomic_write_bytes gets the mode a stock write gives it (not mkstemp's 0600), and a
    replaced file keeps its own mode."""
    old = os.umask(umask)
    try:
        (tmp_path / "stock").mkdir()
        (tmp_path / "stock" / "new.pt").write_bytes(b"x")
        stock = (tmp_path / "stock" / "new.pt").stat().st_mode & 0o777
        folder = tmp_path / "weights"
        folder.mkdir()
        (folder / "kept.pt").write_bytes(b"old")
        (folder / "kept.pt").chmod(0o640)
        with atomic_saves(folder):
            (folder / "last.pt").write_bytes(b"new")
            torch.save({"epoch": -1}, folder / "best.pt")
            torch.save({"epoch": -1}, folder / "kept.pt")
        atomic_write_bytes(folder / "args.yaml", b"a: 1\n")
    finally:
        os.umask(old)
    assert stock == 0o666 & ~umask
    modes = {p.name: p.stat().st_mode & 0o777 for p in folder.iterdir()}
    assert modes == {"last.pt": stock, "best.pt": stock, "args.yaml": stock, "kept.pt": 0o640}
    assert torch.load(folder / "kept.pt")["epoch"] == -1


@pytest.mark.slow
def test_a_disk_without_room_for_two_checkpoints_finishes_the_run(synthetic, tmp_path, monkeypatch):
    """A disk that holds one checkpoint but not two (simulated: ENOSPC while the temporary copy of a file that
    exists is synced): every save after the first falls back to stock's in-place write with one warning line each,
    but the exact resume state's, removed with its own line; the run finishes as stock does (both epochs, stripped
    last.pt and best.pt), and no temporary file is left."""
    fsync, refused = os.fsync, []

    def full_disk_fsync(fd):
        tmp = Path(os.readlink(f"/proc/self/fd/{fd}"))
        target = tmp.parent / tmp.name[1:].rsplit(".", 2)[0]  # .last.pt.XXXXXXXX.tmp -> last.pt
        if tmp.name.endswith(".tmp") and target.exists():
            refused.append(target.name)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return fsync(fd)

    monkeypatch.setattr(os, "fsync", full_disk_fsync)
    with logged_messages() as messages:
        YOLO("yolo11n.yaml").train(data=synthetic(), trainer=CheckpointDetectionTrainer, project=str(tmp_path), name="run",
                                   epochs=2, batch=2, nbs=2, imgsz=32, workers=0, device="cpu", plots=False, val=False, seed=0,
                                   fraction=0.5, estimate=False)
    weights = tmp_path / "run" / "weights"
    assert sorted(p.name for p in weights.iterdir()) == ["best.pt", "last.pt"]
    assert (
        torch.load(weights / "last.pt", weights_only=False)["epoch"] == -1
        and torch.load(weights / "best.pt", weights_only=False)["epoch"] == -1
    )
    warnings = [m for m in messages if "no room for an atomic save's temporary copy" in m]
    removed = [m for m in messages if f"no room for {STATE_NAME}" in m]  # no in-place write: removed, its resume stock's
    assert refused and len(warnings) + len(removed) == len(refused) == refused.count(STATE_NAME) + len(warnings)
    assert {"last.pt", "best.pt", STATE_NAME} <= set(refused) and len(removed) == 1


def test_no_room_without_an_earlier_file_leaves_no_torn_file(tmp_path, monkeypatch):
    """The disk holds no temporary copy (ENOSPC as it is synced, after its bytes were written): with no earlier file
    nothing is left (stock's in-place write would fail the same way halfway, a torn last.pt), and NoRoomError's one
    line says the bytes the save needs and the disk's free bytes; with an earlier file whose room does not hold the new
    content either (a disk with 0 bytes free), the earlier file is kept as it was."""
    fsync = os.fsync

    def full_disk_fsync(fd):
        if os.readlink(f"/proc/self/fd/{fd}").endswith(".tmp"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return fsync(fd)

    monkeypatch.setattr(os, "fsync", full_disk_fsync)
    monkeypatch.setattr(os, "statvfs", lambda path: os.statvfs_result((4096, 4096, 100, 0, 0, 10, 0, 0, 0, 255)))
    folder = tmp_path / "weights"
    folder.mkdir()
    data = b"x" * 3000
    with atomic_saves(folder), pytest.raises(NoRoomError) as raised:
        (folder / "last.pt").write_bytes(data)
    assert raised.value.errno == errno.ENOSPC and list(folder.iterdir()) == []
    assert str(raised.value) == (
        f"{folder / 'last.pt'}: no room to save it ({os.strerror(errno.ENOSPC)}): the save needs 0.0 MiB (3000 bytes), "
        "0.0 MiB (0 bytes) free on its disk; no last.pt was written"
    )
    (folder / "best.pt").write_bytes(b"old")
    with atomic_saves(folder), pytest.raises(NoRoomError, match=r"needs 0\.0 MiB \(3000 bytes\).*; best.pt keeps its previous content$"):
        (folder / "best.pt").write_bytes(data)
    assert [p.name for p in folder.iterdir()] == ["best.pt"] and (folder / "best.pt").read_bytes() == b"old"


def test_a_file_size_limit_leaves_every_checkpoint_loadable_or_absent(tmp_path):
    """Under a real file-size limit (RLIMIT_FSIZE, ``ulimit -f``) smaller than the checkpoint: the first save of
    last.pt (torch.save, as strip_optimizer writes) leaves no file, a save over an earlier best.pt (Path.write_bytes,
    as save_model writes) keeps it loadable (no in-place write: it would hit the same limit and tear the file); each
    says the bytes the save needs."""
    import io
    import resource

    folder = tmp_path / "weights"
    folder.mkdir()
    ckpt = {"epoch": 0, "model": torch.zeros(100_000)}
    buffer = io.BytesIO()
    torch.save(ckpt, buffer)
    size = len(buffer.getvalue())
    torch.save({"epoch": -1}, folder / "best.pt")
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (size // 2, hard))  # Python ignores SIGXFSZ: the write gets EFBIG
    try:
        errors = []
        for name, save in (("last.pt", lambda c, f: torch.save(c, f)), ("best.pt", lambda c, f: f.write_bytes(buffer.getvalue()))):
            with atomic_saves(folder), pytest.raises(NoRoomError) as raised:
                save(ckpt, folder / name)  # torch.save: ~3.5 s, Ultralytics' patched torch.save retries 3 times
            errors.append(raised.value)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert [e.errno for e in errors] == [errno.EFBIG, errno.EFBIG]
    limit = f"{size // 2 / 2**20:.1f} MiB ({size // 2} bytes)"
    assert str(errors[0]) == (
        f"{folder / 'last.pt'}: no room to save it ({os.strerror(errno.EFBIG)}): the save needs {size / 2**20:.1f} MiB ({size} bytes), "
        f"the file-size limit (ulimit -f) is {limit}; no last.pt was written"
    )
    assert str(errors[1]).endswith("best.pt keeps its previous content")
    assert [p.name for p in folder.iterdir()] == ["best.pt"] and torch.load(folder / "best.pt") == {"epoch": -1}


def test_stale_temporaries_are_removed_but_not_a_live_writers(tmp_path):
    """remove_stale_temporaries removes a killed save's temporary copies (no writer holds them) and spares one that a
    live atomic_write holds locked; other files stay."""
    import fcntl

    stale, live, other = (tmp_path / n for n in (".last.pt.abcd1234.tmp", ".best.pt.efgh5678.tmp", "notes.tmp"))
    for p in (stale, live, other):
        p.write_bytes(b"x")
    with open(live, "rb") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)  # as atomic_write holds it while it writes
        assert remove_stale_temporaries(tmp_path) == [stale]
    assert sorted(p.name for p in tmp_path.iterdir()) == [live.name, other.name]
    assert remove_stale_temporaries(tmp_path) == [live]  # its writer gone (the lock released): stale now
