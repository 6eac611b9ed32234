"""Issue 47: every committed result is indexed, tied to a commit, reproducible by the command its record gives, and
its status agrees with git history (benchmarks/results/index.yaml, each folder's record.json)."""

import importlib.util
import json
import re
import shlex
import subprocess

import pytest

from benchmarks import results_index
from yolo_ckpt.bench.results_io import LEG, RECORD, dataset_yaml, git_state, provenance, recorded_command
from yolo_ckpt.cli.args import parse_keys, parse_train_args
from yolo_ckpt.cli.bench import bench_keys
from yolo_ckpt.cli.run_setup import estimate_keys
from yolo_ckpt.shipped import resolve_yaml

INDEX = results_index.load()
FOLDERS = results_index.folders()
RECORD_KEYS = {"commit", "commit_inferred", "dirty", "date", "machine", "versions", "seeds", "command"}
ABSOLUTE_OR_CLIMBING = re.compile(r"(?<![\w.$-])(/(?:tmp|work|root|home|Users|mnt|data)/|[A-Za-z]:\\\\|\.\./)")


def record(folder: str) -> dict:
    return json.loads((results_index.RESULTS / folder / RECORD).read_text())


def test_every_results_folder_is_indexed():
    """Every folder of benchmarks/results/ holds a record.json and has an index entry, and the index names no other."""
    on_disk = sorted(p.name for p in results_index.RESULTS.iterdir() if p.is_dir())
    assert FOLDERS == on_disk, f"folders without {RECORD}: {sorted(set(on_disk) - set(FOLDERS))}"
    older = sorted(p.relative_to(results_index.RESULTS).as_posix() for name in ("provenance.json", "result.json")
                   for p in results_index.RESULTS.glob(f"*/{name}"))
    assert not older, f"one record file per folder, {RECORD}; fold these into it: {older}"
    unindexed, absent = sorted(set(FOLDERS) - set(INDEX)), sorted(set(INDEX) - set(FOLDERS))
    assert not unindexed and not absent, f"not indexed: {unindexed}; indexed but absent: {absent}"


@pytest.mark.parametrize("folder", FOLDERS)
def test_index_entry_is_whole_and_true(folder):
    """Each entry names a question of the page, a study file or matrix that exists, measured modules that exist,
    the README and docs pages that cite it (equal to a grep of them), its quality and a status of the schema."""
    entry = INDEX[folder]
    assert entry["question"] in results_index.QUESTIONS and entry["answers"].strip() and entry["quality"].strip()
    assert ("study" in entry) != ("matrix" in entry), "an entry names a study or a matrix"
    if "study" in entry and entry["study"].startswith("benchmarks/"):
        assert (results_index.ROOT / entry["study"]).is_file(), entry["study"]
    assert entry["measures"] and all((results_index.ROOT / p).exists() for p in entry["measures"]), entry["measures"]
    cited = results_index.citations().get(folder, [])
    assert entry["cited_in"] == cited, f"{folder}: cited_in: {entry['cited_in']}, a grep of README.md and docs/ finds {cited}"
    status = entry["status"]
    assert status == "current" or (isinstance(status, dict) and len(status) == 1 and set(status) <= {"stale", "superseded_by", "holds"})
    if isinstance(status, dict) and "superseded_by" in status:
        assert status["superseded_by"] in INDEX


@pytest.mark.parametrize("folder", FOLDERS)
def test_record_has_the_schema_and_no_machine_path(folder):
    """One schema for all: commit (40 hex, or None outside a git checkout), whether inferred, dirty, date, machine,
    versions, seeds, command; no absolute or climbing path anywhere in the record, the figures' files or matrix.yaml."""
    rec = record(folder)
    assert RECORD_KEYS <= set(rec), f"missing {RECORD_KEYS - set(rec)}"
    assert rec["commit"] is None or re.fullmatch(r"[0-9a-f]{40}", rec["commit"])
    assert isinstance(rec["commit_inferred"], bool) and rec["dirty"] in (True, False, None) and rec["seeds"]
    for leg in rec.get("earlier_runs", []):
        assert set(leg) == set(LEG)
    for path in (results_index.RESULTS / folder).iterdir():
        if path.suffix in {".json", ".md", ".csv", ".yaml"}:
            hit = ABSOLUTE_OR_CLIMBING.search(path.read_text())
            assert hit is None, f"{path.name}: a path of the machine that ran it: ...{path.read_text()[hit.start() - 40:hit.end() + 40]}..."


def _module(words: list[str]) -> str:
    """The module a recorded command runs: python -m's, or the CLI's for yolo-ckpt."""
    return words[2] if words[:2] == ["python", "-m"] else "yolo_ckpt.cli.main"


@pytest.mark.parametrize("folder", FOLDERS)
def test_recorded_command_imports_and_parses(folder):
    """The record's command names a module that exists and keys its own parser takes (the study's KEYS through
    parse_keys; yolo-ckpt bench's and plan's through the CLI's parsers), with any matrix file or name that resolves."""
    words = shlex.split(record(folder)["command"])
    module = _module(words)
    assert importlib.util.find_spec(module) is not None, f"no module {module}"
    if words[0] == "yolo-ckpt":
        command, args = words[1], words[2:]
        if command == "bench":
            opts = parse_keys(args, bench_keys(), "bench", required=("matrix",))
            assert resolve_yaml(opts["matrix"], "bench", "matrix").is_file()  # a shipped name or a repository file
        else:
            parse_train_args(args, estimate_keys(command))
    else:
        study = importlib.import_module(module)
        parse_keys(words[3:], study.KEYS, module)


def _history_available() -> str | None:
    """Why the history check cannot run here, or None."""
    try:
        if results_index.git("rev-parse", "--is-shallow-repository") == "true":
            return "a shallow clone: git log cannot tell which commits changed the measured modules (git fetch --unshallow)"
    except (OSError, subprocess.CalledProcessError):
        return "not a git checkout"
    return None


@pytest.mark.parametrize("folder", FOLDERS)
def test_status_agrees_with_history(folder):
    """A result marked current measures code that is the same at HEAD as at its record's commit (docstrings and comments
    aside); one marked stale names a commit after its own that changed that code; one that holds cites a later commit
    or re-measured folder after which it did not change. ``python -m benchmarks.results_index`` prints the statuses
    the history gives."""
    if reason := _history_available():
        pytest.skip(reason)
    rec, entry = record(folder), INDEX[folder]
    if rec["commit"] is None:
        pytest.fail("a committed result without a commit")
    status, measures = entry["status"], entry["measures"]
    if status == "current":
        assert not results_index.code_changed(rec["commit"], "HEAD", measures), (
            f"{folder}: marked current, but the code of {measures} changed after {rec['commit'][:12]}: "
            f"python -m benchmarks.results_index gives its status"
        )
    elif "stale" in status:
        cited, later = results_index.git("rev-parse", str(status["stale"])), results_index.git("rev-list", f"{rec['commit']}..HEAD").split()
        assert cited in later and results_index.code_changed(f"{cited}^", cited, measures), (
            f"{folder}: {status['stale']} changed none of {measures} after it"
        )
    elif "holds" in status:
        cited = str(status["holds"])
        commit = record(cited)["commit"] if cited in INDEX else results_index.git("rev-parse", cited)
        assert not results_index.code_changed(commit, "HEAD", measures), f"{folder}: the code changed after {cited} too"


def test_a_result_that_holds_turns_stale_when_its_code_changes_later():
    """``holds: <commit>`` stays while the code it measures is unchanged after that commit, and the history gives
    ``stale`` from the first later commit that changed it: fake_rules.py changed at c6b87a8 (16-bit shape rules) after
    b116a71, and never after HEAD."""
    if reason := _history_available():
        pytest.skip(reason)
    measures = ["yolo_ckpt/memory/fake_rules.py"]
    folder = "estimate-accuracy-high-resolution-all"
    kept = {"holds": results_index.git("rev-parse", "HEAD")[:12]}
    assert results_index.history_status(folder, {"measures": measures, "status": kept}) == kept
    assert results_index.history_status(folder, {"measures": measures, "status": {"holds": "b116a71f4eb4"}}) == {"stale": "c6b87a8195b7"}


def test_history_follows_a_moved_module():
    """A module moved since a record keeps its history: the pilot study, benchmarks/pilot_curve.py at its record's
    commit, is benchmarks/equal_memory/pilot_curve.py now (issue 47), and the history check reads its code there under
    the old name; a path that never existed has no code."""
    if reason := _history_available():
        pytest.skip(reason)
    commit, path = record("accuracy-pilot-deeppcb")["commit"], "benchmarks/equal_memory/pilot_curve.py"
    assert results_index.former_path(commit, path) == "benchmarks/pilot_curve.py"
    assert results_index.former_path("HEAD", path) == path
    assert results_index.code_of(commit, path) == results_index.code_of(commit, "benchmarks/pilot_curve.py") is not None
    assert results_index.code_of(commit, "benchmarks/no_such_study.py") is None


def test_record_writer_ties_a_run_to_its_commit(tmp_path):
    """The writer records git rev-parse HEAD and git status of this checkout; None outside a git checkout; the command
    with paths inside the repository made relative and the datasets= root named $DATASETS."""
    state = git_state()
    if state["commit"] is not None:
        assert state["commit"] == results_index.git("rev-parse", "HEAD") and isinstance(state["dirty"], bool)
    assert git_state(tmp_path) == {"commit": None, "commit_inferred": False, "dirty": None}
    inside = results_index.ROOT / "benchmarks" / "results" / "x"
    assert recorded_command(["python -m benchmarks.mechanism.soak", f"out={inside}", "datasets=/data/sets", "epochs=3"]) == (
        "python -m benchmarks.mechanism.soak out=benchmarks/results/x datasets=$DATASETS epochs=3"
    )
    assert dataset_yaml("monuseg/data.yaml", "/data/sets") == "/data/sets/monuseg/data.yaml"  # a study's data= against datasets=
    assert dataset_yaml("/elsewhere/data.yaml", "/data/sets") == dataset_yaml("/elsewhere/data.yaml") == "/elsewhere/data.yaml"
    rec = provenance(["python -m benchmarks.mechanism.soak", "epochs=3"], seeds=[7])
    assert RECORD_KEYS <= set(rec) and rec["seeds"] == [7] and rec["commit"] == state["commit"]


REPRODUCED = "chunked-assigner-estimate-preds"  # the cheapest committed result: ~20 CPU s on one thread (130 s wall on a loaded host)


@pytest.mark.slow
def test_a_committed_result_reproduces_from_its_record(tmp_path, one_thread):
    """The command of a record, rerun into a fresh out= (never the committed folder), gives the committed figures: the
    measured live-tensor bytes within 2% (the loss's bytes move by up to 1.4% with the assigner's order of work), the
    step peak within 0.1%. The estimates are compared only while the index marks the result current: a stale one names
    the commit that changed the estimate since."""
    rec = record(REPRODUCED)
    words = shlex.split(rec["command"])
    study = importlib.import_module(_module(words))
    args = [w for w in words[3:] if not w.startswith("out=")] + [f"out={tmp_path / 'out'}"]
    again = study.main(args)
    assert json.loads((tmp_path / "out" / RECORD).read_text())["rows"] == again["rows"]
    estimates = ("estimated_peak_bytes", "estimated_loss_bytes") if INDEX[REPRODUCED]["status"] == "current" else ()
    for committed, rerun in zip(rec["rows"], again["rows"], strict=True):
        assert rerun["measured_peak_bytes"] == pytest.approx(committed["measured_peak_bytes"], rel=1e-3)
        for key in ("measured_loss_bytes", "measured_loss_phase_bytes", *estimates):
            assert rerun[key] == pytest.approx(committed[key], rel=0.02), (committed["objects"], key)
