"""The benchmark's plumbing on tiny sizes: it runs every comparison, interleaved, and writes
JSON, Markdown and PNG with every figure. Speeds are not asserted here (they live in bench/)."""

from __future__ import annotations

import pytest

from chexflow.bench.core import Result, Side, compare, markdown, write_report
from tests.conftest import read_json, run_chexflow

FIGURES = ("samples_a", "samples_b", "median_a", "median_b", "spread_a", "spread_b", "ratio",
           "figure", "goal", "met", "unit", "a", "b", "notes")


def test_compare_interleaves_sides_and_computes_figures(tmp_path):
    order: list[str] = []

    def side(name: str, value: float):
        return lambda: order.append(name) or value

    r = compare("demo", "images/s", Side("A", side("a", 9.0)), Side("B", side("b", 10.0)),
                repeats=4, goal=0.95)
    assert order == ["a", "b", "b", "a", "a", "b", "b", "a"]
    assert r.ratio == pytest.approx(0.9) and not r.met
    overhead = Result("o", "s", "x", "y", [1.3, 1.5], [1.0, 1.0], 0.5, goal_is_max=True)
    assert overhead.figure == pytest.approx(0.4) and overhead.met
    doc = write_report([r, overhead], tmp_path)
    assert (tmp_path / "bench.png").stat().st_size > 0
    assert doc["results"][0]["met"] is False and doc["results"][1]["met"] is True
    table = markdown([r, overhead], doc["machine"])
    assert "| demo | A | B | 9 ± 0 | 10 ± 0 | images/s | ratio A/B | 0.900 | ≥ 0.95 | NO |" in table


@pytest.mark.trainer
@pytest.mark.slow
def test_bench_quick_runs_every_comparison(tmp_path):
    out = tmp_path / "bench"
    proc = run_chexflow("bench", "--quick", "--out", out, timeout=1800)
    doc = read_json(out / "bench.json")
    names = [r["name"] for r in doc["results"]]
    assert names == ["preprocessing", "input pipeline resnet50", "orchestration overhead",
                     "horovod scaling resnet50", "katib runner overhead"]
    for r in doc["results"]:
        assert set(FIGURES) <= set(r), r["name"]
        assert len(r["samples_a"]) == len(r["samples_b"]) == 1
        assert all(x > 0 for x in r["samples_a"] + r["samples_b"]), r["name"]
    pre = doc["results"][0]["notes"]
    assert pre["png_decode_images_per_sec"] > 0 and pre["fraction_of_limit"] > 0
    assert set(doc["results"][2]["notes"]["wall_seconds"]) == {"chexflow run", "horovodrun"}
    assert doc["machine"]["cpus"] >= 1
    assert (out / "bench.png").stat().st_size > 0
    assert "| preprocessing |" in (out / "bench.md").read_text()
    assert "bench.md" in proc.stdout


def test_bench_gpu_is_refused_without_a_gpu(tmp_path):
    from chexflow.bench.gpu import gpu_count

    if gpu_count():
        pytest.skip("this machine has a GPU: the refusal path does not apply here")
    proc = run_chexflow("bench", "--gpu", "--out", tmp_path, check=False)
    assert proc.returncode == 2
    assert "--gpu" in proc.stderr and "sees no GPU" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.trainer
@pytest.mark.slow
def test_gpu_sweep_runs_amp_and_xla_and_writes_its_report(nih_tfrecords, tmp_path):
    """The --gpu sweep's own runs on CPU at tiny sizes: AMP and XLA both on, on TFRecords (the
    synthetic side differs only in its input); XLA must really compile (Horovod's allreduce
    stays outside the clusters)."""
    from chexflow.bench.gpu import SweepPlan, sweep, write_report

    plan = SweepPlan(models=("resnet50",), batches=(4,), amp=(True,), xla=(True,),
                     synthetic=(False,), image_size=64, steps=3, warmup_steps=1)
    rows = sweep(tmp_path / "runs", nih_tfrecords, plan)
    assert [(r["amp"], r["xla"], r["synthetic"]) for r in rows] == [(True, True, False)]
    for r in rows:
        assert "error" not in r, r
        assert r["images_per_sec"] > 0 and r["step_time_ms"] > 0 and r["xla_compiled"], r
    write_report(rows, tmp_path / "report", gpus=0, plan=plan)
    doc = read_json(tmp_path / "report" / "bench-gpu.json")
    assert doc["runs"] == rows and doc["plan"]["batches"] == [4] and doc["gpus"] == 0
    table = (tmp_path / "report" / "bench-gpu.md").read_text()
    assert "| resnet50 | 4 | on | on | TFRecords |" in table
    assert (tmp_path / "report" / "bench-gpu.png").stat().st_size > 0
