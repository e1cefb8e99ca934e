"""A real Kubernetes control plane on loopback: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler, kwok (simulated GPU nodes) and mpi-operator, each a local process; with
`real_node=True` also a real node (containerd, kubelet, CoreDNS: realnode.py) that runs pods,
and with `katib=True` kube-proxy on it (ClusterIP Services: kubeproxy.py) and Katib v0.19.0
(katib.py); with `kueue=True` Kueue's manager (kueue.py: MPIJob integration, a ClusterQueue over
the kwok nodes' GPUs); with `coscheduling=True` scheduler-plugins' Coscheduling scheduler beside
the default one, and mpi-operator making a PodGroup per MPIJob (coscheduling.py).

With a real node the apiserver listens on and advertises the node's address (198.18.K.1, on
the node's bridge) instead of 127.0.0.1: host clients reach it there, and pods reach it through
the `kubernetes` Service, whose endpoint is that address.

    with LocalCluster(state_dir) as cluster:      # or cluster.start() ... cluster.stop()
        api = cluster.api_client()                # kubernetes.client.ApiClient (admin)
        os.environ["KUBECONFIG"] = str(cluster.kubeconfig)

`state_dir` holds pki/, kubeconfigs, etcd data, logs/<component>.log and cluster.json (ports and
process ids), so `chexflow cluster down` can stop a cluster another process started.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import ssl
import subprocess
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from chexflow.data.faults import cause
from chexflow.devcluster import (
    binaries,
    certs,
    coscheduling,
    crds,
    katib,
    kubeproxy,
    kueue,
    nodes,
    realnode,
    supervise,
)
from chexflow.errors import ChexflowError
from chexflow.kube import client_from_kubeconfig
from chexflow.ports import free_port, port_free
from chexflow.processes import die_with_parent, stop_marked

STATE_FILE = "cluster.json"
PORTS_FILE = "ports.json"  # kept after a stop: a resumed cluster listens where it did
START_ORDER = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok",
               "coscheduling-scheduler", "podgroup-controller", "mpi-operator", "kueue",
               "containerd", "kubelet", "coredns", "kube-proxy")
# RFC 2544 benchmarking addresses, never a private range: services here, pods in 198.18.0.0/16
# (kwok nodes' pods in the upper half, the real node's in a /24 of the lower half).
SERVICE_CIDR = "198.19.0.0/16"
KWOK_POD_CIDR = "198.18.128.0/17"
KWOK_START_ATTEMPTS = 3
KWOK_LEASE_PARALLELISM = 16
MPI_OPERATOR_NAMESPACE = "mpi-operator"
KWOK_POD_LOG = "kwok: simulated container on a kwok node (no process ran)\n"
# in every component's environment (value: the state folder), so that a stop also finds a
# process started a moment before its start was recorded (cluster.json)
COMPONENT_MARK = "CHEXFLOW_DEVCLUSTER"


class DevClusterError(ChexflowError):
    """The local control plane failed to start, or is not running."""


def _alive(pid: int, exe: str) -> bool:
    """True when `pid` runs the binary `exe` (guards against a reused process id)."""
    try:
        return os.readlink(f"/proc/{pid}/exe").removesuffix(" (deleted)") == exe
    except OSError:
        return False


def process_alive(pid: int) -> bool:
    """True when process `pid` exists and is not a zombie (killed, not yet reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


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
    """One control plane; `nodes` kwok nodes with `gpus_per_node` nvidia.com/gpu each."""

    state_dir: Path
    nodes: int = 4
    gpus_per_node: int = 8
    bin_dir: Path | None = None
    # True: the components get SIGTERM when the process that started them dies (Linux
    # PR_SET_PDEATHSIG), so a killed test run leaves nothing behind. `chexflow cluster up`
    # leaves it False: its cluster outlives the command.
    die_with_parent: bool = False
    # A real node beside the kwok nodes (root, Debian's containerd/runc/CNI plugins), with
    # these image archives (OCI or docker) loaded into its containerd.
    real_node: bool = False
    node_images: list[Path] = field(default_factory=list)
    # with real_node: how many real nodes (each its own containerd, kubelet, bridge and /24)
    real_nodes: int = 1
    # kube-proxy on the real node and Katib in namespace kubeflow (implies real_node)
    katib: bool = False
    # Kubeflow Trainer v2 and JobSet (trainer.py; built from their Go modules on first use)
    trainer: bool = False
    # the node lifecycle controller's grace before a silent node is NotReady (0: Kubernetes'
    # default); simulations of 1,000s of kwok nodes on a few cores set it longer
    node_monitor_grace_s: int = 0
    # Kueue's manager with its webhooks, ResourceFlavor kwok-gpu and ClusterQueue chexflow
    # (built from its Go module on first use)
    kueue: bool = False
    # scheduler-plugins' Coscheduling scheduler; mpi-operator gangs every MPIJob's pods with it
    coscheduling: bool = False
    # the address the apiserver listens on: the real node's when there is one
    host: str = "127.0.0.1"
    ports: dict[str, int] = field(default_factory=dict)
    processes: dict[str, dict] = field(default_factory=dict)
    # True: once started, a supervisor process (reaper --supervise) restarts components that
    # exit (supervise.py); `chexflow cluster up` detached sets it, --foreground supervises itself
    supervise: bool = False
    # set once start() has finished: a supervisor restarts nothing before
    ready: bool = False
    # the process that starts it (cluster.json records it: a start that did not finish is told
    # from one under way) and this start's own id (a stop leaves a later start's cluster alone)
    starter: int = 0
    run_id: str = ""

    def __post_init__(self) -> None:
        self.state_dir = Path(self.state_dir).resolve()
        self.real_node = self.real_node or self.katib or self.real_nodes > 1

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

    # ---- lifecycle -----------------------------------------------------------------------------
    def start(self, timeout: float = 180, fresh: bool = False) -> LocalCluster:
        """Start every component and wait until nodes are Ready and the default ServiceAccount
        exists; on failure everything started is stopped and the error names the component.

        A state folder used before (stopped, or left by a crash) is resumed: etcd's data and the
        PKI are kept, so the objects are still there; `fresh` starts from an empty etcd."""
        check_state_dir(self.state_dir)
        if self.running():
            raise DevClusterError(f"a cluster is already running from {self.state_dir}: "
                               f"run `chexflow cluster down --dir {self.state_dir}` first")
        self.bin_dir = Path(self.bin_dir or binaries.ensure_binaries())
        node_bin = katib_images = kueue_bin = cosched_bin = None
        if self.real_node:
            realnode.check_requirements()
            node_bin = binaries.ensure_node_binaries()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        if fresh:
            for stale in ("etcd", "logs", "volumes"):  # volumes: hostPath data (katib-mysql)
                shutil.rmtree(self.state_dir / stale, ignore_errors=True)
        self.log_dir.mkdir(exist_ok=True)
        old: dict[str, int] = {}
        if not fresh:  # a resumed cluster keeps its ports where free: kubeconfigs stay valid
            with contextlib.suppress(OSError, ValueError):
                old = json.loads((self.state_dir / PORTS_FILE).read_text())
        self.ports = {}
        for k in ("etcd", "etcd_peer", "apiserver", "controller_manager", "scheduler", "kwok",
                  "mpi_health", "kubelet", "kubelet_healthz", "coredns_health", "coredns_ready",
                  "kube_proxy_healthz", "kube_proxy_metrics", "kueue_health", "kueue_metrics",
                  "kueue_webhook", "coscheduling", "podgroup_metrics", "podgroup_health"):
            keep = k in old and old[k] not in self.ports.values() and port_free(old[k])
            self.ports[k] = old[k] if keep else free_port(self.ports.values())
        self.processes = {}
        self.ready = False
        self.starter, self.run_id = os.getpid(), uuid.uuid4().hex
        with supervise.locked(self.state_dir):  # after a stop under way, not during it
            for stale in (supervise.STOPPING_FILE, supervise.SUPERVISOR_FILE):
                (self.state_dir / stale).unlink(missing_ok=True)  # left by a crash
            self.save()  # what was asked, before anything runs: `cluster status` compares
        # A watcher stops whatever was started if this process dies before the cluster is
        # ready (SIGKILL included); a detached cluster's then goes on as its supervisor.
        self._start_reaper(supervise=self.supervise, parent=os.getpid(),
                           until_ready=not self.die_with_parent)
        try:
            if self.katib:  # before anything starts: refused at once when another cluster has it
                kubeproxy.claim(self.state_dir, node_bin / "kube-proxy")
                katib_images = katib.build_images()  # cached; not counted in `timeout`
            if self.kueue:
                kueue_bin = kueue.ensure_binaries()  # cached; not counted in `timeout`
            if self.coscheduling:
                cosched_bin = coscheduling.ensure_binaries()  # cached; not counted either
            deadline = time.monotonic() + timeout
            self.host = (self._prepare_real_node(keep_images=not fresh)["node_ip"] if node_bin
                         else "127.0.0.1")
            pki = certs.make_pki(self.state_dir, server_ips=(self.host,) if node_bin else ())
            certs.write_kubeconfig(self.kubeconfig, self.server, pki, "admin")
            for client in ("controller-manager", "scheduler"):
                certs.write_kubeconfig(self.state_dir / f"{client}.kubeconfig", self.server, pki,
                                       client)
            self._spawn("etcd", self._etcd_args())
            self._spawn("kube-apiserver", self._apiserver_args(pki))
            self._wait_apiserver(deadline)
            api = self.api_client()
            crds.install_crds(api, timeout=max(5.0, deadline - time.monotonic()))
            if cosched_bin:  # before mpi-operator, which looks for the PodGroup API
                crds.install_crd_docs(api, coscheduling.crd_docs(cosched_bin),
                                      timeout=max(5.0, deadline - time.monotonic()))
            self._ensure_namespace(api, MPI_OPERATOR_NAMESPACE)
            self._spawn("kube-controller-manager", self._controller_manager_args(pki))
            self._spawn("kube-scheduler", self._scheduler_args())
            self._spawn("kwok", self._kwok_args(pki))
            if cosched_bin:
                config = self.state_dir / "coscheduling-config.yaml"
                config.write_text(json.dumps(coscheduling.scheduler_config(self.kubeconfig)))
                self._spawn("coscheduling-scheduler",
                            coscheduling.args(config, self.kubeconfig,
                                              self.ports["coscheduling"]),
                            exe=cosched_bin / coscheduling.EXE)
                self._spawn("podgroup-controller", coscheduling.controller_args(self.ports),
                            exe=cosched_bin / coscheduling.CONTROLLER)
            self._spawn("mpi-operator", self._mpi_operator_args(),
                        env={"MPI_OPERATOR_HEALTH_ADDR": f"127.0.0.1:{self.ports['mpi_health']}"})
            names = nodes.create_gpu_nodes(api, self.nodes, self.gpus_per_node)
            self._wait_kwok_nodes(api, names, deadline)
            self._wait_default_service_account(api, deadline)
            self._wait_http(f"http://127.0.0.1:{self.ports['mpi_health']}/healthz",
                            "mpi-operator", deadline)
            if kueue_bin:
                self._start_kueue(kueue_bin, pki, deadline)
            if node_bin:
                self._start_real_node(node_bin, pki, deadline)
            if katib_images:
                katib.deploy(self, katib_images, timeout=max(5.0, deadline - time.monotonic()))
            if self.trainer:
                self.add_trainer(timeout=max(5.0, deadline - time.monotonic()))
            self.ready = True
            self.save()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self, grace: float = 10) -> None:
        """Stop the components one by one in reverse start order (SIGTERM, then SIGKILL after
        `grace` s): the apiserver exits in about a second while etcd is still there. The stop
        holds the supervision lock throughout: a supervisor restarts nothing meanwhile, and two
        stops (a watcher's and a `cluster up`'s) do not overlap. A later start's cluster in the
        same folder is left alone."""
        present = self.state_dir.is_dir()  # else removed under it: its processes still go
        with supervise.locked(self.state_dir) if present else contextlib.nullcontext():
            recorded = self._recorded_state()
            if recorded is not None and recorded.get("run_id", "") != self.run_id:
                return
            if present:
                (self.state_dir / supervise.STOPPING_FILE).touch()
            if recorded is not None:
                self.processes = recorded["processes"]
            for name in self._stop_order():
                self._stop_process(self.processes[name], grace)
            for node in realnode.all_nodes(self.state_dir):
                node.cleanup()
            if self.katib:
                kubeproxy.release(self.state_dir)
            stop_marked(COMPONENT_MARK, str(self.state_dir), grace)  # started, not yet recorded
            self.processes = {}
            (self.state_dir / STATE_FILE).unlink(missing_ok=True)
            (self.state_dir / supervise.STOPPING_FILE).unlink(missing_ok=True)

    def _stop_process(self, proc: dict, grace: float) -> None:
        """SIGTERM, then SIGKILL after `grace` s, one recorded process."""
        with contextlib.suppress(ProcessLookupError):
            if not _alive(proc["pid"], proc["exe"]):
                return
            os.kill(proc["pid"], signal.SIGTERM)
            end = time.monotonic() + grace
            while _alive(proc["pid"], proc["exe"]):
                if time.monotonic() > end:
                    os.kill(proc["pid"], signal.SIGKILL)
                    time.sleep(0.1)
                    break
                self._reap(proc["pid"])
                time.sleep(0.05)
        self._reap(proc["pid"])

    def _stop_order(self) -> list[str]:
        """The recorded processes, the last in START_ORDER first; an extra real node's
        (`kubelet-2`) beside its first node's; any other name before all of them."""
        rank = {name: i for i, name in enumerate(START_ORDER)}

        def key(name: str) -> int:
            return rank.get(name, rank.get(name.rsplit("-", 1)[0], len(rank)))
        return sorted(self.processes, key=key, reverse=True)

    def expected_components(self) -> list[str]:
        """The processes this cluster runs when it is up, as asked (--coscheduling, --kueue,
        real nodes, --katib, --trainer), in start order."""
        names = ["etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok"]
        if self.coscheduling:
            names += ["coscheduling-scheduler", "podgroup-controller"]
        names.append("mpi-operator")
        if self.kueue:
            names.append("kueue")
        if self.real_node:
            names += ["containerd", "kubelet", "coredns"]
            for node in range(1, self.real_nodes):
                suffix = realnode.RealNode(self.state_dir, node).suffix
                names += [f"containerd{suffix}", f"kubelet{suffix}"]
        if self.katib:
            names.append("kube-proxy")
        if self.trainer:
            names += ["jobset", "trainer"]
        return names

    def starting(self) -> bool:
        """True while the process that starts this cluster is still at it (not ready yet)."""
        return not self.ready and bool(self.starter) and process_alive(self.starter)

    def component_alive(self, name: str) -> bool:
        """True when the recorded process of component `name` still runs."""
        proc = self.processes[name]
        return _alive(proc["pid"], proc["exe"])

    def running(self) -> bool:
        """True when any recorded component process is alive."""
        self._refresh()
        return any(_alive(p["pid"], p["exe"]) for p in self.processes.values())

    def check(self) -> None:
        """Raise DevClusterError naming any component that has exited."""
        self._refresh()
        dead = supervise.dead(self)
        if dead:
            raise DevClusterError(f"component(s) exited: {', '.join(dead)}; "
                               f"see {self.log_dir}/<component>.log")

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *_exc) -> None:
        self.stop()

    # ---- state file ----------------------------------------------------------------------------
    def save(self) -> None:
        state = {"server": self.server, "kubeconfig": str(self.kubeconfig),
                 "bin_dir": str(self.bin_dir), "nodes": self.nodes,
                 "gpus_per_node": self.gpus_per_node, "real_node": self.real_node,
                 "real_nodes": self.real_nodes, "trainer": self.trainer, "katib": self.katib,
                 "kueue": self.kueue, "coscheduling": self.coscheduling, "host": self.host,
                 "ports": self.ports,
                 "processes": self.processes, "ready": self.ready,
                 "supervise": self.supervise, "starter": self.starter, "run_id": self.run_id}
        tmp = self.state_dir / f".{STATE_FILE}.{os.getpid()}"  # readers never see half of it
        tmp.write_text(json.dumps(state, indent=2))
        tmp.replace(self.state_dir / STATE_FILE)
        (self.state_dir / PORTS_FILE).write_text(json.dumps(self.ports))

    def recorded(self) -> bool:
        """True while cluster.json records this start of the cluster (not stopped since, nor
        started again); the processes are read from it."""
        state = self._recorded_state()
        if state is None or state.get("run_id", "") != self.run_id:
            return False
        self.processes = state["processes"]
        return True

    def _recorded_state(self) -> dict | None:
        """cluster.json as it is now, or None when there is none (stopped, or never started)."""
        try:
            return json.loads((self.state_dir / STATE_FILE).read_text())
        except (OSError, ValueError):
            return None

    def _refresh(self) -> None:
        """The processes as cluster.json records them now: a supervisor may have restarted
        some (new process ids, restart counts) since this object last saw them."""
        with contextlib.suppress(OSError, ValueError, KeyError):
            self.processes = json.loads((self.state_dir / STATE_FILE).read_text())["processes"]

    def restart(self, name: str, reason: str = "exited") -> None:
        """Start component `name` again with its recorded exe, args and env (supervise.py)."""
        supervise.restart(self, name, reason)

    @classmethod
    def attach(cls, state_dir: Path) -> LocalCluster:
        """The cluster recorded in state_dir/cluster.json (started by another process)."""
        path = Path(state_dir) / STATE_FILE
        if not path.exists():
            raise DevClusterError(f"{path}: no cluster recorded here "
                                  "(start one: chexflow cluster up)")
        state = json.loads(path.read_text())
        return cls(state_dir=Path(state_dir), nodes=state["nodes"],
                   gpus_per_node=state["gpus_per_node"], bin_dir=Path(state["bin_dir"]),
                   real_node=state.get("real_node", False), katib=state.get("katib", False),
                   real_nodes=state.get("real_nodes", 1), trainer=state.get("trainer", False),
                   kueue=state.get("kueue", False),
                   coscheduling=state.get("coscheduling", False),
                   host=state.get("host", "127.0.0.1"), ports=state["ports"],
                   processes=state["processes"], ready=state.get("ready", True),
                   supervise=state.get("supervise", False), starter=state.get("starter", 0),
                   run_id=state.get("run_id", ""))

    # ---- clients -------------------------------------------------------------------------------
    def api_client(self):
        """A kubernetes.client.ApiClient authenticated as the admin."""
        return client_from_kubeconfig(self.kubeconfig)

    def memory(self, component: str = "kube-apiserver") -> dict[str, float]:
        """Current and peak resident memory (MiB) of one component."""
        return rss_mib(self.processes[component]["pid"])

    # ---- components ----------------------------------------------------------------------------
    def _spawn(self, name: str, args: list[str], env: dict | None = None,
               exe: Path | str | None = None) -> None:
        exe = str(exe or self.bin_dir / name)
        log = self.log_dir / f"{name}.log"
        self._refresh()
        with open(log, "ab") as out:
            proc = subprocess.Popen([exe, *args], stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True,
                                    # its own kubeconfig: mpi-operator lets KUBECONFIG
                                    # override --kubeConfig (a caller's may name another cluster)
                                    env={**os.environ, "KUBECONFIG": str(self.kubeconfig),
                                         COMPONENT_MARK: str(self.state_dir), **(env or {})},
                                    preexec_fn=die_with_parent() if self.die_with_parent else None)
        self.processes[name] = {"pid": proc.pid, "exe": os.path.realpath(exe), "log": str(log),
                                "args": args, **({"env": env} if env else {})}
        self.save()

    def _reap(self, pid: int) -> None:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)

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
            *(["--endpoint-reconciler-type=none"] if self.host == "127.0.0.1" else []),
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
                "--kube-api-qps=200", "--kube-api-burst=400", "--v=1",
                *([f"--node-monitor-grace-period={self.node_monitor_grace_s}s"]
                  if self.node_monitor_grace_s else [])]

    def _scheduler_args(self) -> list[str]:
        kc = self.state_dir / "scheduler.kubeconfig"
        return [f"--kubeconfig={kc}", f"--authentication-kubeconfig={kc}",
                f"--authorization-kubeconfig={kc}", "--bind-address=127.0.0.1",
                f"--secure-port={self.ports['scheduler']}", "--leader-elect=false",
                "--kube-api-qps=200", "--kube-api-burst=400", "--v=1"]

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
                f"--tls-private-key-file={pki.serving_key}", "--node-lease-duration-seconds=40"]

    def _mpi_operator_args(self) -> list[str]:
        # The work queue's default 10 syncs/s (burst 100) paced 100 MPIJobs to ~2 s each in
        # bench/cluster_scale.py; the API client limits are raised to match.
        return [f"--kubeConfig={self.kubeconfig}", f"--lock-namespace={MPI_OPERATOR_NAMESPACE}",
                "--threadiness=4", "--kube-api-qps=200", "--kube-api-burst=400",
                "--controller-queue-rate-limit=100", "--controller-queue-burst=1000",
                *([f"--gang-scheduling={coscheduling.SCHEDULER_NAME}"]
                  if self.coscheduling else [])]

    def _start_kueue(self, bin_dir: Path, pki: certs.PKI, deadline: float) -> None:
        """Kueue's CRDs and webhooks, its manager, then the ResourceFlavor and ClusterQueue."""
        api = self.api_client()
        port = self.ports["kueue_webhook"]
        kueue.install(api, bin_dir, port, pki, timeout=max(5.0, deadline - time.monotonic()))
        self._ensure_namespace(api, kueue.NAMESPACE)
        cert_dir = kueue.serving_cert(pki)
        config = self.state_dir / "kueue-config.yaml"
        config.write_text(json.dumps(kueue.configuration(self.ports, cert_dir), indent=2))
        self._spawn("kueue", kueue.args(config), exe=bin_dir / "kueue",
                    env={"KUEUE_METRICS_CERT_DIR": str(cert_dir)})
        self._wait_http(f"http://127.0.0.1:{self.ports['kueue_health']}/readyz", "kueue",
                        deadline)
        kueue.create_queues(api, self.nodes, self.gpus_per_node, deadline)
        kueue.wait_cluster_queue_active(api, kueue.CLUSTER_QUEUE, deadline)

    def _prepare_real_node(self, keep_images: bool = False) -> dict[str, str]:
        """The real node's folder and bridge (before the apiserver, which listens there).
        `keep_images`: the first node's containerd root (images, and the metadata of containers
        that no longer run, as after a reboot) stays for the resumed cluster."""
        for stale in realnode.all_nodes(self.state_dir):  # whatever a killed run left
            stale.cleanup()
            root = stale.dir / "containerd" / "root"
            aside = self.state_dir / f".{stale.dir.name}-containerd-root"
            if keep_images and not stale.suffix and root.is_dir():
                root.rename(aside)
            shutil.rmtree(stale.dir, ignore_errors=True)
            if aside.is_dir():
                root.parent.mkdir(parents=True)
                aside.rename(root)
        node = realnode.RealNode(self.state_dir)
        node.dir.mkdir(parents=True, exist_ok=True)
        return node.setup_network(SERVICE_CIDR if self.katib else None)

    def _start_containerd(self, node: realnode.RealNode, node_bin: Path,
                          deadline: float) -> None:
        """A real node's cgroups and containerd, with the pause image and node_images loaded."""
        node.make_cgroups()
        self._spawn(f"containerd{node.suffix}", [f"--config={node.containerd_config()}"],
                    exe=realnode.CONTAINERD)
        while node.ctr("version", check=False).returncode != 0:
            self.check()
            if time.monotonic() > deadline:
                raise DevClusterError(f"containerd not answering on {node.containerd_socket}; "
                                      f"see {self.log_dir}/containerd{node.suffix}.log")
            time.sleep(0.2)
        node.import_image(realnode.pause_archive(node_bin / "pause", node.dir / "pause.oci.tar"))
        for archive in self.node_images:
            node.import_image(Path(archive))

    def _start_real_node(self, node_bin: Path, pki: certs.PKI, deadline: float) -> None:
        """containerd (with the pause image), the kubelet, CoreDNS and with `katib` kube-proxy;
        waits for Ready."""
        node = realnode.RealNode(self.state_dir)
        addr = node.addresses()
        self._start_containerd(node, node_bin, deadline)
        kubeconfig = certs.write_kubeconfig(node.dir / "kubelet.kubeconfig", self.server, pki,
                                            "kubelet")
        config = node.kubelet_config(self.ports, addr["node_ip"], pki.ca)
        self._spawn("kubelet", node.kubelet_args(config, kubeconfig, addr["node_ip"]),
                    exe=node_bin / "kubelet")
        corefile = node.corefile(self.ports, addr["node_ip"], self.kubeconfig)
        self._spawn("coredns", [f"-conf={corefile}"], exe=node_bin / "coredns")
        self._wait_real_node_ready(node.name, deadline)
        self._wait_http(f"http://127.0.0.1:{self.ports['coredns_ready']}/ready", "coredns",
                        deadline)
        if self.katib:
            self._start_kube_proxy(node_bin / "kube-proxy", pki, addr, deadline)
        for _ in range(1, self.real_nodes):
            self._start_extra_node(node_bin, pki, deadline)

    def add_real_node(self, timeout: float = 120) -> realnode.RealNode:
        """Start one more real node on this running cluster (the first one must exist); the
        cluster's node_images are loaded into it. Returns it once Ready."""
        if not self.real_node or not realnode.RealNode(self.state_dir).dir.exists():
            raise DevClusterError(f"the cluster in {self.state_dir} has no real node to add "
                                  "another beside (start it with --real-node)")
        node = self._start_extra_node(binaries.ensure_node_binaries(),
                                      certs.PKI(self.state_dir / "pki"),
                                      time.monotonic() + timeout)
        self.real_nodes = len(realnode.all_nodes(self.state_dir))
        self.save()
        return node

    def add_trainer(self, timeout: float = 120) -> None:
        """Start Kubeflow Trainer v2 and JobSet on this running cluster (trainer.py): their
        CRDs, webhooks and controllers, each a local process (stopped with the cluster)."""
        from chexflow.devcluster import trainer

        for name in trainer.PORTS:
            self.ports[name] = free_port(self.ports.values())
        trainer.start(self, timeout)
        self.trainer = True
        self.save()

    def _start_extra_node(self, node_bin: Path, pki: certs.PKI,
                          deadline: float) -> realnode.RealNode:
        """Real node number len(all_nodes) + 1: its bridge and /24, routes between its pods and
        the other nodes' (the host forwards between the bridges), containerd and a kubelet
        whose DNS is the first node's CoreDNS. Waits for Ready."""
        nodes_now = realnode.all_nodes(self.state_dir)
        node = realnode.RealNode(self.state_dir, len(nodes_now))
        node.dir.mkdir(parents=True)
        addr = node.setup_network(SERVICE_CIDR if self.katib else None)
        realnode.enable_ip_forwarding()
        everyone = [*nodes_now, node]
        cidrs = [n.addresses()["pod_cidr"] for n in everyone]
        for n in everyone:
            n.route_peers(cidrs)
        self._start_containerd(node, node_bin, deadline)
        kubeconfig = certs.write_kubeconfig(node.dir / "kubelet.kubeconfig", self.server, pki,
                                            certs.node_client(pki, node.name))
        for port in ("kubelet", "kubelet_healthz"):
            self.ports[port + node.suffix] = free_port(self.ports.values())
        dns = realnode.RealNode(self.state_dir).addresses()["node_ip"]
        config = node.kubelet_config(self.ports, addr["node_ip"], pki.ca, dns_ip=dns)
        self._spawn(f"kubelet{node.suffix}", node.kubelet_args(config, kubeconfig,
                                                               addr["node_ip"]),
                    exe=node_bin / "kubelet")
        self._wait_real_node_ready(node.name, deadline)
        return node

    def _start_kube_proxy(self, exe: Path, pki: certs.PKI, addr: dict[str, str],
                          deadline: float) -> None:
        """kube-proxy for the node's pod /24 (this cluster holds the machine's claim)."""
        node_dir = realnode.RealNode(self.state_dir).dir
        kubeconfig = certs.write_kubeconfig(node_dir / "kube-proxy.kubeconfig", self.server, pki,
                                            "kube-proxy")
        config = kubeproxy.config(kubeproxy.config_path(self.state_dir), kubeconfig,
                                  realnode.NODE_NAME, addr["node_ip"], addr["pod_cidr"],
                                  self.ports)
        self._spawn("kube-proxy", [f"--config={config}", "--v=1"], exe=exe)
        self._wait_http(f"http://127.0.0.1:{self.ports['kube_proxy_healthz']}/healthz",
                        "kube-proxy", deadline)

    def start_supervisor(self) -> int:
        """Supervise this running cluster from now on (a process restarting the components that
        exit, supervise.py); it watches no parent and ends when the cluster is stopped.
        Returns its process id."""
        self.supervise = True
        return self._start_reaper(supervise=True, parent=0)

    def _start_reaper(self, supervise: bool = False, parent: int = 0,
                      until_ready: bool = False) -> int:
        """A detached watcher that stops this cluster (real node included) if process `parent`
        dies without stopping it (chexflow.devcluster.reaper), or with `until_ready` only if it
        dies before the cluster is ready; with `supervise` it also restarts components that exit
        once the cluster is ready."""
        import sys

        name = "supervisor" if supervise else "reaper"
        with open(self.log_dir / f"{name}.log", "ab") as out:
            return subprocess.Popen([sys.executable, "-m", "chexflow.devcluster.reaper",
                                     str(self.state_dir), str(parent),
                                     *(["--supervise"] if supervise else []),
                                     *(["--until-ready"] if until_ready else [])], stdout=out,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True).pid

    def _wait_real_node_ready(self, name: str, deadline: float) -> None:
        from kubernetes import client
        from kubernetes.client.rest import ApiException

        core = client.CoreV1Api(self.api_client())
        while time.monotonic() < deadline:
            self.check()
            try:
                conds = core.read_node(name).status.conditions or []
                if any(c.type == "Ready" and c.status == "True" for c in conds):
                    return
            except ApiException as e:
                if e.status != 404:
                    raise
            time.sleep(0.5)
        log = "kubelet" + name.removeprefix(realnode.NODE_NAME)
        raise DevClusterError(f"node {name} not Ready; see {self.log_dir}/{log}.log")

    # ---- readiness -----------------------------------------------------------------------------
    def _ssl_context(self) -> ssl.SSLContext:
        pki = certs.PKI(self.state_dir / "pki")
        ctx = ssl.create_default_context(cafile=str(pki.ca))
        ctx.load_cert_chain(*map(str, pki.client("admin")))
        return ctx

    def _wait_http(self, url: str, component: str, deadline: float,
                   context: ssl.SSLContext | None = None) -> None:
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

    def _wait_kwok_nodes(self, api, names: list[str], deadline: float) -> None:
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
                if _alive(kwok["pid"], kwok["exe"]) or attempt == KWOK_START_ATTEMPTS:
                    raise
                self.restart("kwok")

    def _wait_apiserver(self, deadline: float) -> None:
        self._wait_http(f"{self.server}/readyz", "kube-apiserver", deadline, self._ssl_context())

    def _ensure_namespace(self, api, name: str) -> None:
        from kubernetes import client
        from kubernetes.client.rest import ApiException

        try:
            client.CoreV1Api(api).create_namespace({"metadata": {"name": name}})
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
