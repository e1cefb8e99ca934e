"""Scale benchmark of the local control plane: many MPIJobs on many kwok GPU nodes.

Starts its own LocalCluster (default 1,000 nodes x 8 nvidia.com/gpu), submits `jobs` MPIJobs
(default 100, each 1 launcher + `workers` workers x `gpus_per_worker` GPUs; launchers held Running
with the kwok hold label so "all Running" is a steady state), and reports the seconds from the
first submission until every MPIJob has its Running condition, the apiserver's (and etcd's)
resident memory, and a curve of Running MPIJobs over time.

    .venv/bin/python -m chexflow.bench.cluster_scale --out runs/bench-cluster
writes cluster_scale.json, cluster_scale.png and cluster_scale.html there. Not a test.
"""

from __future__ import annotations

import argparse
import html
import json
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tqdm import tqdm

from chexflow.bench.core import machine
from chexflow.devcluster import nodes as kwok_nodes
from chexflow.devcluster.controlplane import LocalCluster

GROUP, VERSION, PLURAL = "kubeflow.org", "v2beta1", "mpijobs"
NAMESPACE = "scale"


def scale_mpijob(name: str, workers: int, gpus_per_worker: int) -> dict:
    """An MPIJob whose launcher kwok keeps Running (label chexflow.io/kwok-hold)."""
    def template(role: str, limits: dict, labels: dict) -> dict:
        return {"metadata": {"labels": labels},
                "spec": {"containers": [{"name": role, "image": "chexflow-trainer:bench",
                                         "resources": {"limits": limits}}]}}

    return {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "MPIJob", "metadata": {"name": name},
        "spec": {
            "slotsPerWorker": gpus_per_worker,
            "runPolicy": {"cleanPodPolicy": "All"},
            "mpiReplicaSpecs": {
                "Launcher": {"replicas": 1, "template": template(
                    "launcher", {"cpu": "1"}, {kwok_nodes.HOLD_LABEL: "true"})},
                "Worker": {"replicas": workers, "template": template(
                    "worker", {kwok_nodes.GPU_RESOURCE: gpus_per_worker}, {})},
            },
        },
    }


def _running(api) -> int:
    from kubernetes import client

    items = client.CustomObjectsApi(api).list_namespaced_custom_object(
        GROUP, VERSION, NAMESPACE, PLURAL)["items"]
    return sum(
        any(c["type"] == "Running" and c["status"] == "True"
            for c in (j.get("status") or {}).get("conditions") or [])
        for j in items)


def run(nodes: int = 1000, gpus_per_node: int = 8, jobs: int = 100, workers: int = 4,
        gpus_per_worker: int = 8, timeout: float = 1800, state_dir: Path | None = None) -> dict:
    """Run the benchmark once; returns the measurements (also see write_report)."""
    from kubernetes import client

    state_dir = Path(state_dir or tempfile.mkdtemp(prefix="chexflow-scale-"))
    result: dict = {"nodes": nodes, "gpus_per_node": gpus_per_node, "jobs": jobs,
                    "workers_per_job": workers, "gpus_per_worker": gpus_per_worker,
                    "machine": machine()}
    t0 = time.monotonic()
    with LocalCluster(state_dir, nodes=1, gpus_per_node=gpus_per_node,
                      die_with_parent=True) as cluster:
        result["cluster_start_s"] = time.monotonic() - t0
        api = cluster.api_client()
        t = time.monotonic()
        names = kwok_nodes.create_gpu_nodes(api, nodes, gpus_per_node, prefix="scale-gpu-",
                                            workers=16)
        kwok_nodes.wait_nodes_ready(api, names, timeout=timeout)
        result["nodes_ready_s"] = time.monotonic() - t
        result["apiserver_memory_mib_idle"] = cluster.memory()
        client.CoreV1Api(api).create_namespace({"metadata": {"name": NAMESPACE}})
        custom = client.CustomObjectsApi(api)

        start = time.monotonic()
        with ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(lambda i: custom.create_namespaced_custom_object(
                GROUP, VERSION, NAMESPACE, PLURAL,
                scale_mpijob(f"job-{i:04d}", workers, gpus_per_worker)), range(jobs)))
        result["submit_s"] = time.monotonic() - start
        curve: list[tuple[float, int]] = []
        peak = {"VmRSS": 0.0}
        with tqdm(total=jobs, desc="MPIJobs Running", unit="job") as bar:
            while True:
                running = _running(api)
                elapsed = time.monotonic() - start
                curve.append((round(elapsed, 2), running))
                bar.update(running - bar.n)
                mem = cluster.memory()
                peak = mem if mem["VmRSS"] > peak["VmRSS"] else peak
                if running >= jobs:
                    break
                if elapsed > timeout:
                    raise TimeoutError(f"{running}/{jobs} MPIJobs Running after {timeout:.0f} s")
                cluster.check()
                time.sleep(1)
        result["all_running_s"] = curve[-1][0]
        result["curve"] = curve
        result["apiserver_memory_mib"] = cluster.memory()
        result["apiserver_memory_mib_peak_sampled"] = peak
        result["etcd_memory_mib"] = cluster.memory("etcd")
        pods = client.CoreV1Api(api).list_namespaced_pod(NAMESPACE).items
        result["pods"] = len(pods)
        result["pods_bound"] = sum(1 for p in pods if p.spec.node_name)
    return result


def write_report(result: dict, out: Path) -> None:
    """cluster_scale.json, .png (Running MPIJobs over time) and .html in `out`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    (out / "cluster_scale.json").write_text(json.dumps(result, indent=2) + "\n")
    xs, ys = zip(*result["curve"], strict=True)
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.step(xs, ys, where="post")
    ax.set_xlabel("seconds since first submission")
    ax.set_ylabel("MPIJobs Running")
    ax.set_title(f"{result['jobs']} MPIJobs on {result['nodes']} kwok nodes x "
                 f"{result['gpus_per_node']} GPUs: all Running in {result['all_running_s']:.1f} s",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(out / "cluster_scale.png", dpi=120)
    plt.close(fig)
    rows = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(json.dumps(v))}</td></tr>"
                   for k, v in result.items() if k != "curve")
    (out / "cluster_scale.html").write_text(
        "<!doctype html><meta charset=utf-8><title>chexflow cluster scale</title>"
        "<h1>Local control plane at scale</h1><img src=cluster_scale.png>"
        f"<table border=1 cellpadding=4>{rows}</table>\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--jobs", type=int, default=100)
    p.add_argument("--workers", type=int, default=4, help="workers per MPIJob")
    p.add_argument("--gpus-per-worker", type=int, default=8)
    p.add_argument("--timeout", type=float, default=1800)
    a = p.parse_args(argv)
    if a.jobs * a.workers * a.gpus_per_worker > a.nodes * a.gpus_per_node:
        p.error(f"{a.jobs} jobs x {a.workers} workers x {a.gpus_per_worker} GPUs do not fit on "
                f"{a.nodes} nodes x {a.gpus_per_node} GPUs")
    result = run(a.nodes, a.gpus_per_node, a.jobs, a.workers, a.gpus_per_worker, a.timeout)
    write_report(result, a.out)
    print(f"{a.jobs} MPIJobs all Running {result['all_running_s']:.1f} s after submission; "
          f"apiserver RSS {result['apiserver_memory_mib']['VmRSS']:.0f} MiB "
          f"(peak {result['apiserver_memory_mib']['VmHWM']:.0f} MiB); report in {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
