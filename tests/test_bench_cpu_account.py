"""The CPU account of a benchmark phase: a child's CPU is charged to its program, this process's
own work to the bench's client, and the machine's busy share is a share of all cores."""

from __future__ import annotations

import subprocess
import sys
import time
from types import SimpleNamespace

import psutil

from chexflow.bench import contention
from chexflow.bench.apiserver_requests import ApiRequests, request_counts
from chexflow.bench.cpu_account import CpuAccount

# waits for a line, burns a CPU second, waits for another line
CHILD = """import sys, time
sys.stdin.readline()
end = time.process_time() + 1.0
while time.process_time() < end:
    pass
sys.stdin.readline()
"""


def test_a_child_alive_at_both_ends_is_charged_the_cpu_it_used_between():
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE, text=True)
    try:
        time.sleep(0.5)  # started, waiting: what it used so far is not the phase's
        with CpuAccount() as account:
            child.stdin.write("\n")
            child.stdin.flush()
            deadline = time.monotonic() + 60
            while sum(psutil.Process(child.pid).cpu_times()[:2]) < 1.0:
                assert time.monotonic() < deadline, "the child never burned its second"
                time.sleep(0.1)
            sum(i * i for i in range(1_000_000))  # this process's own work
        name = psutil.Process(child.pid).name()
    finally:
        child.kill()
        child.wait()
    r = account.result
    assert 0.9 <= r["programs_cpu_s"][name] < 2.0
    assert r["bench_client_cpu_s"] > 0.0
    assert r["cores"] == psutil.cpu_count() and 0.0 < r["machine_busy"] <= 1.0


def test_the_report_says_how_busy_each_phase_was_and_which_programs_used_it():
    phase = {"wall_s": 60.0, "cores": 2, "machine_busy": 0.97, "bench_client_cpu_s": 9.0,
             "programs_cpu_s": {"kube-apiserver": 50.0, "etcd": 20.0, "kueue": 12.0},
             "requests": {"put leases": 3000, "patch pods/status": 800}}
    lines = contention.cpu_lines([{"policy": "kueue", "stream_cpu": phase, "fit_cpu": phase}],
                                 {"fit_jobs": 100})
    assert ("- kueue: the stream 97% of 2 cores busy over 60 s (kube-apiserver 50, etcd 20, "
            "kueue 12, the bench's client 9 core-s); the apiserver served put leases 3000, "
            "patch pods/status 800;") in lines
    assert "the 100 fitting MPIJobs 97% of 2 cores busy" in lines
    assert contention.cpu_lines([{"policy": "default"}], {"fit_jobs": 100}) == ""


def counter(verb: str, resource: str, subresource: str, code: int, value: int) -> str:
    """One apiserver_request_total sample as kube-apiserver's /metrics writes it."""
    return (f'apiserver_request_total{{code="{code}",component="apiserver",dry_run="",group="",'
            f'resource="{resource}",scope="namespace",subresource="{subresource}",'
            f'verb="{verb}",version="v1"}} {value}\n')


HEAD = ("# HELP apiserver_request_total [STABLE] Counter of apiserver requests\n"
        "# TYPE apiserver_request_total counter\n")
METRICS = HEAD + counter("PUT", "leases", "", 200, 120) + counter("PUT", "leases", "", 409, 3) \
    + counter("PATCH", "pods", "status", 200, 40) + counter("POST", "pods", "binding", 201, 2)


class FakeMetricsApi:
    """An ApiClient whose /metrics answers with `texts` in turn."""

    def __init__(self, *texts: str):
        self.texts = list(texts)

    def call_api(self, path, method, **kw):
        assert (path, method, kw.get("_preload_content")) == ("/metrics", "GET", False)
        return (SimpleNamespace(data=self.texts.pop(0).encode()), 200, {})


def test_the_apiserver_requests_of_a_phase_are_its_counters_difference_by_verb_and_resource():
    later = METRICS.replace("} 120", "} 150").replace("} 40", "} 100")
    with ApiRequests(FakeMetricsApi(METRICS, later), least=10) as served:
        pass
    assert served.result == {"patch pods/status": 60, "put leases": 30}  # the 2 bindings: < 10
    assert request_counts(FakeMetricsApi(METRICS))[("put", "leases")] == 123  # every code
