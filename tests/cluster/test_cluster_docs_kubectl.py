"""The docs' kubectl commands run as they stand, with the kubectl built with the dev cluster (its
Kubernetes release, on PATH as `chexflow cluster env` puts it): docs/cluster-jobs.md's plain
TrainJob on chexflow's runtime, in a namespace other than `kubeflow`, trains with Horovod size 2
on the session cluster's real pods, and its launcher's log is read back with `kubectl logs`."""

from __future__ import annotations

import json
import subprocess

import pytest

from chexflow.envs import REPO_ROOT
from tests.support.docs_blocks import cluster_shell, marked_block

pytestmark = [pytest.mark.cluster, pytest.mark.realnode, pytest.mark.slow]

TEST = "tests/cluster/test_cluster_docs_kubectl.py"


def test_the_cluster_ships_kubectl_of_its_own_release(trainer_cluster):
    env = cluster_shell(trainer_cluster, "default")
    which = subprocess.run(["bash", "-c", "command -v kubectl"], env=env, capture_output=True,
                           text=True, check=True).stdout.strip()
    assert which == str(trainer_cluster.path_dir / "kubectl")
    version = json.loads(subprocess.run(["kubectl", "version", "-o", "json"], env=env,
                                        capture_output=True, text=True, check=True).stdout)
    assert version["clientVersion"]["gitVersion"] == version["serverVersion"]["gitVersion"]


@pytest.mark.timeout(900)
def test_the_docs_plain_trainjob_runs_verbatim_with_kubectl_in_a_users_namespace(
        trainer_cluster, real_namespace):
    namespace, _ = real_namespace
    assert namespace != "kubeflow"
    proc = subprocess.run(["bash", "-euo", "pipefail", "-c", marked_block("cluster-jobs.md", TEST)],
                          cwd=REPO_ROOT, env=cluster_shell(trainer_cluster, namespace),
                          capture_output=True, text=True, timeout=800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "trainjob.trainer.kubeflow.org/hello-horovod created" in proc.stdout
    assert "trainjob.trainer.kubeflow.org/hello-horovod condition met" in proc.stdout
    ranks = sorted(line for line in proc.stdout.splitlines() if line.startswith("rank "))
    assert ranks == ["rank 0 of 2", "rank 1 of 2"], proc.stdout[-3000:]
