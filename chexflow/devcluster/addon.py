"""What the local cluster runs beside its control plane, one add-on at a time: the real nodes,
kube-proxy, Katib, Kueue, the Coscheduling scheduler, Kubeflow Trainer. `chexflow cluster up
--NAME` (and `cluster build --NAME`) exists for each add-on in addons.TABLE;
`LocalCluster(state_dir, addons=[...])` takes them as objects.

Writing an add-on: one module with a dataclass that subclasses AddOn, and one entry in
addons.TABLE. Its fields are its settings (cluster.json records them, so `cluster status`,
`down` and the watcher rebuild it with `type(**settings)`); what it finds while it runs (a
binaries folder, built images) goes in `field(init=False)` fields. It sets the class attributes
below and overrides the phases it needs; each phase gets the running cluster (`Cluster`: what an
add-on may use of it) and, from install on, the start's deadline (time.monotonic()). A start
runs each phase over every add-on, in the table's order, before the next phase:

    ensure(cluster)             before the deadline starts: build or fetch what it runs (cached
                                by content: binaries.GoBuild, images.build_image), check the
                                machine, take machine-wide claims; fails before anything runs
    prepare(cluster)            before the control plane: host-side setup the apiserver needs
                                (the real node's bridge, whose address it sets as cluster.host)
      -- etcd and the apiserver start; the MPIJob and Katib CRDs are installed --
    install(cluster, deadline)  CRDs, webhook configurations, namespaces: before the control
                                plane's controllers start (mpi-operator looks for the PodGroup
                                API as it starts; Katib's controller for the trial kinds' CRDs)
      -- controller-manager, scheduler, kwok, mpi-operator; the kwok nodes Ready --
    start(cluster, deadline)    its processes (cluster.spawn: logged, supervised, stopped with
                                the cluster) or its Deployments
    ready(cluster, deadline)    wait until it serves; call cluster.check() between polls, so a
                                component that exits ends the wait with its name

and on a running cluster:

    joined(cluster, other, deadline)  add-on `other` was added (LocalCluster.add) after this one
    stop(cluster)               after every process is stopped: what goes beyond them (mounts,
                                bridges, iptables rules, claims); safe to repeat, and on a start
                                that failed halfway

A failure is the add-on's ChexflowError subclass in one line naming what failed and its log
(cluster.log_dir / "<process>.log"); the start then stops everything it started.

Class attributes: `name` (its flag and table key), `help` (the flag's help), `title` (its part
of `cluster up`'s one-line summary), `requires` (add-ons it needs: added with their defaults
when not asked, and earlier in the table), `ports` (loopback ports allocated into
cluster.ports by name, kept on a resumed cluster where free), `extra_args` (arguments it adds to
another component's command line, by process name: Coscheduling's `--gang-scheduling` for
mpi-operator), `pod_routes` (address ranges pods reach through their real node: kube-proxy's
Service range).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, ClassVar, Protocol

# the Services' ClusterIP range (RFC 2544 benchmarking addresses, never a private range);
# kube-proxy routes it from the pods
SERVICE_CIDR = "198.19.0.0/16"


class Cluster(Protocol):
    """What an add-on may use of the running cluster (controlplane.LocalCluster)."""

    state_dir: Path
    log_dir: Path
    kubeconfig: Path          # the admin's
    host: str                 # the apiserver's address (a real node's, once prepared)
    ports: dict[str, int]     # name -> loopback port (its `ports` among them)
    nodes: int                # kwok nodes
    gpus_per_node: int
    fresh: bool               # this start began from an empty etcd
    ready: bool               # the start has finished (False during a start)

    @property
    def server(self) -> str: ...

    @property
    def pki(self) -> Any: ...  # certs.PKI: the CA, client certificates

    def api_client(self) -> Any: ...

    def spawn(self, name: str, args: list[str], exe: Path | str | None = None,
              env: dict[str, str] | None = None) -> None: ...

    def renew(self, name: str, reason: str) -> None: ...

    def check(self) -> None: ...

    def wait_http(self, url: str, component: str, deadline: float) -> None: ...

    def ensure_namespace(self, name: str) -> None: ...

    def has(self, name: str) -> bool: ...

    def new_port(self, name: str) -> int: ...

    def pod_routes(self) -> list[str]: ...

    def save(self) -> None: ...


@dataclass
class AddOn:
    """One add-on (see the module's docstring); every phase does nothing unless overridden."""

    name: ClassVar[str] = ""
    help: ClassVar[str] = ""
    title: ClassVar[str] = ""
    requires: ClassVar[tuple[str, ...]] = ()
    ports: ClassVar[tuple[str, ...]] = ()
    extra_args: ClassVar[Mapping[str, tuple[str, ...]]] = {}
    pod_routes: ClassVar[tuple[str, ...]] = ()

    def settings(self) -> dict[str, Any]:
        """What cluster.json records of it: its init fields (paths as strings)."""
        return {f.name: _plain(getattr(self, f.name)) for f in fields(self) if f.init}

    def components(self, cluster: Cluster) -> list[str]:
        """The processes it runs when it is up, in start order (`cluster status` lists them)."""
        return []

    def describe(self, cluster: Cluster) -> str:
        """Its part of `chexflow cluster up`'s summary line."""
        return self.title

    def build(self) -> list[Path]:
        """Build or fetch what it runs (cached); the folders or files `cluster build` prints."""
        return []

    def ensure(self, cluster: Cluster) -> None:
        self.build()

    def prepare(self, cluster: Cluster) -> None:
        pass

    def install(self, cluster: Cluster, deadline: float) -> None:
        pass

    def start(self, cluster: Cluster, deadline: float) -> None:
        pass

    def ready(self, cluster: Cluster, deadline: float) -> None:
        pass

    def joined(self, cluster: Cluster, other: AddOn, deadline: float) -> None:
        pass

    def stop(self, cluster: Cluster) -> None:
        pass


def _plain(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value

