"""The run report record (:class:`yolo_ckpt.report.record.RunReport`): schema 2 files still read, other schemas refused
with their number, the headline a person reads."""

import json

import pytest

from yolo_ckpt.report.record import REPORT_NAME, PlanRecord, RunReport, load_report

# a schema-2 ckpt_report.json as yolo-ckpt 0.1.0 wrote it before the record (estimated_none_peak_bytes came in 3)
SCHEMA_2 = {
    "schema_version": 2, "versions": {"yolo_ckpt": "0.1.0", "ultralytics": "8.4.190", "torch": "2.14.1"},
    "task": "detect", "model": "yolo11n.yaml", "data": "data.yaml", "recompute": "backbone", "recompute_mode": "full",
    "recomputed_layers": [{"index": 0, "type": "Conv"}], "recomputed_regions": [], "device": "cpu", "imgsz": 640,
    "batch": 8, "batch_at_start": 8, "amp": False, "epochs": 3, "memory_source": "cpu_probe_live_tensors",
    "memory_probe_images": 8, "memory_probe_objects": 40, "memory_probe_imgsz": 640,
    "train_peak_allocated_bytes": 3 * 2**30, "train_peak_reserved_bytes": None, "val_peak_allocated_bytes": 2**29,
    "val_peak_reserved_bytes": None, "train_step_time_median_s": 1.25, "train_steps_timed": 10, "plan": None,
    "metrics": {"box_mAP50-95": 0.5}, "ultralytics_metrics": {"metrics/mAP50-95(B)": 0.5},
}


def test_schema_2_reads_and_writes_back_as_6(tmp_path):
    (tmp_path / REPORT_NAME).write_text(json.dumps(SCHEMA_2))
    record = load_report(tmp_path)
    assert (record.schema_version, record.train_peak_allocated_bytes, record.estimated_none_peak_bytes) == (2, 3 * 2**30, None)
    written = RunReport(**{**vars(record), "schema_version": 6}).to_dict()
    added = ("estimated_none_peak_bytes", "estimated_all_peak_bytes", "estimated_policy_peak_bytes", "estimated_step", "estimate_skipped")
    assert list(written)[0] == "schema_version" and written == {
        **SCHEMA_2, "schema_version": 6, "val_time_s": None, "best_epoch": None, "class_ap": {}, **dict.fromkeys(added), "not_measured": [],
        "attention": None,
    }


PLAN = {
    "recompute": "0,2,loss", "budget_bytes": 4 * 10**9, "estimated_peak_bytes": 3 * 10**9, "batch": 8, "imgsz": 640,
    "recompute_flops": 10**9, "recompute_cost_fraction": 0.05, "headroom_bytes": 0, "margin_bytes": 10**9,
    "assumed": {"device": "cpu", "amp": False, "objects": 80},
}


def test_plan_is_a_record_and_round_trips(tmp_path):
    (tmp_path / REPORT_NAME).write_text(json.dumps({**SCHEMA_2, "schema_version": 3, "plan": PLAN}))
    record = load_report(tmp_path)
    assert isinstance(record.plan, PlanRecord) and record.plan.margin_bytes == 10**9 and record.plan.assumed["objects"] == 80
    assert record.to_dict()["plan"] == PLAN
    record.write(tmp_path)
    assert json.loads((tmp_path / REPORT_NAME).read_text())["plan"] == PLAN


@pytest.mark.parametrize(("change", "message"), [
    ({"schema_version": 1}, r"schema_version=1 is not readable by yolo-ckpt .*; readable: 2, 3"),
    ({"peak": 1}, r"unknown keys \['peak'\] for schema_version=2"),
    ({"plan": {**PLAN, "fits": True}}, r"unknown keys \['fits'\] for schema_version=2"),
])
def test_other_reports_are_refused(tmp_path, change, message):
    (tmp_path / REPORT_NAME).write_text(json.dumps({**SCHEMA_2, **change}))
    with pytest.raises(ValueError, match=message):
        load_report(tmp_path)


def test_headline():
    """Issue 43, item 5: the run's last line leads with what recompute bought, the estimated peak as a ratio of none's at
    the same step, and says every size in one unit (MiB below 10 GiB, else GiB), all named once."""
    record = RunReport.from_dict(SCHEMA_2)
    assert record.headline() == (
        "recompute=backbone: training peak 3072 MiB (CPU live tensors of one step of 8 images, 40 objects at imgsz 640); "
        "median step 1.250 s"
    )
    # a planned run: the saving is the plan's estimate against none's, of the same step (the planner's objects, not
    # the measured batch's)
    planned = RunReport.from_dict({
        **SCHEMA_2, "schema_version": 3, "estimated_none_peak_bytes": 4 * 10**9, "plan": PLAN, "memory_source": "cuda_allocator",
        "memory_probe_images": None, "memory_probe_objects": None, "train_step_time_median_s": None,
    })
    assert planned.headline() == (
        "recompute=backbone: 0.75x of recompute=none's estimated peak (~2861 MiB of ~3815 MiB) at batch 8, imgsz 640, 80 objects "
        "per image; training peak 3072 MiB (CUDA allocated); planned for memory_budget=3815 MiB; step time not measured (too few steps)"
    )
    # schema 4: every run estimates its step at set-up, for none, all and its policy; or says why not
    estimated = RunReport.from_dict({
        **planned.to_dict(), "plan": None, "estimated_all_peak_bytes": 2**30, "estimated_policy_peak_bytes": 3 * 2**30,
        "estimated_step": {"batch": 16, "imgsz": 1024, "objects": 0, "device": "cuda", "amp": True},
    })
    assert estimated.headline().startswith(
        "recompute=backbone: 0.81x of recompute=none's estimated peak (~3072 MiB of ~3815 MiB; all ~1024 MiB) at batch 16, imgsz 1024; "
        "training peak 3072 MiB (CUDA allocated); step"
    )
    large = RunReport.from_dict({**estimated.to_dict(), "estimated_none_peak_bytes": 12 * 2**30, "recompute": "all"}).headline()
    assert large.startswith("recompute=all: 0.25x of recompute=none's estimated peak (~3.00 GiB of ~12.00 GiB) at batch 16")
    assert "training peak 3.00 GiB (CUDA" in large and "MiB" not in large
    skipped = RunReport.from_dict({**estimated.to_dict(), "estimated_none_peak_bytes": None, "estimate_skipped": "estimate=False"})
    assert skipped.headline().startswith("recompute=backbone: no estimate (estimate=False); training peak 3072 MiB (CUDA allocated); step")


def test_headline_says_when_the_estimates_are_of_another_step():
    """Issue 31, item 3: estimates beside a measurement are of the same step, or the line says plainly how not."""
    probed = {**SCHEMA_2, "schema_version": 4, "memory_probe_images": 2, "memory_probe_objects": 586, "memory_probe_imgsz": 640,
              "estimated_none_peak_bytes": 7345 * 2**20, "estimated_all_peak_bytes": 1099 * 2**20,
              "estimated_policy_peak_bytes": 1992 * 2**20}
    at = {"imgsz": 640, "objects": 2144, "device": "cpu", "amp": False}
    other = RunReport.from_dict({**probed, "estimated_step": {**at, "batch": 16}}).headline()
    assert " at batch 16, imgsz 640, 2144 objects per image (not the measured step: 2 images at imgsz 640); training peak" in other
    same = RunReport.from_dict({**probed, "estimated_step": {**at, "batch": 2}}).headline()
    assert same.startswith(
        "recompute=backbone: 0.27x of recompute=none's estimated peak (~1992 MiB of ~7345 MiB; all ~1099 MiB) at batch 2, imgsz 640, "
        "2144 objects per image (the data's densest image x its augmentation; the measured step had 293 per image); training peak"
    )
    alike = RunReport.from_dict({**probed, "estimated_step": {**at, "batch": 2, "objects": 293}}).headline()
    assert " at batch 2, imgsz 640, 293 objects per image; training peak" in alike


def test_compare_reads_as_a_person_reads(tmp_path, capsys):
    """compare prints MiB and GiB, names the baseline, and has no column of metrics no run has (no validation here:
    no mAP; detection: no top-1/top-5), no 'nan'."""
    from yolo_ckpt.cli import main

    for name, recompute, peak, step in (("base", "none", 3 * 2**30, 1.0), ("all", "all", 2**30, 1.25)):
        (tmp_path / name).mkdir()
        record = {
            **SCHEMA_2,
            "recompute": recompute,
            "train_peak_allocated_bytes": peak,
            "train_step_time_median_s": step,
            "metrics": {},
            "ultralytics_metrics": {},
        }
        (tmp_path / name / REPORT_NAME).write_text(json.dumps(record))
    assert main(["compare", str(tmp_path / "base"), str(tmp_path / "all"), f"out={tmp_path / 'cmp'}"]) == 0
    printed = capsys.readouterr().out
    assert printed.splitlines()[:5] == [
        f"Baseline: {tmp_path / 'base'} (recompute=none). memory: training peak change against it; time: step time ratio; pts: "
        "accuracy change in points.",
        "",
        "| run | task | dataset | recompute | mode | imgsz | batch | epochs | peak MiB | peak GiB | memory | step s | time |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        f"| {tmp_path / 'base'} | detect | data.yaml | none | full | 640 | 8 | 3 | 3072 | 3.00 | +0.0% | 1 | 1.00x |",
    ]
    assert (
        printed.splitlines()[5]
        == f"| {tmp_path / 'all'} | detect | data.yaml | all | full | 640 | 8 | 3 | 1024 | 1.00 | -66.7% | 1.25 | 1.25x |"
    )
    assert "nan" not in printed and "nan" not in (tmp_path / "cmp" / "compare.csv").read_text()
    assert "differ" not in printed and "warning" not in capsys.readouterr().err


def test_compare_warns_on_different_data_or_task(tmp_path, capsys):
    """Runs of different datasets or tasks side by side: one warning line on stderr and in compare.md, naming the
    values that differ; the dataset and imgsz columns show them."""
    from yolo_ckpt.cli import main

    runs = {"a": {}, "b": {"data": "other.yaml"}, "c": {"task": "segment", "imgsz": 1024}}
    for name, changes in runs.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / REPORT_NAME).write_text(json.dumps({**SCHEMA_2, **changes}))
    assert main(["compare", *(str(tmp_path / n) for n in runs), f"out={tmp_path / 'cmp'}"]) == 0
    captured = capsys.readouterr()
    warning = "the runs differ in data (data.yaml, other.yaml) and task (detect, segment): their deltas are not the policy's alone."
    assert captured.err.strip() == f"yolo-ckpt: warning: {warning}"
    assert f"Warning: {warning}" in (tmp_path / "cmp" / "compare.md").read_text().splitlines()[1]
    rows = [line for line in captured.out.splitlines() if line.startswith(f"| {tmp_path}")]
    assert [r.split(" | ")[2:6] for r in rows] == [
        ["data.yaml", "backbone", "full", "640"],
        ["other.yaml", "backbone", "full", "640"],
        ["data.yaml", "backbone", "full", "1024"],
    ]


def test_compare_names_a_missing_folder(tmp_path, capsys):
    """A run folder that is not there (a typo): one line saying so, exit 2, not that it "has no ckpt_report.json";
    a folder that exists without a report still says that."""
    from yolo_ckpt.cli import main

    (tmp_path / "empty").mkdir()
    assert main(["compare", str(tmp_path / "missing"), str(tmp_path / "empty"), f"out={tmp_path / 'cmp'}"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"yolo-ckpt: error: {tmp_path / 'missing'} does not exist: give run directories of finished yolo-ckpt runs"
    ]
    assert main(["compare", str(tmp_path / "empty"), str(tmp_path / "empty"), f"out={tmp_path / 'cmp'}"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"yolo-ckpt: error: {tmp_path / 'empty'} has no {REPORT_NAME}: give run directories of finished yolo-ckpt runs"
    ]
    assert not (tmp_path / "cmp").exists()
