"""A real node beside the kwok nodes: containerd + runc + CNI bridge, a kubelet and CoreDNS (the
`real-node` add-on, RealNodes, at the end).

Pods on it are real processes running images loaded into its containerd. Addresses are RFC 2544
benchmarking ones: the node owns 198.18.K.1 on a bridge of its own (`cxf<id>`) and its pods get
198.18.K.0/24 (K picked per cluster, skipping subnets already on this machine); no default route,
no masquerading, nothing routed off the machine. CoreDNS serves `cluster.local` on the node
address (the kubelet's clusterDNS), so mpi-operator's `<job>-worker-N.<job>.<ns>.svc` resolve.

Everything lives under `<state_dir>/node/` but the sockets (`/run/chexflow/<id>/`) and the
kubelet's root (`/var/lib/chexflow/<id>/kubelet`, where it listens on unix sockets): a unix
socket's path may not pass 108 bytes, however deep the state folder. All is named after a hash
of the state folder (bridge, cgroup root `/chexflow-<id>`), so two clusters run side by side.
`RealNode.cleanup` kills the pods' processes (cgroups) and the runtime's shims, unmounts whatever
the runtime and kubelet mounted under its folders, removes them and the cgroups, and deletes the
bridge. The node is tainted `chexflow.io/real-node=true:NoSchedule` and
labelled `chexflow.io/node=real`: only pods that tolerate the taint and select the label land on
it (or every pod of a namespace annotated with namespace_annotations()), and GPU-shaped pods
(nvidia.com/gpu) cannot, as it has none.

A cluster may have more real nodes (`index` 1, 2, ...: `chexflow-node-2`, folder `node-2/`), each
with its own containerd, kubelet, bridge and /24. Their pods route the other nodes' /24s through
their own node address, and the host forwards between the bridges (IP forwarding, no NAT), so
pod-to-pod traffic crosses nodes as on a real network. CoreDNS runs on the first node only and
serves them all. An extra node also carries EXTRA_NODE_TAINT: only pods that tolerate it (or the
namespaces annotated with namespace_annotations(extra_nodes=True)) land there, so tests that
expect one real node keep it.
"""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
import json
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from chexflow.devcluster import binaries, certs
from chexflow.devcluster.addon import AddOn, Cluster
from chexflow.devcluster.images import LOCAL_REGISTRY
from chexflow.errors import ChexflowError

NODE_NAME = "chexflow-node"
NODE_LABEL = ("chexflow.io/node", "real")
NODE_TAINT = {"key": "chexflow.io/real-node", "value": "true", "effect": "NoSchedule"}
EXTRA_NODE_TAINT = {"key": "chexflow.io/extra-real-node", "value": "true", "effect": "NoSchedule"}
IP_FORWARD = Path("/proc/sys/net/ipv4/ip_forward")
POD_SUPERNET = ipaddress.ip_network("198.18.0.0/17")
CLUSTER_DOMAIN = "cluster.local"
PAUSE_IMAGE = f"{LOCAL_REGISTRY}/pause:3.10"
CNI_BIN_DIR = Path("/usr/lib/cni")
KUBELET_ROOTS = Path("/var/lib/chexflow")
CONTAINERD = "/usr/bin/containerd"
# the node cgroup's weight against the host's processes: its cores, as a node of its own has
NODE_CPU_SHARES = (os.cpu_count() or 1) * 1024
DEBIAN_PACKAGES = "containerd runc containernetworking-plugins iproute2 (images/install-system.sh)"


class RealNodeError(ChexflowError):
    """The real node could not start (missing packages, root, address) or clean up."""


def pod_toleration(taint: dict = NODE_TAINT) -> dict:
    """The toleration a pod needs to run on the real node (or past another of its taints)."""
    return {**taint, "operator": "Equal"}


def node_selector() -> dict[str, str]:
    """The nodeSelector that sends a pod to the real node."""
    return dict([NODE_LABEL])


def namespace_annotations(extra_nodes: bool = False) -> dict[str, str]:
    """Annotations that send every pod of a namespace to the real node, through the
    apiserver's PodNodeSelector and PodTolerationRestriction admission plugins: jobs rendered
    for any cluster run there unchanged. `extra_nodes`: to any of the real nodes."""
    tolerations = [pod_toleration()] + ([pod_toleration(EXTRA_NODE_TAINT)] if extra_nodes else [])
    return {"scheduler.alpha.kubernetes.io/node-selector": "=".join(NODE_LABEL),
            "scheduler.alpha.kubernetes.io/defaultTolerations": json.dumps(tolerations)}


def enable_ip_forwarding() -> None:
    """Let the host forward between the real nodes' bridges (as kubeadm's preflight requires);
    pods have routes to the nodes' /24s only, so nothing goes off the machine."""
    if IP_FORWARD.read_text().strip() != "1":
        IP_FORWARD.write_text("1")


def _run(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise RealNodeError(f"`{' '.join(cmd)}` failed: {proc.stderr.strip() or proc.stdout}")
    return proc


def _used_subnets() -> set[ipaddress.IPv4Network]:
    out = _run("ip", "-j", "-4", "addr", "show").stdout
    return {ipaddress.ip_interface(f"{a['local']}/24").network
            for link in json.loads(out) for a in link.get("addr_info", [])}


def check_requirements() -> None:
    """Raise naming what is missing: root, containerd, runc, the CNI plugins, ip."""
    if os.geteuid() != 0:
        raise RealNodeError("the real node needs root (containerd, kubelet, network setup)")
    need = {CONTAINERD: "containerd", "/usr/sbin/runc": "runc",
            str(CNI_BIN_DIR / "bridge"): "containernetworking-plugins"}
    absent = [pkg for path, pkg in need.items() if not os.access(path, os.X_OK)]
    if shutil.which("ip") is None:
        absent.append("iproute2")
    if absent:
        raise RealNodeError(f"the real node needs the Debian packages {', '.join(absent)}: "
                            f"run images/install-system.sh ({DEBIAN_PACKAGES})")


@dataclass
class RealNode:
    """Real node `index` (0: the first) of the cluster whose state folder is `state_dir`."""

    state_dir: Path
    index: int = 0

    def __post_init__(self) -> None:
        self.state_dir = Path(self.state_dir).resolve()
        key = str(self.state_dir) + (f"#{self.index}" if self.index else "")
        self.id = hashlib.sha256(key.encode()).hexdigest()[:8]

    # ---- names and paths -----------------------------------------------------------------------
    @property
    def suffix(self) -> str:
        """"" for the first node, "-2", "-3", ... for the others (names, folders, processes)."""
        return f"-{self.index + 1}" if self.index else ""

    @property
    def name(self) -> str:
        return NODE_NAME + self.suffix

    @property
    def taints(self) -> list[dict]:
        return [NODE_TAINT] + ([EXTRA_NODE_TAINT] if self.index else [])

    @property
    def dir(self) -> Path:
        return self.state_dir / f"node{self.suffix}"

    @property
    def bridge(self) -> str:
        return f"cxf{self.id}"

    @property
    def cgroup_root(self) -> str:
        return f"/chexflow-{self.id}"

    @property
    def run_dir(self) -> Path:
        """Sockets: a short path (unix socket paths are limited to about 100 bytes)."""
        return Path("/run/chexflow") / self.id

    @property
    def kubelet_dir(self) -> Path:
        """The kubelet's --root-dir (pods' volumes; its pod-resources, device-plugins and
        plugins_registry sockets): a short path, as run_dir."""
        return KUBELET_ROOTS / self.id / "kubelet"

    @property
    def containerd_socket(self) -> Path:
        return self.run_dir / "containerd.sock"

    @property
    def address_file(self) -> Path:
        return self.dir / "address.json"

    def addresses(self) -> dict:
        """{"node_ip", "pod_cidr", "routes"} recorded at start (routes: what pods send through
        the node beyond its /24)."""
        return json.loads(self.address_file.read_text())

    # ---- setup ---------------------------------------------------------------------------------
    def pick_subnet(self) -> ipaddress.IPv4Network:
        """A /24 of POD_SUPERNET no interface of this machine uses (first choice from the id)."""
        subnets = list(POD_SUPERNET.subnets(new_prefix=24))
        used = _used_subnets()
        first = int(self.id, 16) % len(subnets)
        for i in range(len(subnets)):
            net = subnets[(first + i) % len(subnets)]
            if net not in used:
                return net
        raise RealNodeError(f"every /24 of {POD_SUPERNET} is in use on this machine")

    def setup_network(self, routes: list[str]) -> dict[str, str]:
        """Create the bridge with the node address; write the CNI config; returns the addresses.
        Pods route `routes` (the other nodes' pod /24s; with kube-proxy the Service range,
        whose ClusterIP connections its rules send on) through the node."""
        net = self.pick_subnet()
        node_ip = str(next(net.hosts()))
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        _run("ip", "addr", "add", f"{node_ip}/{net.prefixlen}", "dev", self.bridge)
        _run("ip", "link", "set", self.bridge, "up")
        addresses = {"node_ip": node_ip, "pod_cidr": str(net), "routes": []}
        self.address_file.write_text(json.dumps(addresses))
        self.set_routes(routes)
        return self.addresses()

    def set_routes(self, routes: list[str]) -> None:
        """Pods started from now on route `routes` (but the node's own /24) through this node
        (containerd reads the CNI config again when it changes)."""
        addresses = self.addresses()
        addresses["routes"] = [r for r in dict.fromkeys(routes) if r != addresses["pod_cidr"]]
        self.address_file.write_text(json.dumps(addresses))
        self.write_cni_config()

    def write_cni_config(self) -> None:
        """The bridge plugin's config: host-local from the /24; no routes but the on-link subnet
        and the recorded ones (Services, other nodes' pods) through the node; no masquerading."""
        a = self.addresses()
        cni_dir = self.dir / "cni"
        cni_dir.mkdir(parents=True, exist_ok=True)
        (cni_dir / "10-chexflow.conflist").write_text(json.dumps({
            "cniVersion": "1.0.0", "name": f"chexflow-{self.id}",
            "plugins": [
                {"type": "bridge", "bridge": self.bridge, "isGateway": True, "ipMasq": False,
                 "hairpinMode": True,
                 "ipam": {"type": "host-local", "ranges": [[{"subnet": a["pod_cidr"],
                                                               "gateway": a["node_ip"]}]],
                          "routes": [{"dst": dst, "gw": a["node_ip"]} for dst in a["routes"]],
                          "dataDir": str(self.dir / "cni-ipam")}},
                {"type": "loopback"},
            ],
        }, indent=2))

    def containerd_config(self) -> Path:
        """containerd 1.6 (CRI) with its root, state, socket and CNI config under dir/."""
        base = self.dir / "containerd"
        sock = self.containerd_socket
        cri = 'plugins."io.containerd.grpc.v1.cri"'
        text = f"""version = 2
root = "{base / 'root'}"
state = "{base / 'state'}"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
                    "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.devmapper"]
[grpc]
  address = "{sock}"
[ttrpc]
  address = "{sock}.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "{base / 'opt'}"
[{cri}]
  sandbox_image = "{PAUSE_IMAGE}"
  # no CAP_SYS_RESOURCE here: the sandbox's oom_score_adj -998 cannot be set, keep the parent's
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [{cri}.registry]
    # registries' hosts.toml (the cluster's registry add-on writes its own there)
    config_path = "{self.state_dir / 'certs.d'}"
  [{cri}.cni]
    bin_dir = "{CNI_BIN_DIR}"
    conf_dir = "{self.dir / 'cni'}"
  [{cri}.containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [{cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{cri}.containerd.runtimes.runc.options]
        SystemdCgroup = false
"""
        path = base / "config.toml"
        path.parent.mkdir(parents=True, exist_ok=True)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return path

    def kubelet_config(self, ports: dict[str, int], node_ip: str, ca: Path,
                       dns_ip: str | None = None) -> Path:
        """KubeletConfiguration: cgroup v1 + cgroupfs, the taints, DNS at `dns_ip` (the first
        node's address, where CoreDNS listens; default this node's)."""
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            "address": node_ip, "port": ports["kubelet" + self.suffix], "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": ports["kubelet_healthz" + self.suffix],
            "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": False},
                               "x509": {"clientCAFile": str(ca)}},
            "authorization": {"mode": "AlwaysAllow"},
            "containerRuntimeEndpoint": f"unix://{self.containerd_socket}",
            "failCgroupV1": False, "cgroupDriver": "cgroupfs", "cgroupRoot": self.cgroup_root,
            "clusterDNS": [dns_ip or node_ip], "clusterDomain": CLUSTER_DOMAIN,
            "resolvConf": str(self.dir / "resolv.conf"),
            # not the shared /var/log/pods: a kubelet's garbage collector deletes the folders
            # of pods it does not know, so side-by-side nodes deleted each other's logs
            "podLogsDir": str(self.dir / "pod-logs"),
            "registerWithTaints": self.taints,
            "failSwapOn": False, "maxPods": 32, "serializeImagePulls": False,
            "makeIPTablesUtilChains": False,
            # images are loaded by hand (no registry): never garbage-collect them, neither by
            # usage nor under disk pressure: with 1% thresholds, a shared disk that fell under
            # 1% free made the kubelet delete every unused image, pause included, and the next
            # pods could not start (a CI run's trials waited out their deadlines). "0%" turns a
            # signal off; the disk filling up then fails the writes that fill it.
            "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
            "evictionHard": {"memory.available": "100Mi", "nodefs.available": "0%",
                             "imagefs.available": "0%", "nodefs.inodesFree": "0%"},
            # the kubelet re-checks a pod's right to an image pulled with a Secret before it runs
            # that image again (KEP-2535), by image ID; an image loaded by hand has the ID of the
            # same image pulled from the registry, and its chexflow.local name cannot be pulled:
            # never re-check those names, check every pulled name as a real cluster does
            "imagePullCredentialsVerificationPolicy": "NeverVerifyAllowlistedImages",
            "preloadedImagesVerificationAllowlist": [f"{LOCAL_REGISTRY}/*"],
            "shutdownGracePeriod": "0s", "syncFrequency": "5s",
            "nodeStatusUpdateFrequency": "5s",
        }
        (self.dir / "resolv.conf").write_text("")
        path = self.dir / "kubelet-config.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        return path

    def kubelet_args(self, config: Path, kubeconfig: Path, node_ip: str) -> list[str]:
        return [f"--config={config}", f"--kubeconfig={kubeconfig}",
                f"--root-dir={self.kubelet_dir}", f"--cert-dir={self.dir / 'kubelet-pki'}",
                f"--hostname-override={self.name}", f"--node-ip={node_ip}",
                f"--node-labels={'='.join(NODE_LABEL)}", "--v=1"]

    def corefile(self, ports: dict[str, int], node_ip: str, kubeconfig: Path) -> Path:
        """CoreDNS on the node address: cluster.local from the apiserver, nothing forwarded."""
        path = self.dir / "Corefile"
        path.write_text(f""".:53 {{
    bind {node_ip}
    errors
    health 127.0.0.1:{ports['coredns_health']}
    ready 127.0.0.1:{ports['coredns_ready']}
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        kubeconfig {kubeconfig}
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 5
    }}
    cache 5
}}
""")
        return path

    def make_cgroups(self) -> None:
        """The kubelet's cgroupRoot in every cgroup v1 hierarchy (cpuset: the parent's CPUs
        and memory nodes), as the kubelet requires it to exist. Its cpu.shares is the node's
        cores x 1024 (NODE_CPU_SHARES), as the kubelet gives `kubepods` on a node of its own:
        with the default 1024, all the pods together would weigh what one host process weighs
        whenever other processes here want the cores."""
        for top in Path("/sys/fs/cgroup").iterdir():
            if not (top / "cgroup.procs").exists():
                continue
            d = top / self.cgroup_root.lstrip("/")
            d.mkdir(exist_ok=True)
            for knob in ("cpuset.cpus", "cpuset.mems"):
                if (d / knob).exists() and not (d / knob).read_text().strip():
                    (d / knob).write_text((top / knob).read_text())
            if (d / "cpu.shares").exists():
                (d / "cpu.shares").write_text(str(NODE_CPU_SHARES))

    # ---- images --------------------------------------------------------------------------------
    def ctr(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        """`ctr` against this node's containerd, namespace k8s.io."""
        return _run("ctr", "--address", str(self.containerd_socket), "--namespace", "k8s.io",
                    *args, check=check)

    def import_image(self, archive: Path) -> None:
        """Load an OCI/docker archive into the node's containerd (as `ctr images import`)."""
        self.ctr("images", "import", "--no-unpack", str(archive))

    def has_image(self, ref: str) -> bool:
        out = self.ctr("images", "list", "--quiet").stdout.split()
        return ref in out or f"docker.io/{ref}" in out

    # ---- teardown ------------------------------------------------------------------------------
    def cleanup(self) -> None:
        """Kill the pods' processes and shims, unmount, remove cgroups, delete the bridge.
        Safe to repeat; containerd and the kubelet must be stopped first or after."""
        self._kill_pods()
        self._kill_shims()
        self._unmount_all()
        self._remove_cgroups()
        if Path(f"/sys/class/net/{self.bridge}").exists():
            _run("ip", "link", "delete", self.bridge, check=False)
        shutil.rmtree(self.run_dir, ignore_errors=True)
        shutil.rmtree(self.kubelet_dir.parent, ignore_errors=True)

    def _cgroup_dirs(self) -> list[Path]:
        root = Path("/sys/fs/cgroup")
        rel = self.cgroup_root.lstrip("/")
        return [d / rel for d in root.iterdir() if (d / rel).is_dir()]

    def _kill_pods(self) -> None:
        for _ in range(50):
            pids = set()
            for top in self._cgroup_dirs():
                for procs in top.rglob("cgroup.procs"):
                    pids.update(int(p) for p in procs.read_text().split())
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.1)

    def _kill_shims(self) -> None:
        """containerd-shim-runc-v2 processes started by this node's containerd."""
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if (cmdline and cmdline[0].endswith(b"containerd-shim-runc-v2")
                    and str(self.containerd_socket).encode() in cmdline):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(entry.name), signal.SIGKILL)

    def mounts(self) -> list[str]:
        """Mount points under the node's folder or the kubelet's root, in mount order."""
        prefixes = (f"{self.dir}/", f"{self.kubelet_dir.parent}/")
        mounts = [line.split()[4].encode().decode("unicode_escape")
                  for line in Path("/proc/self/mountinfo").read_text().splitlines()]
        return [m for m in mounts if m.startswith(prefixes)]

    def _unmount_all(self) -> None:
        for _ in range(5):
            if not (ours := self.mounts()):
                return
            for m in reversed(ours):
                subprocess.run(["umount", "-l", m], capture_output=True)
        raise RealNodeError(f"mounts under {self.dir} or {self.kubelet_dir.parent} remain after "
                            f"umount: {ours[:3]}")

    def _remove_cgroups(self) -> None:
        for top in self._cgroup_dirs():
            for d in sorted((p for p in top.rglob("*") if p.is_dir()),
                            key=lambda p: len(p.parts), reverse=True):
                with contextlib.suppress(OSError):
                    d.rmdir()
            with contextlib.suppress(OSError):
                top.rmdir()


def all_nodes(state_dir: Path) -> list[RealNode]:
    """The real nodes whose folders exist under `state_dir`, first node first."""
    found = []
    for index in range(64):
        node = RealNode(state_dir, index)
        if not node.dir.exists():
            break
        found.append(node)
    return found


def pause_archive(pause_bin: Path, out: Path) -> Path:
    """An OCI image archive of PAUSE_IMAGE: one layer holding the static `/pause` program."""
    import io
    import tarfile

    def blob(data: bytes) -> tuple[str, bytes]:
        return "sha256:" + hashlib.sha256(data).hexdigest(), data

    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w") as tar:
        info = tar.gettarinfo(str(pause_bin), arcname="pause")
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        info.mtime = 0
        with open(pause_bin, "rb") as f:
            tar.addfile(info, f)
    layer_digest, layer_data = blob(layer.getvalue())
    config = {"architecture": "amd64", "os": "linux",
              "config": {"Entrypoint": ["/pause"], "User": "65535:65535"},
              "rootfs": {"type": "layers", "diff_ids": [layer_digest]}}
    config_digest, config_data = blob(json.dumps(config).encode())
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                           "digest": config_digest, "size": len(config_data)},
                "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                            "digest": layer_digest, "size": len(layer_data)}]}
    manifest_digest, manifest_data = blob(json.dumps(manifest).encode())
    index = {"schemaVersion": 2, "manifests": [{
        "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": manifest_digest,
        "size": len(manifest_data),
        "annotations": {"org.opencontainers.image.ref.name": PAUSE_IMAGE.split(":")[-1],
                        "io.containerd.image.name": PAUSE_IMAGE}}]}
    out.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(out, "w") as tar:
        for name, data in [("oci-layout", b'{"imageLayoutVersion": "1.0.0"}'),
                           ("index.json", json.dumps(index).encode()),
                           *((f"blobs/sha256/{d.split(':')[1]}", b) for d, b in (
                               (layer_digest, layer_data), (config_digest, config_data),
                               (manifest_digest, manifest_data)))]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out


def drop_images(state_dir: Path) -> int:
    """After a stop: every real node's containerd root (its content store and unpacked
    snapshots: the images pulled or loaded, 5.9 GB for the trainer's); the logs stay. They
    are in the registry or ~/.cache/chexflow/images anyway. Returns the bytes freed."""
    freed = 0
    for root in Path(state_dir).glob("node*/containerd/root"):
        freed += sum(f.lstat().st_size for f in root.rglob("*") if f.is_file()
                     and not f.is_symlink())
        shutil.rmtree(root, ignore_errors=True)
    return freed


@dataclass
class RealNodes(AddOn):
    """`count` real nodes, `images` (OCI or docker archives) loaded into each one's containerd.
    The first node's bridge is made before the control plane, whose apiserver then listens on
    and advertises its address (pods reach it through the `kubernetes` Service); the others
    join once it is Ready (add_node). A resumed cluster keeps the first node's containerd root
    (its images) unless the start is fresh."""

    name = "real-node"
    help = ("also start a real node (containerd, kubelet, CoreDNS) that runs pods; needs root "
            "and the Debian packages of images/install-system.sh")
    ports = ("kubelet", "kubelet_healthz", "coredns_health", "coredns_ready")
    count: int = 1
    images: list[Path] = field(default_factory=list)
    bin_dir: Path | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.images = [Path(p) for p in self.images]

    def components(self, cluster: Cluster) -> list[str]:
        names = ["containerd", "kubelet", "coredns"]
        for index in range(1, self.count):
            suffix = RealNode(cluster.state_dir, index).suffix
            names += [f"containerd{suffix}", f"kubelet{suffix}"]
        return names

    def describe(self, cluster: Cluster) -> str:
        return f"real node(s) {', '.join(n.name for n in all_nodes(cluster.state_dir))}"

    def build(self) -> list[Path]:
        self.bin_dir = binaries.ensure_node_binaries()
        return [self.bin_dir]

    def ensure(self, cluster: Cluster) -> None:
        check_requirements()
        self.build()

    def prepare(self, cluster: Cluster) -> None:
        """Whatever a killed run left removed; the first node's folder and bridge, whose
        address the apiserver listens on."""
        if cluster.ready:
            raise RealNodeError(f"the cluster in {cluster.state_dir} runs already: a first real "
                                "node's address is the apiserver's, so start the cluster with it")
        self._remove_stale(cluster.state_dir, keep_images=not cluster.fresh)
        first = RealNode(cluster.state_dir)
        first.dir.mkdir(parents=True, exist_ok=True)
        cluster.host = first.setup_network(cluster.pod_routes())["node_ip"]

    def start(self, cluster: Cluster, deadline: float) -> None:
        """The first node's containerd and kubelet, and CoreDNS."""
        first = RealNode(cluster.state_dir)
        self._start_containerd(cluster, first, deadline)
        self._start_kubelet(cluster, first)
        corefile = first.corefile(cluster.ports, first.addresses()["node_ip"], cluster.kubeconfig)
        cluster.spawn("coredns", [f"-conf={corefile}"], exe=self.bin_dir / "coredns")

    def ready(self, cluster: Cluster, deadline: float) -> None:
        """Until the first node is Ready and CoreDNS answers; then the other nodes join."""
        self._wait_ready(cluster, RealNode(cluster.state_dir), deadline)
        cluster.wait_http(f"http://127.0.0.1:{cluster.ports['coredns_ready']}/ready", "coredns",
                          deadline)
        while len(all_nodes(cluster.state_dir)) < self.count:
            self.add_node(cluster, deadline)

    def joined(self, cluster: Cluster, other: AddOn, deadline: float) -> None:
        if other.pod_routes:
            self._route_all(cluster)

    def stop(self, cluster: Cluster) -> None:
        for node in all_nodes(cluster.state_dir):
            node.cleanup()

    def add_node(self, cluster: Cluster, deadline: float) -> RealNode:
        """One more real node beside the first (which must be Ready): its bridge and /24,
        routed to the other nodes' (the host forwards between the bridges), containerd with
        `images`, a kubelet whose DNS is the first node's CoreDNS. Returns it once Ready."""
        node = RealNode(cluster.state_dir, len(all_nodes(cluster.state_dir)))
        node.dir.mkdir(parents=True)
        node.setup_network(cluster.pod_routes())
        self._route_all(cluster)
        self._start_containerd(cluster, node, deadline)
        self._start_kubelet(cluster, node)
        self._wait_ready(cluster, node, deadline)
        self.count = max(self.count, node.index + 1)
        cluster.save()
        return node

    def _remove_stale(self, state_dir: Path, keep_images: bool) -> None:
        """The nodes a killed or stopped run left: cleaned and removed; `keep_images`: the
        first node's containerd root (images, and the metadata of containers that no longer
        run, as after a reboot) stays for the resumed cluster."""
        for stale in all_nodes(state_dir):
            stale.cleanup()
            root = stale.dir / "containerd" / "root"
            aside = state_dir / f".{stale.dir.name}-containerd-root"
            if keep_images and not stale.suffix and root.is_dir():
                root.rename(aside)
            shutil.rmtree(stale.dir, ignore_errors=True)
            if aside.is_dir():
                root.parent.mkdir(parents=True)
                aside.rename(root)

    def _route_all(self, cluster: Cluster) -> None:
        """Every node's pods route the other nodes' /24s and the add-ons' pod_routes."""
        everyone = all_nodes(cluster.state_dir)
        if len(everyone) > 1:
            enable_ip_forwarding()
        routes = [*cluster.pod_routes(), *(n.addresses()["pod_cidr"] for n in everyone)]
        for node in everyone:
            node.set_routes(routes)

    def _start_containerd(self, cluster: Cluster, node: RealNode, deadline: float) -> None:
        """The node's cgroups and containerd, with the pause image and `images` loaded."""
        node.make_cgroups()
        cluster.spawn(f"containerd{node.suffix}", [f"--config={node.containerd_config()}"],
                      exe=CONTAINERD)
        while node.ctr("version", check=False).returncode != 0:
            cluster.check()
            if time.monotonic() > deadline:
                raise RealNodeError(f"containerd not answering on {node.containerd_socket}; "
                                    f"see {cluster.log_dir}/containerd{node.suffix}.log")
            time.sleep(0.2)
        node.import_image(pause_archive(self.bin_dir / "pause", node.dir / "pause.oci.tar"))
        for archive in self.images:
            node.import_image(archive)

    def _start_kubelet(self, cluster: Cluster, node: RealNode) -> None:
        """The node's kubelet: an extra node's with a client certificate of its own
        (`system:node:<name>`) and ports; the first node's CoreDNS as its DNS."""
        pki = cluster.pki
        client = certs.node_client(pki, node.name) if node.index else "kubelet"
        kubeconfig = certs.write_kubeconfig(node.dir / "kubelet.kubeconfig", cluster.server, pki,
                                            client)
        if node.index:
            for port in ("kubelet", "kubelet_healthz"):
                cluster.new_port(port + node.suffix)
        node_ip = node.addresses()["node_ip"]
        dns = RealNode(cluster.state_dir).addresses()["node_ip"]
        config = node.kubelet_config(cluster.ports, node_ip, pki.ca, dns_ip=dns)
        cluster.spawn(f"kubelet{node.suffix}", node.kubelet_args(config, kubeconfig, node_ip),
                      exe=self.bin_dir / "kubelet")

    def _wait_ready(self, cluster: Cluster, node: RealNode, deadline: float) -> None:
        from kubernetes import client
        from kubernetes.client.rest import ApiException

        core = client.CoreV1Api(cluster.api_client())
        while time.monotonic() < deadline:
            cluster.check()
            try:
                conds = core.read_node(node.name).status.conditions or []
                if any(c.type == "Ready" and c.status == "True" for c in conds):
                    return
            except ApiException as e:
                if e.status != 404:
                    raise
            time.sleep(0.5)
        raise RealNodeError(f"node {node.name} not Ready; see "
                            f"{cluster.log_dir}/kubelet{node.suffix}.log")
