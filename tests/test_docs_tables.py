"""The docs' tables of figures are what `chexflow bench tables` makes from docs/bench/*.json:
a page whose table differs from its JSON fails here, as a stale compiled pipeline does in
test_pipelines_compile."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from chexflow.bench.cluster_faults import FaultRun, table
from tests.conftest import REPO, run_chexflow

DOCS = REPO / "docs"


def copy_docs(tmp_path: Path) -> Path:
    docs = tmp_path / "docs"
    shutil.copytree(DOCS, docs, ignore=shutil.ignore_patterns("*.png"))
    return docs


def test_the_committed_docs_tables_are_what_their_json_gives():
    proc = run_chexflow("bench", "tables", "--check", check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_json_of_figures_lies_under_docs_bench_and_is_shown_on_a_page():
    marked = "".join(page.read_text() for page in DOCS.glob("*.md"))
    unused = [str(p.relative_to(DOCS)) for p in DOCS.rglob("*.json")
              if p.parent != DOCS / "bench" or f"from bench/{p.name} -->" not in marked]
    assert not unused, f"docs JSON files outside docs/bench or on no page: {unused}"


def test_a_changed_figure_makes_the_page_stale_until_the_tables_are_made_again(tmp_path):
    docs = copy_docs(tmp_path)
    bench = docs / "bench" / "katib-cluster.json"
    doc = json.loads(bench.read_text())
    doc["tables"][0]["rows"][0][3] = "12.34 ± 5"
    bench.write_text(json.dumps(doc))
    stale = run_chexflow("bench", "tables", "--check", "--docs", docs, check=False)
    assert stale.returncode == 1
    assert f"{docs / 'benchmarks.md'}" in stale.stdout + stale.stderr
    assert "12.34 ± 5" not in (docs / "benchmarks.md").read_text()  # --check writes nothing

    run_chexflow("bench", "tables", "--docs", docs)
    page = (docs / "benchmarks.md").read_text()
    assert "| start to first trial | real Katib | local runner | 12.34 ± 5 |" in page
    assert run_chexflow("bench", "tables", "--check", "--docs", docs).returncode == 0
    unchanged = [p.name for p in docs.glob("*.md")
                 if p.name != "benchmarks.md" and p.read_text() != (DOCS / p.name).read_text()]
    assert not unchanged, f"pages rewritten without a change of their JSON: {unchanged}"


def test_a_bench_run_copied_under_docs_bench_renders_its_comparisons_and_machine(tmp_path):
    docs = copy_docs(tmp_path)
    result = {"name": "input pipeline resnet50", "unit": "images/s", "a": "TFRecords",
              "b": "synthetic", "samples_a": [50.0, 52.0], "samples_b": [51.0, 53.0],
              "goal": 0.97, "notes": {}, "goal_is_max": False, "figure_name": "ratio A/B",
              "suspect_above": 1.03, "median_a": 51.0, "median_b": 52.0, "ratio": 0.9808,
              "figure": 0.9808, "met": True, "baseline_suspect": False, "spread_a": 1.0,
              "spread_b": 1.0}
    run = {"machine": {"platform": "Linux-6.18", "python": "3.12.1", "cpus": 2,
                       "cpu_model": "AMD EPYC 7B13", "processor": "x86_64",
                       "load_average": [0.42, 0.3, 0.2], "when": "2030-01-02 03:04:05 UTC"},
           "results": [result], "quick": False, "repeats": 2,
           "command": "chexflow bench --only input-pipeline --repeats 2", "commit": "abc1234"}
    (docs / "bench" / "input-pipeline.json").write_text(json.dumps(run))
    run_chexflow("bench", "tables", "--docs", docs)
    page = (docs / "benchmarks.md").read_text()
    table = page.split("from bench/input-pipeline.json -->\n", 1)[1].split("<!-- end", 1)[0]
    assert table.splitlines()[0] == (
        "`chexflow bench --only input-pipeline --repeats 2` on 2 CPUs (AMD EPYC 7B13), "
        "Linux-6.18, 2030-01-02 03:04:05 UTC, load average 0.42 at the end, commit abc1234.")
    assert ("| input pipeline resnet50 | TFRecords | synthetic | 51 ± 1 | 52 ± 1 | images/s | "
            "ratio A/B | 0.981 | ≥ 0.97 | yes |") in table


def test_a_marked_table_whose_json_is_missing_is_one_line_naming_both(tmp_path):
    docs = copy_docs(tmp_path)
    (docs / "bench" / "tf-stack.json").unlink()
    proc = run_chexflow("bench", "tables", "--docs", docs, check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert str(docs / "benchmarks.md") in line and "tf-stack.json" in line
    assert (docs / "benchmarks.md").read_text() == (DOCS / "benchmarks.md").read_text()


def test_a_fault_run_copied_under_docs_bench_renders_one_row_per_fault(tmp_path):
    docs = copy_docs(tmp_path)
    rows = [{"fault": "etcd", "at": 109.0, "back": 110.0, "restarted_after_s": 0.5,
             "healthy_after_s": 1.0, "job_pods_replaced_or_restarted": [],
             "also_restarted": []},
            {"fault": "kubelet", "at": 140.0, "back": 141.5, "restarted_after_s": 0.5,
             "healthy_after_s": 1.5, "job_pods_replaced_or_restarted": ["w-worker-0"],
             "also_restarted": ["mpi-operator"]}]
    ends = {1: 100.0, 2: 104.0, 3: 108.0, 4: 115.0, 5: 119.0}
    run = {"command": "chexflow bench --only cluster-faults", "measured": "2030-01-02T03:04Z",
           "load_average_1m": 1.25, "cores": 2, "commit": "abc1234",
           "job": {"kind": "MPIJob, 1 worker, DenseNet-121 64 px", "epochs": 5,
                   "outcome": "Succeeded", "seconds": 77},
           **table(FaultRun(rows=rows, epoch_ends=ends))}
    (docs / "bench" / "cluster-faults.json").write_text(json.dumps(run))
    run_chexflow("bench", "tables", "--docs", docs)
    page = (docs / "local-cluster.md").read_text()
    made = page.split("from bench/cluster-faults.json -->\n", 1)[1].split("<!-- end", 1)[0]
    assert made.splitlines()[0] == ("`chexflow bench --only cluster-faults` on 2 CPUs, "
                                    "2030-01-02T03:04Z, load average 1.25 at the start, "
                                    "commit abc1234.")
    assert "ended **Succeeded** in 77 s; median fault-free epoch 4 s" in made
    assert "| etcd | 0.5 s | 1 s | 4 | none | 3 | - |" in made
    assert "| kubelet | 0.5 s | 1.5 s | - | w-worker-0 | - | mpi-operator |" in made


def test_the_katib_fault_table_says_how_the_trials_in_flight_ended(tmp_path):
    docs = copy_docs(tmp_path)
    bench = docs / "bench" / "cluster-faults-katib.json"
    doc = json.loads(bench.read_text())
    mysql = next(f for f in doc["faults"] if f["fault"] == "katib-mysql")
    mysql["trials_ended"] = {"t1": "Failed", "t2": "Succeeded", "t3": "Failed"}
    bench.write_text(json.dumps(doc))
    run_chexflow("bench", "tables", "--docs", docs)
    page = (docs / "local-cluster.md").read_text()
    made = page.split("from bench/cluster-faults-katib.json -->\n", 1)[1].split("<!-- end", 1)[0]
    assert made.startswith(f"`{doc['command']}` on {doc['cores']} CPUs, {doc['measured']}")
    row = next(line for line in made.splitlines() if line.startswith("| katib-mysql |"))
    assert "| 2 Failed, 1 Succeeded |" in row
