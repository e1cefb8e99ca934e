"""Gang scheduling in the local cluster (the `coscheduling` add-on): scheduler-plugins'
scheduler (kube-scheduler with the Coscheduling plugin) as a second scheduler, built from its Go
module (build/coscheduling/build.sh, cached by content), with the PodGroup CRD
(scheduling.x-k8s.io/v1alpha1) of the same module.

mpi-operator then runs with `--gang-scheduling=SCHEDULER_NAME`: it makes a PodGroup per MPIJob
(minMember from runPolicy.schedulingPolicy.minAvailable) and gives the job's pods that
scheduler, which holds them at its Permit stage until the whole group can be placed. The
PodGroup controller (scheduler-plugins' cmd/controller) keeps PodGroup status up to date: a gang
that did not fit is retried when another PodGroup changes (the one event Coscheduling asks the
scheduler's queue for besides new pods), e.g. when an earlier job's group finishes.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from chexflow.devcluster import crds
from chexflow.devcluster.addon import AddOn, Cluster
from chexflow.devcluster.binaries import GO_DIR, GoBuild

# The API clients of the coscheduling scheduler and of the PodGroup controller
SCHEDULER_CLIENT = {"qps": 200, "burst": 400}
CONTROLLER_CLIENT = {"qps": 100, "burst": 200}

BUILD_DIR = GO_DIR / "coscheduling"
SCHEDULER_NAME = "scheduler-plugins-scheduler"
EXE = "coscheduling-scheduler"
CONTROLLER = "podgroup-controller"
CRD_FILES = ("podgroup-crd.yaml", "elasticquota-crd.yaml")
# how long a pod of an incomplete gang waits at Permit before it is sent back to the queue
PERMIT_WAITING_SECONDS = 10


BUILD = GoBuild("coscheduling", BUILD_DIR, "sigs.k8s.io/scheduler-plugins",
                (EXE, CONTROLLER, *CRD_FILES), cold="about 15 min")
cache_dir = BUILD.cache_dir  # coscheduling-<release>-<10 hex of sha256(go.mod + go.sum + build.sh)>
ensure_binaries = BUILD.ensure  # the folder with the scheduler, the controller and the CRDs


def version() -> str:
    return BUILD.version()


def crd_docs(bin_dir: Path) -> list[dict]:
    """PodGroup and ElasticQuota (scheduling.x-k8s.io/v1alpha1): the controller watches both."""
    return [d for f in CRD_FILES for d in yaml.safe_load_all((bin_dir / f).read_text())
            if d and d.get("kind") == "CustomResourceDefinition"]


def scheduler_config(kubeconfig: Path) -> dict:
    """A KubeSchedulerConfiguration with one profile, SCHEDULER_NAME, that gangs pods by their
    PodGroup (scheduler-plugins' manifests/coscheduling/scheduler-config.yaml, renamed)."""
    return {
        "apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
        "leaderElection": {"leaderElect": False},
        "clientConnection": {"kubeconfig": str(kubeconfig), **SCHEDULER_CLIENT},
        "profiles": [{
            "schedulerName": SCHEDULER_NAME,
            "plugins": {"multiPoint": {"enabled": [{"name": "Coscheduling"}]},
                        "queueSort": {"enabled": [{"name": "Coscheduling"}],
                                      "disabled": [{"name": "*"}]}},
            "pluginConfig": [{"name": "Coscheduling",
                              "args": {"permitWaitingTimeSeconds": PERMIT_WAITING_SECONDS}}],
        }],
    }


def controller_args(ports: dict[str, int]) -> list[str]:
    """The PodGroup controller: PodGroup status (Scheduled, Running, Finished) follows its pods;
    that update is the event on which the scheduler retries a waiting gang."""
    return [f"--metricsAddr=127.0.0.1:{ports['podgroup_metrics']}",
            f"--probeAddr=127.0.0.1:{ports['podgroup_health']}",
            f"--qps={CONTROLLER_CLIENT['qps']}", f"--burst={CONTROLLER_CLIENT['burst']}",
            "--workers=2"]


def args(config: Path, kubeconfig: Path, port: int) -> list[str]:
    return [f"--config={config}", f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}", "--bind-address=127.0.0.1",
            f"--secure-port={port}", "--v=1"]


@dataclass
class Coscheduling(AddOn):
    """The PodGroup CRDs before mpi-operator starts (it looks for the API then), the scheduler
    and the PodGroup controller; mpi-operator gets --gang-scheduling."""

    name = "coscheduling"
    help = ("also scheduler-plugins' Coscheduling scheduler (built from its Go module on first "
            "use), and mpi-operator gang-schedules every MPIJob with it (PodGroups)")
    title = "Coscheduling scheduler"
    ports = ("coscheduling", "podgroup_metrics", "podgroup_health")
    extra_args = {"mpi-operator": (f"--gang-scheduling={SCHEDULER_NAME}",)}
    bin_dir: Path | None = field(default=None, init=False, repr=False)

    def components(self, cluster: Cluster) -> list[str]:
        return [EXE, CONTROLLER]

    def build(self) -> list[Path]:
        self.bin_dir = ensure_binaries()
        return [self.bin_dir]

    def install(self, cluster: Cluster, deadline: float) -> None:
        crds.install_crd_docs(cluster.api_client(), crd_docs(self.bin_dir),
                              timeout=max(5.0, deadline - time.monotonic()))

    def start(self, cluster: Cluster, deadline: float) -> None:
        config = cluster.state_dir / "coscheduling-config.yaml"
        config.write_text(json.dumps(scheduler_config(cluster.kubeconfig)))
        cluster.spawn(EXE, args(config, cluster.kubeconfig, cluster.ports["coscheduling"]),
                      exe=self.bin_dir / EXE)
        cluster.spawn(CONTROLLER, controller_args(cluster.ports), exe=self.bin_dir / CONTROLLER)
