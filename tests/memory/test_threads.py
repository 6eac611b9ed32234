"""The estimate's own real tensor work runs on one torch thread (yolo_ckpt.memory.threads): one inside, the caller's
count restored after (on an error too); plan's model build takes it (Ultralytics' stride probe, the copy), and the model
built so is the one built on two threads."""

import pytest
import torch

from yolo_ckpt.memory.threads import one_thread


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_one_thread_inside_and_the_count_restored_after(two_threads):
    with one_thread():
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == 2
    with pytest.raises(RuntimeError, match="stop"), one_thread():
        raise RuntimeError("stop")
    assert torch.get_num_threads() == 2


def test_plan_builds_its_model_on_one_thread_and_the_same_model(two_threads, monkeypatch):
    """PlannedRun.from_keys builds the model (Ultralytics' YOLO, its stride probe a real forward) on one thread and
    gives the caller its two back; the model equals one built on two threads from the same seed (weights, BatchNorm
    statistics, strides)."""
    import ultralytics

    from yolo_ckpt.memory import PlannedRun

    built = []

    def spy(*args, **kwargs):
        built.append(torch.get_num_threads())
        torch.manual_seed(0)
        return ultralytics_yolo(*args, **kwargs)

    ultralytics_yolo = ultralytics.YOLO
    monkeypatch.setattr(ultralytics, "YOLO", spy)
    run = PlannedRun.from_keys({"model": "yolo11n.yaml", "imgsz": 64, "batch": 1, "device": "cpu"})
    assert built == [1] and torch.get_num_threads() == 2
    torch.manual_seed(0)
    stock = ultralytics_yolo("yolo11n.yaml").model  # two threads
    ours, theirs = run.model.state_dict(), stock.state_dict()
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    assert torch.equal(run.model.stride, stock.stride)
