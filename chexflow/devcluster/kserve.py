"""KServe in the local cluster (the `kserve` add-on): its controller manager built from its Go
module (build/kserve/build.sh, cached by content beside the control plane's binaries), run as a
local process whose webhooks the apiserver calls on 127.0.0.1 with a certificate of the
cluster's CA, in RawDeployment ("Standard") mode: an InferenceService becomes a Deployment and a
Service, no Knative or Istio needed.

The CRDs, webhook configurations and the inferenceservice-config ConfigMap are the module's own
manifests, with two settings changed in the ConfigMap: `deploy.defaultDeploymentMode` Standard
(RawDeployment) and `ingress.disableIngressCreation` (no Ingress controller runs here; the
predictor is reached at its Service or pod address). After the start, chexflow's
ClusterServingRuntime (chexflow.serve.render) is applied for the chosen trainer image.
"""

from __future__ import annotations

import base64
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from chexflow.devcluster import certs, crds
from chexflow.devcluster.addon import AddOn, Cluster
from chexflow.devcluster.binaries import GO_DIR, GoBuild
from chexflow.errors import ChexflowError

KSERVE_DIR = GO_DIR / "kserve"
NAMESPACE = "kserve"  # the manager reads inferenceservice-config from here (constants)
CONFIG_MAP = "inferenceservice-config"
EXE = "kserve-manager"
DEPLOYMENT_MODE = "Standard"  # v0.16's name for RawDeployment (which it still accepts)


class KServeError(ChexflowError):
    """KServe could not be built, configured or started."""


BUILD = GoBuild("kserve", KSERVE_DIR, "github.com/kserve/kserve",
                (EXE, "webhooks.yaml", "inferenceservice-config.yaml"), cold="about 5 min")
cache_dir = BUILD.cache_dir  # kserve-<release>-<10 hex of sha256(go.mod + go.sum + build.sh)>
ensure_binaries = BUILD.ensure


def serving_cert(pki: certs.PKI) -> Path:
    """pki/kserve/k8s-webhook-server/serving-certs/tls.{crt,key} for 127.0.0.1: the manager
    reads its webhook certificate from $TMPDIR/k8s-webhook-server/serving-certs
    (controller-runtime's default), so its TMPDIR is pki/kserve."""
    return certs.loopback_serving_cert(pki, "kserve-webhook",
                                       pki.dir / "kserve" / "k8s-webhook-server" / "serving-certs")


def webhook_configurations(bin_dir: Path, port: int, ca_bundle: str) -> list[dict]:
    """The module's webhook configurations, each calling 127.0.0.1:<port> with the cluster CA
    (the manifests name a Service through kustomize variables, which nothing fills here)."""
    out = []
    for doc in yaml.safe_load_all((bin_dir / "webhooks.yaml").read_text()):
        if not doc:
            continue
        for hook in doc["webhooks"]:
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}",
                                    "caBundle": ca_bundle}
        doc["metadata"] = {"name": doc["metadata"]["name"]}
        out.append(doc)
    return out


def config_map(bin_dir: Path) -> dict:
    """inferenceservice-config as the module ships it, in Standard (RawDeployment) mode and
    without Ingress creation."""
    doc = yaml.safe_load((bin_dir / "inferenceservice-config.yaml").read_text())
    data = doc["data"]
    data.pop("_example", None)
    deploy = json.loads(data["deploy"])
    deploy["defaultDeploymentMode"] = DEPLOYMENT_MODE
    data["deploy"] = json.dumps(deploy, indent=2)
    ingress = json.loads(data["ingress"])
    ingress["disableIngressCreation"] = True
    data["ingress"] = json.dumps(ingress, indent=2)
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": CONFIG_MAP, "namespace": NAMESPACE}, "data": data}


def apply_config_map(api, doc: dict) -> None:
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    core = client.CoreV1Api(api)
    try:
        core.create_namespaced_config_map(NAMESPACE, doc)
    except ApiException as e:
        if e.status != 409:
            raise KServeError(f"ConfigMap {NAMESPACE}/{CONFIG_MAP}: {e.status} {e.reason}") \
                from None
        core.replace_namespaced_config_map(CONFIG_MAP, NAMESPACE, doc)


def install(api, bin_dir: Path, port: int, pki: certs.PKI, timeout: float) -> None:
    """The serving.kserve.io CRDs and KServe's webhook configurations."""
    crds.install_crds(api, sorted((bin_dir / "crds").glob("*.yaml")), timeout=timeout)
    ca_bundle = base64.b64encode(pki.ca.read_bytes()).decode()
    crds.apply_webhook_configurations(api, webhook_configurations(bin_dir, port, ca_bundle),
                                      KServeError)


def apply_runtime(api) -> str:
    """chexflow's ClusterServingRuntime for the chosen trainer image; its name."""
    from chexflow.serve.deploy import ensure_runtime

    return ensure_runtime(api, replace=True)


@dataclass
class KServe(AddOn):
    """KServe's CRDs, webhooks and ConfigMap, its controller manager, then chexflow's
    ClusterServingRuntime."""

    name = "kserve"
    help = ("also KServe (built from its Go module on first use: about 5 min) in RawDeployment "
            "mode with chexflow's ClusterServingRuntime; predictors run on a real node")
    title = "KServe (RawDeployment)"
    requires = ("real-node",)
    ports = ("kserve_webhook", "kserve_health", "kserve_metrics")
    bin_dir: Path | None = field(default=None, init=False, repr=False)

    def components(self, cluster: Cluster) -> list[str]:
        return ["kserve"]

    def build(self) -> list[Path]:
        self.bin_dir = ensure_binaries()
        return [self.bin_dir]

    def install(self, cluster: Cluster, deadline: float) -> None:
        api = cluster.api_client()
        install(api, self.bin_dir, cluster.ports["kserve_webhook"], cluster.pki,
                timeout=max(5.0, deadline - time.monotonic()))
        cluster.ensure_namespace(NAMESPACE)
        apply_config_map(api, config_map(self.bin_dir))

    def start(self, cluster: Cluster, deadline: float) -> None:
        cert_dir = serving_cert(cluster.pki)
        cluster.spawn("kserve", [
            f"--webhook-port={cluster.ports['kserve_webhook']}",
            f"--health-probe-addr=127.0.0.1:{cluster.ports['kserve_health']}",
            f"--metrics-addr=127.0.0.1:{cluster.ports['kserve_metrics']}",
            "--zap-log-level=info"],
            exe=self.bin_dir / EXE,
            env={"TMPDIR": str(cert_dir.parent.parent), "POD_NAMESPACE": NAMESPACE,
                 "KUBECONFIG": str(cluster.kubeconfig)})

    def ready(self, cluster: Cluster, deadline: float) -> None:
        cluster.wait_http(f"http://127.0.0.1:{cluster.ports['kserve_health']}/readyz", "kserve",
                          deadline)
        apply_runtime(cluster.api_client())
