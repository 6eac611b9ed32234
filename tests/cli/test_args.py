"""The one key=value parser (yolo_ckpt.cli.args): help and argument errors answered without importing torch, unknown
keys refused in every command and study, and the Ultralytics rules its first pass mirrors held equal to Ultralytics'."""

import subprocess
import sys
from pathlib import Path

import pytest
from helpers import SUBPROCESS_TIMEOUT_S
from hypothesis import given, settings, strategies as st

from yolo_ckpt.cli import main
from yolo_ckpt.cli.args import (
    TASKS,
    ULTRALYTICS_OLD_KEYS,
    check_words,
    listed,
    merge_equals,
    parse_keys,
    train_keys,
    ultralytics_keys,
)
from yolo_ckpt.cli.main import run_command

ROOT = Path(__file__).resolve().parents[2]
# argument errors of every kind, each answered before torch is imported: (words, the line's end)
BAD_WORDS = [
    (["bogus"], "unknown command 'bogus'"),
    (["plan", "imgsx=640", "memory_budget=1GB"], "'imgsx' is not a valid YOLO argument. Similar arguments are i.e. ['imgsz=640']."),
    (["profile", "imgsz="], "missing 'imgsz' value"),
    (["train", "segmnet"], "'segmnet' is neither a task nor a key"),
    (["train", "imgsz=[640"], "has an unmatched '[' or ']' bracket"),
    (["compare", "runs/a", "outt=x"], "unknown key 'outt' (did you mean 'out'?); compare takes out"),
    (["bench", "matirx=cpu-step"], "unknown key 'matirx' (did you mean 'matrix'?); bench takes matrix, out"),
    (["bench", "out=x"], "matrix= is required; bench takes matrix, out"),
]


def test_help_and_argument_errors_import_no_torch():
    """Issue 32: `yolo-ckpt help` and every argument error (unknown command, key=value syntax, unknown key) answer in
    one line, exit 2, with neither torch nor Ultralytics imported (importing yolo_ckpt.cli took 7.8 s, as torch does)."""
    code = (
        "import sys\nfrom yolo_ckpt.cli import main\n"
        f"codes = [main(['help'])] + [main(words) for words, _ in {BAD_WORDS!r}]\n"
        "print(codes, sorted(m for m in ('torch', 'ultralytics') if m in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=SUBPROCESS_TIMEOUT_S)
    out, err = result.stdout.splitlines(), result.stderr.splitlines()
    assert out[-1] == f"{[0] + [2] * len(BAD_WORDS)} []", result.stderr
    assert "usage: yolo-ckpt COMMAND" in out[0] and len(err) == len(BAD_WORDS), err
    for line, (_, end) in zip(err, BAD_WORDS):
        assert line.startswith("yolo-ckpt: ") and end in line, line


def test_python_m_cli_help_imports_no_torch():
    """``python -m yolo_ckpt.cli help``, the console script's path: no torch module among the imports it times."""
    result = subprocess.run([sys.executable, "-X", "importtime", "-m", "yolo_ckpt.cli", "help"], capture_output=True, text=True,
                            cwd=ROOT, timeout=SUBPROCESS_TIMEOUT_S)
    imported = {line.rsplit("|", 1)[-1].strip().split(".")[0] for line in result.stderr.splitlines() if line.startswith("import time:")}
    assert result.returncode == 0 and "usage: yolo-ckpt" in result.stdout
    assert "yolo_ckpt" in imported and not imported & {"torch", "ultralytics", "cv2", "pandas"}, sorted(imported)


@pytest.mark.parametrize(
    ("study", "words", "message"),
    [
        ("mechanism.soak", ["epoch=3"], "unknown key 'epoch' (did you mean 'epochs'?); benchmarks.mechanism.soak takes epochs, out"),
        (
            "dense_scenes.densest_mosaic",
            ["imgsz=512"],
            "data= is required; benchmarks.dense_scenes.densest_mosaic takes data, datasets, model, imgsz, batch, recompute, repeat, rank, "
            "objects, predictions, out",
        ),
        (
            "equal_memory.pilot_curve", ["run=x", "threads"],
            "'threads' is not a key=value word; benchmarks.equal_memory.pilot_curve takes run, threads, out",
        ),
        ("dense_scenes.densest_mosaic", ["data=x", "predictions=trained"], "predictions=trained: valid values are initial, overlapping"),
        ("dense_scenes.densest_mosaic", ["data=x", "rank=area"], "rank=area is not one of objects, foreground"),
        ("dense_scenes.densest_mosaic", ["data=x", "objects=0"], "objects=0: give a whole number of objects per image, at least 1"),
        ("memory_model.epoch_peaks", ["data=x", "predictions=trained"], "predictions=trained: valid values are initial, overlapping"),
        (
            "memory_model.breaker", ["case=detect-large"],
            "unknown key 'case' (did you mean 'cases'?); benchmarks.memory_model.breaker takes render, out, cases",
        ),
    ],
)
def test_a_study_refuses_an_unknown_key_in_one_line(study, words, message, capsys):
    """The studies in benchmarks/ parse with the one parser: an unknown key, a missing required key or a bare word is
    one line and exit 2, before the study starts (they took any key, and failed later with a KeyError or not at all)."""
    import importlib

    module = importlib.import_module(f"benchmarks.{study}")
    assert run_command(module.main, words, f"benchmarks.{study}") == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith(f"benchmarks.{study}: error: {message}"), err


@pytest.mark.slow
def test_python_m_a_study_exits_2():
    """``python -m benchmarks.mechanism.soak`` with an unknown key: exit 2, one line, nothing measured."""
    result = subprocess.run([sys.executable, "-m", "benchmarks.mechanism.soak", "epoch=3"], capture_output=True, text=True, cwd=ROOT,
                            timeout=SUBPROCESS_TIMEOUT_S)
    assert (result.returncode, result.stdout) == (2, "")
    message = "unknown key 'epoch' (did you mean 'epochs'?); benchmarks.mechanism.soak takes epochs, out"
    assert result.stderr.splitlines()[-1] == f"benchmarks.mechanism.soak: error: {message}"


def test_compare_and_bench_refuse_unknown_keys(tmp_path, capsys):
    """compare takes run folders and out=; bench its own keys and the settings of a matrix: any other key is refused,
    naming it, the close valid one and the valid ones (they read any key, and compare named none close)."""
    assert main(["compare", str(tmp_path), str(tmp_path), "outdir=x"]) == 2
    assert capsys.readouterr().err.splitlines() == ["yolo-ckpt: error: unknown key 'outdir' (did you mean 'out'?); compare takes out"]
    assert main(["bench", "matrix=cpu-step", "dry=True", "rerunn=True"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("yolo-ckpt: error: unknown key 'rerunn' (did you mean 'rerun'?); bench takes matrix")
    assert main(["bench", "matrix=cpu-step", "dry=True", "epoch=3"]) == 2  # no matrix takes it: refused before the matrix is read
    assert "unknown key 'epoch' (did you mean 'epochs'?)" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_run_command_turns_bad_input_into_one_line(capsys):
    """A study's main under run_command: its parse errors exit 2 in one line named after the study."""
    assert run_command(lambda argv: parse_keys(argv, ("out",), "benchmarks.x"), ["out=a", "b=1"], "benchmarks.x") == 2
    assert capsys.readouterr().err == "benchmarks.x: error: unknown key 'b'; benchmarks.x takes out\n"
    assert run_command(lambda argv: parse_keys(argv, ("out",), "benchmarks.x"), ["out=runs/a"], "benchmarks.x") == 0


def test_parse_keys_converts_values_as_ultralytics():
    words = ["epochs=30", "out=runs/x", "cases=a,b", "rerun=True"]
    assert parse_keys(words, ("epochs", "out", "cases", "rerun"), "x") == {"epochs": 30, "out": "runs/x", "cases": "a,b", "rerun": True}


def test_listed_reads_the_comma_lists_parse_keys_gives():
    """Ultralytics' parser turns ``sides=0.01,0.03`` into a tuple of floats and keeps ``cases=a,b`` a str: the studies'
    list keys (foreground_decomposition's sides=, breaker's cases=, ...) read both through listed()."""
    opts = parse_keys(["sides=0.01,0.03", "cases=a,b", "one=x", "cells=4"], ("sides", "cases", "one", "cells"), "x")
    assert [float(s) for s in listed(opts["sides"])] == [0.01, 0.03]
    assert listed(opts["cases"]) == ["a", "b"] and listed(opts["one"]) == ["x"] and listed(opts["cells"]) == ["4"]


# The Ultralytics rules the first pass mirrors (ultralytics/cfg/__init__.py), held equal to Ultralytics' own


def test_keys_and_tasks_are_ultralytics():
    from ultralytics.cfg import TASKS as ULTRALYTICS_TASKS
    from ultralytics.utils import DEFAULT_CFG_DICT

    assert ultralytics_keys() == DEFAULT_CFG_DICT and TASKS == ULTRALYTICS_TASKS


def test_old_keys_are_taken_by_ultralytics():
    """Every key the first pass lets through beside default.yaml's is one Ultralytics' check takes (renamed, dropped
    with a warning, or allowed)."""
    from ultralytics.cfg import check_dict_alignment
    from ultralytics.utils import DEFAULT_CFG_DICT

    for key in sorted(ULTRALYTICS_OLD_KEYS):
        check_dict_alignment(DEFAULT_CFG_DICT, {key: True})
        assert check_words([f"{key}=True"], train_keys(), TASKS) == [f"{key}=True"]


@pytest.mark.parametrize("key", ["imgsx", "recompte", "xyzzy", "lr"])
def test_unknown_key_worded_as_ultralytics(key):
    """One unknown key: Ultralytics' line (its similar keys), then where every valid key is listed."""
    from ultralytics.cfg import check_dict_alignment

    valid = train_keys()
    with pytest.raises(SyntaxError) as ours:
        check_words([f"{key}=1"], valid, TASKS)
    with pytest.raises(SyntaxError) as theirs:
        check_dict_alignment(valid, {key: 1})
    assert str(ours.value).startswith(str(theirs.value).strip())


WORDS = st.lists(st.one_of(st.sampled_from(["=", "[", "]", "imgsz", "imgsz=", "=640", "[3,", "640]", "a=[1,", "2]", "x", "b=c"]),
                           st.text(max_size=6)), max_size=6)


@settings(max_examples=300, deadline=None)
@given(WORDS)
def test_merge_equals_is_ultralytics(words):
    """merge_equals joins words as Ultralytics' merge_equals_args does, and raises where it raises (its IndexError
    on ['[', '='] a SyntaxError naming the '=')."""
    from ultralytics.cfg import merge_equals_args

    try:
        expected = merge_equals_args(list(words))
    except (SyntaxError, IndexError) as e:
        with pytest.raises(SyntaxError):
            merge_equals(words)
        if isinstance(e, SyntaxError):
            assert str(e) in str(pytest.raises(SyntaxError, merge_equals, words).value)
        return
    assert merge_equals(words) == expected
