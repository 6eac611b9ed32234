"""The suite never writes into ../shared: conftest's session hooks compare a manifest of the tree (paths, sizes,
mtimes, content of small files) at the start and end of the suite, on the xdist controller, and fail the session on
a change."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import SUBPROCESS_TIMEOUT_S
from manifest import manifest_changes, tree_manifest

TESTS = Path(__file__).resolve().parent


def test_manifest_sees_every_kind_of_write(tmp_path):
    """An added file, a removed one, and a small file rewritten at the same size with its mtime put back."""
    (tmp_path / "labels").mkdir()
    (tmp_path / "labels" / "a.txt").write_text("0 0.5 0.5 0.1 0.1\n")
    (tmp_path / "gone.txt").write_text("x")
    before = tree_manifest(tmp_path)
    assert manifest_changes(before, tree_manifest(tmp_path)) == []
    stat = (tmp_path / "labels" / "a.txt").stat()
    (tmp_path / "labels" / "a.txt").write_text("1 0.5 0.5 0.1 0.1\n")
    os.utime(tmp_path / "labels" / "a.txt", ns=(stat.st_atime_ns, stat.st_mtime_ns))
    (tmp_path / "labels" / "train.cache").write_bytes(b"cache")
    (tmp_path / "gone.txt").unlink()
    assert manifest_changes(before, tree_manifest(tmp_path)) == ["added: labels/train.cache", "removed: gone.txt", "changed: labels/a.txt"]


@pytest.mark.slow
def test_a_suite_that_writes_into_shared_fails(tmp_path):
    """This conftest in a checkout beside a shared/ folder, under 2 xdist workers: a test that writes there passes
    itself, and the session fails naming the file."""
    checkout = tmp_path / "checkout" / "tests"
    checkout.mkdir(parents=True)
    for name in ("conftest.py", "manifest.py"):
        shutil.copy(TESTS / name, checkout / name)
    (tmp_path / "shared" / "datasets").mkdir(parents=True)
    (checkout / "test_writes.py").write_text(
        "from conftest import SHARED\n\ndef test_writes():\n    (SHARED / 'datasets' / 'train.cache').write_text('x')\n\ndef "
        "test_other():\n    pass\n"
    )
    caches = [Path(os.environ[k]) for k in ("YOLO_CKPT_ESTIMATE_CACHE", "YOLO_CKPT_CACHE")]
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "-p", "no:cacheprovider", "-q", str(checkout)],
        capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S, cwd=tmp_path / "checkout",
    )
    assert all(c.is_dir() for c in caches)  # this session's caches, which the child inherited, are still there
    assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-3000:]
    assert (
        "2 passed" in run.stdout and f"the suite wrote into {tmp_path / 'shared'} (1 paths): added: datasets/train.cache" in run.stdout
    ), run.stdout[-3000:]
