"""The benchmark's plumbing on tiny sizes: it runs every comparison, interleaved, and writes
JSON, Markdown and PNG with every figure. Speeds are not asserted here (they live in bench/)."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from chexflow.bench.allreduce import copy_and_sum_ms, gradient_steps, read_timeline
from chexflow.bench.core import (
    Result,
    Side,
    compare,
    compare_each,
    cpu_model,
    input_bound,
    markdown,
    write_report,
)
from chexflow.envs import trainer_python
from tests.conftest import REPO, read_json, run_chexflow

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


def test_report_logic_flags_a_baseline_slower_than_the_real_side(tmp_path):
    """Plain callables as sides: a synthetic baseline 5% slower than real data is suspect and
    not met, though the ratio clears the goal; 2% slower is within the allowance and met."""
    suspect = compare("input pipeline demo", "images/s", Side("TFRecords", lambda: 10.5),
                      Side("synthetic", lambda: 10.0), repeats=2, goal=0.97, suspect_above=1.03)
    fine = compare("input pipeline ok", "images/s", Side("TFRecords", lambda: 10.2),
                   Side("synthetic", lambda: 10.0), repeats=2, goal=0.97, suspect_above=1.03)
    assert suspect.ratio == pytest.approx(1.05) and suspect.baseline_suspect and not suspect.met
    assert fine.ratio == pytest.approx(1.02) and not fine.baseline_suspect and fine.met
    doc = write_report([suspect, fine], tmp_path)
    assert [(r["baseline_suspect"], r["met"]) for r in doc["results"]] == [(True, False),
                                                                          (False, True)]
    table = (tmp_path / "bench.md").read_text()
    assert "| 1.050 | ≥ 0.97 | NO (baseline suspect) |" in table
    assert "| 1.020 | ≥ 0.97 | yes |" in table


def test_report_logic_scaling_against_two_baselines_with_the_machine_beside(tmp_path):
    """Plain callables as sides: Horovod's total against one worker alone x 2 and against two
    independent workers at once, interleaved in one loop; both figures share the Horovod samples
    and the table is followed by the CPU model, cores and the one-worker rate."""
    order: list[str] = []

    def side(name: str, value: float):
        return lambda: order.append(name) or value

    alone = Side("1 worker alone x 2", side("alone", 60.0))
    results = compare_each(
        ["scaling vs one worker alone", "scaling vs 2 independent workers"], "images/s",
        Side("2 workers (total)", side("horovod", 45.0)),
        [alone, Side("2 independent workers at once (total)", side("concurrent", 50.0))],
        repeats=2, goal=0.9, figure_name="scaling efficiency",
    )
    for r in results:
        r.notes["one_worker_images_per_sec"] = [s / 2 for s in alone.samples]
    assert order == ["horovod", "alone", "concurrent", "concurrent", "alone", "horovod"]
    assert [round(r.figure, 3) for r in results] == [0.75, 0.9]
    assert [r.met for r in results] == [False, True]
    assert results[0].samples_a == results[1].samples_a == [45.0, 45.0]
    doc = write_report(results, tmp_path)
    assert doc["machine"]["cpu_model"] == cpu_model() != ""
    table = (tmp_path / "bench.md").read_text()
    assert f"({cpu_model()})" in table.splitlines()[0]
    assert (f"scaling vs one worker alone: {cpu_model()}, {doc['machine']['cpus']} cores; one "
            "worker alone 30 images/s (median of 2)") in table


def test_allreduce_account_counts_fused_tensors_once_per_step(tmp_path):
    """Two tensors fused into one ALLREDUCE and a third reduced later, over two steps: the
    active time is the union of intervals, phases likewise, bytes from shape and dtype."""
    def tensor(pid, name, spans, shape, dtype):
        events = [{"name": "process_name", "ph": "M", "pid": pid, "args": {"name": name}}]
        for b, e in spans:
            events += [{"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": b - 50, "pid": pid},
                       {"ph": "E", "ts": b - 10, "pid": pid},
                       {"ph": "B", "name": "ALLREDUCE", "ts": b, "pid": pid},
                       {"ph": "B", "name": "MEMCPY_IN_FUSION_BUFFER", "ts": b, "pid": pid},
                       {"ph": "E", "ts": b + 100, "pid": pid},
                       {"ph": "B", "name": "GLOO_ALLREDUCE", "ts": b + 100, "pid": pid},
                       {"ph": "E", "ts": e - 100, "pid": pid},
                       {"ph": "B", "name": "MEMCPY_OUT_FUSION_BUFFER", "ts": e - 100, "pid": pid},
                       {"ph": "E", "ts": e, "pid": pid},
                       {"ph": "E", "ts": e, "pid": pid, "args": {"dtype": dtype, "shape": shape}}]
        return events

    grad = "PartitionedCall/DistributedAdam_Allreduce/cond_{}/HorovodAllreduce_grads_{}_0"
    events = (tensor(1, grad.format(0, 0), [(1000, 2000), (9000, 10000)], "[3, 4]", "float32")
              + tensor(2, grad.format(1, 1), [(1000, 2000), (9000, 10000)], "[8]", "float16")
              + tensor(3, grad.format(2, 2), [(2500, 3000), (10000, 11000)], "[2]", "float32")
              + tensor(4, "HorovodAllreduce_metric_0", [(5000, 6000)], "[]", "float32"))
    path = tmp_path / "timeline.json"
    path.write_text(json.dumps(events)[:-1] + ",")  # Horovod leaves the array open
    steps = gradient_steps(read_timeline(path))
    assert steps == [
        {"allreduce_ms": 1.5, "copy_in_ms": 0.2, "reduce_ms": 1.1, "copy_out_ms": 0.2,
         "bytes": 48 + 16 + 8, "tensors": 3},
        {"allreduce_ms": 2.0, "copy_in_ms": 0.2, "reduce_ms": 1.6, "copy_out_ms": 0.2,
         "bytes": 48 + 16 + 8, "tensors": 3},
    ]
    assert 0 < copy_and_sum_ms(4_000_000, repeats=2) < float("inf")  # a measurement


def test_cpu_model_reads_the_model_name_of_proc_cpuinfo(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7B13\n")
    assert cpu_model(info) == "AMD EPYC 7B13"


INPUT_STAGES = """
import json, sys
from pathlib import Path
from tensorflow.core.framework import graph_pb2
from chexflow.data.manifest import load_manifest
from chexflow.train import data

def ops(ds):
    g = graph_pb2.GraphDef()
    g.ParseFromString(ds._as_serialized_graph().numpy())
    return sorted({n.op for n in g.node} | {n.op for f in g.library.function for n in f.node_def})

m = load_manifest(Path(sys.argv[1]))
real = data.train_dataset(m, 4, 0, 1, 0)
synthetic = data.synthetic_dataset(m.image_size, len(m.classes), 4, 0)
print(json.dumps({name: {"spec": str(ds.element_spec), "ops": ops(ds)}
                  for name, ds in (("real", real), ("synthetic", synthetic))}))
"""


@pytest.mark.trainer
def test_synthetic_input_runs_the_real_inputs_stages_from_memory(nih_tfrecords):
    """The synthetic side of the input-pipeline comparison hands the training step batches of
    the same shape (batch dimension unknown, as the real pipeline's decode leaves it: a
    different shape compiles a different step) through the same parse, decode, batch and
    prefetch stages; only the TFRecord files are missing."""
    proc = subprocess.run([str(trainer_python()), "-c", INPUT_STAGES, str(nih_tfrecords)],
                          capture_output=True, text=True, check=True, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "3"})
    sides = json.loads(proc.stdout.strip().splitlines()[-1])
    assert sides["synthetic"]["spec"] == sides["real"]["spec"]
    assert "shape=(None, 64, 64, 1), dtype=tf.uint8" in sides["real"]["spec"]
    stages = {"ParseExampleV2", "DecodeRaw", "BatchDatasetV2", "ParallelMapDatasetV2",
              "PrefetchDataset", "RepeatDataset"}
    assert stages <= set(sides["real"]["ops"]) and stages <= set(sides["synthetic"]["ops"])
    assert set(sides["real"]["ops"]) - set(sides["synthetic"]["ops"]) >= {"TFRecordDataset"}


def test_the_input_alone_bounds_the_ratio_it_can_explain(tmp_path):
    """0.1 ms more CPU per batch on a 302 ms step can explain a ratio of 0.9997, not 0.94."""
    r = compare("input pipeline demo", "images/s", Side("TFRecords", lambda: 50.0),
                Side("synthetic", lambda: 53.0), repeats=1, goal=0.97, notes={
                    "batch_per_worker": 16,
                    "input_alone": {"TFRecords": {"cpu_ms_per_batch": 0.6},
                                    "synthetic": {"cpu_ms_per_batch": 0.5},
                                    "repeats": 3, "batches": 300}})
    assert input_bound(0.1, 16e3 / 53) == pytest.approx(0.99967, abs=1e-5)
    assert input_bound(-0.2, 300) == 1.0
    write_report([r], tmp_path)
    assert ("input pipeline demo: the input alone, no model: 0.6 ms CPU per batch from "
            "TFRecords, 0.5 from memory (median of 3 x 300 batches); on the synthetic side's "
            "302 ms step the difference accounts for a ratio of 0.9997"
            ) in (tmp_path / "bench.md").read_text()


@pytest.mark.trainer
@pytest.mark.slow
def test_bench_quick_runs_every_comparison(tmp_path):
    out = tmp_path / "bench"
    proc = run_chexflow("bench", "--quick", "--out", out, timeout=1800)
    doc = read_json(out / "bench.json")
    names = [r["name"] for r in doc["results"]]
    assert names == ["preprocessing", "input pipeline resnet50", "orchestration overhead",
                     "horovod scaling resnet50 vs one worker alone",
                     "horovod scaling resnet50 vs 2 independent workers",
                     "katib runner overhead"]
    for r in doc["results"]:
        assert set(FIGURES) <= set(r), r["name"]
        assert len(r["samples_a"]) == len(r["samples_b"]) == 1
        assert all(x > 0 for x in r["samples_a"] + r["samples_b"]), r["name"]
    pre = doc["results"][0]["notes"]
    assert pre["png_decode_images_per_sec"] > 0 and pre["fraction_of_limit"] > 0
    assert set(doc["results"][2]["notes"]["wall_seconds"]) == {"chexflow run", "horovodrun"}
    assert doc["machine"]["cpus"] >= 1
    assert "baseline_suspect" in doc["results"][1]
    alone = doc["results"][1]["notes"]["input_alone"]  # the input without a model, both sides
    assert alone["TFRecords"]["cpu_ms_per_batch"] > 0 and alone["synthetic"]["cpu_ms_per_batch"] > 0
    assert "input pipeline resnet50: the input alone, no model: " in (out / "bench.md").read_text()
    assert doc["results"][3]["samples_a"] == doc["results"][4]["samples_a"]
    assert len(doc["results"][3]["notes"]["one_worker_images_per_sec"]) == 1
    assert (out / "bench.png").stat().st_size > 0
    assert "| preprocessing |" in (out / "bench.md").read_text()
    assert "bench.md" in proc.stdout


@pytest.mark.trainer
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


def test_katib_overhead_timings_read_the_trials_own_marks(tmp_path):
    from chexflow.bench.katib_cluster import timings
    from chexflow.bench.real_pods import RealPodsError

    log = tmp_path / "trials.log"
    log.write_text("start 102.0\nend 105.0\nstart 107.5\nend 110.5\nstart 111.5\nend 114.5\n")
    first, gap = timings(log, 100.0, 3)
    assert first == pytest.approx(2.0)
    assert gap == pytest.approx((2.5 + 1.0) / 2)
    with pytest.raises(RealPodsError, match=r"trials.log: 3 trial starts and 3 ends, expected 4"):
        timings(log, 100.0, 4)


def test_horovod_options_best_setting_is_the_fastest_that_keeps_gloos_numbers():
    from chexflow.bench.core import Result
    from chexflow.bench.training import best_setting, horovod_option_sides

    assert not any(n.startswith("mpi") for n in horovod_option_sides(mpi=False))
    sides = horovod_option_sides(mpi=True)
    assert list(sides)[0] == "gloo" and not sides["gloo --fp16-allreduce"].same_results
    speed = {"mpi": 50.0, "mpi, yield when idle": 55.0, "gloo --fp16-allreduce": 60.0}
    results = [Result(f"horovod option {n}", "images/s", n, "gloo", [speed.get(n, 45.0)] * 3,
                      [45.0] * 3, 1.0) for n in sides if n != "gloo"]
    assert best_setting(results, sides) == "mpi, yield when idle"


def test_allreduce_levers_each_sit_on_the_default_and_name_a_lever_whose_losses_differ(
        tmp_path, monkeypatch):
    """Every lever is the default's MPI environment plus one change; the comparison runs each
    side once a repeat (interleaved) and says, per lever, whether its losses are the default's.
    `chexflow train` is replaced by a record of the arguments (the real runs are the bench's)."""
    from chexflow.bench import training
    from chexflow.jobs.allreduce import MPI_CPU_ENV

    sides = training.allreduce_lever_sides()
    default = sides.pop("default (MPI, yield when idle)")
    assert default.env == MPI_CPU_ENV and default.args == ("--controller", "mpi")
    for name, lever in sides.items():
        changed = {k for k in lever.env if lever.env[k] != default.env.get(k)}
        assert (len(changed) + len(lever.args) - len(default.args)) in (1, 2), name
        assert lever.env.items() >= default.env.items(), name
    runs = []

    def metrics(work, data, *, extra, env=None, workers=1, **kw):
        runs.append((workers, extra, env))
        slower = "--cycle-time-ms" in extra  # a lever whose loss differs, for the check
        return {"images_per_sec": 10.0 if slower else 12.0,
                "history": [{"loss": 0.5 + (1e-3 if slower else 0.0)}]}

    monkeypatch.setattr(training, "train_metrics", metrics)
    monkeypatch.setattr(training, "concurrent_images_per_sec", lambda *a, **k: 20.0)
    results = training.allreduce_levers(tmp_path, tmp_path, "resnet50", 32, 4, 4, repeats=2)
    assert len(runs) == 2 * (len(sides) + 1)
    by_name = {r.name: r for r in results}
    cycle = by_name["allreduce lever --cycle-time-ms 5"]
    ring = by_name["allreduce lever allreduce algorithm ring"]
    assert not cycle.notes["same_losses_as_default"] and ring.notes["same_losses_as_default"]
    assert ring.ratio == pytest.approx(1.0) and cycle.ratio == pytest.approx(10 / 12)
    scaling = by_name["allreduce scaling resnet50 default (MPI, yield when idle) vs 2 "
                      "independent workers"]
    assert scaling.ratio == pytest.approx(12 / 20) and scaling.goal == 0.90


@pytest.mark.trainer
@pytest.mark.slow
def test_bench_inference_compares_predict_with_evaluate_on_the_same_images(tmp_path):
    out = tmp_path / "bench"
    run_chexflow("bench", "--quick", "--only", "inference", "--out", out, timeout=1800)
    (result,) = read_json(out / "bench.json")["results"]
    assert result["name"] == "inference densenet121" and result["unit"] == "images/s"
    assert result["a"].startswith("chexflow predict")
    assert result["b"].startswith("chexflow evaluate")
    assert all(x > 0 for x in result["samples_a"] + result["samples_b"])
    notes = result["notes"]
    assert notes["images"] > 0 and notes["split"] == "train" and notes["batch_size"] == 4
    assert "| inference densenet121 |" in (out / "bench.md").read_text()


def test_image_pull_compares_pull_with_side_loading_first_and_cached_and_the_pushes():
    from chexflow.bench.image_pull import PUSHES, SIDES, comparisons, markdown

    seconds = {name: [float(i + 1), float(i + 2)] for i, name in
               enumerate((*SIDES, *PUSHES, "import"))}
    results = [r.as_dict() for r in comparisons(seconds, 2, {"image": "chexflow.local/trainer:x"})]
    assert [(r["a"], r["b"]) for r in results] == [
        ("registry, first pull", "side-loaded, first"), ("registry, cached", "side-loaded, cached"),
        ("push again", "push, empty registry")]
    first = results[0]
    assert first["figure"] == pytest.approx(1.5 - 3.5) and first["met"]
    assert first["notes"]["runs"]["import"] == [7.0, 8.0] and first["notes"]["cpu"]
    table = markdown(first)
    assert "| registry, first pull | 1.0, 2.0 |" in table and "| import | 7.0, 8.0 |" in table
