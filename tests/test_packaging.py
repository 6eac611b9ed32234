"""What yolo-ckpt ships and how a user reaches it: shipped matrices and policies by name or by path, and an installed
wheel that holds the bench runner as ``yolo_ckpt.bench`` and every shipped YAML as package data (a checkout on
``sys.path`` would mask missing files)."""

import json
import shutil
import site
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import numpy as np
import pytest
import yaml
from helpers import SUBPROCESS_TIMEOUT_S

from yolo_ckpt.bench.cells import BUILT_IN_DATASETS
from yolo_ckpt.shipped import resolve_yaml, shipped

ROOT = Path(__file__).resolve().parents[1]


def test_shipped_by_name_or_path(tmp_path, monkeypatch):
    assert list(shipped("policies")) == ["full-resolution", "heavy-blocks"]
    assert {p.parent for p in shipped("bench").values()} == {ROOT / "yolo_ckpt" / "cfg" / "bench"}  # this checkout's
    assert (
        resolve_yaml("cpu-step", "bench", "matrix")
        == resolve_yaml("cpu-step.yaml", "bench", "matrix")
        == ROOT / "yolo_ckpt" / "cfg" / "bench" / "cpu-step.yaml"
    )
    monkeypatch.chdir(ROOT)
    assert resolve_yaml("yolo_ckpt/cfg/bench/cpu-step.yaml", "bench", "matrix") == Path("yolo_ckpt/cfg/bench/cpu-step.yaml")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "cpu-step.yaml").write_text("kind: step\n")
    assert resolve_yaml("cpu-step.yaml", "bench", "matrix") == Path("cpu-step.yaml")  # a file wins over the name
    with pytest.raises(
        FileNotFoundError, match=r"^cfg=heavy: no such file and no shipped file of that name; shipped: full-resolution, heavy-blocks$"
    ):
        resolve_yaml("heavy", "policies", "cfg")
    with pytest.raises(FileNotFoundError, match="shipped: accuracy"):  # a missing path is not read as a name
        resolve_yaml("elsewhere/cpu-step.yaml", "bench", "matrix")
    with pytest.raises(ValueError, match="kind='matrix' is not valid; valid: bench, policies"):
        shipped("matrix")


@pytest.mark.slow
def test_wheel_ships_the_bench_and_its_yaml(tmp_path):
    """The wheel (built without isolation, installed offline into a venv on the suite's interpreter's packages) holds the bench
    runner and every shipped YAML; from a folder outside the checkout every shipped matrix by name either would run
    (``dry=True``: checked whole, datasets found) or says why not in one line, exit 2: the real-data matrices name
    datasets that an installed matrix's ``datasets_dir`` cannot reach (it points into site-packages) until
    ``datasets=`` gives them; gpu's budget is a fraction of CUDA memory."""
    source = tmp_path / "src"  # built from a copy: the build writes build/ and *.egg-info beside the sources
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for folder in ("yolo_ckpt",):
        shutil.copytree(ROOT / folder, source / folder, ignore=shutil.ignore_patterns("results", "__pycache__"))
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", str(source), "-w", str(tmp_path / "whl")],
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
    )
    assert build.returncode == 0, build.stderr[-3000:]
    (wheel,) = (tmp_path / "whl").glob("yolo_ckpt-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    runner = {f"yolo_ckpt/bench/{p.name}" for p in (ROOT / "yolo_ckpt" / "bench").glob("*.py")}
    yamls = {p.relative_to(ROOT).as_posix() for p in (ROOT / "yolo_ckpt" / "cfg").rglob("*.yaml")}
    assert runner <= names and yamls <= names and "yolo_ckpt/cfg/default.yaml" in names
    assert {n.split("/")[0] for n in names if not n.startswith("yolo_ckpt-")} == {"yolo_ckpt"}  # one top-level package
    venv = tmp_path / "venv"  # the running interpreter's torch and Ultralytics; yolo-ckpt only from the wheel, offline
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=SUBPROCESS_TIMEOUT_S)
    python = venv / "bin" / "python"
    # the packages of the interpreter running the suite, a venv's or the system's, after the new venv's own: a .pth
    # (--system-site-packages reaches the base interpreter's, which from inside a venv lacks the venv's packages)
    site_packages = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], check=True,
                                   capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S).stdout.strip()
    added = "".join(f"import site; site.addsitedir({folder!r})\n" for folder in site.getsitepackages())  # their .pth files too
    (Path(site_packages) / "running-interpreter.pth").write_text(added)
    # offline; the dependencies are the running interpreter's (test_cli's test_console_script_and_dependencies_declared checks them)
    install = subprocess.run(
        # --ignore-installed: the system's yolo-ckpt (CI installs the checkout there) must not satisfy it
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-index", "--no-deps", "--ignore-installed"]
        + [str(wheel)],
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
    )
    assert install.returncode == 0, install.stderr[-3000:]
    shared = ROOT.parent / "shared" / "datasets"
    real = {  # the shipped matrices that name datasets beyond the built-in ones
        name
        for name, path in shipped("bench").items()
        if {d for block in yaml.safe_load(path.read_text())["grid"] for d in np.atleast_1d(block.get("dataset", "synthetic"))}
        - set(BUILT_IN_DATASETS)
    }
    assert real == {
        "accuracy", "equal-memory-bccd", "equal-memory-bccd-steps", "equal-memory-deeppcb", "equal-memory-deeppcb-steps",
        "real-data", "regime-monuseg", "regime-monuseg-steps", "small-objects-aerial",
    }
    script = textwrap.dedent(f"""
        import contextlib, io, json
        import yolo_ckpt
        from yolo_ckpt.bench.matrix_file import load_matrix
        from yolo_ckpt.cli import main
        from yolo_ckpt.cli.args import parse_train_args
        from yolo_ckpt.shipped import shipped
        venv = {str(venv)!r}
        assert yolo_ckpt.__file__.startswith(venv), yolo_ckpt.__file__
        matrix = load_matrix("cpu-step")
        assert str(matrix.path).startswith(venv) and matrix.cells, matrix.path
        assert parse_train_args(["cfg=heavy-blocks"])["recompute"] == "C3k2,SPPF,C2PSA"
        assert main(["bench", "matrix=nope"]) == 2
        results = {{}}
        for extra, names in (([], list(shipped("bench"))), (["datasets={shared}"], {sorted(real)!r} if {shared.is_dir()!r} else [])):
            for name in names:
                err = io.StringIO()
                with contextlib.redirect_stderr(err):
                    code = main(["bench", f"matrix={{name}}", "dry=True", "out=bench-out", *extra])
                errors = [line for line in err.getvalue().splitlines() if line.startswith("yolo-ckpt: error")]
                results[f"{{name}} {{' '.join(extra)}}".strip()] = [code, errors]
        print(json.dumps(results))
    """)
    out = tmp_path / "elsewhere"  # a folder outside the checkout
    out.mkdir()
    env = {"PATH": "/usr/bin:/bin", "YOLO_OFFLINE": "1", "HOME": str(tmp_path), "YOLO_CONFIG_DIR": str(tmp_path / "config")}
    run = subprocess.run([str(python), "-c", script], capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S, cwd=out, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "matrix=nope: no such file and no shipped file of that name; shipped: accuracy, cpu-step" in run.stderr
    results = json.loads(run.stdout.strip().splitlines()[-1])
    assert all((code == 0 and not errors) or (code == 2 and len(errors) == 1) for code, errors in results.values()), results
    assert not (out / "bench-out").exists()  # dry=True writes nothing
    for name in shipped("bench"):
        code, errors = results[name]
        if name in real:  # the one line names the three places it looked
            assert (
                code == 2
                and "datasets= (not given); the matrix's datasets_dir" in errors[0]
                and "Ultralytics' SETTINGS['datasets_dir']" in errors[0]
            ), errors
        elif name == "gpu":
            assert code == 2 and "is a fraction of CUDA memory and this machine has no CUDA device" in errors[0], errors
        else:
            assert code == 0, (name, errors)
        if name in real and shared.is_dir():  # given the shared datasets, they would run too
            assert results[f"{name} datasets={shared}"] == [0, []], results[f"{name} datasets={shared}"]
