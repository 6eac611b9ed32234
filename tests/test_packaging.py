"""What yolo-ckpt ships and how a user reaches it: shipped matrices and policies by name or by path, and an installed
wheel that holds the bench runner as ``yolo_ckpt.bench`` and every shipped YAML as package data (a checkout on
``sys.path`` would mask missing files)."""

import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from yolo_ckpt.shipped import resolve_yaml, shipped

ROOT = Path(__file__).resolve().parents[1]


def test_shipped_by_name_or_path(tmp_path, monkeypatch):
    assert list(shipped("policies")) == ["full-resolution", "heavy-blocks"]
    assert {p.parent for p in shipped("bench").values()} == {ROOT / "cfg" / "bench"}  # this checkout's
    assert resolve_yaml("cpu-step", "bench", "matrix") == resolve_yaml("cpu-step.yaml", "bench", "matrix") == ROOT / "cfg" / "bench" / "cpu-step.yaml"
    monkeypatch.chdir(ROOT)
    assert resolve_yaml("cfg/bench/cpu-step.yaml", "bench", "matrix") == Path("cfg/bench/cpu-step.yaml")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "cpu-step.yaml").write_text("kind: step\n")
    assert resolve_yaml("cpu-step.yaml", "bench", "matrix") == Path("cpu-step.yaml")  # a file wins over the name
    with pytest.raises(FileNotFoundError, match=r"^cfg=heavy: no such file and no shipped file of that name; shipped: full-resolution, heavy-blocks$"):
        resolve_yaml("heavy", "policies", "cfg")
    with pytest.raises(FileNotFoundError, match="shipped: accuracy"):  # a missing path is not read as a name
        resolve_yaml("elsewhere/cpu-step.yaml", "bench", "matrix")
    with pytest.raises(ValueError, match="kind='matrix' is not valid; valid: bench, policies"):
        shipped("matrix")


@pytest.mark.slow
def test_wheel_ships_the_bench_and_its_yaml(tmp_path):
    source = tmp_path / "src"  # built from a copy: the build writes build/ and *.egg-info beside the sources
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for folder in ("yolo_ckpt", "benchmarks", "cfg"):
        shutil.copytree(ROOT / folder, source / folder, ignore=shutil.ignore_patterns("results", "__pycache__"))
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", str(source), "-w", str(tmp_path / "whl")], capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr[-3000:]
    (wheel,) = (tmp_path / "whl").glob("yolo_ckpt-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    runner = {f"yolo_ckpt/bench/{p.name}" for p in (ROOT / "benchmarks").glob("*.py")}
    yamls = {f"yolo_ckpt/cfg/{p.relative_to(ROOT / 'cfg')}" for p in (ROOT / "cfg").glob("*/*.yaml")}
    assert runner <= names and yamls <= names and "yolo_ckpt/cfg/default.yaml" in names
    assert {n.split("/")[0] for n in names if not n.startswith("yolo_ckpt-")} == {"yolo_ckpt"}  # one top-level package
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    script = textwrap.dedent(f"""
        import yolo_ckpt
        from yolo_ckpt.bench.matrix import load_matrix
        from yolo_ckpt.cli import main, parse_train_args
        site = {str(site)!r}
        assert yolo_ckpt.__file__.startswith(site), yolo_ckpt.__file__
        matrix = load_matrix("cpu-step")
        assert str(matrix.path).startswith(site) and matrix.cells, matrix.path
        assert parse_train_args(["cfg=heavy-blocks"])["recompute"] == "C3k2,SPPF,C2PSA"
        assert main(["bench", "matrix=nope"]) == 2
    """)
    out = tmp_path / "elsewhere"  # a folder outside the checkout, with only the unzipped wheel on the path
    out.mkdir()
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=out, env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin", "YOLO_OFFLINE": "1", "HOME": str(tmp_path)})
    assert run.returncode == 0, run.stderr[-3000:]
    assert "matrix=nope: no such file and no shipped file of that name; shipped: accuracy, cpu-step" in run.stderr
