"""Katib v0.19.0 on the local cluster's real node (`chexflow cluster up --katib`): its pods run,
pods reach ClusterIP Services through kube-proxy, and Katib's own webhook judges chexflow's
Experiment specs."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from chexflow.devcluster import katib, realnode
from chexflow.envs import REPO_ROOT
from tests.conftest import run_chexflow

pytestmark = [pytest.mark.cluster, pytest.mark.realnode]

SPEC = REPO_ROOT / "katib" / "specs" / "chexnet-random.yaml"


def _experiment(path: Path = SPEC) -> dict:
    """The spec with its ConfigMap's template inlined as trialSpec (Katib defaults a trialSpec;
    test_cluster_katib_tune.py has Katib read the ConfigMap)."""
    from chexflow.katib.experiment.spec import load_experiment

    doc = next(d for d in yaml.safe_load_all(path.read_text()) if d)
    template = doc["spec"]["trialTemplate"]
    if template.pop("configMap", None) is not None:
        template["trialSpec"] = load_experiment(path).trial_spec
    return doc


def _create(api, ns: str, experiment: dict, dry_run: str | None = "All"):
    from kubernetes import client

    experiment = copy.deepcopy(experiment)
    experiment["metadata"]["namespace"] = ns
    return client.CustomObjectsApi(api).create_namespaced_custom_object(
        "kubeflow.org", "v1beta1", ns, "experiments", experiment, dry_run=dry_run)


def _rejection(api, ns: str, experiment: dict) -> str:
    """The apiserver's message for an Experiment it refuses."""
    from kubernetes.client.rest import ApiException

    with pytest.raises(ApiException) as e:
        _create(api, ns, experiment)
    assert e.value.status == 400, e.value.body
    return json.loads(e.value.body)["message"]


def _wait_pod(core, ns: str, name: str, timeout: float = 120):
    deadline = time.monotonic() + timeout
    while (pod := core.read_namespaced_pod(name, ns)).status.phase not in ("Succeeded", "Failed"):
        assert time.monotonic() < deadline, pod.status
        time.sleep(0.5)
    return pod


KILLED_STARTER = """
import sys
from chexflow.devcluster.controlplane import LocalCluster
from chexflow.devcluster.katib import Katib
LocalCluster(sys.argv[1], nodes=1, gpus_per_node=0, die_with_parent=True,
             addons=[Katib()]).start(600)
"""


def _kube_rules() -> list[str]:
    return [line for tool in ("iptables-save", "ip6tables-save")
            for line in subprocess.run([tool], capture_output=True, text=True).stdout.splitlines()
            if "KUBE-" in line]


@pytest.mark.before_katib_cluster
def test_a_killed_katib_starter_leaves_no_iptables_rule_claim_or_bridge(tmp_path):
    """SIGKILL to the process starting a --katib cluster once kube-proxy has written its rules:
    the watcher stops the cluster, removes every KUBE-* rule and chain and frees the claim.
    (Runs before the session's Katib cluster: one kube-proxy per machine.)"""
    from chexflow.devcluster import kubeproxy

    deadline = time.monotonic() + 900
    while kubeproxy.holder():
        assert time.monotonic() < deadline, kubeproxy.holder()
        time.sleep(5)
    state = tmp_path / "killed"
    node = realnode.RealNode(state)
    proc = subprocess.Popen([sys.executable, "-c", KILLED_STARTER, str(state)])
    try:
        deadline = time.monotonic() + 600
        while not (kubeproxy.holder() == str(state)
                   and any(r.startswith("-A KUBE-SERVICES") for r in _kube_rules())):
            assert proc.poll() is None and time.monotonic() < deadline, proc.returncode
            time.sleep(0.5)
        assert Path(f"/sys/class/net/{node.bridge}").exists()
    finally:
        proc.kill()
        proc.wait()
    deadline = time.monotonic() + 60
    while _kube_rules() or kubeproxy.CLAIM.exists() or \
            Path(f"/sys/class/net/{node.bridge}").exists():
        assert time.monotonic() < deadline, (_kube_rules(), kubeproxy.CLAIM.exists())
        time.sleep(0.5)


def test_the_katib_clusters_mpi_operator_talks_to_its_own_apiserver(katib_cluster):
    """Started in a session whose KUBECONFIG names another cluster (the k8s_cluster fixture's),
    mpi-operator, which lets KUBECONFIG override --kubeConfig, still gets this cluster's."""
    pid = katib_cluster.processes["mpi-operator"]["pid"]
    environ = dict(item.split("=", 1) for item in
                   Path(f"/proc/{pid}/environ").read_text().split("\0") if "=" in item)
    assert environ["KUBECONFIG"] == str(katib_cluster.kubeconfig)


def test_katib_controller_db_manager_and_mysql_pods_are_ready_on_the_real_node(katib_cluster):
    from kubernetes import client

    core = client.CoreV1Api(katib_cluster.api_client())
    pods = core.list_namespaced_pod(katib.NAMESPACE).items
    ready = {p.metadata.labels["katib.kubeflow.org/component"]: p for p in pods
             if any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])}
    assert set(ready) == {"controller", "db-manager", "mysql"}, [p.metadata.name for p in pods]
    for pod in ready.values():
        assert pod.spec.node_name == realnode.NODE_NAME
        assert pod.spec.containers[0].image.startswith("chexflow.local/katib-")
    # Ready means serving: db-manager listens only once MySQL answers
    db_manager = ready["db-manager"]
    assert db_manager.spec.containers[0].readiness_probe.grpc.port == katib.DB_MANAGER_PORT
    assert "Start Katib manager" in core.read_namespaced_pod_log(db_manager.metadata.name,
                                                                 katib.NAMESPACE)


def test_a_pod_resolves_and_reaches_clusterip_services_through_kube_proxy(
        katib_cluster, katib_namespace, katib_base_image):
    """The `kubernetes` Service (the apiserver, as in-cluster clients reach it) and Katib's
    db-manager, by name, from a pod."""
    from kubernetes import client

    core = client.CoreV1Api(katib_cluster.api_client())
    targets = ["kubernetes.default.svc.cluster.local:443",
               f"katib-db-manager.{katib.NAMESPACE}.svc.cluster.local:6789"]
    script = "; ".join(
        f"getent hosts {t.split(':')[0]} && timeout 10 bash -c 'exec 3<>/dev/tcp/"
        f"{t.replace(':', '/')}' && echo reached {t}" for t in targets)
    core.create_namespaced_pod(katib_namespace, {
        "metadata": {"name": "reach"},
        "spec": {"restartPolicy": "Never", "containers": [{
            "name": "main", "image": katib_base_image, "imagePullPolicy": "Never",
            "command": ["bash", "-c", script]}]}})
    pod = _wait_pod(core, katib_namespace, "reach")
    log = core.read_namespaced_pod_log("reach", katib_namespace)
    assert pod.status.phase == "Succeeded", log
    kubernetes_ip = core.read_namespaced_service("kubernetes", "default").spec.cluster_ip
    assert f"{kubernetes_ip} " in log
    for target in targets:
        assert f"reached {target}" in log


def test_katib_webhook_rejects_more_parallel_than_max_trials_with_its_own_message(
        katib_cluster, katib_namespace):
    experiment = _experiment()
    experiment["spec"].update(maxTrialCount=2, parallelTrialCount=3)
    message = _rejection(katib_cluster.api_client(), katib_namespace, experiment)
    assert message.startswith('admission webhook "validator.experiment.katib.kubeflow.org" '
                              "denied the request: ")
    assert ("spec.parallelTrialCount: Invalid value: 3: should be less than or equal to "
            "spec.maxTrialCount") in message


def test_katib_webhook_rejects_a_name_of_41_characters(katib_cluster, katib_namespace):
    experiment = _experiment()
    experiment["metadata"]["name"] = "c" * 41
    message = _rejection(katib_cluster.api_client(), katib_namespace, experiment)
    assert "validator.experiment.katib.kubeflow.org" in message
    assert f'metadata.name: Invalid value: "{"c" * 41}": name must consist of' in message
    assert "may not be longer than 40 characters" in message


def test_katib_webhook_accepts_chexnet_random_and_defaults_it(katib_cluster, katib_namespace):
    """chexnet-random.yaml passes Katib's mutating and validating webhooks (server-side dry
    run: nothing is stored, no trial starts). Its MPIJob success/failure conditions are
    Katib's defaults for Kubeflow jobs: left out, the defaulter puts the same ones back; it gives
    the list parameters Katib's default distribution. Its `earlyStopping: medianstop` passes:
    katib-config lists chexflow's early-stopping service for it."""
    spec = _experiment()
    experiment = copy.deepcopy(spec)
    template = experiment["spec"]["trialTemplate"]
    template.pop("successCondition"), template.pop("failureCondition")
    created = _create(katib_cluster.api_client(), katib_namespace, experiment)
    assert created["metadata"]["name"] == "chexnet-random"
    for mine, katibs in zip(spec["spec"]["parameters"], created["spec"]["parameters"],
                            strict=True):
        assert katibs == {**mine, "feasibleSpace": {"distribution": "uniform",
                                                    **mine["feasibleSpace"]}}
    assert created["spec"]["trialTemplate"]["trialSpec"]["kind"] == "MPIJob"
    for key in ("successCondition", "failureCondition"):
        assert created["spec"]["trialTemplate"][key] == spec["spec"]["trialTemplate"][key]
    assert created["spec"]["earlyStopping"] == spec["spec"]["earlyStopping"]


TRIVIAL_TRIAL = ["bash", "-c", 'sleep 3; echo "lr=${trialParameters.lr}"; echo val_auroc=0.5']


def _container(name: str, image: str, command: list[str]) -> dict:
    return {"spec": {"restartPolicy": "Never", "containers": [
        {"name": name, "image": image, "imagePullPolicy": "Never", "command": command}]}}


def _trivial_experiment(name: str, image: str) -> dict:
    """Random search over one parameter; each trial a batch Job printing `val_auroc=0.5`
    (after a pause: Katib's collector must find the main process still running)."""
    return {
        "apiVersion": "kubeflow.org/v1beta1", "kind": "Experiment", "metadata": {"name": name},
        "spec": {
            "objective": {"type": "maximize", "objectiveMetricName": "val_auroc"},
            "algorithm": {"algorithmName": "random"},
            "metricsCollectorSpec": {"collector": {"kind": "StdOut"}},
            "parallelTrialCount": 1, "maxTrialCount": 2, "maxFailedTrialCount": 1,
            "parameters": [{"name": "lr", "parameterType": "double",
                            "feasibleSpace": {"min": "0.001", "max": "0.1"}}],
            "trialTemplate": {
                "primaryContainerName": "main",
                "trialParameters": [{"name": "lr", "reference": "lr"}],
                "trialSpec": {"apiVersion": "batch/v1", "kind": "Job", "spec": {
                    "backoffLimit": 0, "template": _container("main", image, TRIVIAL_TRIAL)}}}}}


def _wait_experiment(custom, ns: str, name: str, timeout: float = 300) -> dict:
    """The Experiment's status once it has Succeeded or Failed."""
    deadline = time.monotonic() + timeout
    while True:
        status = custom.get_namespaced_custom_object(
            "kubeflow.org", "v1beta1", ns, "experiments", name).get("status", {})
        ended = {c["type"] for c in status.get("conditions", []) if c["status"] == "True"}
        if ended & {"Succeeded", "Failed"}:
            return status
        assert time.monotonic() < deadline, status
        time.sleep(2)


def _succeeded(status: dict) -> bool:
    return any(c["type"] == "Succeeded" and c["status"] == "True" for c in status["conditions"])


def test_an_experiment_with_job_trials_succeeds_with_goptuna_random_and_the_stdout_collector(
        katib_cluster, katib_namespace, katib_base_image):
    """The whole chain: the controller asks the goptuna suggestion service for parameters,
    runs each trial's Job, the injected collector sends val_auroc to db-manager (MySQL), and
    the Experiment ends Succeeded at maxTrialCount with Katib's optimal trial.
    The name is unique on the cluster: Katib's suggestion controller lists an Experiment's
    trials by label in every namespace."""
    from kubernetes import client

    custom = client.CustomObjectsApi(katib_cluster.api_client())
    args = ("kubeflow.org", "v1beta1", katib_namespace, "experiments")
    name = f"trivial-{katib_namespace[-5:]}"
    custom.create_namespaced_custom_object(*args, _trivial_experiment(name, katib_base_image))
    status = _wait_experiment(custom, katib_namespace, name)
    assert _succeeded(status), status
    assert status["trialsSucceeded"] == 2, status
    optimal = status["currentOptimalTrial"]
    assert optimal["observation"]["metrics"] == [
        {"name": "val_auroc", "latest": "0.5", "max": "0.5", "min": "0.5"}]
    (lr,) = optimal["parameterAssignments"]
    assert lr["name"] == "lr" and 0.001 <= float(lr["value"]) <= 0.1
    trials = custom.list_namespaced_custom_object(
        "kubeflow.org", "v1beta1", katib_namespace, "trials")["items"]
    suggestion = custom.get_namespaced_custom_object(
        "kubeflow.org", "v1beta1", katib_namespace, "suggestions", name)
    assert len(trials) == 2 and suggestion["status"]["suggestionCount"] == 2


def test_grid_runs_on_the_real_katib_through_chexflows_suggestion_service(
        katib_cluster, katib_namespace, katib_base_image):
    """grid (a Python algorithm in Katib): Katib's controller starts chexflow's suggestion
    service (the launcher image, `chexflow katib-suggestion`), probes its health, validates the
    settings and asks it for trials: two at once, then one more, which must be the grid's last
    point, so the service read the first two from Katib's trial list."""
    from kubernetes import client

    custom = client.CustomObjectsApi(katib_cluster.api_client())
    name = f"grid-{katib_namespace[-5:]}"
    exp = _trivial_experiment(name, katib_base_image)
    exp["spec"].update(algorithm={"algorithmName": "grid"}, parallelTrialCount=2,
                       maxTrialCount=3, parameters=[{
                           "name": "lr", "parameterType": "discrete",
                           "feasibleSpace": {"list": ["0.001", "0.01", "0.1"]}}])
    custom.create_namespaced_custom_object("kubeflow.org", "v1beta1", katib_namespace,
                                           "experiments", exp)
    status = _wait_experiment(custom, katib_namespace, name)
    assert _succeeded(status), status
    assert status["trialsSucceeded"] == 3, status
    trials = custom.list_namespaced_custom_object(
        "kubeflow.org", "v1beta1", katib_namespace, "trials")["items"]
    values = sorted(float(a["value"]) for t in trials for a in t["spec"]["parameterAssignments"])
    assert values == [0.001, 0.01, 0.1]
    suggestion = custom.get_namespaced_custom_object(
        "kubeflow.org", "v1beta1", katib_namespace, "suggestions", name)
    assert suggestion["status"]["suggestionCount"] == 3


def _pod_logs(cluster, namespace: str) -> dict[str, str]:
    """The last lines of every container's log in the namespace (for a failure's message)."""
    from kubernetes import client

    core = client.CoreV1Api(cluster.api_client())
    out = {}
    for pod in core.list_namespaced_pod(namespace).items:
        for c in pod.spec.containers:
            try:
                text = core.read_namespaced_pod_log(pod.metadata.name, namespace,
                                                    container=c.name, tail_lines=8)
            except client.ApiException as e:
                text = f"({e.reason})"
            out[f"{pod.metadata.name}/{c.name}"] = text
    return out


def test_medianstop_on_the_real_katib_early_stops_a_trial_below_the_first_ones_mean(
        katib_cluster, katib_namespace, katib_base_image, tmp_path):
    """medianstop through chexflow's early-stopping service (the `earlystopping` image): the
    first trial reports val_auroc=0.9 eight times and succeeds; Katib asks the service for the
    second trial's rule (from db-manager's log of the first: val_auroc less than 0.9 from step
    2), the second reports 0.1, its metrics collector stops it and calls SetTrialStatus, and
    Katib counts it EarlyStopped. Which trial runs first is decided by a marker on a host
    folder both mount."""
    from kubernetes import client

    marks = tmp_path / "marks"
    marks.mkdir()
    marks.chmod(0o777)
    custom = client.CustomObjectsApi(katib_cluster.api_client())
    name = f"median-{katib_namespace[-5:]}"
    exp = _trivial_experiment(name, katib_base_image)
    # one group: the process the collector ends when the rule fires (it ends the main
    # process's only child), and the output Katib's redirection collects
    script = ('( sleep 3; if mkdir /marks/first 2>/dev/null; then v=0.9; else v=0.1; fi; '
              'echo "lr=${trialParameters.lr}"; '
              'for i in 1 2 3 4 5 6 7 8; do echo "val_auroc=$v"; sleep 1; done )')
    pod = exp["spec"]["trialTemplate"]["trialSpec"]["spec"]["template"]["spec"]
    pod["containers"][0]["command"] = ["bash", "-c", script]
    pod["containers"][0]["volumeMounts"] = [{"name": "marks", "mountPath": "/marks"}]
    pod["volumes"] = [{"name": "marks", "hostPath": {"path": str(marks), "type": "Directory"}}]
    exp["spec"]["trialTemplate"]["retain"] = True  # the trials' pods stay for _pod_logs
    exp["spec"]["earlyStopping"] = {"algorithmName": "medianstop", "algorithmSettings": [
        {"name": "min_trials_required", "value": "1"}, {"name": "start_step", "value": "2"}]}
    custom.create_namespaced_custom_object("kubeflow.org", "v1beta1", katib_namespace,
                                           "experiments", exp)
    status = _wait_experiment(custom, katib_namespace, name)
    assert _succeeded(status), (status, _pod_logs(katib_cluster, katib_namespace))
    assert status["trialsSucceeded"] == 1 and status["trialsEarlyStopped"] == 1, status
    trials = {t["metadata"]["name"]: t for t in custom.list_namespaced_custom_object(
        "kubeflow.org", "v1beta1", katib_namespace, "trials")["items"]}
    (stopped,) = [t for t in trials.values() if any(
        c["type"] == "EarlyStopped" and c["status"] == "True"
        for c in t["status"]["conditions"])]
    (rule,) = stopped["spec"]["earlyStoppingRules"]
    assert rule == {"name": "val_auroc", "value": "0.9", "comparison": "less", "startStep": 2}
    assert status["currentOptimalTrial"]["bestTrialName"] != stopped["metadata"]["name"]


def test_a_second_katib_cluster_is_refused_in_one_line_naming_the_first(katib_cluster, tmp_path):
    """kube-proxy's chains are global to the host's network namespace: one --katib cluster per
    machine. The second is refused before it starts anything; the first keeps its rules."""
    from chexflow.devcluster import kubeproxy
    from chexflow.devcluster.controlplane import LocalCluster
    from chexflow.devcluster.katib import Katib

    second = LocalCluster(tmp_path / "second", nodes=1, gpus_per_node=0, die_with_parent=True,
                          addons=[Katib()])
    with pytest.raises(kubeproxy.KubeProxyError) as e:
        second.start(timeout=60)
    message = str(e.value)
    assert "\n" not in message
    assert f"the cluster in {katib_cluster.state_dir} has it" in message
    assert f"chexflow cluster down --dir {katib_cluster.state_dir}" in message
    assert not second.running() and not (tmp_path / "second" / "cluster.json").exists()
    assert not Path(f"/sys/class/net/{realnode.RealNode(second.state_dir).bridge}").exists()
    assert kubeproxy.holder() == str(katib_cluster.state_dir)
    rules = subprocess.run(["iptables-save", "-t", "nat"], capture_output=True, text=True).stdout
    assert "-A KUBE-SERVICES" in rules


def test_cluster_up_katib_beside_the_katib_cluster_exits_2_with_one_line(katib_cluster, tmp_path):
    """`chexflow cluster up --katib` as a user runs it: refused before starting anything."""
    proc = run_chexflow("cluster", "up", "--katib", "--dir", tmp_path / "mine", check=False)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [
        f"chexflow cluster: error: kube-proxy (needed by --katib) runs for one cluster per "
        f"machine and the cluster in {katib_cluster.state_dir} has it: stop that one first "
        f"(chexflow cluster down --dir {katib_cluster.state_dir})"]
    assert not (tmp_path / "mine" / "cluster.json").exists()


def test_an_experiment_with_mpijob_v2beta1_trials_succeeds(
        katib_cluster, katib_namespace, katib_base_image):
    """MPIJob.v2beta1.kubeflow.org in katib-config's trialResources: Katib runs each trial as an
    MPIJob (mpi-operator makes the launcher and worker pods), collects the launcher's
    val_auroc and ends Succeeded. Katib v0.19.0's pod webhook adds KATIB_TRIAL_NAME to the
    primary container in EVERY pod of the trial and refuses a pod without a container of that
    name, so the worker's container carries the launcher's name."""
    from kubernetes import client

    custom = client.CustomObjectsApi(katib_cluster.api_client())
    name = f"mpi-{katib_namespace[-5:]}"
    experiment = _trivial_experiment(name, katib_base_image)
    experiment["spec"]["trialTemplate"] = {
        "primaryContainerName": "launcher",
        "primaryPodLabels": {"training.kubeflow.org/job-role": "launcher"},
        "trialParameters": [{"name": "lr", "reference": "lr"}],
        "trialSpec": {"apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob", "spec": {
            "slotsPerWorker": 1, "runPolicy": {"cleanPodPolicy": "Running"},
            "mpiReplicaSpecs": {
                "Launcher": {"replicas": 1, "template": _container(
                    "launcher", katib_base_image,
                    ["bash", "-c", f"cat /etc/mpi/hostfile; {TRIVIAL_TRIAL[2]}"])},
                "Worker": {"replicas": 1, "template": _container(
                    "launcher", katib_base_image, ["sleep", "300"])}}}}}
    custom.create_namespaced_custom_object("kubeflow.org", "v1beta1", katib_namespace,
                                           "experiments", experiment)
    status = _wait_experiment(custom, katib_namespace, name)
    assert _succeeded(status), status
    assert status["trialsSucceeded"] == 2, status
    assert status["currentOptimalTrial"]["observation"]["metrics"][0]["max"] == "0.5"
    trials = custom.list_namespaced_custom_object("kubeflow.org", "v1beta1", katib_namespace,
                                                  "trials")["items"]
    assert [t["spec"]["runSpec"]["kind"] for t in trials] == ["MPIJob", "MPIJob"]
