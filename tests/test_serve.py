"""chexflow's KServe artefacts and predictor without a cluster: the ClusterServingRuntime
(serving/chexflow-runtime.yaml) and InferenceService validate against KServe's own CRD schemas
(from its Go module); `serve render` and `serve deploy` refuse bad names and URIs in one line;
the predictor's request parsing refuses what it cannot answer, naming the instance; the
inferenceservice-config the dev cluster installs is KServe's own in RawDeployment mode."""

from __future__ import annotations

import base64
import io
import json
import os
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image

from chexflow.devcluster import kserve as devkserve
from chexflow.devcluster.binaries import required_version
from chexflow.envs import REPO_ROOT
from chexflow.jobs.schema import validate_against_crd
from chexflow.serve.predictor import RequestRejected, v1_batch, v2_batch
from chexflow.serve.render import RUNTIME_FILE, inference_service, runtime_text, serving_runtime
from tests.conftest import run_chexflow
from tests.recorded_kube_fake import RecordedRequestFakeKubeApi

KSERVE_MODULE = "github.com/kserve/kserve"
LONG_NAMESPACE = "team-" + "a" * 41  # with chexnet-predictor-: one over 63 characters


def kserve_module() -> Path:
    """KServe's module of the release build/kserve/go.mod names (downloaded into the module
    cache when missing: seconds, no build)."""
    version = required_version(devkserve.KSERVE_DIR / "go.mod", KSERVE_MODULE)
    proc = subprocess.run(["go", "mod", "download", "-json", f"{KSERVE_MODULE}@{version}"],
                          cwd=devkserve.KSERVE_DIR, capture_output=True, text=True,
                          env={**os.environ, "PATH": f"/usr/local/go/bin:{os.environ['PATH']}"})
    assert proc.returncode == 0, proc.stderr
    return Path(json.loads(proc.stdout)["Dir"])


def kserve_crd(plural: str) -> Path:
    return kserve_module() / "config" / "crd" / "full" / f"serving.kserve.io_{plural}.yaml"


def png(pixels: np.ndarray) -> str:
    buf = io.BytesIO()
    Image.fromarray(pixels.astype(np.uint8), mode="L").save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


def test_committed_runtime_is_what_the_renderer_writes():
    assert RUNTIME_FILE.read_text() == runtime_text(), (
        "serving/chexflow-runtime.yaml is stale: python -m chexflow.serve.render")


def test_runtime_and_inference_service_validate_against_kserves_crds():
    runtime = yaml.safe_load(RUNTIME_FILE.read_text())
    validate_against_crd(runtime, kserve_crd("clusterservingruntimes"), version="v1alpha1")
    isvc = inference_service("chexnet", "pvc://data/runs/r1", namespace="team-a", cpu="500m",
                             service_account="chexflow-serve")
    validate_against_crd(isvc, kserve_crd("inferenceservices"), version="v1beta1")
    model = isvc["spec"]["predictor"]["model"]
    assert model["modelFormat"] == {"name": "chexflow"}
    assert model["runtime"] == runtime["metadata"]["name"] == "chexflow-predictor"
    assert isvc["metadata"]["annotations"] == {
        "serving.kserve.io/deploymentMode": "Standard"}


def test_serve_render_prints_what_kubectl_applies_and_refuses_bad_input_in_one_line(tmp_path):
    out = run_chexflow("serve", "render", "pvc://data/runs/r1", "--name", "cxr",
                       "--namespace", "team-a").stdout
    assert yaml.safe_load(out)["metadata"]["namespace"] == "team-a"
    for args, expected in (
            (["runs/r1"], "chexflow serve: error: MODEL 'runs/r1': expected a storage URI"),
            (["pvc://Data_1/r1"], "chexflow serve: error: MODEL 'pvc://Data_1/r1': "
                                  "pvc://CLAIM/PATH"),
            (["pvc://data/r1", "--name", "CheXNet"], "chexflow serve: error: --name 'CheXNet': "
                                                     "expected a DNS label"),
            (["pvc://data/r1", "--namespace", LONG_NAMESPACE],
             f"chexflow serve: error: --name chexnet in namespace {LONG_NAMESPACE}: KServe's "
             f"host name chexnet-predictor-{LONG_NAMESPACE} is 64 characters, over the 63 of a "
             "DNS label (KServe would not create it); use a name of at most 6 characters")):
        proc = run_chexflow("serve", "render", *args, check=False)
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert proc.stderr.startswith(expected), proc.stderr


def test_serve_deploy_without_a_cluster_is_one_line(tmp_path):
    proc = run_chexflow("serve", "deploy", "pvc://data/runs/r1", check=False,
                        env={"KUBECONFIG": str(tmp_path / "none")})
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "no Kubernetes configuration" in proc.stderr


def test_v1_instances_are_files_or_pixels_and_anything_else_names_the_instance():
    size = 16
    image = np.arange(size * size).reshape(size, size) % 256
    batch = v1_batch([{"b64": png(image)}, {"image_bytes": {"b64": png(image)}}], size)
    assert batch.shape == (2, size, size, 1) and (batch[0, ..., 0] == image).all()
    pixels = v1_batch([image.tolist()], size)
    assert (pixels[0, ..., 0] == image).all()
    for instances, message in (
            ([], 'expected {"instances": [...]} with at least one instance'),
            ([{"b64": png(image)}, {"b64": "not base64!"}], "instance 1: not base64"),
            ([{"b64": base64.b64encode(b"GIF89a....").decode()}],
             "not an image Pillow can identify: instance 0"),
            ([{"b64": ""}], "instance 0: an empty image"),
            ([{"url": "x"}], "instance 0: expected {\"b64\""),
            ([{"b64": png(image)}, image.tolist()], "instances mix files"),
            ([np.zeros((8, 8)).tolist()], "pixels of shape [1, 8, 8, 1]: expected [N, 16, 16]"),
            ([np.full((16, 16), 300).tolist()], "pixels: expected grey levels from 0 to 255")):
        with pytest.raises(RequestRejected) as err:
            v1_batch(instances, size)
        assert str(err.value).startswith(message), err.value


def test_v2_inputs_are_bytes_or_pixel_tensors_with_their_shape_checked():
    size = 16
    image = np.full((size, size), 7)
    files = np.asarray([png(image)] * 3, dtype=object)
    assert v2_batch("BYTES", [3], files, size).shape == (3, size, size, 1)
    assert v2_batch("UINT8", [1, size, size, 1], image[None, ..., None], size).shape == (
        1, size, size, 1)
    for args, message in (
            (("BYTES", [3, 1], files), "BYTES input of shape [3, 1]: expected [N]"),
            (("BYTES", [4], files), "BYTES input of shape [4] holds 3 elements"),
            (("BOOL", [1], np.zeros(1)), "input datatype BOOL: expected BYTES"),
            (("FP32", [1, 3, 3], np.zeros((1, 3, 3))), "pixels of shape [1, 3, 3, 1]")):
        with pytest.raises(RequestRejected) as err:
            v2_batch(*args, size)
        assert str(err.value).startswith(message), err.value


def test_dev_cluster_config_map_is_kserves_own_in_raw_deployment_mode_without_ingress(tmp_path):
    """What the `kserve` add-on installs: the module's inferenceservice-config with only the
    deployment mode and Ingress creation changed."""
    module = kserve_module()
    (tmp_path / "inferenceservice-config.yaml").write_bytes(
        (module / "config" / "configmap" / "inferenceservice.yaml").read_bytes())
    doc = devkserve.config_map(tmp_path)
    upstream = yaml.safe_load((tmp_path / "inferenceservice-config.yaml").read_text())["data"]
    assert doc["metadata"] == {"name": "inferenceservice-config", "namespace": "kserve"}
    assert json.loads(doc["data"]["deploy"]) == {"defaultDeploymentMode": "Standard"}
    ingress = json.loads(doc["data"]["ingress"])
    assert ingress.pop("disableIngressCreation") is True
    expected = json.loads(upstream["ingress"])
    expected.pop("disableIngressCreation")
    assert ingress == expected
    same = set(upstream) - {"_example", "deploy", "ingress"}
    assert {k: doc["data"][k] for k in same} == {k: upstream[k] for k in same}


class _ServingFakeKubeApi(RecordedRequestFakeKubeApi):
    """The recorded-request fake answering what `serve deploy` asks: chexflow's runtime (there
    for `image`), InferenceServices (Ready once created, or never), their predictor pods
    (running, or crash-looping with a log)."""

    def __init__(self, image: str, crash: bool = False):
        super().__init__()
        self.image, self.crash = image, crash
        self.isvcs: dict[str, dict] = {}

    def _handle(self, method, path, query, body):
        if path.endswith("/clusterservingruntimes/chexflow-predictor"):
            return 200, serving_runtime(self.image)
        m = re.match(r"^/apis/serving\.kserve\.io/v1beta1/namespaces/[^/]+/inferenceservices"
                     r"(?:/([^/]+))?$", path)
        if m:
            return self._isvc(method, m.group(1), body)
        if path.endswith("/pods") and method == "GET":
            state = ({"waiting": {"reason": "CrashLoopBackOff"}} if self.crash else
                     {"running": {}})
            return 200, {"items": [{
                "metadata": {"name": "cx-predictor-1", "namespace": "team-a"},
                "status": {"phase": "Running", "podIP": "198.18.5.9", "containerStatuses": [{
                    "name": "kserve-container", "ready": not self.crash, "restartCount": 3,
                    "image": self.image, "imageID": "", "state": state}]}}]}
        if path.endswith("/log"):
            return 200, "ModuleNotFoundError: No module named 'kserve'"
        return super()._handle(method, path, query, body)

    def _isvc(self, method, name, body):
        if method == "POST":
            if body["metadata"]["name"] in self.isvcs:
                return 409, {"kind": "Status", "reason": "AlreadyExists", "message": "exists"}
            self.isvcs[body["metadata"]["name"]] = body
            return 201, body
        if method == "DELETE":
            self.isvcs.pop(name)
            return 200, {"kind": "Status", "status": "Success"}
        if method == "PUT":
            self.isvcs[name] = body
            return 200, body
        ready = "False" if self.crash else "True"
        return 200, {**self.isvcs[name], "metadata": {**self.isvcs[name]["metadata"],
                                                      "resourceVersion": "5"},
                     "status": {"address": {"url": f"http://{name}-predictor.team-a.svc"},
                                "conditions": [{"type": "Ready", "status": ready}]}}


def test_deploy_step_asks_exactly_what_serving_rbac_grants_and_deletes_what_never_got_ready(
        monkeypatch):
    """The pipeline's deploy step as chexflow-launcher: a new InferenceService, the same name
    again (replaced), and one whose predictor crash-loops (one line with the end of its log;
    deleted again). Its requests are what serving/rbac.yaml grants, no more."""
    from chexflow import kube
    from chexflow.components.steps import StepError, Target, deploy_step
    from chexflow.serve.deploy import DeployError
    from tests.rbac_requests import access, granted

    image = "reg.example/chexflow/trainer:1"
    target = Target(workdir="/mnt/chexflow/runs/r1", backend="kubernetes", namespace="team-a",
                    data_pvc="data", trainer_image=image)
    ok = _ServingFakeKubeApi(image)
    monkeypatch.setattr(kube, "load_api_client", lambda *a, **k: ok.api_client())
    for _ in range(2):  # created, then the same name again: replaced
        url = deploy_step("/mnt/chexflow/runs/r1/train/best_model.keras", "cx", target)
        assert url == "http://cx-predictor.team-a.svc"
        model = ok.isvcs["cx"]["spec"]["predictor"]["model"]
        assert model["storageUri"] == "pvc://data/runs/r1/train"
    crashing = _ServingFakeKubeApi(image, crash=True)
    monkeypatch.setattr(kube, "load_api_client", lambda *a, **k: crashing.api_client())
    with pytest.raises(DeployError) as err:
        deploy_step("/mnt/chexflow/runs/r1/train", "cx", target)
    assert str(err.value) == (
        "InferenceService team-a/cx not Ready after 0 s: pod cx-predictor-1 container "
        "kserve-container keeps exiting (CrashLoopBackOff); its log ends: "
        "ModuleNotFoundError: No module named 'kserve' (the InferenceService was deleted)")
    assert crashing.isvcs == {}
    used = {access(r.method, r.path, r.query) for f in (ok, crashing) for r in f.requests}
    assert used == granted(REPO_ROOT / "serving" / "rbac.yaml")
    with pytest.raises(StepError, match="deploy true: needs backend kubernetes"):
        deploy_step("/x/best_model.keras", "cx", Target(workdir="/tmp/r", backend="local"))
