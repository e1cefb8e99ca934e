"""The real-pods benchmark's report logic on given figures (the runs themselves are in
tests/cluster/test_cluster_bench_real_pods.py)."""

from __future__ import annotations

import pytest

from chexflow.bench.core import Result
from chexflow.bench.real_pods import (
    LOCAL_PHASES,
    POD_PHASES,
    RealPodsError,
    markdown,
    phases,
    plot_startup,
    run_timeline,
)


def test_real_pods_timeline_splits_the_time_from_creation_to_the_first_step():
    created = 1000.0
    metrics = {"started_at": 1012.5, "first_step_began_at": 1030.0, "first_step_ended_at": 1041.0}
    timeline = {"workers scheduled": 0.25, "worker containers running": 3.0,
                "launcher running": 5.5, **run_timeline(metrics, created)}
    split = phases(timeline, POD_PHASES)
    assert split == {"workers scheduled": 0.25, "worker containers running": 2.75,
                     "launcher running": 2.5, "rank 0 started": 7.0,
                     "TensorFlow, Horovod, model, input": 17.5, "first step": 11.0}
    assert sum(split.values()) == pytest.approx(41.0)
    assert phases(run_timeline(metrics, 1010.0), LOCAL_PHASES) == {
        "rank 0 started": 2.5, "TensorFlow, Horovod, model, input": 17.5, "first step": 11.0}
    with pytest.raises(RealPodsError, match="metrics.json lacks first_step_began_at"):
        run_timeline({"started_at": 1.0, "first_step_ended_at": 2.0}, 0.0)


def test_real_pods_report_has_each_runs_phases_and_the_medians(tmp_path):
    pods = {"to_first_step_s": 41.0, "phases": dict.fromkeys(POD_PHASES, 41.0 / 6)}
    local = {"to_first_step_s": 31.0, "phases": dict.fromkeys(LOCAL_PHASES, 31.0 / 3)}
    notes = {"workers": 2, "controllers": {"MPIJob on real pods": ["mpi"],
                                           "horovodrun locally": ["gloo"]},
             "load_average_start": [1.5, 1.0, 0.5],
             "startup": {"MPIJob on real pods": [pods, pods], "horovodrun locally": [local]}}
    result = Result("MPIJob on real pods vs local horovodrun", "images/s", "MPIJob on real pods",
                    "horovodrun locally", [20.0, 22.0], [21.0], 0.95, notes).as_dict()
    text = markdown(result)
    assert "| MPIJob on real pods #2 | 6.83 | 6.83 | 6.83 | 6.83 | 6.83 | 6.83 | 41.00 |" in text
    assert "| horovodrun locally #1 | – | – | – | 10.33 | 10.33 | 10.33 | 31.00 |" in text
    assert "| **MPIJob on real pods median** |" in text and "load average 1.5" in text
    plot_startup(result, tmp_path / "startup.png")
    assert (tmp_path / "startup.png").stat().st_size > 0
