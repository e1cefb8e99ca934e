"""The Kubeflow SDK's OptimizerClient (`kubeflow` 0.5.0) on the real Katib (v0.19.0) with
Kubeflow Trainer v2, as a notebook user drives it: notebooks/optimizer-client.ipynb executed with
nbclient on a kernel of the project's one environment sweeps a learning rate over two Trials,
each a TrainJob on chexflow's Horovod runtime training DenseNet-121 with Horovod size 2 on real
pods, and reads the best trial back.

First, without trainjob/katib-sdk-policy.yaml, a server-side dry run of the SDK's own Experiment
shows the upstream limit the policy works around: Katib defaults the Trials' primary pod to
replicated job `node`, index 0 (an sshd pod on an MPI runtime) and keeps the SDK's command
starting with mpirun, which Katib's collector would join with spaces. Then the policy is
applied from the shipped file, as `kubectl apply -f` does."""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from chexflow.envs import REPO_ROOT
from tests.cluster.test_cluster_katib_trainjob import PodLog
from tests.support.notebooks import execute, text_of

pytestmark = [pytest.mark.cluster, pytest.mark.realnode, pytest.mark.slow]

NOTEBOOK = REPO_ROOT / "notebooks" / "optimizer-client.ipynb"
POLICY = REPO_ROOT / "trainjob" / "katib-sdk-policy.yaml"
LAUNCHER = {"jobset.sigs.k8s.io/replicatedjob-name": "launcher"}
KATIBS_TRAINJOB_DEFAULT = {"jobset.sigs.k8s.io/replicatedjob-name": "node",
                           "batch.kubernetes.io/job-completion-index": "0"}


def one_rank(lr: str):
    """The function of the dry run's trial template (never run)."""
    print(f"val_auroc={float(lr)}")


def sdk_experiment_dry_run(api, kubeconfig: Path, namespace: str) -> dict:
    """The Experiment OptimizerClient().optimize() creates, as the API server would store it
    (Katib's webhooks applied), without creating it."""
    from kubeflow.common.types import KubernetesBackendConfig
    from kubeflow.optimizer import Objective, OptimizerClient, Search, TrainJobTemplate
    from kubeflow.trainer import CustomTrainer
    from kubernetes import client

    optimizer = OptimizerClient(KubernetesBackendConfig(namespace=namespace,
                                                        config_file=str(kubeconfig)))
    custom, stored = client.CustomObjectsApi(api), {}

    def create(group, version, ns, plural, body):
        stored.update(custom.create_namespaced_custom_object(group, version, ns, plural, body,
                                                             dry_run="All"))

    optimizer.backend.custom_api = SimpleNamespace(create_namespaced_custom_object=create)
    optimizer.optimize(TrainJobTemplate(runtime="chexflow-horovod", trainer=CustomTrainer(
        func=one_rank, num_nodes=2)), search_space={"lr": Search.loguniform(1e-4, 1e-2)},
        objectives=[Objective(metric="val_auroc", direction="maximize")])
    return stored


def apply_policy(api) -> list:
    """trainjob/katib-sdk-policy.yaml created object by object (kubectl apply -f's effect)."""
    from kubernetes.dynamic import DynamicClient

    dynamic, created = DynamicClient(api), []
    for doc in yaml.safe_load_all(POLICY.read_text()):
        kind = dynamic.resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
        kind.create(body=doc)
        created.append((kind, doc["metadata"]["name"]))
    return created


@pytest.mark.timeout(2400)
def test_optimizer_client_sweeps_chexflows_densenet_on_katib_from_the_notebook(
        katib_trainer, katib_namespace, tmp_path, monkeypatch):
    from kubernetes import client

    api, ns = katib_trainer.api_client(), katib_namespace
    monkeypatch.setenv("KUBECONFIG", str(katib_trainer.kubeconfig))

    # the limit, on the SDK's own Experiment: Katib's TrainJob default picks an sshd pod
    def template() -> dict:
        return sdk_experiment_dry_run(api, katib_trainer.kubeconfig, ns)["spec"]["trialTemplate"]

    bare = template()
    assert bare["primaryPodLabels"] == KATIBS_TRAINJOB_DEFAULT, bare
    assert bare["trialSpec"]["spec"]["trainer"]["command"][:3] == [
        "mpirun", "--hostfile", "/etc/mpi/hostfile"]

    policy = apply_policy(api)
    deadline = time.monotonic() + 60  # the API server admits with a new policy once it sees it
    while template()["primaryPodLabels"] != LAUNCHER:
        assert time.monotonic() < deadline, "the policy did not apply within 60 s"
        time.sleep(2)
    pods = PodLog(api, ns)
    pods.start()
    try:
        text = text_of(execute(NOTEBOOK, tmp_path, timeout=2000, NAMESPACE=ns, CPU="750m",
                               MEMORY="3Gi"))
    finally:
        pods.done.set()
        pods.join(timeout=30)
        for kind, name in reversed(policy):
            kind.delete(name=name)
    print(text[-2000:], file=sys.stderr)

    custom = client.CustomObjectsApi(api)
    (experiment,) = custom.list_namespaced_custom_object("kubeflow.org", "v1beta1", ns,
                                                         "experiments")["items"]
    name, template = experiment["metadata"]["name"], experiment["spec"]["trialTemplate"]
    assert f"OptimizationJob {name}: Complete" in text, text[-3000:]
    assert template["primaryPodLabels"] == LAUNCHER
    command = template["trialSpec"]["spec"]["trainer"]["command"]
    assert command[:2] == ["bash", "-c"] and command[2].startswith(
        "'mpirun' '--hostfile' '/etc/mpi/hostfile' 'bash' '-c' '"), command
    trials = custom.list_namespaced_custom_object(
        "kubeflow.org", "v1beta1", ns, "trials",
        label_selector=f"katib.kubeflow.org/experiment={name}")["items"]
    assert len(trials) == 2
    assert all(any(c["type"] == "Succeeded" and c["status"] == "True"
                   for c in t["status"]["conditions"]) for t in trials), trials

    # Katib's collector sat beside the launcher only; each trial was Horovod size 2
    pods.assert_collector_in_launchers_only([t["metadata"]["name"] for t in trials])
    assert re.search(r"train: densenet121 32px, 2 workers \(CPU, .*mpi controller\)", text), \
        text[-3000:]

    # the best result is Katib's optimal trial, its val_auroc the one observed
    optimal = experiment["status"]["currentOptimalTrial"]
    lr = next(a["value"] for a in optimal["parameterAssignments"] if a["name"] == "lr")
    best = next(m for m in optimal["observation"]["metrics"] if m["name"] == "val_auroc")
    assert f"best: lr={lr}, [('val_auroc', '{best['max']}')]" in text, text[-3000:]
    observed = {t["metadata"]["name"]: float(m["max"]) for t in trials
                for m in t["status"]["observation"]["metrics"] if m["name"] == "val_auroc"}
    assert float(best["max"]) == max(observed.values())
