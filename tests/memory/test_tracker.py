"""The live tensor tracker's tags (yolo_ckpt.memory.tracker): what was alive at a peak, storage by storage, with the
bytes counted as without a tagger."""

import torch

from yolo_ckpt.memory.tracker import LiveTensorTracker


def steps(t: LiveTensorTracker, label: list) -> dict:
    """The same ops under any tracker: 4000 B (a), 8000 B (b), a freed, 2000 B (c); a mark after b."""
    label[0] = "a"
    a = torch.ones(1000)
    label[0] = "b"
    b = torch.zeros(1000, dtype=torch.float64)
    peak_of_mark = t.mark()
    del a
    label[0] = "c"
    c = torch.ones(500)
    return {"b": b, "c": c, "mark": peak_of_mark}


def test_tagger_snapshots_the_storages_alive_at_the_peak_with_the_bytes_unchanged():
    label = [None]
    with LiveTensorTracker() as plain:
        kept_plain = steps(plain, label)  # noqa: F841 (alive as the tagged run's)
    with LiveTensorTracker(tagger=lambda: label[0]) as tagged:
        kept = steps(tagged, label)
        assert (tagged.live_bytes, tagged.peak_bytes) == (plain.live_bytes, plain.peak_bytes) == (10000, 12000)
        assert sorted(tagged.phase_peak_storages.values()) == [(4000, "a"), (8000, "b")]  # at the peak: a and b
        assert list(tagged.phase_peak_storages.values())[-1] == (8000, "b")  # counting order: the last made the peak
        assert kept["mark"] == 12000 and sorted(tagged.marked_storages.values()) == [(4000, "a"), (8000, "b")]
        tagged.retag(kept["b"], "gradient")  # alive at the peak: retagged there too
        tagged.retag(kept["c"], "late")  # made after the peak: the snapshot has no c
        assert sorted(tagged.phase_peak_storages.values()) == [(4000, "a"), (8000, "gradient")]
        # the second mark's peak is where it began, at the first mark (a freed since, c made below it)
        assert tagged.mark() == 12000 and sorted(tagged.marked_storages.values()) == [(4000, "a"), (8000, "gradient")]
        assert tagged.start_phase() == 10000 and sum(n for n, _ in tagged.phase_peak_storages.values()) == 10000


def test_without_a_tagger_nothing_is_snapshot():
    with LiveTensorTracker() as t:
        x = torch.ones(100)
        t.retag(x, "ignored")
        assert t.phase_peak_storages == {} and t.marked_storages == {} and t.live_bytes == 400
