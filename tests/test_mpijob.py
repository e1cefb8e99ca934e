"""MPIJob rendering against the real mpi-operator CRD schema, the schema helper, and the CLI."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from chexflow.envs import REPO_ROOT
from chexflow.jobs import JobSpec, JobSpecError, Volume
from chexflow.jobs.queueing import JOB_UID_LABEL, QueueError
from chexflow.jobs.render import QUEUE_LABEL, render_batch_job, render_mpijob
from chexflow.jobs.schema import SchemaError, validate_mpijob
from chexflow.jobs.spec import ClusterOptions
from tests.conftest import run_chexflow
from tests.recorded_kube_fake import Recorded, RecordedRequestFakeKubeApi
from tests.support.reference import reference_dir

CRD = Path(__file__).parent / "data" / "mpijobs.kubeflow.org.v2beta1.yaml"


def spec(**kw) -> JobSpec:
    base = dict(
        name="chexnet-train", command=["chexflow", "train", "--data", "/data/tfr"], workers=4,
        horovod=True, gpus_per_worker=2, cpu="8", memory="32Gi", shm_size="8Gi",
        volumes=[Volume("chexflow-data", "/data")], env={"TF_CPP_MIN_LOG_LEVEL": "2"},
        timeout_seconds=7200,
    )
    return JobSpec(**{**base, **kw})


def test_rendered_mpijob_validates_and_has_the_cluster_fields():
    obj = render_mpijob(spec(), namespace="team-a", image="reg.example/trainer:1")
    validate_mpijob(obj, CRD)
    s = obj["spec"]
    assert s["slotsPerWorker"] == 2
    assert s["runPolicy"] == {"cleanPodPolicy": "Running", "ttlSecondsAfterFinished": 3600,
                              "activeDeadlineSeconds": 7200, "backoffLimit": 2,
                              "schedulingPolicy": {"minAvailable": 4}}
    launcher = s["mpiReplicaSpecs"]["Launcher"]
    worker = s["mpiReplicaSpecs"]["Worker"]
    assert launcher["replicas"] == 1 and worker["replicas"] == 4
    lc = launcher["template"]["spec"]["containers"][0]
    wc = worker["template"]["spec"]["containers"][0]
    assert lc["command"][:3] == ["mpirun", "-np", "8"]  # 4 workers x 2 slots
    assert lc["command"][-4:] == ["chexflow", "train", "--data", "/data/tfr"]
    assert "TF_CPP_MIN_LOG_LEVEL" in lc["command"]  # forwarded to the ranks with -x
    assert "nvidia.com/gpu" not in lc["resources"]["limits"]
    assert wc["resources"]["limits"]["nvidia.com/gpu"] == 2
    for tmpl in (launcher, worker):
        pod = tmpl["template"]["spec"]
        claims = [v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"]
                  if "persistentVolumeClaim" in v]
        assert claims == ["chexflow-data"]
        shm = [v for v in pod["volumes"] if v["name"] == "dshm"][0]["emptyDir"]
        assert shm == {"medium": "Memory", "sizeLimit": "8Gi"}
        mounts = {m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
        assert mounts == {"/data", "/dev/shm"}


def test_schema_rejects_wrong_types_and_unknown_fields():
    obj = render_mpijob(spec())
    worker = obj["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    worker["gpus"] = 2
    worker["resources"]["limits"]["cpu"] = "lots"
    obj["spec"]["slotsPerWorker"] = "2"
    with pytest.raises(SchemaError) as err:
        validate_mpijob(obj, CRD)
    msg = str(err.value)
    assert "containers.0.gpus: unknown field" in msg
    assert "limits.cpu" in msg and "spec.slotsPerWorker" in msg


def test_schema_requires_an_explicit_clean_pod_policy_and_one_launcher():
    obj = render_mpijob(spec())
    del obj["spec"]["runPolicy"]["cleanPodPolicy"]
    with pytest.raises(SchemaError, match="cleanPodPolicy must be set"):
        validate_mpijob(obj, CRD)
    obj = render_mpijob(spec())
    obj["spec"]["mpiReplicaSpecs"]["Launcher"]["replicas"] = 2
    with pytest.raises(SchemaError, match="Launcher.replicas must be 1"):
        validate_mpijob(obj, CRD)


def test_katib_reference_trial_spec_is_checked_too():
    """The Katib example's trialSpec is a kubeflow.org/v1 MPIJob: the v2beta1 check says so."""
    ref = reference_dir() / "katib-examples" / "mpijob-horovod.yaml"
    trial = yaml.safe_load(ref.read_text())["spec"]["trialTemplate"]["trialSpec"]
    trial["metadata"] = {"name": "t"}
    with pytest.raises(SchemaError, match=r"apiVersion is 'kubeflow.org/v1'.*cleanPodPolicy"):
        validate_mpijob(trial, CRD)


def test_batch_job_for_single_process():
    job = render_batch_job(spec(workers=1, horovod=False, gpus_per_worker=1))
    pod = job["spec"]["template"]["spec"]
    assert job["apiVersion"] == "batch/v1" and pod["restartPolicy"] == "Never"
    assert pod["containers"][0]["command"] == ["chexflow", "train", "--data", "/data/tfr"]
    assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 1


def test_bad_specs_are_refused_with_the_field_named():
    with pytest.raises(JobSpecError, match="name must be lowercase"):
        spec(name="Train_1")
    with pytest.raises(JobSpecError, match="workers=2 needs horovod"):
        spec(workers=2, horovod=False)


def test_cli_render_prints_a_valid_mpijob(tmp_path):
    proc = run_chexflow(
        "mpijob", "render", "--name", "cli-job", "--workers", 2, "--gpus-per-worker", 1,
        "--pvc", "chexflow-data", "--validate", CRD, "--", "chexflow", "train", "--epochs", 1,
    )
    obj = yaml.safe_load(proc.stdout)
    assert obj["kind"] == "MPIJob" and obj["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] == 2
    assert "valid against" in proc.stderr
    bad = run_chexflow("mpijob", "render", "--name", "Bad_Name", "--", "true", check=False)
    assert bad.returncode == 2 and "name must be lowercase" in bad.stderr


def pods(obj: dict) -> dict[str, dict]:
    """role -> pod template spec (launcher, worker; main for a batch Job)."""
    if obj["kind"] == "Job":
        return {"main": obj["spec"]["template"]}
    return {r.lower(): t["template"] for r, t in obj["spec"]["mpiReplicaSpecs"].items()}


def test_every_pod_runs_as_the_images_numeric_user_without_an_istio_sidecar():
    for obj in (render_mpijob(spec()), render_batch_job(spec(workers=1, horovod=False))):
        for role, tmpl in pods(obj).items():
            assert tmpl["metadata"]["annotations"] == {"sidecar.istio.io/inject": "false"}, role
            ctx = tmpl["spec"]["containers"][0]["securityContext"]
            assert ctx == {"runAsUser": 1000, "runAsNonRoot": True}, role


def test_launcher_is_retried_on_failure_and_a_batch_job_is_not():
    obj = render_mpijob(spec())
    replicas = obj["spec"]["mpiReplicaSpecs"]
    assert replicas["Launcher"]["restartPolicy"] == "OnFailure"
    assert replicas["Worker"]["restartPolicy"] == "Never"
    assert obj["spec"]["runPolicy"]["backoffLimit"] == 2
    assert render_mpijob(spec(backoff_limit=0))["spec"]["runPolicy"]["backoffLimit"] == 0
    assert render_batch_job(spec(workers=1, horovod=False))["spec"]["backoffLimit"] == 0
    with pytest.raises(JobSpecError, match="backoff_limit must be >= 0"):
        spec(backoff_limit=-1)


def test_worker_requests_grow_with_gpus_and_with_ranks_without_gpus():
    def requests(**kw) -> dict:
        worker = pods(render_mpijob(spec(**kw)))["worker"]["spec"]["containers"][0]
        assert worker["resources"]["limits"]["cpu"] == worker["resources"]["requests"]["cpu"]
        return worker["resources"]["requests"]

    auto = {"cpu": "", "memory": ""}
    assert requests(**auto, gpus_per_worker=8) == {"cpu": "32", "memory": "128Gi"}
    assert requests(**auto, gpus_per_worker=1) == {"cpu": "4", "memory": "16Gi"}
    assert requests(**auto, gpus_per_worker=8, cpu_per_gpu="1500m", memory_per_gpu="10Gi") == \
        {"cpu": "12000m", "memory": "80Gi"}
    assert requests(**auto, gpus_per_worker=0, slots_per_worker=4) == {"cpu": "4", "memory": "8Gi"}
    assert requests(**auto, gpus_per_worker=0) == {"cpu": "1", "memory": "2Gi"}
    assert requests(cpu="6", memory="20Gi", gpus_per_worker=8) == {"cpu": "6", "memory": "20Gi"}
    with pytest.raises(JobSpecError, match="cpu_per_gpu 'lots' is not a Kubernetes quantity"):
        spec(cpu_per_gpu="lots")


def test_slots_per_worker_apart_from_gpus_sets_mpirun_ranks():
    obj = render_mpijob(spec(gpus_per_worker=0, slots_per_worker=3, workers=2))
    validate_mpijob(obj, CRD)
    assert obj["spec"]["slotsPerWorker"] == 3
    assert pods(obj)["launcher"]["spec"]["containers"][0]["command"][:3] == ["mpirun", "-np", "6"]
    assert "nvidia.com/gpu" not in pods(obj)["worker"]["spec"]["containers"][0]["resources"][
        "limits"]
    assert render_mpijob(spec(gpus_per_worker=4))["spec"]["slotsPerWorker"] == 4


def test_cluster_options_reach_every_pod_and_gpu_pods_tolerate_the_gpu_taint():
    options = ClusterOptions(
        node_selector={"cloud.google.com/gke-accelerator": "nvidia-tesla-a100"},
        tolerations=[{"key": "dedicated", "operator": "Equal", "value": "ml",
                      "effect": "NoSchedule"}],
        priority_class="training-high", image_pull_secrets=["regcred"], run_as_user=1234,
    )
    gpu_tol = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    for obj in (render_mpijob(spec(), options=options),
                render_batch_job(spec(workers=1, horovod=False, gpus_per_worker=1),
                                 options=options)):
        if obj["kind"] == "MPIJob":
            validate_mpijob(obj, CRD)  # the priority class is the pods' (no gang asked)
            assert obj["spec"]["runPolicy"]["schedulingPolicy"] == {"minAvailable": 4}
        for role, tmpl in pods(obj).items():
            pod = tmpl["spec"]
            assert pod["nodeSelector"] == options.node_selector
            assert pod["priorityClassName"] == "training-high"
            assert pod["imagePullSecrets"] == [{"name": "regcred"}]
            assert pod["containers"][0]["securityContext"]["runAsUser"] == 1234
            expected = [*([] if role == "launcher" else [gpu_tol]), *options.tolerations]
            assert pod["tolerations"] == expected, role
    assert "tolerations" not in pods(render_mpijob(spec(gpus_per_worker=0)))["worker"]["spec"]


def test_gang_scheduling_sets_run_policy_scheduling_policy():
    plain = render_mpijob(spec(workers=4), options=ClusterOptions(gang_scheduling=True))
    validate_mpijob(plain, CRD)
    # the launcher comes once the workers are ready (WaitForWorkersReady): the gang is the workers
    assert plain["spec"]["runPolicy"]["schedulingPolicy"] == {"minAvailable": 4}
    at_startup = render_mpijob(spec(workers=4), options=ClusterOptions(gang_scheduling=True),
                               launcher_creation_policy="AtStartup")
    assert at_startup["spec"]["runPolicy"]["schedulingPolicy"] == {"minAvailable": 5}
    options = ClusterOptions(gang_scheduling=True, volcano_queue="research", min_available=3,
                             priority_class="training-high")
    obj = render_mpijob(spec(workers=4), options=options)
    validate_mpijob(obj, CRD)
    assert obj["spec"]["runPolicy"]["schedulingPolicy"] == {
        "minAvailable": 3, "queue": "research", "priorityClass": "training-high"}
    assert QUEUE_LABEL not in obj["metadata"]["labels"]
    with pytest.raises(JobSpecError, match="set gang_scheduling too"):
        ClusterOptions(volcano_queue="research")


def test_a_plain_mpijob_counts_only_its_workers_in_any_gang_the_operator_makes():
    """mpi-operator with --gang-scheduling gang-schedules every MPIJob, with minMember
    workers + 1 unless schedulingPolicy.minAvailable says otherwise; the launcher comes only
    once the workers are ready (WaitForWorkersReady), so `chexflow mpijob render` without
    --gang-scheduling still says the gang is the workers (AtStartup: workers + launcher)."""
    proc = run_chexflow("mpijob", "render", "--name", "plain", "--workers", 3,
                        "--gpus-per-worker", 4, "--validate", CRD, "--", "chexflow", "train")
    obj = yaml.safe_load(proc.stdout)
    assert obj["spec"]["launcherCreationPolicy"] == "WaitForWorkersReady"
    assert obj["spec"]["runPolicy"]["schedulingPolicy"] == {"minAvailable": 3}
    at_startup = render_mpijob(spec(workers=3), launcher_creation_policy="AtStartup")
    assert "schedulingPolicy" not in at_startup["spec"]["runPolicy"]  # the operator's default


def test_queue_labels_the_job_for_kueue_without_gang_scheduling():
    """--queue is Kueue's LocalQueue: the label on the MPIJob (and batch Job), nothing in
    schedulingPolicy, no suspend of chexflow's own (Kueue's webhook sets it)."""
    options = ClusterOptions(queue="team-a")
    obj = render_mpijob(spec(workers=2), options=options)
    validate_mpijob(obj, CRD)
    assert obj["metadata"]["labels"][QUEUE_LABEL] == "team-a"
    assert obj["spec"]["runPolicy"]["schedulingPolicy"] == {"minAvailable": 2}  # no Volcano queue
    assert "suspend" not in obj["spec"]["runPolicy"]
    for role in ("launcher", "worker"):
        assert QUEUE_LABEL not in pods(obj)[role]["metadata"]["labels"]
    job = render_batch_job(spec(workers=1, horovod=False), options=options)
    assert job["metadata"]["labels"][QUEUE_LABEL] == "team-a"
    both = render_mpijob(spec(workers=2), options=ClusterOptions(
        queue="team-a", gang_scheduling=True, volcano_queue="research"))
    assert both["metadata"]["labels"][QUEUE_LABEL] == "team-a"
    assert both["spec"]["runPolicy"]["schedulingPolicy"]["queue"] == "research"
    with pytest.raises(JobSpecError, match="queue 'Team A': a LocalQueue name"):
        ClusterOptions(queue="Team A")


def test_cli_flags_appear_where_mpi_operator_reads_them():
    proc = run_chexflow(
        "mpijob", "render", "--name", "flags", "--workers", 2, "--gpus-per-worker", 8,
        "--slots-per-worker", 8, "--cpu-per-gpu", 6, "--memory-per-gpu", "24Gi",
        "--node-selector", "nvidia.com/gpu.product=A100", "--node-selector", "pool=train",
        "--toleration", "dedicated=ml:NoSchedule", "--toleration", "spot:NoExecute",
        "--priority-class", "high", "--image-pull-secret", "regcred", "--gang-scheduling",
        "--volcano-queue", "research", "--queue", "team-a", "--backoff-limit", 4,
        "--run-as-user", 1001,
        "--validate", CRD, "--", "chexflow", "train",
    )
    obj = yaml.safe_load(proc.stdout)
    run_policy = obj["spec"]["runPolicy"]
    assert run_policy["backoffLimit"] == 4
    assert run_policy["schedulingPolicy"] == {"minAvailable": 2, "queue": "research",
                                              "priorityClass": "high"}
    assert obj["metadata"]["labels"][QUEUE_LABEL] == "team-a"
    assert obj["spec"]["slotsPerWorker"] == 8
    worker = pods(obj)["worker"]["spec"]
    assert worker["nodeSelector"] == {"nvidia.com/gpu.product": "A100", "pool": "train"}
    assert worker["tolerations"][1:] == [
        {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"},
        {"key": "spot", "operator": "Exists", "effect": "NoExecute"}]
    assert worker["priorityClassName"] == "high"
    assert worker["imagePullSecrets"] == [{"name": "regcred"}]
    assert worker["containers"][0]["resources"]["requests"] == {"cpu": "48", "memory": "192Gi"}
    assert worker["containers"][0]["securityContext"] == {"runAsUser": 1001,
                                                          "runAsNonRoot": True}
    bad = run_chexflow("mpijob", "render", "--name", "x", "--toleration", "gpu:Sometimes", "--",
                       "true", check=False)
    assert bad.returncode == 2 and "expected KEY[=VALUE]:EFFECT" in bad.stderr


def shipped_trial_spec(spec: Path) -> dict:
    """The trialSpec a shipped Katib spec runs (inline: a key of katib/trial-templates.yaml)."""
    return yaml.safe_load(spec.read_text())["spec"]["trialTemplate"]["trialSpec"]


def mpijob_specs() -> list:
    """The shipped Katib specs whose trials are MPIJobs (TrainJob trials: test_trainjob.py)."""
    return [p for p in sorted((REPO_ROOT / "katib" / "specs").glob("*.yaml"))
            if shipped_trial_spec(p)["kind"] == "MPIJob"]


@pytest.mark.parametrize("path", mpijob_specs(), ids=lambda p: p.stem)
def test_katib_trial_specs_carry_what_render_puts_in_an_mpijob(path):
    """The trialSpec each shipped spec runs (2 workers x 1 GPU, or 2 CPU workers) matches
    `chexflow mpijob render`: launcher retries, restart policies, no Istio sidecar, numeric
    non-root user, the GPU toleration and the per-GPU requests where it has GPUs; and it passes
    the CRD schema."""
    trial = shipped_trial_spec(path)
    validate_mpijob({**trial, "metadata": {"name": "trial"}}, CRD)
    worker = trial["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    gpus = int(worker["resources"]["limits"].get("nvidia.com/gpu", 0))
    sized = {} if gpus else {"cpu": worker["resources"]["requests"]["cpu"],
                             "memory": worker["resources"]["requests"]["memory"]}
    ours = render_mpijob(JobSpec(name="trial", command=["true"], workers=2, horovod=True,
                                 gpus_per_worker=gpus, **sized))
    for key in ("slotsPerWorker", "sshAuthMountPath", "mpiImplementation",
                "launcherCreationPolicy"):
        assert trial["spec"][key] == ours["spec"][key], key
    for key in ("cleanPodPolicy", "backoffLimit"):
        assert trial["spec"]["runPolicy"][key] == ours["spec"]["runPolicy"][key], key
    for role in ("Launcher", "Worker"):
        theirs, mine = (s["spec"]["mpiReplicaSpecs"][role] for s in (trial, ours))
        assert theirs["restartPolicy"] == mine["restartPolicy"], role
        tmpl, want = theirs["template"], mine["template"]
        assert tmpl["metadata"]["annotations"] == want["metadata"]["annotations"], role
        assert tmpl["spec"].get("tolerations") == want["spec"].get("tolerations"), role
        container, expected = tmpl["spec"]["containers"][0], want["spec"]["containers"][0]
        assert container["securityContext"] == expected["securityContext"], role
    worker = trial["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    assert worker["resources"]["requests"] == worker_requests_of(ours)


def worker_requests_of(obj: dict) -> dict:
    return obj["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0][
        "resources"]["requests"]


def test_workers_are_ready_when_their_sshd_listens_in_renders_and_katib_specs():
    """WaitForWorkersReady starts the launcher once the workers are Ready; a tcpSocket probe on
    the image's sshd port makes Ready mean 'mpirun's ssh gets through' (not 'container started')."""
    import re

    from chexflow.jobs.render import SSH_PORT

    dockerfile = (REPO_ROOT / "images" / "trainer" / "Dockerfile").read_text()
    assert f"ARG SSH_PORT={SSH_PORT}\n" in dockerfile
    probe = {"tcpSocket": {"port": SSH_PORT}, "periodSeconds": 1, "failureThreshold": 1}
    obj = render_mpijob(spec())
    assert obj["spec"]["launcherCreationPolicy"] == "WaitForWorkersReady"
    assert pods(obj)["worker"]["spec"]["containers"][0]["readinessProbe"] == probe
    assert "readinessProbe" not in pods(obj)["launcher"]["spec"]["containers"][0]
    validate_mpijob(obj, CRD)
    for path in mpijob_specs():
        job = shipped_trial_spec(path)
        worker = job["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
        assert worker["readinessProbe"] == probe, path.name
        assert job["spec"]["launcherCreationPolicy"] == "WaitForWorkersReady", path.name
    assert re.search(r"^Port @PORT@$", (REPO_ROOT / "images/trainer/sshd_config").read_text(),
                     re.M)


# ---- RBAC: mpijob/rbac.yaml and mpijob/rbac-cluster.yaml against the backend's requests -----

class _QueuedFakeKubeApi(RecordedRequestFakeKubeApi):
    """The recorded-request fake with what the backend also reads on a real cluster: job uids,
    pod lists with a resourceVersion (so it watches the job's pods between polls), an empty
    watch stream, and Kueue's LocalQueue team-a with an admitted Workload for every job."""

    def request(self, method, url, query_params=None, headers=None, body=None,
                post_params=None, _preload_content=True, _request_timeout=None):
        if ("watch", True) in list(query_params or []):
            self.requests.append(Recorded(method, urlsplit(url).path, dict(query_params), None))
            return _EmptyStream()
        return super().request(method, url, query_params, headers, body, post_params,
                               _preload_content, _request_timeout)

    def _handle(self, method, path, query, body):
        kueue = re.match(r"^/apis/kueue\.x-k8s\.io/v1beta2/namespaces/[^/]+/"
                         r"(localqueues|workloads)(?:/([^/]+))?$", path)
        if kueue and kueue.group(1) == "localqueues":
            queue = {"metadata": {"name": "team-a"}}
            if kueue.group(2) is None:
                return 200, {"items": [queue]}
            return (200, queue) if kueue.group(2) == "team-a" else \
                (404, {"kind": "Status", "reason": "NotFound", "message": "not found"})
        if kueue:
            return 200, {"items": [{
                "metadata": {"name": f"wl-{n}", "uid": f"wl-{n}",
                             "creationTimestamp": "2026-11-22T00:00:00Z",
                             "labels": {JOB_UID_LABEL: job.obj["metadata"]["uid"]}},
                "spec": {"queueName": "team-a"},
                "status": {"admission": {"clusterQueue": "cq"}, "conditions": [
                    {"type": "Admitted", "status": "True"}]}}
                for (_, n), job in self.jobs.items()]}
        status, payload = super()._handle(method, path, query, body)
        if method == "POST" and status == 201:
            payload["metadata"]["uid"] = f"uid-{payload['metadata']['name']}"
            self.jobs[next(k for k in self.jobs if k[1] == payload["metadata"]["name"])
                      ].obj["metadata"]["uid"] = payload["metadata"]["uid"]
        if path.endswith("/pods") and status == 200:
            payload["metadata"] = {"resourceVersion": "7"}
        return status, payload


class _EmptyStream:
    """A watch that ends without events."""

    def stream(self, amt=None, decode_content=False):
        return iter(())

    def close(self) -> None:
        pass

    def release_conn(self) -> None:
        pass


def test_rbac_grants_exactly_what_the_backend_asks_for_every_job_kind_and_queue():
    """Every request of MPIJob runs (succeeding, failing, queued by Kueue, refused for a queue
    that is not there), a batch Job and TrainJobs (plain, queued by Kueue, refused for a queue
    that is not there), each mapped to (group, resource, verb, namespaced) as RBAC sees it: the
    Role and ClusterRole grant all of them and nothing more."""
    import io

    from chexflow.jobs import JobFailed
    from chexflow.jobs.kubernetes import KubernetesBackend
    from tests.rbac_requests import access, granted

    fake = _QueuedFakeKubeApi(scripts={"f": [["Created", "Failed"]]}, logs={"f": "boom"},
                              failures={"f": ("MPIJobFailed", "x")})
    now = [0.0]

    def backend(**kw) -> KubernetesBackend:
        return KubernetesBackend(namespace="team-a", api_client=fake.api_client(),
                                 poll_seconds=5, stream=io.StringIO(), clock=lambda: now[0],
                                 sleep=lambda s: now.__setitem__(0, now[0] + s), **kw)

    def job(name: str, **kw) -> JobSpec:
        return JobSpec(name=name, command=["chexflow", "train"], workers=2, horovod=True,
                       timeout_seconds=600, **kw)

    backend(delete_policy="always").run(job("ok"))
    with pytest.raises(JobFailed):
        backend(delete_policy="always").run(job("f"))
    backend().run(JobSpec(name="single", command=["chexflow", "evaluate"]))
    backend(job_kind="trainjob").run(job("tj"))
    backend(options=ClusterOptions(queue="team-a")).run(job("queued"))
    backend(job_kind="trainjob", options=ClusterOptions(queue="team-a")).run(job("tj-queued"))
    for kind in ("mpijob", "trainjob"):
        with pytest.raises(QueueError, match=r"no LocalQueue nope in namespace team-a \(there: "
                           r"team-a\)"):
            backend(job_kind=kind, options=ClusterOptions(queue="nope")).run(job(f"lost-{kind}"))
    used = {access(r.method, r.path, r.query) for r in fake.requests}
    rbac = REPO_ROOT / "mpijob"
    assert used == granted(rbac / "rbac.yaml", rbac / "rbac-cluster.yaml")
