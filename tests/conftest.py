"""Shared fixtures: offline Ultralytics, synthetic datasets in a session cache (one for all xdist workers), training
runs shared by the tests that only read them, the shared real datasets."""

import os
import tempfile

os.environ["YOLO_OFFLINE"] = "1"  # nothing downloads: no weights, fonts, AMP-check models or datasets
MADE_CACHES = []  # the caches this process made: the session that made them removes them, never another's
if not os.environ.get("PYTEST_XDIST_WORKER"):
    # One estimate cache for the session, made on the controller and inherited by the xdist workers: the loss
    # calibrations and fake passes of the same model and step are computed once (the trainers' set-up estimates
    # repeat them run after run). No test patches the estimate, but tests/memory/test_estimate_cache.py, which uses
    # a folder of its own; none is read from the user's cache.
    os.environ["YOLO_CKPT_ESTIMATE_CACHE"] = tempfile.mkdtemp(prefix="yolo-ckpt-test-estimates-")
    # One cache of the built-in synthetic datasets, the same way: each is generated once per session, not once per
    # worker (a few seconds each; two workers that need one at once both write it, and the first rename wins).
    os.environ["YOLO_CKPT_CACHE"] = tempfile.mkdtemp(prefix="yolo-ckpt-test-cache-")
    MADE_CACHES += [os.environ["YOLO_CKPT_ESTIMATE_CACHE"], os.environ["YOLO_CKPT_CACHE"]]

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
SHARED_DATASETS = SHARED / "datasets"
SHARED_BEFORE = pytest.StashKey[dict]()


def pytest_configure(config):
    """Under xdist, each worker gets its share of the cores as torch's intra-op threads (inherited by the workers and
    the subprocesses they start): two workers of two threads each on two cores spin against each other (the suite ran
    ~1.4x slower). Bit-equality comparisons are always between runs of one process, under one setting."""
    workers = getattr(config.option, "numprocesses", None)
    if isinstance(workers, int) and workers > 1 and not hasattr(config, "workerinput"):
        os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // workers)))


def pytest_sessionstart(session):
    """The manifest of ../shared at the start of the suite (on the controller under xdist, whose workers share the
    tree), to prove at the end that no test wrote there: tests copy what they train on."""
    if not hasattr(session.config, "workerinput") and SHARED.is_dir():
        from manifest import tree_manifest

        session.config.stash[SHARED_BEFORE] = tree_manifest(SHARED)


def pytest_sessionfinish(session, exitstatus):
    """Fail the session when ../shared changed during it, naming what changed (a label cache, an added file...); the
    controller removes the caches it made (a pytest run by a test inherits its worker's caches and leaves them)."""
    if not hasattr(session.config, "workerinput"):
        import shutil

        for cache in MADE_CACHES:
            shutil.rmtree(cache, ignore_errors=True)
    before = session.config.stash.get(SHARED_BEFORE, None)
    if before is None:
        return
    from manifest import manifest_changes, tree_manifest

    changes = manifest_changes(before, tree_manifest(SHARED))
    if changes:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        text = f"the suite wrote into {SHARED} ({len(changes)} paths): " + "; ".join(changes[:10])
        reporter.write_line(f"ERROR: {text}", red=True, bold=True) if reporter else print(text)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_collection_modifyitems(items):
    """Every test that takes the ``shared_datasets`` fixture is marked ``real_data``: -m "not real_data" leaves out
    what needs ../shared/datasets. A test marked ``cuda`` is skipped, saying so, where there is no CUDA device."""
    no_cuda = pytest.mark.skip(reason="needs a CUDA device; this machine has none")
    for item in items:
        if "shared_datasets" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.real_data)
        if item.get_closest_marker("cuda"):
            import torch  # here only: a session without a cuda test (the xdist controller's) starts without torch

            if not torch.cuda.is_available():
                item.add_marker(no_cuda)


@pytest.fixture(scope="session", autouse=True)
def lighter_ultralytics_runs():
    """Two costs of every Ultralytics run that nothing in the suite reads, dropped for stock and yolo-ckpt runs alike:
    the model summaries' GFLOPs, counted with thop (a profiled forward pass, ~0.5 s of a 3 s trainer run at imgsz 64;
    yolo-ckpt counts its own FLOPs with ``torch.utils.flop_counter``), so the summaries print none; and the trainer's
    ``gc.collect()`` at the end of a CPU run (``BaseTrainer._clear_memory``, ~0.4 s in a worker's grown heap; there is
    no accelerator cache to empty, and Python's own collector runs as usual). Patched where collection loaded
    Ultralytics; a session that never imports it is not made to."""
    import sys

    torch_utils = sys.modules.get("ultralytics.utils.torch_utils")
    if torch_utils is None:
        yield
        return
    from ultralytics.engine.trainer import BaseTrainer

    clear_memory = BaseTrainer._clear_memory

    def cpu_without_collect(self, threshold=None):
        return None if self.device.type == "cpu" else clear_memory(self, threshold)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch_utils, "get_flops", lambda *args, **kwargs: 0.0)
        patch.setattr(BaseTrainer, "_clear_memory", cpu_without_collect)
        yield


@pytest.fixture(scope="session")
def synthetic_cache():
    """The session's cache of the built-in synthetic datasets (``$YOLO_CKPT_CACHE``, made on the controller above:
    the workers and the CLI in subprocesses see it too)."""
    return Path(os.environ["YOLO_CKPT_CACHE"])


@pytest.fixture(scope="session")
def synthetic(synthetic_cache):
    """``synthetic(task)`` -> the built-in synthetic dataset of ``task`` (generated once per session)."""
    from yolo_ckpt.data.synthetic import synthetic_dataset

    return lambda task="detect": str(synthetic_dataset(task))


@pytest.fixture(scope="session")
def shared_run(synthetic, tmp_path_factory):
    """``shared_run(model, task="detect", trainer=None, **kw)`` -> ``(trainer, recompute counter)`` of
    ``helpers.train`` (``model`` a YAML name, ``kw`` hashable training keys) on the built-in synthetic dataset of
    ``task``, trained once per session for each set of arguments and torch thread count, in a run folder of its own. For
    tests that only read a finished run (several
    compare against the same stock run): the thread count is part of the key because bit-equality holds between runs
    under the same setting. Callers leave what others read as they found it (weights, EMA, args, the run report)."""
    import torch
    from helpers import train

    runs = {}

    def run(model, task="detect", trainer=None, **kw):
        key = (model, task, trainer, tuple(sorted(kw.items())), torch.get_num_threads())
        if key not in runs:
            runs[key] = train(model, synthetic(task), tmp_path_factory.mktemp("shared-run"), "run", trainer=trainer, **kw)
        return runs[key]

    return run


@pytest.fixture(scope="session")
def shared_datasets():
    """The real datasets in ../shared/datasets (read-only in CI); skip when the folder is absent."""
    if not SHARED_DATASETS.is_dir():
        pytest.skip(f"{SHARED_DATASETS} is absent: the real-data tests need the shared datasets beside the checkout")
    return SHARED_DATASETS


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread for many small ops on the shared 2-core machine (two spinning threads are slower there).
    Bit-equality comparisons are always between runs under the same setting."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def saved_for_backward_bytes():
    """``saved_for_backward_bytes(fn)`` -> bytes of the distinct storages autograd saves for backward while ``fn``
    runs (a whole-forward count, independent of yolo_ckpt's per-layer accounting)."""
    import torch

    def count(fn) -> int:
        seen = {}

        def pack(t):
            seen[t.untyped_storage()._cdata] = t.untyped_storage().nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            fn()
        return sum(seen.values())

    return count
