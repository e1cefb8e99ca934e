"""A real Kubernetes control plane on loopback: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler, kwok (simulated GPU nodes) and mpi-operator, each a local process run by one
Supervisor (supervisor.py), with the add-ons asked beside it (addon.py says what one is,
addons.TABLE lists them): real nodes that run pods (realnode.py), kube-proxy, Katib, Kueue,
the Coscheduling scheduler, Kubeflow Trainer.

With a real node the apiserver listens on and advertises the node's address (198.18.K.1, on
the node's bridge) instead of 127.0.0.1: host clients reach it there, and pods reach it through
the `kubernetes` Service, whose endpoint is that address.

    with LocalCluster(state_dir, addons=addons.named(["katib"])) as cluster:  # or start()/stop()
        api = cluster.api_client()                # kubernetes.client.ApiClient (admin)
        os.environ["KUBECONFIG"] = str(cluster.kubeconfig)

`state_dir` holds pki/, kubeconfigs, etcd data, logs/<component>.log and cluster.json (what was
asked, ports and process ids), so `chexflow cluster down` can stop a cluster another process
started.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import ssl
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from chexflow.data.faults import cause
from chexflow.devcluster import addons as addon_table
from chexflow.devcluster import binaries, certs, crds, nodes
from chexflow.devcluster.addon import SERVICE_CIDR, AddOn
from chexflow.devcluster.supervisor import (
    STOPPING_FILE,
    WATCHER_FILE,
    DevClusterError,
    Supervisor,
    locked,
    process_alive,
    read_state,
    runs,
    start_watcher,
)
from chexflow.kube import client_from_kubeconfig
from chexflow.ports import free_port, port_free

# The API clients' rate limits of the controllers the control plane runs (kube-controller-manager,
# kube-scheduler, mpi-operator): raised from client-go's 5 qps / 10 burst, as production installs
# do for clusters of hundreds of nodes; the apiserver keeps its own defaults (APISERVER_LIMITS).
CLIENT_QPS, CLIENT_BURST = 200, 400
# mpi-operator's work queue (its defaults are 10 syncs/s, burst 100)
MPI_OPERATOR_QUEUE = {"rate": 100, "burst": 1000}
# not passed to kube-apiserver: its defaults, stated for the benchmarks' reports
APISERVER_LIMITS = {"max_requests_inflight": 400, "max_mutating_requests_inflight": 200,
                    "api_priority_and_fairness": True}


PORTS_FILE = "ports.json"  # kept after a stop: a resumed cluster listens where it did
# the control plane's own ports; each add-on names its own (AddOn.ports)
PORTS = ("etcd", "etcd_peer", "apiserver", "controller_manager", "scheduler", "kwok",
         "mpi_health")
# the control plane's processes, in start order
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok",
              "mpi-operator")
# RFC 2544 benchmarking addresses, never a private range: services in SERVICE_CIDR, pods in
# 198.18.0.0/16 (kwok nodes' pods in the upper half, the real nodes' in /24s of the lower half).
KWOK_POD_CIDR = "198.18.128.0/17"
KWOK_START_ATTEMPTS = 3
KWOK_LEASE_PARALLELISM = 16
MPI_OPERATOR_NAMESPACE = "mpi-operator"
KWOK_POD_LOG = "kwok: simulated container on a kwok node (no process ran)\n"
LOOPBACK = "127.0.0.1"


def check_state_dir(state_dir: Path) -> None:
    """DevClusterError in one line unless `state_dir` is (or can be made) a folder this process
    can write in; checked before anything starts."""
    state_dir = Path(state_dir)
    if state_dir.exists() and not state_dir.is_dir():
        raise DevClusterError(f"--dir {state_dir}: exists and is not a folder")
    try:
        state_dir.mkdir(parents=True, exist_ok=True)
        probe = state_dir / f".chexflow-write-probe.{os.getpid()}"
        probe.touch()
        probe.unlink()
    except OSError as e:
        raise DevClusterError(f"--dir {state_dir}: cannot write there ({cause(e)}); choose a "
                              f"folder you can write") from None


def rss_mib(pid: int) -> dict[str, float]:
    """Resident memory of a process from /proc: current (VmRSS) and peak (VmHWM), MiB."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) / 1024
    return out


@dataclass
class LocalCluster:
    """One control plane; `nodes` kwok nodes with `gpus_per_node` nvidia.com/gpu each; the
    `addons` asked (addons.resolve adds what they require)."""

    state_dir: Path
    nodes: int = 4
    gpus_per_node: int = 8
    addons: list[AddOn] = field(default_factory=list)
    bin_dir: Path | None = None
    # True: the components get SIGTERM when the process that started them dies (Linux
    # PR_SET_PDEATHSIG), so a killed test run leaves nothing behind. `chexflow cluster up`
    # leaves it False: its cluster outlives the command.
    die_with_parent: bool = False
    # the node lifecycle controller's grace before a silent node is NotReady (0: Kubernetes'
    # default); simulations of 1,000s of kwok nodes on a few cores set it longer
    node_monitor_grace_s: int = 0
    # the kwok nodes' lease duration (they renew every quarter of it): the kubelet's 40 s; with
    # 1,000s of nodes their renewals are most of the apiserver's requests, which a simulation on
    # a few cores may space out (beneath node_monitor_grace_s)
    node_lease_duration_s: int = 40
    # the address the apiserver listens on: a real node's when there is one (its prepare)
    host: str = LOOPBACK
    ports: dict[str, int] = field(default_factory=dict)
    # True: once started, a watcher process restarts components that exit (supervisor.py);
    # `chexflow cluster up` detached sets it, --foreground supervises itself
    supervise: bool = False
    # set once start() has finished: a watcher restarts nothing before
    ready: bool = False
    # the process that starts it (cluster.json records it: a start that did not finish is told
    # from one under way)
    starter: int = 0
    # this start began from an empty etcd (start(fresh=True)): add-ons drop what they kept
    fresh: bool = False
    supervisor: Supervisor = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.state_dir = Path(self.state_dir).resolve()
        self.addons = addon_table.resolve(self.addons)
        self.supervisor = Supervisor(self.state_dir, record=self.record,
                                     env={"KUBECONFIG": str(self.kubeconfig)},
                                     die_with_parent=self.die_with_parent)
        self._kept_ports: dict[str, int] = {}

    # ---- paths -------------------------------------------------------------------------------
    @property
    def kubeconfig(self) -> Path:
        """The admin kubeconfig (client certificate in group system:masters)."""
        return self.state_dir / "kubeconfig"

    @property
    def server(self) -> str:
        return f"https://{self.host}:{self.ports['apiserver']}"

    @property
    def log_dir(self) -> Path:
        return self.state_dir / "logs"

    @property
    def path_dir(self) -> Path:
        """The folder `cluster up` puts on PATH: kubectl of the cluster's Kubernetes release."""
        return self.state_dir / "bin"

    @property
    def pki(self) -> certs.PKI:
        return certs.PKI(self.state_dir / "pki")

    @property
    def processes(self) -> dict[str, dict]:
        """The recorded processes (name -> pid, exe, args, ...), in start order."""
        return self.supervisor.processes

    # ---- add-ons -------------------------------------------------------------------------------
    def has(self, name: str) -> bool:
        """True when add-on `name` is one of this cluster's."""
        return any(a.name == name for a in self.addons)

    def addon(self, name: str) -> AddOn:
        """This cluster's add-on `name`."""
        for a in self.addons:
            if a.name == name:
                return a
        raise DevClusterError(f"the cluster in {self.state_dir} has no {name} add-on "
                              f"(it has: {', '.join(a.name for a in self.addons) or 'none'})")

    def pod_routes(self) -> list[str]:
        """What the add-ons route from the pods through their real node (AddOn.pod_routes)."""
        return [r for a in self.addons for r in a.pod_routes]

    def components(self) -> list[str]:
        """The processes this cluster runs when it is up, as asked, in start order."""
        return [*COMPONENTS, *(n for a in self.addons for n in a.components(self))]

    def add(self, addon: AddOn, timeout: float = 120) -> None:
        """Add `addon` to this running cluster (its requirements must be there): every phase of
        it, then the others' `joined`. Its binaries are built first when missing (not counted
        in `timeout`)."""
        if self.has(addon.name):
            raise DevClusterError(f"the cluster in {self.state_dir} has {addon.name} already")
        missing = [n for n in addon.requires if not self.has(n)]
        if missing:
            raise DevClusterError(f"add-on {addon.name} needs {', '.join(missing)}: start the "
                                  f"cluster with {' '.join('--' + n for n in missing)}")
        addon.ensure(self)
        deadline = time.monotonic() + timeout
        self.supervisor.refresh()  # a watcher may have restarted some since: saved as they are
        others = list(self.addons)
        self.addons = addon_table.resolve([*others, addon])  # a stop now cleans it up too
        for name in addon.ports:
            self.new_port(name)
        self.save()
        addon.prepare(self)
        for phase in (addon.install, addon.start, addon.ready):
            phase(self, deadline)
        for other in others:
            other.joined(self, addon, deadline)

    # ---- lifecycle -----------------------------------------------------------------------------
    def start(self, timeout: float = 180, fresh: bool = False) -> LocalCluster:
        """Start the control plane and the add-ons, phase by phase (addon.py), and wait until
        the nodes are Ready and the default ServiceAccount exists; on failure everything started
        is stopped and the error names the component.

        A state folder used before (stopped, or left by a crash) is resumed: etcd's data and the
        PKI are kept, so the objects are still there; `fresh` starts from an empty etcd."""
        check_state_dir(self.state_dir)
        if self.running():
            raise DevClusterError(f"a cluster is already running from {self.state_dir}: "
                                  f"run `chexflow cluster down --dir {self.state_dir}` first")
        self.bin_dir = Path(self.bin_dir or binaries.ensure_binaries())
        self._reset(fresh)
        self._link_kubectl()
        with locked(self.state_dir):  # after a stop under way, not during it
            for stale in (STOPPING_FILE, WATCHER_FILE):
                (self.state_dir / stale).unlink(missing_ok=True)  # left by a crash
            self.save()  # what was asked, before anything runs: `cluster status` compares
        # A watcher stops whatever was started if this process dies before the cluster is
        # ready (SIGKILL included); a detached cluster's then goes on as its supervisor.
        start_watcher(self.state_dir, parent=os.getpid(), supervise=self.supervise,
                      until_ready=not self.die_with_parent)
        try:
            for addon in self.addons:  # cached builds, claims: not counted in `timeout`
                addon.ensure(self)
            deadline = time.monotonic() + timeout
            for addon in self.addons:
                addon.prepare(self)
            self._start_apiserver(deadline)
            for addon in self.addons:
                addon.install(self, deadline)
            self._start_controllers(deadline)
            for addon in self.addons:
                addon.start(self, deadline)
            for addon in self.addons:
                addon.ready(self, deadline)
            self.ready = True
            self.save()
        except BaseException:
            self.stop()
            raise
        return self

    def _reset(self, fresh: bool) -> None:
        """A new start's folders, ports (a resumed cluster keeps its own where free, so its
        kubeconfigs stay valid), records and ids."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.fresh = fresh
        if fresh:
            for stale in ("etcd", "logs", "volumes"):  # volumes: add-ons' hostPath data
                shutil.rmtree(self.state_dir / stale, ignore_errors=True)
        self.log_dir.mkdir(exist_ok=True)
        self._kept_ports = {}
        if not fresh:
            with contextlib.suppress(OSError, ValueError):
                self._kept_ports = json.loads((self.state_dir / PORTS_FILE).read_text())
        self.ports = {}
        for name in (*PORTS, *(p for a in self.addons for p in a.ports)):
            self.new_port(name)
        self.host = LOOPBACK
        self.ready = False
        self.starter = os.getpid()
        self.supervisor.processes = {}
        self.supervisor.run_id = uuid.uuid4().hex

    def new_port(self, name: str) -> int:
        """A loopback port for `name` in `ports`: the one it had before this start when free."""
        old = self._kept_ports.get(name)
        keep = old is not None and old not in self.ports.values() and port_free(old)
        self.ports[name] = old if keep else free_port(self.ports.values())
        return self.ports[name]

    def stop(self, grace: float = 10) -> None:
        """Stop the components one by one in reverse start order (SIGTERM, then SIGKILL after
        `grace` s): the apiserver exits in about a second while etcd is still there; then the
        add-ons' cleanup, the last first. The stop holds the supervision lock throughout: a
        watcher restarts nothing meanwhile, and two stops (a watcher's and a `cluster up`'s) do
        not overlap. A later start's cluster in the same folder is left alone."""
        def cleanup() -> None:
            for addon in reversed(self.addons):
                addon.stop(self)

        self.supervisor.stop(grace, cleanup)

    def start_supervisor(self) -> int:
        """Supervise this running cluster from now on (a watcher restarting the components that
        exit); it watches no parent and ends when the cluster is stopped. Returns its pid."""
        self.supervise = True
        self.supervisor.refresh()
        self.save()
        return start_watcher(self.state_dir, parent=0, supervise=True)

    def starting(self) -> bool:
        """True while the process that starts this cluster is still at it (not ready yet)."""
        return not self.ready and bool(self.starter) and process_alive(self.starter)

    def running(self) -> bool:
        """True when any recorded component process is alive."""
        return self.supervisor.any_alive()

    def check(self) -> None:
        """Raise DevClusterError naming any component that has exited."""
        self.supervisor.refresh()
        dead = self.supervisor.dead()
        if dead:
            raise DevClusterError(f"component(s) exited: {', '.join(dead)}; "
                                  f"see {self.log_dir}/<component>.log")

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *_exc) -> None:
        self.stop()

    # ---- state file ----------------------------------------------------------------------------
    def record(self) -> dict:
        """What cluster.json records of this cluster beside its processes."""
        return {"server": self.server, "kubeconfig": str(self.kubeconfig),
                "bin_dir": str(self.bin_dir), "nodes": self.nodes,
                "gpus_per_node": self.gpus_per_node, "addons": addon_table.records(self.addons),
                "host": self.host, "ports": self.ports, "ready": self.ready,
                "supervise": self.supervise, "starter": self.starter}

    def save(self) -> None:
        self.supervisor.save()
        (self.state_dir / PORTS_FILE).write_text(json.dumps(self.ports))

    def _link_kubectl(self) -> None:
        """state_dir/bin/kubectl: the kubectl built with the control plane (build/build.sh)."""
        link = self.path_dir / "kubectl"
        self.path_dir.mkdir(exist_ok=True)
        link.unlink(missing_ok=True)
        link.symlink_to(self.bin_dir / "kubectl")

    @classmethod
    def attach(cls, state_dir: Path) -> LocalCluster:
        """The cluster recorded in state_dir/cluster.json (started by another process)."""
        state = read_state(state_dir)
        if state is None:
            raise DevClusterError(f"{Path(state_dir) / 'cluster.json'}: no cluster recorded "
                                  "here (start one: chexflow cluster up)")
        cluster = cls(state_dir=Path(state_dir), nodes=state["nodes"],
                      gpus_per_node=state["gpus_per_node"], bin_dir=Path(state["bin_dir"]),
                      addons=addon_table.from_records(state.get("addons", [])),
                      host=state.get("host", LOOPBACK), ports=state["ports"],
                      ready=state.get("ready", True), supervise=state.get("supervise", False),
                      starter=state.get("starter", 0))
        cluster.supervisor.processes = state["processes"]
        cluster.supervisor.run_id = state.get("run_id", "")
        return cluster

    # ---- clients -------------------------------------------------------------------------------
    def api_client(self):
        """A kubernetes.client.ApiClient authenticated as the admin."""
        return client_from_kubeconfig(self.kubeconfig)

    def memory(self, component: str = "kube-apiserver") -> dict[str, float]:
        """Current and peak resident memory (MiB) of one component."""
        return rss_mib(self.processes[component]["pid"])

    # ---- components ----------------------------------------------------------------------------
    def spawn(self, name: str, args: list[str], exe: Path | str | None = None,
              env: dict[str, str] | None = None) -> None:
        """Start component `name` (`exe`, default the control plane's binary of that name) under
        the supervisor, with the arguments add-ons add to it (AddOn.extra_args)."""
        extra = [arg for a in self.addons for arg in a.extra_args.get(name, ())]
        self.supervisor.spawn(name, exe or self.bin_dir / name, [*args, *extra], env=env)

    def restart(self, name: str, reason: str = "exited") -> None:
        """Start component `name` again with its recorded exe, args and env."""
        self.supervisor.restart(name, reason)

    def renew(self, name: str, reason: str) -> None:
        """Stop the running component `name` and start it again as recorded (an add-on's
        process that must see what came after it started)."""
        self.supervisor.renew(name, reason)

    def _start_apiserver(self, deadline: float) -> None:
        """The PKI and kubeconfigs, etcd and the apiserver; the control plane's CRDs and
        namespace once it answers."""
        pki = certs.make_pki(self.state_dir,
                             server_ips=() if self.host == LOOPBACK else (self.host,))
        certs.write_kubeconfig(self.kubeconfig, self.server, pki, "admin")
        for client in ("controller-manager", "scheduler"):
            certs.write_kubeconfig(self.state_dir / f"{client}.kubeconfig", self.server, pki,
                                   client)
        self.spawn("etcd", self._etcd_args())
        self.spawn("kube-apiserver", self._apiserver_args(pki))
        self.wait_http(f"{self.server}/readyz", "kube-apiserver", deadline, self.ssl_context())
        crds.install_crds(self.api_client(), timeout=max(5.0, deadline - time.monotonic()))
        self.ensure_namespace(MPI_OPERATOR_NAMESPACE)

    def _start_controllers(self, deadline: float) -> None:
        """The controller-manager, scheduler, kwok and mpi-operator; until the kwok nodes are
        Ready, the default ServiceAccount exists and mpi-operator is healthy."""
        pki = self.pki
        self.spawn("kube-controller-manager", self._controller_manager_args(pki))
        self.spawn("kube-scheduler", self._scheduler_args())
        self.spawn("kwok", self._kwok_args(pki))
        self.spawn("mpi-operator", self._mpi_operator_args(),
                   env={"MPI_OPERATOR_HEALTH_ADDR": f"{LOOPBACK}:{self.ports['mpi_health']}"})
        api = self.api_client()
        names = nodes.create_gpu_nodes(api, self.nodes, self.gpus_per_node)
        self.wait_kwok_nodes(api, names, deadline)
        self._wait_default_service_account(api, deadline)
        self.wait_http(f"http://{LOOPBACK}:{self.ports['mpi_health']}/healthz", "mpi-operator",
                       deadline)

    def _etcd_args(self) -> list[str]:
        client = f"http://127.0.0.1:{self.ports['etcd']}"
        peer = f"http://127.0.0.1:{self.ports['etcd_peer']}"
        return ["--name=chexflow", f"--data-dir={self.state_dir / 'etcd'}",
                f"--listen-client-urls={client}", f"--advertise-client-urls={client}",
                f"--listen-peer-urls={peer}", f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=chexflow={peer}", "--unsafe-no-fsync",
                "--quota-backend-bytes=4294967296", "--log-level=warn"]

    def _apiserver_args(self, pki: certs.PKI) -> list[str]:
        return [
            f"--etcd-servers=http://127.0.0.1:{self.ports['etcd']}",
            f"--bind-address={self.host}", f"--advertise-address={self.host}",
            f"--secure-port={self.ports['apiserver']}",
            f"--tls-cert-file={pki.serving_cert}", f"--tls-private-key-file={pki.serving_key}",
            f"--client-ca-file={pki.ca}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki.sa_pub}",
            f"--service-account-signing-key-file={pki.sa_key}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--authorization-mode=Node,RBAC", "--allow-privileged=true",
            # namespaces whose pods all go to the real node (realnode.namespace_annotations)
            "--enable-admission-plugins=PodNodeSelector,PodTolerationRestriction",
            # pod logs come from kwok's kubelet API (loopback, certificate not verified)
            "--kubelet-preferred-address-types=InternalIP",
            f"--kubelet-client-certificate={pki.client('admin')[0]}",
            f"--kubelet-client-key={pki.client('admin')[1]}",
            # loopback is not a valid endpoint address for the `kubernetes` Service
            *(["--endpoint-reconciler-type=none"] if self.host == LOOPBACK else []),
            "--profiling=false", "--v=1",
        ]

    def _controller_manager_args(self, pki: certs.PKI) -> list[str]:
        kc = self.state_dir / "controller-manager.kubeconfig"
        return [f"--kubeconfig={kc}", f"--authentication-kubeconfig={kc}",
                f"--authorization-kubeconfig={kc}", "--bind-address=127.0.0.1",
                f"--secure-port={self.ports['controller_manager']}",
                f"--service-account-private-key-file={pki.sa_key}", f"--root-ca-file={pki.ca}",
                # each controller as its own ServiceAccount with the bootstrap RBAC roles
                # (e.g. node-controller may patch Node taints), as kubeadm runs it
                "--use-service-account-credentials=true",
                f"--service-cluster-ip-range={SERVICE_CIDR}", "--leader-elect=false",
                f"--kube-api-qps={CLIENT_QPS}", f"--kube-api-burst={CLIENT_BURST}", "--v=1",
                *([f"--node-monitor-grace-period={self.node_monitor_grace_s}s"]
                  if self.node_monitor_grace_s else [])]

    def _scheduler_args(self) -> list[str]:
        kc = self.state_dir / "scheduler.kubeconfig"
        return [f"--kubeconfig={kc}", f"--authentication-kubeconfig={kc}",
                f"--authorization-kubeconfig={kc}", "--bind-address=127.0.0.1",
                f"--secure-port={self.ports['scheduler']}", "--leader-elect=false",
                f"--kube-api-qps={CLIENT_QPS}", f"--kube-api-burst={CLIENT_BURST}", "--v=1"]

    def _kwok_args(self, pki: certs.PKI) -> list[str]:
        """kwok manages the annotated nodes and serves their kubelet API on loopback, so
        `kubectl logs` works: every container's log is the file written here (ClusterLogs)."""
        stages = resources.files("chexflow.devcluster").joinpath("kwok-stages.yaml")
        pod_log = self.state_dir / "kwok-pod.log"
        # CRI log format, as the kubelet reads container logs: "<RFC3339Nano> stdout F <line>"
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S.000000000Z", time.gmtime())
        pod_log.write_text("".join(f"{stamp} stdout F {line}\n"
                                   for line in KWOK_POD_LOG.splitlines()))
        logs = self.state_dir / "kwok-logs.yaml"
        logs.write_text(json.dumps({
            "apiVersion": "kwok.x-k8s.io/v1alpha1", "kind": "ClusterLogs",
            "metadata": {"name": "all-pods"},
            "spec": {"logs": [{"logsFile": str(pod_log), "follow": False}]},
        }))
        # kwok renews 1,000 nodes' leases 4 at a time by default: on 2 busy cores some lapsed,
        # the node lifecycle controller marked their pods NotReady for good (kwok readies a pod
        # only while it is Pending). Stage parallelism stays kwok's 4: at 16, two workers played
        # one pod's stage at once (two pod IPs, refused). A KwokConfiguration replaces kwok's
        # defaults, so the others are restated as they are.
        options = self.state_dir / "kwok-options.yaml"
        options.write_text(json.dumps({
            "apiVersion": "config.kwok.x-k8s.io/v1alpha1", "kind": "KwokConfiguration",
            "options": {"podPlayStageParallelism": 4, "nodePlayStageParallelism": 4,
                        "nodeLeaseParallelism": KWOK_LEASE_PARALLELISM,
                        "podsOnNodeSyncParallelism": 1,
                        "enablePodsOnNodeSyncListPager": True,
                        "enablePodsOnNodeSyncStreamWatch": False,
                        "enableDebuggingHandlers": True, "enableProfilingHandler": True}}))
        port = self.ports["kwok"]
        return [f"--kubeconfig={self.kubeconfig}", f"--config={stages}", f"--config={logs}",
                f"--config={options}",
                "--manage-all-nodes=false",
                f"--manage-nodes-with-annotation-selector={'='.join(nodes.KWOK_ANNOTATION)}",
                f"--cidr={KWOK_POD_CIDR}", "--node-ip=127.0.0.1", f"--node-port={port}",
                f"--server-address=127.0.0.1:{port}", f"--tls-cert-file={pki.serving_cert}",
                f"--tls-private-key-file={pki.serving_key}",
                f"--node-lease-duration-seconds={self.node_lease_duration_s}"]

    def _mpi_operator_args(self) -> list[str]:
        # The work queue's default 10 syncs/s (burst 100) paced 100 MPIJobs to ~2 s each in
        # bench/cluster_scale.py; the API client limits are raised to match.
        return [f"--kubeConfig={self.kubeconfig}", f"--lock-namespace={MPI_OPERATOR_NAMESPACE}",
                "--threadiness=4", f"--kube-api-qps={CLIENT_QPS}",
                f"--kube-api-burst={CLIENT_BURST}",
                f"--controller-queue-rate-limit={MPI_OPERATOR_QUEUE['rate']}",
                f"--controller-queue-burst={MPI_OPERATOR_QUEUE['burst']}"]

    # ---- readiness -----------------------------------------------------------------------------
    def ssl_context(self) -> ssl.SSLContext:
        """TLS to the apiserver as the admin (its CA, the admin's client certificate)."""
        pki = self.pki
        ctx = ssl.create_default_context(cafile=str(pki.ca))
        ctx.load_cert_chain(*map(str, pki.client("admin")))
        return ctx

    def wait_http(self, url: str, component: str, deadline: float,
                  context: ssl.SSLContext | None = None) -> None:
        """Until `url` answers 200; a component that exits meanwhile ends the wait (check)."""
        last = ""
        while time.monotonic() < deadline:
            self.check()
            try:
                with urllib.request.urlopen(url, timeout=5, context=context) as r:
                    if r.status == 200:
                        return
            except OSError as e:
                last = str(e)
            time.sleep(0.3)
        raise DevClusterError(f"{component} not healthy at {url} ({last}); "
                              f"see {self.log_dir}/{component}.log")

    def wait_kwok_nodes(self, api, names: list[str], deadline: float) -> None:
        """Until the kwok nodes are Ready. kwok v0.8.0 can die as it first matches its stages
        ("fatal error: concurrent map writes" in its CEL type registry, easycel) and keeps no
        state of its own, so a kwok that exits here is started again (its log goes on), up to
        KWOK_START_ATTEMPTS in all; any other component that exits ends the start."""
        for attempt in range(1, KWOK_START_ATTEMPTS + 1):
            try:
                nodes.wait_nodes_ready(api, names, max(5.0, deadline - time.monotonic()),
                                       check=self.check)
                return
            except DevClusterError:
                kwok = self.processes["kwok"]
                if runs(kwok["pid"], kwok["exe"]) or attempt == KWOK_START_ATTEMPTS:
                    raise
                self.restart("kwok")

    def ensure_namespace(self, name: str) -> None:
        """Namespace `name`, created unless it is there."""
        from kubernetes import client
        from kubernetes.client.rest import ApiException

        try:
            client.CoreV1Api(self.api_client()).create_namespace({"metadata": {"name": name}})
        except ApiException as e:
            if e.status != 409:
                raise

    def _wait_default_service_account(self, api, deadline: float) -> None:
        """Pods are refused until the controller-manager has made the `default` ServiceAccount."""
        from kubernetes import client
        from kubernetes.client.rest import ApiException

        core = client.CoreV1Api(api)
        while time.monotonic() < deadline:
            self.check()
            try:
                core.read_namespaced_service_account("default", "default")
                return
            except ApiException as e:
                if e.status != 404:
                    raise
            time.sleep(0.3)
        raise DevClusterError("the controller-manager did not create ServiceAccount "
                              f"default/default; see {self.log_dir}/kube-controller-manager.log")
