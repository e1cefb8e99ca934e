"""The KServe predictor (`chexflow serve local`, the process chexflow's ClusterServingRuntime
runs) on the demo's DenseNet-121, over HTTP as a client of an InferenceService talks to it: the
v1 and v2 protocols answer evaluate's probabilities for the test PNGs (atol 1e-5); a corrupt
image and a wrong tensor shape are a 400 with one message naming the instance, and the server
goes on answering; SIGTERM (a pod deleted) ends it."""

from __future__ import annotations

import base64
import json
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from chexflow.ports import free_port
from tests.conftest import CHEXFLOW

pytestmark = [pytest.mark.trainer, pytest.mark.slow]  # the demo's training run

ATOL = 1e-5
MODEL = "chexnet"


def post(url: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.fixture(scope="module")
def served(densenet_run, tmp_path_factory) -> Iterator[str]:
    """`chexflow serve local` of the demo's training run; its base URL."""
    http, grpc = free_port(), None
    grpc = free_port((http,))
    log = tmp_path_factory.mktemp("serve") / "predictor.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([*CHEXFLOW, "serve", "local", str(densenet_run), "--name", MODEL,
                                 "--http-port", str(http), "--grpc-port", str(grpc)],
                                stdout=out, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{http}"
    deadline = time.monotonic() + 300
    while True:
        try:
            with urllib.request.urlopen(f"{base}/v2/models/{MODEL}/ready", timeout=5) as r:
                if r.status == 200:
                    break
        except (urllib.error.URLError, ConnectionError):
            pass
        assert proc.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(1)
    yield base
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) is not None


@pytest.fixture(scope="module")
def test_images(densenet_eval, demo_run) -> tuple[list[Path], np.ndarray, list[str]]:
    """The test split's PNGs, evaluate's probabilities for them and the class names."""
    with np.load(densenet_eval / "predictions.npz") as pred:
        names, probs = list(pred["image_index"]), pred["probs"]
    images = demo_run[2] / "synth-data-64px-seed0" / "images"
    classes = json.loads((densenet_eval / "auroc.json").read_text())["classes"]
    return [images / n for n in names], probs, classes


def b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def test_v1_and_v2_answer_evaluates_probabilities_for_the_test_images(served, test_images):
    paths, probs, classes = test_images
    status, body = post(f"{served}/v1/models/{MODEL}:predict",
                        {"instances": [{"b64": b64(p)} for p in paths]})
    assert status == 200, body
    v1 = np.array([[row[c] for c in classes] for row in body["predictions"]])
    np.testing.assert_allclose(v1, probs, atol=ATOL)
    status, body = post(f"{served}/v2/models/{MODEL}/infer", {"inputs": [{
        "name": "images", "datatype": "BYTES", "shape": [len(paths)],
        "data": [b64(p) for p in paths]}]})
    assert status == 200, body
    (out,) = body["outputs"]
    assert out["name"] == "probabilities" and out["shape"] == [len(paths), len(classes)]
    assert out["parameters"]["classes"].split(",") == classes
    np.testing.assert_allclose(np.array(out["data"]).reshape(out["shape"]), probs, atol=ATOL)


def test_a_corrupt_image_and_a_wrong_shape_are_400s_and_the_server_goes_on(served, test_images):
    paths, probs, _ = test_images
    truncated = base64.b64encode(paths[0].read_bytes()[:60]).decode()
    status, body = post(f"{served}/v1/models/{MODEL}:predict",
                        {"instances": [{"b64": b64(paths[0])}, {"b64": truncated}]})
    assert status == 400 and body["error"].startswith("corrupt or unreadable image: instance 1"), \
        body
    status, body = post(f"{served}/v2/models/{MODEL}/infer", {"inputs": [{
        "name": "images", "datatype": "FP32", "shape": [1, 32, 32], "data": [0.0] * 1024}]})
    assert status == 400 and body["error"].startswith(
        "pixels of shape [1, 32, 32, 1]: expected [N, 64, 64]"), body
    status, body = post(f"{served}/v2/models/{MODEL}/infer", {"inputs": [{
        "name": "images", "datatype": "BYTES", "shape": [1], "data": [b64(paths[0])]}]})
    assert status == 200
    np.testing.assert_allclose(body["outputs"][0]["data"], probs[0], atol=ATOL)
