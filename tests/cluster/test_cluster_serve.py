"""KServe on the dev cluster (the `kserve` add-on: KServe v0.16.0's controller manager built from
its Go module, RawDeployment) serving a trained model from a PersistentVolumeClaim on a real
pod: `chexflow serve deploy` refuses to replace a ClusterServingRuntime that differs (with the
diff), then creates the InferenceService; KServe makes its Deployment, mounts the claim at
/mnt/models, and the predictor pod answers a v1 and a v2 request from the host with
`chexflow predict`'s probabilities for the same images; a corrupt image and a wrong tensor shape
are 400s with one message, and it keeps serving."""

from __future__ import annotations

import csv
import re
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from chexflow.devcluster.kserve import KServe
from chexflow.envs import REPO_ROOT
from tests.conftest import run_chexflow
from tests.test_serve_predictor import b64, post

pytestmark = [pytest.mark.cluster, pytest.mark.realnode, pytest.mark.slow]

MODEL = REPO_ROOT / "tests" / "data" / "tf2.15" / "best_model.keras"  # a saved Keras model
ATOL = 1e-5


@pytest.fixture(scope="module")
def kserve_cluster(k8s_cluster, trainer_image):
    if not k8s_cluster.has("kserve"):
        start = time.monotonic()
        k8s_cluster.add(KServe(), timeout=180)
        print(f"KServe up in {time.monotonic() - start:.1f} s", file=sys.stderr)
    return k8s_cluster


def images(folder: Path, count: int = 6) -> list[Path]:
    """Greyscale PNGs of different sizes and content (the predictor resizes them)."""
    rng = np.random.default_rng(7)
    folder.mkdir()
    paths = []
    for i in range(count):
        side = 32 + 16 * i
        path = folder / f"x{i}.png"
        Image.fromarray(rng.integers(0, 256, (side, side), dtype=np.uint8), "L").save(path)
        paths.append(path)
    return paths


def test_an_inference_service_on_a_real_pod_answers_v1_and_v2_with_predicts_probabilities(
        kserve_cluster, trainer_image, real_namespace, tmp_path):
    namespace, data = real_namespace
    run = data / "runs" / "m1"
    run.mkdir(parents=True)
    shutil.copy(MODEL, run / "best_model.keras")
    paths = images(tmp_path / "images")
    run_chexflow("predict", MODEL, *paths, "--out", tmp_path / "p.csv")
    with open(tmp_path / "p.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    classes = [c for c in rows[0] if c not in ("image", "error")]
    expected = np.array([[float(r[c]) for c in classes] for r in rows])

    env = {"KUBECONFIG": str(kserve_cluster.kubeconfig), "CHEXFLOW_TRAINER_IMAGE": trainer_image}
    # KServe's host name cx-predictor-NAMESPACE must fit a DNS label (63 characters)
    args = ["serve", "deploy", "pvc://data/runs/m1", "--name", "cx", "--namespace", namespace,
            "--cpu", "500m",
            "--memory", "1500Mi", "--timeout", "420"]
    refused = run_chexflow(*args, "--image", "reg.example/other/trainer:1", env=env,
                           check=False)
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.startswith("chexflow serve: error: ClusterServingRuntime "
                                     "chexflow-predictor on the cluster differs from chexflow's; "
                                     "pass --update-runtime to replace it:"), refused.stderr
    assert "+  image: reg.example/other/trainer:1" in refused.stderr

    out = run_chexflow(*args, "--update-runtime", env=env, timeout=600).stdout
    match = re.search(r"\(predictor pod (\S+):8080\)", out)
    assert match and "Ready at http://cx-predictor." in out, out
    base = f"http://{match.group(1)}:8080"

    status, body = post(f"{base}/v1/models/cx:predict",
                        {"instances": [{"b64": b64(p)} for p in paths]})
    assert status == 200, body
    np.testing.assert_allclose([[row[c] for c in classes] for row in body["predictions"]],
                               expected, atol=ATOL)
    status, body = post(f"{base}/v2/models/cx/infer", {"inputs": [{
        "name": "images", "datatype": "BYTES", "shape": [len(paths)],
        "data": [b64(p) for p in paths]}]})
    assert status == 200, body
    out = body["outputs"][0]
    np.testing.assert_allclose(np.array(out["data"]).reshape(out["shape"]), expected,
                               atol=ATOL)

    status, body = post(f"{base}/v1/models/cx:predict", {"instances": [
        {"b64": b64(paths[0])}, {"b64": "aGVsbG8="}]})
    assert status == 400 and body == {"error": "not an image Pillow can identify: instance 1"}
    status, body = post(f"{base}/v2/models/cx/infer", {"inputs": [{
        "name": "images", "datatype": "UINT8", "shape": [2, 8], "data": [0] * 16}]})
    assert status == 400 and body["error"].startswith("pixels of shape [2, 8]"), body
    status, body = post(f"{base}/v1/models/cx:predict", {"instances": [{"b64": b64(p)}
                                                                            for p in paths]})
    assert status == 200

    # deleted, KServe's finalizer removal passes its own webhook (its deploymentMode unchanged)
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    custom = client.CustomObjectsApi(kserve_cluster.api_client())
    custom.delete_namespaced_custom_object("serving.kserve.io", "v1beta1", namespace,
                                           "inferenceservices", "cx")
    deadline = time.monotonic() + 120
    while True:
        try:
            custom.get_namespaced_custom_object("serving.kserve.io", "v1beta1", namespace,
                                                "inferenceservices", "cx")
        except ApiException as e:
            assert e.status == 404
            break
        assert time.monotonic() < deadline, "the InferenceService was not deleted in 120 s"
        time.sleep(1)
