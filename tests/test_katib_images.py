"""Katib's images (chexflow/devcluster/katib_images.py), built and run with podman: MariaDB serves
katib-db-manager, which stores observation logs; the file metrics collector reports a trial's
metrics to it; goptuna answers health checks and suggestions; the controller reads a katib-config.

Each container gets a network namespace of its own (`--network=none`, only loopback) or shares
the database's (`--network=container:`), so nothing listens on the host; the gRPC client
(tests/katib_grpc.py) runs inside that namespace through nsenter.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from chexflow.devcluster import images as build
from chexflow.devcluster import katib_images as katib
from chexflow.devcluster.commands import image_names

REPO = Path(__file__).resolve().parent.parent
CLIENT = Path(__file__).resolve().parent / "katib_grpc.py"
HADOLINT = str(Path(sys.executable).parent / "hadolint")
PASSWORD = "s3cret'pw"  # a quote: the entrypoint must escape it in SQL
# what katib.py documents: user, entrypoint, working directory, exposed ports
LAYOUT = {
    "katib-controller": ("1000", "/app/katib-controller", "/app", {"8443", "8080", "18080"}),
    "katib-db-manager": ("1000", "/app/katib-db-manager", "/app", {"6789"}),
    "katib-file-metricscollector": ("", "/app/file-metricscollector", "/app", set()),
    "katib-suggestion-goptuna": ("1000", "/opt/katib/goptuna-suggestion", "/opt/katib",
                                 {"6789"}),
    "katib-mysql": ("999", "/usr/local/bin/katib-mysql-entrypoint", "", {"3306"}),
}


def podman(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
    pm = build.Podman(build.cache_root() / "podman")
    proc = subprocess.run(["podman", *args], env=pm.env(), capture_output=True, text=True,
                          timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)} exited {proc.returncode}: {proc.stderr}")
    return proc


def logs(name: str) -> str:
    proc = podman("logs", name)
    return proc.stdout + proc.stderr


def grpc_in(container: str, *args: str):
    """tests/katib_grpc.py ARGS inside the container's network namespace."""
    pid = podman("inspect", "-f", "{{.State.Pid}}", container).stdout.strip()
    proc = subprocess.run(["nsenter", "-t", pid, "-n", sys.executable, str(CLIENT), *args],
                          capture_output=True, text=True, timeout=90)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def wait_for(what: str, check, container: str, timeout: float = 90) -> None:
    """Poll `check` until true; fails at once when the container has stopped."""
    end = time.monotonic() + timeout
    while not check():
        if podman("inspect", "-f", "{{.State.Running}}", container).stdout.strip() != "true":
            raise AssertionError(f"{container} stopped while waiting for {what}: "
                                 f"{logs(container)[-2000:]}")
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.5)


class Containers:
    """Containers started by one test module, removed (newest first) at its end."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def run(self, image: str, *args: str, options: tuple[str, ...] = ()) -> str:
        name = f"chexflow-test-{uuid.uuid4().hex[:8]}"
        podman("run", "-d", "--name", name, *options, image, *args)
        self.names.append(name)
        return name

    def remove_all(self) -> None:
        for name in reversed(self.names):
            podman("rm", "-f", "-t", "1", name, check=False)


@pytest.fixture(scope="module")
def refs() -> dict[str, str]:
    """Every Katib image built (cached archives: seconds) and present in podman's storage."""
    pm = build.Podman(build.cache_root() / "podman")
    return {name: pm.ensure_loaded(build.build_image(name)) for name in katib.IMAGES}


@pytest.fixture(scope="module")
def containers():
    c = Containers()
    yield c
    c.remove_all()


@pytest.fixture(scope="module")
def database(refs, containers) -> dict[str, str]:
    """katib-mysql (Katib's arguments and env) and katib-db-manager in its network namespace."""
    mysql = containers.run(refs["katib-mysql"], "--datadir", "/var/lib/mysql/datadir", options=(
        "--network=none", "-e", f"MYSQL_ROOT_PASSWORD={PASSWORD}",
        "-e", "MYSQL_ALLOW_EMPTY_PASSWORD=true", "-e", "MYSQL_DATABASE=katib"))
    manager = containers.run(refs["katib-db-manager"], options=(
        f"--network=container:{mysql}", "-e", "DB_NAME=mysql", "-e", f"DB_PASSWORD={PASSWORD}",
        "-e", "KATIB_MYSQL_DB_HOST=127.0.0.1"))
    wait_for("katib-db-manager's 'Start Katib manager' line",
             lambda: "Start Katib manager: 0.0.0.0:6789" in logs(manager), manager)
    return {"mysql": mysql, "manager": manager}


def mysql_query(database: dict[str, str], sql: str) -> str:
    """The mysql client in katib-mysql, as Katib's readiness probe runs it."""
    return podman("exec", database["mysql"], "mysql", "-D", "katib", "-u", "root",
                  f"-p{PASSWORD}", "--batch", "--skip-column-names", "-e", sql).stdout


@pytest.mark.slow
def test_katib_binaries_are_static_and_match_their_checksums():
    bin_dir = katib.ensure_katib_binaries()
    assert bin_dir.name.startswith(f"katib-{katib.KATIB_VERSION}-")
    assert bin_dir == katib.katib_cache_dir()
    sums = subprocess.run(["sha256sum", "--check", "SHA256SUMS"], cwd=bin_dir,
                          capture_output=True, text=True)
    assert sums.returncode == 0, sums.stdout + sums.stderr
    for program in katib.BINARIES:
        elf = subprocess.run(["readelf", "--program-headers", str(bin_dir / program)],
                             capture_output=True, text=True, check=True).stdout
        assert "LOAD" in elf and "INTERP" not in elf, program  # CGO_ENABLED=0: no loader
    assert "github.com/kubeflow/katib v0.19.0" in (bin_dir / "VERSIONS").read_text()


@pytest.mark.slow
def test_katib_build_script_builds_into_the_folder_python_looks_in(tmp_path, monkeypatch):
    """build.sh run by hand (as `make` would) names its folder as katib_cache_dir() does; with
    Go's build cache warm it takes seconds."""
    monkeypatch.setenv("CHEXFLOW_K8S_CACHE", str(tmp_path / "k8s"))
    proc = subprocess.run(["bash", str(katib.GO_DIR / "build.sh")], capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (made,) = (tmp_path / "k8s").iterdir()
    assert made == katib.katib_cache_dir()
    assert katib.ensure_katib_binaries() == made  # found, not built again
    assert sorted(p.name for p in made.iterdir()) == sorted(
        [*katib.BINARIES, "SHA256SUMS", "VERSIONS"])


def test_katib_image_key_covers_its_program_bytes(tmp_path, monkeypatch):
    programs = tmp_path / "programs"
    programs.mkdir()
    (programs / "goptuna-suggestion").write_bytes(b"\x7fELF one")
    monkeypatch.setattr(katib, "ensure_katib_binaries", lambda: programs)
    args = {"BASE_IMAGE": build.base_ref()}

    def key() -> str:
        context = tmp_path / f"context-{uuid.uuid4().hex}"
        context.mkdir()
        katib.make_context("katib-suggestion-goptuna", context)
        assert sorted(p.name for p in context.iterdir()) == ["Dockerfile", "goptuna-suggestion"]
        return build.content_key("katib-suggestion-goptuna", args, context)

    first = key()
    assert key() == first
    (programs / "goptuna-suggestion").write_bytes(b"\x7fELF two")
    assert key() != first


@pytest.mark.parametrize("name", [*sorted(katib.IMAGES), *build.DERIVED])
def test_katib_dockerfiles_pass_hadolint(name):
    """Katib's images and the early-stopping one made from the launcher's."""
    path = (katib.image_dir(name) if name in katib.IMAGES else REPO / "images" / name) / \
        "Dockerfile"
    proc = subprocess.run([HADOLINT, "--no-color", "--format", "json", str(path)],
                          capture_output=True, text=True)
    assert proc.returncode == 0 and json.loads(proc.stdout or "[]") == []


def test_images_build_names_katib_images_and_the_katib_group():
    help_text = subprocess.run([str(REPO / ".venv/bin/chexflow"), "images", "build", "--help"],
                               capture_output=True, text=True, check=True).stdout
    assert all(name in help_text.replace("-\n", "-").replace("\n", " ").replace("  ", "")
               for name in katib.IMAGES)
    assert image_names(["katib"]) == list(katib.IMAGES)
    assert image_names(["trainer", "katib", "katib-mysql"]) == ["trainer", *katib.IMAGES]
    assert image_names([]) == ["trainer", "launcher", "earlystopping", *katib.IMAGES]


@pytest.mark.realnode
def test_katib_images_have_the_documented_layout_and_rebuild_from_cache(refs):
    for name, (user, entrypoint, workdir, ports) in LAYOUT.items():
        config = json.loads(podman("image", "inspect", refs[name]).stdout)[0]["Config"]
        assert config.get("User", "") == user, name
        assert config["Entrypoint"] == [entrypoint], name
        assert config.get("WorkingDir", "") == workdir, name
        assert {p.split("/")[0] for p in config.get("ExposedPorts") or {}} == ports, name
    again = [build.build_image(name) for name in katib.IMAGES]
    assert all(image.cached for image in again)  # nothing built again
    assert [image.ref for image in again] == list(refs.values())


@pytest.mark.realnode
def test_katib_mysql_serves_db_manager_which_stores_observation_logs(database):
    manager = database["manager"]
    assert grpc_in(manager, "health", "127.0.0.1:6789") == "SERVING"  # its Check runs SELECT 1
    grpc_in(manager, "report", "127.0.0.1:6789", "trial-a",
            "val_auroc=0.71@2026-11-23T10:00:00Z", "val_auroc=0.83@2026-11-23T10:05:00Z")
    got = grpc_in(manager, "observations", "127.0.0.1:6789", "trial-a", "val_auroc")
    logs_ = got["observationLog"]["metricLogs"]
    assert [(m["metric"]["name"], m["metric"]["value"]) for m in logs_] == [
        ("val_auroc", "0.71"), ("val_auroc", "0.83")]
    assert logs_[0]["timeStamp"].startswith("2026-11-23T10:00:00")
    # stored in MariaDB, in the table Katib's schema made; the password (with a quote) works
    rows = mysql_query(database, "SELECT metric_name, value FROM observation_logs "
                                 "WHERE trial_name = 'trial-a' ORDER BY time")
    assert rows.split() == ["val_auroc", "0.71", "val_auroc", "0.83"]
    assert "10.11" in mysql_query(database, "SELECT VERSION()")
    # runs as the mysql user (uid 999) and answers Katib's liveness probe
    status = podman("exec", database["mysql"], "cat", "/proc/1/status").stdout
    assert "\nUid:\t999\t" in status
    ping = podman("exec", database["mysql"], "mysqladmin", "ping", "-u", "root",
                  f"-p{PASSWORD}").stdout
    assert "mysqld is alive" in ping
    # root has a password everywhere: no passwordless account was left by the initialisation
    accounts = mysql_query(database, "SELECT CONCAT(user, '@', host) FROM mysql.user "
                                     "WHERE user = 'root' ORDER BY host").split()
    assert accounts == ["root@%", "root@localhost"]


@pytest.mark.realnode
def test_file_metricscollector_reports_a_trials_metrics_to_db_manager(refs, containers,
                                                                      database, tmp_path):
    """A trial pod as Katib's pod webhook makes it: the training container's command ends with
    `echo completed > /var/log/katib/$$.pid`, the collector shares its process namespace and
    the metrics folder, and reports to db-manager when the training process ends."""
    metrics = tmp_path / "katib"
    metrics.mkdir()
    metrics.chmod(0o777)
    # the pod's first process (the pause container's role): the collector skips pid 1
    pm = build.Podman(build.cache_root() / "podman")
    trial = containers.run(build.base_image(pm), "sleep", "600",
                           options=("--network=none", "-v", f"{metrics}:/var/log/katib"))
    log = "/var/log/katib/metrics.log"
    training = subprocess.Popen(
        ["podman", "exec", trial, "bash", "-c",
         f"sleep 8; echo '2026-11-23T10:00:00Z epoch 1: val_auroc=0.62 images_per_sec=41.5' "
         f">> {log}; echo '2026-11-23T10:01:00Z val_auroc=0.77' >> {log}; "
         "echo completed > /var/log/katib/$$.pid"], env=pm.env())
    try:
        wait_for("the training process", lambda: "sleep\x008" in podman(
            "exec", trial, "sh", "-c", "cat /proc/[0-9]*/cmdline").stdout, trial, timeout=20)
        collector = containers.run(
            refs["katib-file-metricscollector"],
            "-t", "trial-b", "-m", "val_auroc;images_per_sec", "-o-type", "maximize",
            "-s-db", "127.0.0.1:6789", "-path", "/var/log/katib/metrics.log", "-format", "TEXT",
            options=(f"--network=container:{database['manager']}", f"--pid=container:{trial}",
                     "-v", f"{metrics}:/var/log/katib"))
        assert training.wait(timeout=60) == 0
    finally:
        training.kill()
    exit_code = podman("wait", collector, timeout=90).stdout.strip()
    assert exit_code == "0", logs(collector)
    assert "Metrics reported" in logs(collector)
    got = grpc_in(database["manager"], "observations", "127.0.0.1:6789", "trial-b", "val_auroc")
    assert [m["metric"]["value"] for m in got["observationLog"]["metricLogs"]] == ["0.62", "0.77"]
    speed = grpc_in(database["manager"], "observations", "127.0.0.1:6789", "trial-b",
                    "images_per_sec")
    assert [m["metric"]["value"] for m in speed["observationLog"]["metricLogs"]] == ["41.5"]


@pytest.mark.realnode
def test_goptuna_suggestion_serves_health_and_random_suggestions(refs, containers, database,
                                                                 tmp_path):
    descriptors = tmp_path / "api.pb"
    assert grpc_in(database["manager"], "descriptors", "127.0.0.1:6789", str(descriptors)) == [
        "api.proto"]
    goptuna = containers.run(refs["katib-suggestion-goptuna"], options=("--network=none",))
    wait_for("the goptuna service", lambda: "Start Goptuna suggestion service" in logs(goptuna),
             goptuna)
    assert grpc_in(goptuna, "health", "127.0.0.1:6789") == "SERVING"
    request = {
        "experiment": {"name": "chexnet-random", "spec": {
            "parameterSpecs": {"parameters": [
                {"name": "lr", "parameterType": "DOUBLE",
                 "feasibleSpace": {"min": "0.0001", "max": "0.01"}},
                {"name": "batch_size", "parameterType": "CATEGORICAL",
                 "feasibleSpace": {"list": ["16", "32"]}}]},
            "objective": {"type": "MAXIMIZE", "objectiveMetricName": "val_auroc"},
            "algorithm": {"algorithmName": "random",
                          "algorithmSettings": [{"name": "random_state", "value": "7"}]}}},
        "currentRequestNumber": 3, "totalRequestNumber": 3}
    reply = grpc_in(goptuna, "suggest", "127.0.0.1:6789", str(descriptors), json.dumps(request))
    suggestions = [{a["name"]: a["value"] for a in p["assignments"]}
                   for p in reply["parameterAssignments"]]
    assert len(suggestions) == 3
    assert all(0.0001 <= float(s["lr"]) <= 0.01 and s["batch_size"] in ("16", "32")
               for s in suggestions)
    assert len({s["lr"] for s in suggestions}) == 3


@pytest.mark.realnode
def test_katib_controller_reads_katib_config_with_mpijob_trials(refs, containers, tmp_path):
    config = tmp_path / "katib-config.yaml"
    config.write_text("apiVersion: config.kubeflow.org/v1beta1\nkind: KatibConfig\n"
                      "init:\n  controller:\n    trialResources:\n      - Job.v1.batch\n"
                      "      - MPIJob.v2beta1.kubeflow.org\n")
    config.chmod(0o644)
    name = containers.run(refs["katib-controller"], "--katib-config=/katib-config.yaml",
                          options=("--network=none", "-v", f"{config}:/katib-config.yaml:ro"))
    assert podman("wait", name, timeout=60).stdout.strip() != "0"  # no cluster to reach
    lines = [json.loads(line) for line in logs(name).splitlines() if line.startswith("{")]
    (started,) = [line for line in lines if line.get("msg") == "Config:"]
    assert {"Group": "kubeflow.org", "Version": "v2beta1", "Kind": "MPIJob"} in \
        started["trial-resources"]
    assert any("unable to load in-cluster config" in line.get("msg", "") + line.get("error", "")
               for line in lines)


@pytest.mark.realnode
def test_katib_mysql_refuses_an_empty_password_in_one_line(refs):
    proc = podman("run", "--rm", "--network=none", refs["katib-mysql"], check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("katib-mysql: MYSQL_ROOT_PASSWORD is empty: set it "
                                   "(or MYSQL_ALLOW_EMPTY_PASSWORD=true)")


@pytest.mark.realnode
def test_katib_mysql_started_as_root_runs_mariadb_as_mysql_and_restarts(refs, containers,
                                                                         tmp_path):
    datadir = tmp_path / "data"
    datadir.mkdir()  # owned by root, as a fresh volume is
    name = containers.run(refs["katib-mysql"], options=(
        "--network=none", "--user=0", "-e", "MYSQL_ROOT_PASSWORD=pw",
        "-v", f"{datadir}:/var/lib/mysql"))

    def alive() -> bool:
        return podman("exec", name, "mysqladmin", "ping", "-u", "root", "-ppw",
                      check=False).returncode == 0

    wait_for("mariadbd as root", alive, name)
    assert "\nUid:\t999\t" in podman("exec", name, "cat", "/proc/1/status").stdout
    assert datadir.stat().st_uid == 999 and (datadir / "mysql").is_dir()
    assert os.stat(datadir / "mysql").st_uid == 999
    # a restart (the pod's container again, same volume) keeps the datadir and the password
    podman("restart", "-t", "10", name)
    wait_for("mariadbd after a restart", alive, name)
    assert logs(name).count("katib-mysql: initialising") == 1
