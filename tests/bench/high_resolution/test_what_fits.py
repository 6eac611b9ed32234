"""The what-fits study's record: a run stopped between models says which of its models it lacks."""

import json

from benchmarks.high_resolution.what_fits import save


def test_a_stopped_run_names_the_models_it_lacks(tmp_path):
    row = {
        "model": "yolo11n.yaml",
        "imgsz": 1536,
        "card": "8 GB",
        "card_MiB": 8192,
        "policy": "none",
        "largest_batch": 8,
        "guess": 8,
        "peak_MiB_at_batch_1": 944.6,
    }
    rows = [row, {**row, "policy": "all"}]
    check = {"model": "yolo11n.yaml", "cells": 1, "below_the_line": 0, "most_below": 0, "seconds": 1.0}
    asked = ["yolo11n.yaml", "yolo12n.yaml"]
    save(rows, [check], ["models=yolo11n.yaml,yolo12n.yaml"], str(tmp_path), asked)
    assert json.loads((tmp_path / "record.json").read_text())["not_made"] == ["yolo12n.yaml"]
    save(
        rows + [{**r, "model": "yolo12n.yaml"} for r in rows],
        [check, {**check, "model": "yolo12n.yaml"}],
        ["models=..."],
        str(tmp_path),
        asked,
    )
    record = json.loads((tmp_path / "record.json").read_text())
    assert record["not_made"] == [] and [c["model"] for c in record["checks"]] == asked
