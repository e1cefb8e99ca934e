"""kube-proxy for the real node (the `kube-proxy` add-on): ClusterIP Services (Katib's webhook,
db-manager, suggestions, and the `kubernetes` Service that in-cluster clients use) become
iptables rules in this machine's network namespace.

One cluster per machine. kube-proxy owns global chains (KUBE-SERVICES, KUBE-POSTROUTING, ...) in
the network namespace it runs in, so a second kube-proxy in the same namespace would rewrite the
first one's rules, and `kube-proxy --cleanup` removes every kube-proxy rule there. Giving each
cluster's real node a network namespace of its own would lift the limit but moves containerd, the
kubelet, CoreDNS and their health checks behind a veth; instead the cluster that starts kube-proxy
claims the machine in /run/chexflow/kube-proxy.json (under a file lock), and a second one is
refused in one line naming the folder of the cluster that holds it. Clusters without kube-proxy
are not limited (any number run side by side).

Rules stay on the host only while the cluster runs: stopping it runs `kube-proxy --cleanup`
(every KUBE-* chain and rule, iptables and ip6tables) and releases the claim; a claim whose
cluster is gone (killed without a watcher) is cleaned the same way before the next start.
kube-proxy changes no sysctl: the conntrack limits and timeouts are left as they are
(`maxPerCore: 0`, timeouts `0s`) and NodePorts are not opened on localhost (no route_localnet).
Every Service connection is masqueraded to the node address (`masqueradeAll`), so a pod's reply
to another pod on the same bridge returns through the host's conntrack whatever
net.bridge.bridge-nf-call-iptables says.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from chexflow.devcluster import binaries, certs, realnode
from chexflow.devcluster.addon import SERVICE_CIDR, AddOn, Cluster
from chexflow.errors import ChexflowError

CLAIM = Path("/run/chexflow/kube-proxy.json")
FIREWALL_CHAIN = "KUBE-FIREWALL"


class KubeProxyError(ChexflowError):
    """kube-proxy could not be started here (another cluster holds it) or cleaned up."""


def config(path: Path, kubeconfig: Path, node_name: str, node_ip: str, pod_cidr: str,
           ports: dict[str, int]) -> Path:
    """KubeProxyConfiguration: iptables mode for the pod /24, health and metrics on loopback."""
    cfg = {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "hostnameOverride": node_name, "bindAddress": node_ip,
        "healthzBindAddress": f"127.0.0.1:{ports['kube_proxy_healthz']}",
        "metricsBindAddress": f"127.0.0.1:{ports['kube_proxy_metrics']}",
        "mode": "iptables", "clusterCIDR": pod_cidr,
        "nodePortAddresses": [f"{node_ip}/32"],
        "iptables": {"masqueradeAll": True, "localhostNodePorts": False,
                     "syncPeriod": "30s", "minSyncPeriod": "0s"},
        "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s",
                      "tcpCloseWaitTimeout": "0s"},
    }
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


@contextlib.contextmanager
def _locked():
    CLAIM.parent.mkdir(parents=True, exist_ok=True)
    with open(CLAIM.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _holder() -> dict | None:
    try:
        return json.loads(CLAIM.read_text())
    except (OSError, ValueError):
        return None


def config_path(state_dir: Path) -> Path:
    """The KubeProxyConfiguration of the cluster in `state_dir` (its kube-proxy's --config)."""
    return Path(state_dir) / "node" / "kube-proxy.yaml"


def _kube_proxy_running(state_dir: Path) -> bool:
    arg = f"--config={config_path(state_dir)}".encode()
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            if arg in cmdline.read_bytes().split(b"\0"):
                return True
    return False


def _alive(held: dict) -> bool:
    """The claimant process (still starting its cluster) or the kube-proxy it started lives."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(held["pid"], 0)
        return True
    return _kube_proxy_running(Path(held["state_dir"]))


def holder() -> str | None:
    """The state folder of the live cluster that holds this machine's kube-proxy, if any."""
    with _locked():
        held = _holder()
    return held["state_dir"] if held and _alive(held) else None


def claim(state_dir: Path, kube_proxy: Path) -> None:
    """Record `state_dir` as the machine's kube-proxy cluster; refuse while another live
    cluster holds it; clean a dead holder's rules first."""
    with _locked():
        holder = _holder()
        if holder and holder["state_dir"] != str(state_dir):
            if _alive(holder):
                raise KubeProxyError(
                    f"kube-proxy (needed by --katib) runs for one cluster per machine and the "
                    f"cluster in {holder['state_dir']} has it: stop that one first "
                    f"(chexflow cluster down --dir {holder['state_dir']})")
            cleanup_rules(Path(holder["kube_proxy"]))
        CLAIM.write_text(json.dumps({"state_dir": str(state_dir), "kube_proxy": str(kube_proxy),
                                     "pid": os.getpid()}))


def release(state_dir: Path) -> None:
    """Remove kube-proxy's rules and the claim, when `state_dir` holds it."""
    with _locked():
        holder = _holder()
        if not holder or holder["state_dir"] != str(state_dir):
            return
        cleanup_rules(Path(holder["kube_proxy"]))
        CLAIM.unlink(missing_ok=True)


def cleanup_rules(kube_proxy: Path) -> None:
    """`kube-proxy --cleanup` (every chain and rule kube-proxy made, iptables and ip6tables),
    then the KUBE-FIREWALL chain it leaves for the kubelet (ours makes no iptables chain)."""
    if not os.access(kube_proxy, os.X_OK):
        raise KubeProxyError(f"{kube_proxy}: not found, cannot remove kube-proxy's rules")
    proc = subprocess.run([str(kube_proxy), "--cleanup", "--v=0"], capture_output=True,
                          text=True)
    if proc.returncode != 0:
        raise KubeProxyError(f"kube-proxy --cleanup exited {proc.returncode}: "
                             f"{(proc.stderr or proc.stdout).strip()[-300:]}")
    for tool in ("iptables", "ip6tables"):
        for chain in ("INPUT", "OUTPUT"):
            while _iptables(tool, "-D", chain, "-j", FIREWALL_CHAIN):
                pass
        if _iptables(tool, "-F", FIREWALL_CHAIN):
            _iptables(tool, "-X", FIREWALL_CHAIN)


def _iptables(tool: str, *args: str) -> bool:
    return subprocess.run([tool, "-w", "-t", "filter", *args], capture_output=True).returncode == 0


@dataclass
class KubeProxy(AddOn):
    """kube-proxy for the first real node's pod /24; this cluster holds the machine's claim
    from its ensure (refused at once while another live cluster holds it) to its stop."""

    name = "kube-proxy"
    help = ("also kube-proxy on the real node (ClusterIP Services from the pods and the host; "
            "implies --real-node); one such cluster per machine")
    title = "kube-proxy"
    requires = ("real-node",)
    ports = ("kube_proxy_healthz", "kube_proxy_metrics")
    pod_routes = (SERVICE_CIDR,)
    exe: Path | None = field(default=None, init=False, repr=False)

    def components(self, cluster: Cluster) -> list[str]:
        return ["kube-proxy"]

    def build(self) -> list[Path]:
        self.exe = binaries.ensure_node_binaries() / "kube-proxy"
        return [self.exe]

    def ensure(self, cluster: Cluster) -> None:
        self.build()
        claim(cluster.state_dir, self.exe)

    def start(self, cluster: Cluster, deadline: float) -> None:
        node = realnode.RealNode(cluster.state_dir)
        addr = node.addresses()
        kubeconfig = certs.write_kubeconfig(node.dir / "kube-proxy.kubeconfig", cluster.server,
                                            cluster.pki, "kube-proxy")
        path = config(config_path(cluster.state_dir), kubeconfig, node.name, addr["node_ip"],
                      addr["pod_cidr"], cluster.ports)
        cluster.spawn("kube-proxy", [f"--config={path}", "--v=1"], exe=self.exe)

    def ready(self, cluster: Cluster, deadline: float) -> None:
        cluster.wait_http(f"http://127.0.0.1:{cluster.ports['kube_proxy_healthz']}/healthz",
                          "kube-proxy", deadline)

    def stop(self, cluster: Cluster) -> None:
        release(cluster.state_dir)
