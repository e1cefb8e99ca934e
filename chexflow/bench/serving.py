"""The InferenceService's requests: `chexflow bench --only serving`.

A cluster of its own (a kwok node, a real node and the `kserve` add-on) serves an untrained
DenseNet-121 at the bench's size (inference.write_model: throughput does not depend on the
weights) from a PersistentVolumeClaim, through chexflow's ClusterServingRuntime on the trainer
image; the same predictor runs as a local process (`chexflow serve local`) with the same model
and as many CPUs. Clients post v1 requests of one PNG each (base64) from this machine, 1 and 8
at a time, to the pod's address and to the local process, interleaved, `repeats` rounds:
requests/s per round, and every request's latency (p50, p99) in the notes.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from chexflow.bench.core import Result, cpu_model
from chexflow.bench.inference import MODEL, write_model
from chexflow.errors import ChexflowError

CLIENTS = (1, 8)
SIDES = ("InferenceService pod", "local predictor")
NAME = "chexnet"
CPUS = "2"
GOAL = 0.9  # the pod answers at least 90% of the local process's requests/s
READY_SECONDS = 300


class ServingBenchError(ChexflowError):
    """The predictor could not be started or answered with an error."""


def _post(url: str, body: bytes) -> float:
    """Seconds for one request; ServingBenchError unless it is answered 200."""
    request = urllib.request.Request(url, data=body,
                                     headers={"Content-Type": "application/json"})
    start = time.perf_counter()
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            response.read()
    except (urllib.error.URLError, OSError) as e:
        raise ServingBenchError(f"POST {url}: {e}") from None
    return time.perf_counter() - start


def load(url: str, bodies: list[bytes], clients: int) -> tuple[float, list[float]]:
    """(requests/s, each request's seconds) of `bodies` posted by `clients` threads."""
    with ThreadPoolExecutor(clients) as pool:
        start = time.perf_counter()
        latencies = list(pool.map(lambda b: _post(url, b), bodies))
        return len(bodies) / (time.perf_counter() - start), latencies


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1] \
        if len(values) > 1 else values[0]


def _wait_ready(base: str, deadline: float, alive=lambda: True) -> None:
    while True:
        with contextlib.suppress(urllib.error.URLError, OSError), \
                urllib.request.urlopen(f"{base}/v2/models/{NAME}/ready", timeout=5) as r:
            if r.status == 200:
                return
        if not alive() or time.monotonic() > deadline:
            raise ServingBenchError(f"the predictor at {base} was not ready")
        time.sleep(1)


@contextlib.contextmanager
def local_predictor(model: Path, log: Path) -> Iterator[str]:
    """`chexflow serve local MODEL`, as many CPUs as the pod; its base URL."""
    from chexflow.ports import free_port

    http = free_port()
    grpc = free_port((http,))
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "chexflow.cli", "serve", "local",
                                 str(model), "--name", NAME, "--http-port", str(http),
                                 "--grpc-port", str(grpc)], stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        base = f"http://127.0.0.1:{http}"
        _wait_ready(base, time.monotonic() + READY_SECONDS, lambda: proc.poll() is None)
        yield base
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@contextlib.contextmanager
def inference_service(work: Path, model: Path) -> Iterator[tuple[str, dict]]:
    """A cluster with KServe serving `model` from a claim; (the pod's base URL, setup notes)."""
    import shutil

    from chexflow.bench.real_pods import namespace
    from chexflow.devcluster import addons
    from chexflow.devcluster.controlplane import LocalCluster
    from chexflow.devcluster.images import build_image
    from chexflow.devcluster.realnode import RealNode, drop_images
    from chexflow.serve.deploy import deploy
    from chexflow.serve.render import inference_service as isvc

    image = build_image("trainer")
    cluster = LocalCluster(work / "cluster", nodes=1, die_with_parent=True,
                           addons=addons.named(["kserve"]))
    started = time.monotonic()
    cluster.start(timeout=300)
    setup = {"cluster_start_s": round(time.monotonic() - started, 1), "image": image.ref}
    try:
        node = RealNode(cluster.state_dir)
        if not node.has_image(image.ref):
            node.import_image(image.archive)
        shared = work / "claim"
        (shared / "runs" / "m").mkdir(parents=True, exist_ok=True)
        shutil.copy(model, shared / "runs" / "m" / "best_model.keras")
        api = cluster.api_client()
        with namespace(api, shared) as ns:
            started = time.monotonic()
            done = deploy(api, isvc(NAME, "pvc://data/runs/m", cpu=CPUS, memory="4Gi"), ns,
                          timeout=READY_SECONDS, update_runtime=True, image=image.ref)
            setup["deploy_to_ready_s"] = round(time.monotonic() - started, 1)
            base = f"http://{done.pod_ip}:8080"
            _wait_ready(base, time.monotonic() + 60)
            yield base, setup
    finally:
        cluster.stop()
        drop_images(cluster.state_dir)


def run(work: Path, images: Path, size: int, requests: int, repeats: int) -> list[Result]:
    """Both sides at each number of clients, interleaved `repeats` rounds."""
    work.mkdir(parents=True, exist_ok=True)
    from chexflow.pathologies import PATHOLOGIES

    model = write_model(work / f"{MODEL}-{size}px.keras", size, list(PATHOLOGIES))
    files = sorted(images.glob("*.png"))[:requests]
    bodies = [json.dumps({"instances": [{"b64": base64.b64encode(f.read_bytes()).decode()}]})
              .encode() for f in files]
    bodies = (bodies * (requests // max(1, len(bodies)) + 1))[:requests]
    rates = {(side, c): [] for side in SIDES for c in CLIENTS}
    latencies = {(side, c): [] for side in SIDES for c in CLIENTS}
    with inference_service(work, model) as (pod, setup), \
            local_predictor(model, work / "local-predictor.log") as local:
        urls = {SIDES[0]: f"{pod}/v1/models/{NAME}:predict",
                SIDES[1]: f"{local}/v1/models/{NAME}:predict"}
        for url in urls.values():  # warm-up: the first requests build TensorFlow's functions
            load(url, bodies[:8], 2)
        for _ in range(repeats):
            for clients in CLIENTS:
                for side, url in urls.items():
                    rate, took = load(url, bodies, clients)
                    rates[side, clients].append(rate)
                    latencies[side, clients] += took
    ms = {f"{side}, {c} client(s)": {"p50_ms": round(1000 * percentile(v, 50), 1),
                                     "p99_ms": round(1000 * percentile(v, 99), 1)}
          for (side, c), v in latencies.items()}
    notes = {"model": MODEL, "image_size": size, "requests_per_round": requests,
             "request": "v1, one PNG (base64) per request", "cpus_each": CPUS,
             "latency": ms, "repeats": repeats, **setup, "cpu": cpu_model(),
             "load_average": [round(x, 2) for x in os.getloadavg()]}
    return [Result(f"serving: {c} client(s)", "requests/s", SIDES[0], SIDES[1],
                   rates[SIDES[0], c], rates[SIDES[1], c], GOAL, dict(notes))
            for c in CLIENTS]


def markdown(result: dict) -> str:
    """Every side's latency percentiles."""
    rows = ["serving: request latency (ms)", "", "| side, clients | p50 | p99 |",
            "|---|---|---|"]
    rows += [f"| {name} | {v['p50_ms']} | {v['p99_ms']} |"
             for name, v in result["notes"]["latency"].items()]
    return "\n".join(rows)
