"""Issue 33's pilot curve reader: training time added up across resumes (Ultralytics' results.csv restarts its
clock at a resume)."""

from benchmarks.equal_memory.pilot_curve import curve


def test_curve_adds_up_time_across_resumes(tmp_path):
    header = "epoch,time,metrics/mAP50(B),metrics/mAP50-95(B)\n"
    rows = ["1,100,0.1,0.05", "2,200,0.2,0.1", "3,50,0.3,0.15", "4,120,0.4,0.2"]  # resumed before epoch 3
    (tmp_path / "results.csv").write_text(header + "\n".join(rows) + "\n")
    assert [(r["epoch"], r["seconds"], r["mAP50"]) for r in curve(tmp_path)] == [(1, 100, 0.1), (2, 200, 0.2), (3, 250, 0.3), (4, 320, 0.4)]
