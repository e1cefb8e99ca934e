"""Kueue in the local cluster (the `kueue` add-on): its manager built from its Go module
(build/kueue/build.sh, cached by content beside the control plane's binaries), run as a local
process with the MPIJob and TrainJob integrations, its webhooks called on 127.0.0.1 with a
certificate of the cluster's CA.

Kueue v0.19 serves its API as v1beta2 (stored, its controllers' own, and what chexflow writes
and reads) and v1beta1 (deprecated): the conversion webhook serves a v1beta1 client and objects a
cluster of Kueue v0.15 stored as v1beta1, and its MPIJob and TrainJob webhooks are what suspend a
new job that names a queue (the TrainJob's also adds the runtime patch, manager
kueue.x-k8s.io/manager, through which Kueue sets the admitted flavor's node selector: Kueue cannot
start a TrainJob created without it): the webhooks are not optional here. Only the webhooks of
Kueue's own kinds and of the integrations' kinds are registered (the others' integrations are
off: their paths would answer 404).

Kueue runs as the cluster's admin (its kubeconfig), so it needs no RBAC of its own here; its
manifests' ClusterRole (config/components/rbac/role.yaml) grants what its TrainJob controller
uses: trainjobs, trainingruntimes, clustertrainingruntimes and jobsets.

Trainer before or after Kueue: Kueue sets up its TrainJob controller (and the Trainer runtime
code its TrainJob webhook sizes a job with) as it starts when the TrainJob CRD is served, else
polls for it with a backoff growing to 2 min; until then its validating webhook refuses every
TrainJob, queued or not ("unsupported runtime: ClusterTrainingRuntime.trainer.kubeflow.org": seen
on this cluster 80 s after Kueue's start). Both in one start (`cluster up --kueue --trainer`)
install their CRDs before either starts; Trainer added to a running cluster with Kueue
(LocalCluster.add) restarts Kueue's manager (Kueue.joined), which then sets it up at once; Kueue
added to a cluster with Trainer finds the CRD at its start.

After the start: ResourceFlavor `kwok-gpu` (nodes labelled type=kwok), ClusterQueue
`CLUSTER_QUEUE` with the kwok nodes' nvidia.com/gpu, cpu and memory as quota; LocalQueues per
namespace come from `create_local_queue`.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from chexflow.devcluster import certs, crds, nodes
from chexflow.devcluster.addon import AddOn, Cluster
from chexflow.devcluster.binaries import GO_DIR, GoBuild
from chexflow.errors import ChexflowError

# What Kueue's own manifests run it with (config/components/manager/controller_manager_config.yaml
# of the release built here): its API client (the binary's default: 20 qps, burst 30) and each
# controller's concurrent reconciles. Kinds left out (MPIJob.kubeflow.org, TrainJob) get
# controller-runtime's 1.
CLIENT_CONNECTION = {"qps": 300, "burst": 500}
GROUP_KIND_CONCURRENCY = {
    "Job.batch": 5, "Pod": 5, "Workload.kueue.x-k8s.io": 10, "LocalQueue.kueue.x-k8s.io": 5,
    "Cohort.kueue.x-k8s.io": 1, "ClusterQueue.kueue.x-k8s.io": 5,
    "ResourceFlavor.kueue.x-k8s.io": 1,
}
MPIJOB_KIND = "MPIJob.kubeflow.org"

KUEUE_DIR = GO_DIR / "kueue"
NAMESPACE = "kueue-system"
GROUP, VERSION = "kueue.x-k8s.io", "v1beta2"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
FLAVOR = "kwok-gpu"
TOPOLOGY = "chexflow"  # the add-on's Topology, with `topology` (nodes.topology_labels)
# a pod template's request: its pod set's pods in as few racks as fit (Kueue's TAS)
PREFERRED_TOPOLOGY = "kueue.x-k8s.io/podset-preferred-topology"
CLUSTER_QUEUE = "chexflow"
MPIJOB_FRAMEWORK = "kubeflow.org/mpijob"
TRAINJOB_FRAMEWORK = "trainer.kubeflow.org/trainjob"
TRAINER_ADDON = "trainer"  # the add-on that serves the TrainJob CRD (trainer.Trainer.name)
# the integrations on, and the (group, plural) of the kind each queues: their webhooks only
INTEGRATIONS = {MPIJOB_FRAMEWORK: ("kubeflow.org", "mpijobs"),
                TRAINJOB_FRAMEWORK: ("trainer.kubeflow.org", "trainjobs")}
WAIT_FOR_PODS_READY = "30m"  # Kueue's default timeout
# the CRDs Kueue converts between v1beta1 and v1beta2 itself (config/components/crd's
# kustomization patches them with its /convert webhook); the others' versions are alike
CONVERTED = ("localqueues", "clusterqueues", "cohorts", "workloads", "multikueueclusters")
# node resources the ClusterQueue's quota covers (nodes.gpu_node's per node)
NODE_CPU, NODE_MEMORY_GI = 96, 1024


class KueueError(ChexflowError):
    """Kueue could not be built, configured or started."""


BUILD = GoBuild("kueue", KUEUE_DIR, "sigs.k8s.io/kueue", ("kueue", "webhooks.yaml"),
                cold="about 10 min")
cache_dir = BUILD.cache_dir  # kueue-<release>-<10 hex of sha256(go.mod + go.sum + build.sh)>
ensure_binaries = BUILD.ensure  # the folder with `kueue`, its CRDs and webhook manifests


def serving_cert(pki: certs.PKI) -> Path:
    """tls.crt/tls.key for 127.0.0.1 signed by the cluster's CA, in pki/kueue (the webhook and
    metrics servers' certificate folder)."""
    return certs.loopback_serving_cert(pki, "kueue-webhook", pki.dir / "kueue")


def client_connection(qps: int | None = None) -> dict:
    """Kueue's clientConnection: `qps` with a burst twice it, or CLIENT_CONNECTION."""
    return {"qps": qps, "burst": 2 * qps} if qps else dict(CLIENT_CONNECTION)


def group_kind_concurrency(mpijob: int | None = None) -> dict[str, int]:
    """Kueue's controller.groupKindConcurrency: GROUP_KIND_CONCURRENCY, and `mpijob` concurrent
    reconciles of MPIJobs (its job controller: creating Workloads, unsuspending admitted jobs)."""
    return {**GROUP_KIND_CONCURRENCY, **({MPIJOB_KIND: mpijob} if mpijob else {})}


def configuration(ports: dict[str, int], cert_dir: Path, block_admission: bool = False,
                  client: dict | None = None, concurrency: dict | None = None) -> dict:
    """Kueue's Configuration (config.kueue.x-k8s.io/v1beta2): the MPIJob and TrainJob
    integrations, no leader election, its own certificates, every server on 127.0.0.1,
    waitForPodsReady, the API client and concurrency of Kueue's manifests (or those given)."""
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2", "kind": "Configuration",
        "namespace": NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{ports['kueue_health']}"},
        "metrics": {"bindAddress": f"127.0.0.1:{ports['kueue_metrics']}"},
        "webhook": {"port": ports["kueue_webhook"], "host": "127.0.0.1",
                    "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "clientConnection": client or client_connection(),
        "controller": {"groupKindConcurrency": concurrency or group_kind_concurrency()},
        # on by default since Kueue v0.19, said here: an admitted job whose pods are not all
        # ready (or a running one that lost one) for this long is evicted and queued again
        # (`block_admission`: Kueue admits the next job only once the admitted ones' pods are all
        # ready, so no two jobs are ever being placed at once)
        "waitForPodsReady": {"timeout": WAIT_FOR_PODS_READY, "blockAdmission": block_admission},
        "integrations": {"frameworks": list(INTEGRATIONS)},
    }


def args(config: Path) -> list[str]:
    # VisibilityOnDemand serves an aggregated API through a Service: none here
    return [f"--config={config}", "--feature-gates=VisibilityOnDemand=false", "--zap-log-level=2"]


def _url(port: int, path: str) -> str:
    return f"https://127.0.0.1:{port}{path}"


def webhook_configurations(bin_dir: Path, port: int, ca_bundle: str) -> list[dict]:
    """Kueue's webhook configurations from the module's manifests, for Kueue's own kinds and
    the INTEGRATIONS' kinds only, calling 127.0.0.1:<port> with the cluster CA."""
    kinds = set(INTEGRATIONS.values())
    out = []
    for doc in yaml.safe_load_all((bin_dir / "webhooks.yaml").read_text()):
        if not doc:
            continue
        kept = []
        for hook in doc.get("webhooks", []):
            rules = hook.get("rules", [])
            groups = {g for rule in rules for g in rule.get("apiGroups", [])}
            covered = {(g, r) for rule in rules for g in rule.get("apiGroups", [])
                       for r in rule.get("resources", [])}
            path = hook["clientConfig"]["service"]["path"]
            if GROUP in groups or covered & kinds:
                hook["clientConfig"] = {"url": _url(port, path), "caBundle": ca_bundle}
                kept.append(hook)
        doc["metadata"] = {"name": f"kueue-{doc['metadata']['name']}"}
        doc["webhooks"] = kept
        out.append(doc)
    return out


def crd_docs(bin_dir: Path, port: int, ca_bundle: str) -> list[dict]:
    """Kueue's CRDs, those of CONVERTED through Kueue's /convert."""
    docs = []
    for path in sorted((bin_dir / "crds").glob("*.yaml")):
        doc = yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        if doc["spec"]["names"]["plural"] in CONVERTED:
            doc["spec"]["conversion"] = {"strategy": "Webhook", "webhook": {
                "clientConfig": {"url": _url(port, "/convert"), "caBundle": ca_bundle},
                "conversionReviewVersions": ["v1"]}}
        docs.append(doc)
    return docs


def install(api, bin_dir: Path, port: int, pki: certs.PKI, timeout: float) -> None:
    """CRDs (with conversion) and webhook configurations, before the manager starts."""
    import base64

    ca_bundle = base64.b64encode(pki.ca.read_bytes()).decode()
    crds.install_crd_docs(api, crd_docs(bin_dir, port, ca_bundle), timeout=timeout)
    crds.apply_webhook_configurations(api, webhook_configurations(bin_dir, port, ca_bundle),
                                      KueueError)


def _create(api, plural: str, body: dict, namespace: str | None = None,
            deadline: float | None = None) -> None:
    """Create a Kueue object (409: already there); retried while Kueue's webhook is starting."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    custom = client.CustomObjectsApi(api)
    deadline = deadline or time.monotonic() + 30
    while True:
        try:
            if namespace:
                custom.create_namespaced_custom_object(GROUP, VERSION, namespace, plural, body)
            else:
                custom.create_cluster_custom_object(GROUP, VERSION, plural, body)
            return
        except ApiException as e:
            if e.status == 409:
                return
            if e.status < 500 or time.monotonic() > deadline:
                raise KueueError(f"creating {plural[:-1]} {body['metadata']['name']}: "
                                 f"{e.status} {e.reason}: {e.body}") from None
            time.sleep(0.5)


def create_queues(api, node_count: int, gpus_per_node: int, deadline: float,
                  topology: bool = False) -> None:
    """ResourceFlavor FLAVOR for the kwok nodes and ClusterQueue CLUSTER_QUEUE whose quota is
    their nvidia.com/gpu, cpu and memory, open to every namespace; with `topology`, Topology
    TOPOLOGY (block, rack, node) and the flavor naming it: Kueue's topology-aware scheduling
    then admits a job with the nodes of its pods chosen."""
    spec: dict = {"nodeLabels": {"type": nodes.NODE_LABELS["type"]}}
    if topology:
        _create(api, "topologies", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "Topology", "metadata": {"name": TOPOLOGY},
            "spec": {"levels": [{"nodeLabel": nodes.BLOCK_LABEL}, {"nodeLabel": nodes.RACK_LABEL},
                                {"nodeLabel": "kubernetes.io/hostname"}]},
        }, deadline=deadline)
        spec["topologyName"] = TOPOLOGY
    _create(api, "resourceflavors", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "ResourceFlavor",
        "metadata": {"name": FLAVOR}, "spec": spec,
    }, deadline=deadline)
    quota = {"cpu": str(NODE_CPU * node_count), "memory": f"{NODE_MEMORY_GI * node_count}Gi",
             nodes.GPU_RESOURCE: str(gpus_per_node * node_count)}
    create_cluster_queue(api, CLUSTER_QUEUE, quota, deadline=deadline)


def create_cluster_queue(api, name: str, quota: dict[str, str],
                         deadline: float | None = None) -> None:
    """A ClusterQueue over FLAVOR with `quota` (resource -> nominalQuota), for all namespaces."""
    _create(api, "clusterqueues", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "ClusterQueue", "metadata": {"name": name},
        "spec": {"namespaceSelector": {},
                 "resourceGroups": [{"coveredResources": sorted(quota), "flavors": [{
                     "name": FLAVOR,
                     "resources": [{"name": r, "nominalQuota": q}
                                   for r, q in sorted(quota.items())]}]}]},
    }, deadline=deadline)


def create_local_queue(api, namespace: str, name: str = CLUSTER_QUEUE,
                       cluster_queue: str = CLUSTER_QUEUE) -> None:
    """LocalQueue `name` in `namespace`, feeding `cluster_queue`."""
    _create(api, "localqueues", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "LocalQueue",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"clusterQueue": cluster_queue},
    }, namespace=namespace)


def wait_cluster_queue_active(api, name: str, deadline: float) -> None:
    from kubernetes import client

    custom = client.CustomObjectsApi(api)
    conds: dict = {}
    while time.monotonic() < deadline:
        cq = custom.get_cluster_custom_object(GROUP, VERSION, "clusterqueues", name)
        conds = {c["type"]: c for c in (cq.get("status") or {}).get("conditions", [])}
        if conds.get("Active", {}).get("status") == "True":
            return
        time.sleep(0.3)
    raise KueueError(f"ClusterQueue {name} not Active: "
                     f"{conds.get('Active', {}).get('message', 'no status')}")


@dataclass
class Kueue(AddOn):
    """Kueue's CRDs and webhooks, its manager, then ResourceFlavor FLAVOR and ClusterQueue
    CLUSTER_QUEUE over the kwok nodes."""

    name = "kueue"
    help = ("also Kueue (built from its Go module on first use: about 10 min) with "
            "ResourceFlavor kwok-gpu and ClusterQueue chexflow holding the kwok nodes' GPUs, CPU "
            "and memory; add a LocalQueue per namespace")
    title = "Kueue (ClusterQueue chexflow)"
    ports = ("kueue_health", "kueue_metrics", "kueue_webhook")
    block_admission: bool = False  # waitForPodsReady.blockAdmission (the contention study's)
    topology: bool = False  # Topology TOPOLOGY over the kwok nodes' racks (the study's TAS)
    client_qps: int | None = None  # Kueue's client qps, burst twice it (None: CLIENT_CONNECTION)
    mpijob_concurrency: int | None = None  # concurrent MPIJob reconciles (None: 1, as shipped)
    bin_dir: Path | None = field(default=None, init=False, repr=False)

    def client(self) -> dict:
        """Kueue's clientConnection (qps, burst)."""
        return client_connection(self.client_qps)

    def concurrency(self) -> dict[str, int]:
        """Kueue's controller.groupKindConcurrency."""
        return group_kind_concurrency(self.mpijob_concurrency)

    def components(self, cluster: Cluster) -> list[str]:
        return ["kueue"]

    def build(self) -> list[Path]:
        self.bin_dir = ensure_binaries()
        return [self.bin_dir]

    def install(self, cluster: Cluster, deadline: float) -> None:
        install(cluster.api_client(), self.bin_dir, cluster.ports["kueue_webhook"], cluster.pki,
                timeout=max(5.0, deadline - time.monotonic()))
        cluster.ensure_namespace(NAMESPACE)

    def start(self, cluster: Cluster, deadline: float) -> None:
        cert_dir = serving_cert(cluster.pki)
        config = cluster.state_dir / "kueue-config.yaml"
        config.write_text(json.dumps(configuration(cluster.ports, cert_dir, self.block_admission,
                                                   self.client(), self.concurrency()), indent=2))
        cluster.spawn("kueue", args(config), exe=self.bin_dir / "kueue",
                      env={"KUEUE_METRICS_CERT_DIR": str(cert_dir)})

    def ready(self, cluster: Cluster, deadline: float) -> None:
        cluster.wait_http(f"http://127.0.0.1:{cluster.ports['kueue_health']}/readyz", "kueue",
                          deadline)
        api = cluster.api_client()
        create_queues(api, cluster.nodes, cluster.gpus_per_node, deadline, self.topology)
        wait_cluster_queue_active(api, CLUSTER_QUEUE, deadline)

    def joined(self, cluster: Cluster, other: AddOn, deadline: float) -> None:
        if other.name == TRAINER_ADDON:  # the TrainJob CRD came after Kueue's manager started
            cluster.renew("kueue", f"restarted: add-on {other.name} added (its TrainJob CRD)")
            cluster.wait_http(f"http://127.0.0.1:{cluster.ports['kueue_health']}/readyz",
                              "kueue", deadline)
            wait_cluster_queue_active(cluster.api_client(), CLUSTER_QUEUE, deadline)
