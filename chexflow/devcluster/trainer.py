"""Kubeflow Trainer v2 in the local cluster: JobSet's controller and Trainer's controller manager,
built from their Go modules (build/trainer/build.sh, cached by content beside the control plane's
binaries), each run as a local process whose webhooks the apiserver calls on 127.0.0.1 with a
certificate of the cluster's CA. The CRDs and webhook configurations are the modules' own
manifests (with the JSON patches their kustomizations apply), pointed at those processes.

It is an add-on (`chexflow cluster up --trainer`, `LocalCluster(addons=[Trainer()])`, or
`LocalCluster.add(Trainer())` on a running cluster) rather than always on: the first use builds
two Go programs (minutes), and the MPIJob path needs neither. A Katib that started before it
restarts its controller to watch TrainJobs (Katib.joined).
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

TRAINER_DIR = GO_DIR / "trainer"
BUILD_SCRIPT = TRAINER_DIR / "build.sh"
# Trainer's module here, JobSet's in jobset/ (each program with the versions its project selects)
BUILD_INPUTS = ("go.mod", "go.sum", "jobset/go.mod", "jobset/go.sum", "build.sh")
TRAINER_MODULE = "github.com/kubeflow/trainer/v2"
JOBSET_EXE, TRAINER_EXE = "jobset-controller", "trainer-controller-manager"
GROUP, VERSION = "trainer.kubeflow.org", "v1alpha1"
SYSTEM_NAMESPACE = "kubeflow-system"  # Trainer's, where the Kubeflow SDK looks for its version
PUBLIC_CONFIG_MAP = "kubeflow-trainer-public"
PORTS = ("jobset_webhook", "jobset_health", "trainer_webhook", "trainer_health")


class TrainerError(ChexflowError):
    """Trainer or JobSet could not be built, configured or started."""


BUILD = GoBuild("trainer", TRAINER_DIR, TRAINER_MODULE, (JOBSET_EXE, TRAINER_EXE),
                inputs=BUILD_INPUTS, cold="about 15 min")
cache_dir = BUILD.cache_dir  # trainer-<release>-<10 hex of sha256(BUILD_INPUTS)>
ensure_binaries = BUILD.ensure  # both programs, their CRDs and webhook manifests


def serving_cert(pki: certs.PKI) -> Path:
    """pki/trainer/k8s-webhook-server/serving-certs/tls.{crt,key} for 127.0.0.1, signed by the
    cluster's CA. Trainer's manager reads its webhook certificate from
    $TMPDIR/k8s-webhook-server/serving-certs (controller-runtime's default): TMPDIR=pki/trainer."""
    return certs.loopback_serving_cert(pki, "trainer-webhook",
                                       pki.dir / "trainer" / "k8s-webhook-server" / "serving-certs")


def _json_patch(doc: dict, ops: list[dict]) -> dict:
    """The `replace` and `add` operations (RFC 6902) of a kustomize JSON patch: those these
    manifests use."""
    for op in ops:
        if op.get("op") not in ("replace", "add"):
            raise TrainerError(f"webhook patch: unsupported op {op.get('op')!r}")
        *parents, last = op["path"].strip("/").split("/")
        target: object = doc
        for part in parents:
            target = target[int(part)] if isinstance(target, list) else target[part]
        if not isinstance(target, list):
            target[last] = op["value"]
        elif op["op"] == "replace":
            target[int(last)] = op["value"]
        else:
            target.insert(len(target) if last == "-" else int(last), op["value"])
    return doc


def webhook_configurations(bin_dir: Path, component: str, port: int,
                           ca_bundle: str) -> list[dict]:
    """`component`'s (trainer or jobset) webhook configurations as its kustomization patches
    them, named `<component>-<kind>` and calling 127.0.0.1:<port> with the cluster CA."""
    folder = bin_dir / "webhooks" / component
    out = []
    for doc in yaml.safe_load_all((folder / "manifests.yaml").read_text()):
        if not doc:
            continue
        which = "mutating" if doc["kind"] == "MutatingWebhookConfiguration" else "validating"
        patch = folder / f"patch_{which}.yaml"
        if patch.exists():
            doc = _json_patch(doc, yaml.safe_load(patch.read_text()))
        for hook in doc["webhooks"]:
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}",
                                    "caBundle": ca_bundle}
        doc["metadata"] = {"name": f"{component}-{which}"}
        out.append(doc)
    return out


def public_objects(bin_dir: Path) -> list[dict]:
    """Trainer's public ConfigMap (its release, as the manager overlay's configMapGenerator writes
    it: the Kubeflow SDK reads it) and the module's Role and RoleBinding that let every
    authenticated user read it, in Trainer's namespace."""
    from chexflow.devcluster.binaries import required_version

    version = required_version(TRAINER_DIR / "go.mod", TRAINER_MODULE)
    docs = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": SYSTEM_NAMESPACE}},
            {"apiVersion": "v1", "kind": "ConfigMap",
             "metadata": {"name": PUBLIC_CONFIG_MAP, "namespace": SYSTEM_NAMESPACE},
             "data": {"kubeflow_trainer_version": version}}]
    for path in sorted((bin_dir / "rbac").glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        doc["metadata"]["namespace"] = SYSTEM_NAMESPACE
        docs.append(doc)
    return docs


def apply_public_objects(api, docs: list[dict]) -> None:
    """Create each of `docs`, or replace the one a resumed cluster has."""
    from kubernetes import utils
    from kubernetes.dynamic import DynamicClient

    for doc in docs:
        try:
            utils.create_from_dict(api, doc)
        except utils.FailToCreateError as e:
            if not all(x.status == 409 for x in e.api_exceptions):
                reason = "; ".join(f"{x.status} {x.reason}" for x in e.api_exceptions)
                raise TrainerError(f"{doc['kind']} {doc['metadata']['name']}: {reason}") from None
            if doc["kind"] != "Namespace":
                DynamicClient(api).resources.get(api_version=doc["apiVersion"], kind=doc["kind"]
                                                 ).server_side_apply(
                    body=doc, field_manager="chexflow", force_conflicts=True)


def install(api, bin_dir: Path, ports: dict[str, int], pki: certs.PKI, timeout: float) -> None:
    """JobSet's and Trainer's CRDs, webhook configurations and public ConfigMap, before the
    managers start."""
    crds.install_crds(api, sorted((bin_dir / "crds").glob("*/*.yaml")), timeout=timeout)
    ca_bundle = base64.b64encode(pki.ca.read_bytes()).decode()
    for component in ("jobset", "trainer"):
        crds.apply_webhook_configurations(api, webhook_configurations(
            bin_dir, component, ports[f"{component}_webhook"], ca_bundle), TrainerError)
    apply_public_objects(api, public_objects(bin_dir))


def jobset_configuration(ports: dict[str, int], cert_dir: Path) -> dict:
    """JobSet's Configuration: no leader election, no internal certificates, on 127.0.0.1."""
    return {"apiVersion": "config.jobset.x-k8s.io/v1alpha1", "kind": "Configuration",
            "webhook": {"port": ports["jobset_webhook"], "host": "127.0.0.1",
                        "certDir": str(cert_dir)},
            "health": {"healthProbeBindAddress": f"127.0.0.1:{ports['jobset_health']}"},
            "metrics": {"bindAddress": "0", "certDir": str(cert_dir)},
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": False},
            "clientConnection": {"qps": 100, "burst": 200}}


def trainer_configuration(ports: dict[str, int]) -> dict:
    """Trainer's Configuration: no leader election, no certificate management (the webhook
    certificate comes from serving_cert), no metrics server, on 127.0.0.1."""
    return {"apiVersion": "config.trainer.kubeflow.org/v1alpha1", "kind": "Configuration",
            "webhook": {"port": ports["trainer_webhook"], "host": "127.0.0.1"},
            "health": {"healthProbeBindAddress": f"127.0.0.1:{ports['trainer_health']}",
                       "readinessEndpointName": "readyz", "livenessEndpointName": "healthz"},
            "metrics": {"bindAddress": "0", "secureServing": False},
            "leaderElection": {"leaderElect": False},
            "certManagement": {"enable": False},
            "clientConnection": {"qps": 100, "burst": 200}}


@dataclass
class Trainer(AddOn):
    """JobSet's and Trainer's CRDs and webhooks, then their controllers, each a local process."""

    name = "trainer"
    help = ("also Kubeflow Trainer v2 (TrainJob) and JobSet, built from their Go modules on "
            "first use (minutes); an option because the MPIJob path needs neither")
    title = "Kubeflow Trainer v2 and JobSet"
    ports = PORTS
    bin_dir: Path | None = field(default=None, init=False, repr=False)

    def components(self, cluster: Cluster) -> list[str]:
        return ["jobset", "trainer"]

    def build(self) -> list[Path]:
        self.bin_dir = ensure_binaries()
        return [self.bin_dir]

    def install(self, cluster: Cluster, deadline: float) -> None:
        install(cluster.api_client(), self.bin_dir, cluster.ports, cluster.pki,
                timeout=max(5.0, deadline - time.monotonic()))

    def start(self, cluster: Cluster, deadline: float) -> None:
        cert_dir = serving_cert(cluster.pki)
        configs = {"jobset": jobset_configuration(cluster.ports, cert_dir),
                   "trainer": trainer_configuration(cluster.ports)}
        for name, config in configs.items():
            (cluster.state_dir / f"{name}-config.yaml").write_text(json.dumps(config, indent=2))
        cluster.spawn("jobset", [f"--config={cluster.state_dir / 'jobset-config.yaml'}",
                                 "--zap-log-level=2"], exe=self.bin_dir / JOBSET_EXE)
        # TrainJobStatus (alpha, off by default) would start a status server that needs an
        # in-cluster ServiceAccount token; it stays off.
        cluster.spawn("trainer", [f"--config={cluster.state_dir / 'trainer-config.yaml'}",
                                  "--feature-gates=TrainJobStatus=false", "--zap-log-level=2"],
                      exe=self.bin_dir / TRAINER_EXE, env={"TMPDIR": str(cert_dir.parent.parent)})

    def ready(self, cluster: Cluster, deadline: float) -> None:
        for name in ("jobset", "trainer"):
            cluster.wait_http(f"http://127.0.0.1:{cluster.ports[f'{name}_health']}/readyz", name,
                              deadline)
