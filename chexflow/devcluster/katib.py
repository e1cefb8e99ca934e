"""Katib v0.19.0 on the local cluster's real node (the `katib` add-on: `chexflow cluster up
--katib`).

Everything runs as pods in namespace `kubeflow` (its pods all go to the real node): katib-mysql
(its data in STATE/volumes/katib-mysql), katib-db-manager, and katib-controller with its RBAC, the
katib-config ConfigMap and the experiment/pod webhooks, whose certificate Katib's own cert
generator makes (`init.certGenerator.enable`: it fills the katib-webhook-cert Secret and the
webhooks' caBundle). The manifests are Katib's own, read from the Katib Go module as crds.py reads
the CRDs (`manifests/v1beta1/components/...`), with these changes: images are the ones images.py
builds (`chexflow.local/...`, `imagePullPolicy: Never`: no registry here) run with their own
entrypoints, mysql's claim is that hostPath folder (kept by `cluster down`/`up` as a PV would be),
db-manager gets a readiness probe (gRPC on its port, as its liveness probe: Ready then means
serving), and katib-config lists only what runs here: trial kinds Job, MPIJob v2beta1 and TrainJob
v1alpha1 (Katib v0.19's trial controller skips a listed kind whose CRD is missing, logging it, and
watches it only when its CRD was there at its start: `watch_trial_kinds_again` restarts it after
Trainer), the Go goptuna suggestion service for random, tpe, cmaes and sobol, chexflow's own
(chexflow.katib.services.server, in the launcher image) for Katib's Python algorithms grid,
multivariate-tpe and bayesianoptimization, chexflow's medianstop early-stopping service (the
`earlystopping` image: the launcher's with `chexflow katib-earlystopping` as entrypoint), and the
File/StdOut metrics collector.

katib-controller reaches db-manager and the suggestion services through ClusterIP Services and
the apiserver through the `kubernetes` Service, which is why --katib starts kube-proxy.
Namespaces whose trials Katib should watch need `INJECTION_LABEL` (the pod webhook injects the
metrics collector there) and, on this cluster, realnode.namespace_annotations().
"""

from __future__ import annotations

import copy
import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from chexflow.devcluster import crds, realnode
from chexflow.devcluster.addon import AddOn, Cluster
from chexflow.errors import ChexflowError
from chexflow.katib.suggestions import algorithms

NAMESPACE = "kubeflow"
INJECTION_LABEL = {"katib.kubeflow.org/metrics-collector-injection": "enabled"}
# add-ons whose CRDs are trial kinds of katib-config (TRIAL_RESOURCES)
TRIAL_KIND_ADDONS = ("trainer",)
CONTROLLER, DB_MANAGER, MYSQL = "katib-controller", "katib-db-manager", "katib-mysql"
DB_MANAGER_PORT = 6789
MYSQL_UID = 999  # runAsUser/runAsGroup in Katib's mysql.yaml
COLLECTOR, GOPTUNA = "katib-file-metricscollector", "katib-suggestion-goptuna"
IMAGES = (CONTROLLER, DB_MANAGER, COLLECTOR, GOPTUNA, MYSQL)
GOPTUNA_ALGORITHMS = algorithms.served_on_dev_cluster(algorithms.GOPTUNA)
# served by `chexflow katib-suggestion` in the launcher image (chexflow.katib.services.server)
LAUNCHER, EARLY_STOPPING = "launcher", "earlystopping"
EARLY_STOPPING_ALGORITHMS = algorithms.EARLY_STOPPING
CHEXFLOW_ALGORITHMS = algorithms.served_on_dev_cluster(algorithms.CHEXFLOW)
# Katib's default suggestion limits (100Mi) are too small for Python with optuna and skopt
CHEXFLOW_SUGGESTION_RESOURCES = {"requests": {"cpu": "50m", "memory": "256Mi"},
                                 "limits": {"cpu": "1", "memory": "1Gi"}}
TRIAL_RESOURCES = ("Job.v1.batch", "MPIJob.v2beta1.kubeflow.org",
                   "TrainJob.v1alpha1.trainer.kubeflow.org")
# Katib's manifests used, under manifests/v1beta1/components/ in its module
MANIFESTS = ("controller/rbac.yaml", "controller/controller.yaml", "controller/service.yaml",
             "db-manager/db-manager.yaml", "db-manager/service.yaml", "mysql/secret.yaml",
             "mysql/mysql.yaml", "mysql/service.yaml", "webhook/webhooks.yaml")


class KatibError(ChexflowError):
    """Katib could not be deployed or did not become ready."""


def build_images() -> dict[str, object]:
    """name -> chexflow.devcluster.images BuiltImage (ref, archive) of each Katib image and the
    launcher's and earlystopping's (chexflow's suggestion and early-stopping services)."""
    from chexflow.devcluster.images import build_image

    return {name: build_image(name) for name in (*IMAGES, LAUNCHER, EARLY_STOPPING)}


def components_dir() -> Path:
    """manifests/v1beta1/components of the Katib module (from the Go module cache)."""
    return crds.module_dir(crds.KATIB_MODULE, crds.KATIB_VERSION) / "manifests/v1beta1/components"


def katib_config(refs: dict[str, str]) -> dict:
    """KatibConfig: cert generator on, Job, MPIJob and TrainJob trials, goptuna and chexflow's
    suggestion services, chexflow's medianstop, the file collector."""
    def image(name: str) -> dict:
        return {"image": refs[name], "imagePullPolicy": "Never"}

    return {
        "apiVersion": "config.kubeflow.org/v1beta1", "kind": "KatibConfig",
        "init": {"certGenerator": {"enable": True},
                 "controller": {"webhookPort": 8443, "trialResources": list(TRIAL_RESOURCES)}},
        "runtime": {
            "metricsCollectors": [{"kind": kind, **image(COLLECTOR)}
                                  for kind in ("StdOut", "File")],
            "suggestions": [
                *({"algorithmName": a, **image(GOPTUNA)} for a in GOPTUNA_ALGORITHMS),
                *({"algorithmName": a, **image(LAUNCHER),
                   "command": ["chexflow", "katib-suggestion"],
                   "resources": CHEXFLOW_SUGGESTION_RESOURCES} for a in CHEXFLOW_ALGORITHMS),
            ],
            "earlyStoppings": [{"algorithmName": a, **image(EARLY_STOPPING),
                                "resources": CHEXFLOW_SUGGESTION_RESOURCES}
                               for a in EARLY_STOPPING_ALGORITHMS],
        },
    }


def _adapt(doc: dict, refs: dict[str, str], mysql_data: Path | None = None) -> dict:
    """Katib's manifest with our images (own entrypoints, never pulled), MySQL's claim as a
    hostPath folder `mysql_data` (as a local PV; an emptyDir without it), and a
    readiness probe for db-manager (Katib's has only a liveness probe, so its pod counts as
    Ready, and its Service routes to it, seconds before it listens: it waits for MySQL first)."""
    doc = copy.deepcopy(doc)
    if doc.get("kind") != "Deployment":
        return doc
    pod = doc["spec"]["template"]["spec"]
    for c in pod["containers"]:
        c["image"] = refs[c["name"]]
        c["imagePullPolicy"] = "Never"
        c.pop("command", None)
        if c["name"] == DB_MANAGER and "readinessProbe" not in c:
            c["readinessProbe"] = {"grpc": {"port": DB_MANAGER_PORT}, "periodSeconds": 2}
    for v in pod.get("volumes", []):
        if "persistentVolumeClaim" in v:
            del v["persistentVolumeClaim"]
            if doc["metadata"]["name"] == MYSQL and mysql_data is not None:
                v["hostPath"] = {"path": str(mysql_data), "type": "Directory"}
            else:
                v["emptyDir"] = {}
    return doc


def documents(refs: dict[str, str], mysql_data: Path | None = None) -> list[dict]:
    """Every object to create, in order: namespace, config, Katib's manifests adapted."""
    root = components_dir()
    docs: list[dict] = [
        {"apiVersion": "v1", "kind": "Namespace",
         "metadata": {"name": NAMESPACE, "annotations": realnode.namespace_annotations()}},
        {"apiVersion": "v1", "kind": "ConfigMap",
         "metadata": {"name": "katib-config", "namespace": NAMESPACE},
         "data": {"katib-config.yaml": yaml.safe_dump(katib_config(refs), sort_keys=False)}},
        # filled by Katib's cert generator
        {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
         "metadata": {"name": "katib-webhook-cert", "namespace": NAMESPACE}},
    ]
    for rel in MANIFESTS:
        path = root / rel
        if not path.is_file():
            raise KatibError(f"{crds.KATIB_MODULE}@{crds.KATIB_VERSION}: no {rel} in the module")
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                doc.setdefault("metadata", {})
                if doc["kind"] not in ("ClusterRole", "ClusterRoleBinding") and \
                        "Webhook" not in doc["kind"]:
                    doc["metadata"]["namespace"] = NAMESPACE
                docs.append(_adapt(doc, refs, mysql_data))
    return docs


def mysql_folder(state_dir: Path) -> Path:
    """katib-mysql's data under the cluster's folder: kept by `cluster down`/`up` (as a PVC's
    volume would be), removed by `up --fresh`; owned by MySQL's uid (a hostPath gets no fsGroup)."""
    folder = state_dir / "volumes" / MYSQL
    folder.mkdir(parents=True, exist_ok=True)
    os.chown(folder, MYSQL_UID, MYSQL_UID)
    return folder


def create(cluster, images: dict[str, object]) -> None:
    """Load the images into the real node (a resumed cluster's containerd keeps them) and create
    Katib's objects (a resumed cluster's are updated: _update_existing)."""
    from kubernetes import utils

    node = realnode.RealNode(cluster.state_dir)
    for image in images.values():
        if not node.has_image(image.ref):
            node.import_image(Path(image.archive))
    refs = {name: image.ref for name, image in images.items()}
    api = cluster.api_client()
    for doc in documents(refs, mysql_folder(cluster.state_dir)):
        try:
            utils.create_from_dict(api, doc)
        except utils.FailToCreateError as e:
            if all(x.status == 409 for x in e.api_exceptions):  # a resumed cluster's
                _update_existing(api, doc)
                continue
            reason = "; ".join(f"{x.status} {x.reason}: {x.body}" for x in e.api_exceptions)
            raise KatibError(f"{doc['kind']} {doc['metadata']['name']}: {reason}") from e


def wait_ready(cluster, deadline: float) -> None:
    """Until Katib's Deployments are Available, db-manager's Service answers and the experiment
    webhook judges."""
    for name in (MYSQL, DB_MANAGER, CONTROLLER):
        wait_available(cluster, name, deadline)
    wait_service(cluster, DB_MANAGER, DB_MANAGER_PORT, deadline)
    wait_webhook(cluster, deadline)


def watch_trial_kinds_again(cluster, timeout: float = 120) -> None:
    """Restart katib-controller (as `kubectl rollout restart`) and wait for the new pod: its
    trial controller looks for the trial kinds' CRDs only when it starts, so a kind whose CRD
    came later (TrainJob, when Trainer is added after Katib) is watched only from then on."""
    from kubernetes import client

    deadline = time.monotonic() + timeout
    apps = client.AppsV1Api(cluster.api_client())
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    apps.patch_namespaced_deployment(CONTROLLER, NAMESPACE, {"spec": {"template": {"metadata": {
        "annotations": {"kubectl.kubernetes.io/restartedAt": stamp}}}}})
    while time.monotonic() < deadline:
        cluster.check()
        dep = apps.read_namespaced_deployment(CONTROLLER, NAMESPACE)
        st = dep.status
        if (st.observed_generation or 0) >= dep.metadata.generation and \
                st.updated_replicas == dep.spec.replicas and not st.unavailable_replicas and \
                (st.replicas or 0) == dep.spec.replicas:
            break
        time.sleep(1)
    wait_available(cluster, CONTROLLER, deadline)
    wait_webhook(cluster, deadline)


def _update_existing(api, doc: dict) -> None:
    """An object a resumed cluster already has: Deployments and ConfigMaps (the image refs of
    this tree) are merge-patched; the rest is kept as it is (the webhook configurations hold
    the caBundle the controller injected)."""
    from kubernetes import dynamic

    if doc["kind"] not in ("Deployment", "ConfigMap"):
        return
    resource = dynamic.DynamicClient(api).resources.get(api_version=doc["apiVersion"],
                                                        kind=doc["kind"])
    resource.patch(body=doc, name=doc["metadata"]["name"],
                   namespace=doc["metadata"].get("namespace"),
                   content_type="application/merge-patch+json")


def wait_available(cluster, name: str, deadline: float) -> None:
    """Until Deployment kubeflow/<name> is Available; the error names its pod's last state."""
    from kubernetes import client

    apps, core = client.AppsV1Api(cluster.api_client()), client.CoreV1Api(cluster.api_client())
    while time.monotonic() < deadline:
        cluster.check()
        dep = apps.read_namespaced_deployment(name, NAMESPACE)
        if any(c.type == "Available" and c.status == "True"
               for c in dep.status.conditions or []) and dep.status.ready_replicas:
            return
        time.sleep(1)
    pods = core.list_namespaced_pod(NAMESPACE, label_selector=",".join(
        f"{k}={v}" for k, v in dep.spec.selector.match_labels.items())).items
    states = [f"{p.metadata.name} {p.status.phase}: "
              + "; ".join(f"{s.name} {s.state.waiting or s.state.terminated or 'running'}"
                          for s in p.status.container_statuses or []) for p in pods]
    raise KatibError(f"Deployment {NAMESPACE}/{name} not Available: "
                     f"{' | '.join(states) or 'no pod'} "
                     f"(kubectl -n {NAMESPACE} logs deploy/{name})")


def wait_service(cluster, name: str, port: int, deadline: float) -> None:
    """Until Service kubeflow/<name> accepts a TCP connection at its ClusterIP (from this host,
    through kube-proxy's rules, as pods reach it)."""
    from kubernetes import client

    ip = client.CoreV1Api(cluster.api_client()).read_namespaced_service(
        name, NAMESPACE).spec.cluster_ip
    last = ""
    while time.monotonic() < deadline:
        try:
            socket.create_connection((ip, port), timeout=2).close()
            return
        except OSError as e:
            last = str(e)
        time.sleep(1)
    raise KatibError(f"Service {NAMESPACE}/{name} at {ip}:{port} not reachable: {last} "
                     f"(kubectl -n {NAMESPACE} logs deploy/{name})")


def wait_webhook(cluster, deadline: float) -> None:
    """Until Katib's experiment webhook judges a (server-side dry-run) Experiment: it denies one
    whose parallelTrialCount exceeds maxTrialCount."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    custom = client.CustomObjectsApi(cluster.api_client())
    probe = {"apiVersion": "kubeflow.org/v1beta1", "kind": "Experiment",
             "metadata": {"name": "webhook-probe"},
             "spec": {"maxTrialCount": 1, "parallelTrialCount": 2}}
    last = ""
    while time.monotonic() < deadline:
        try:
            custom.create_namespaced_custom_object("kubeflow.org", "v1beta1", NAMESPACE,
                                                   "experiments", probe, dry_run="All")
        except ApiException as e:
            if "denied the request" in (e.body or ""):
                return
            last = f"{e.status} {e.body}"
        time.sleep(1)
    raise KatibError(f"Katib's experiment webhook not answering: {last[-300:]} "
                     f"(kubectl -n {NAMESPACE} logs deploy/{CONTROLLER})")


@dataclass
class Katib(AddOn):
    """Katib's images (built on first use, cached), its objects on the real node, its
    readiness; a trial kind's add-on that joins later gets katib-controller restarted."""

    name = "katib"
    help = ("also Katib v0.19.0 (controller, webhooks, db-manager, MySQL, goptuna suggestions) "
            "on the real node, with kube-proxy for its Services; implies --real-node; one such "
            "cluster per machine")
    title = "Katib in namespace kubeflow"
    requires = ("real-node", "kube-proxy")
    images: dict[str, object] = field(default_factory=dict, init=False, repr=False)

    def build(self) -> list[Path]:
        self.images = build_images()
        return [Path(image.archive) for image in self.images.values()]

    def start(self, cluster: Cluster, deadline: float) -> None:
        create(cluster, self.images)

    def ready(self, cluster: Cluster, deadline: float) -> None:
        wait_ready(cluster, deadline)

    def joined(self, cluster: Cluster, other: AddOn, deadline: float) -> None:
        if other.name in TRIAL_KIND_ADDONS:  # its CRD came after katib-controller started
            watch_trial_kinds_again(cluster, max(5.0, deadline - time.monotonic()))
