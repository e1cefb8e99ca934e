"""Shared fixtures. Tests run in the one local environment (.venv: kfp, TensorFlow, Horovod);
training runs through the `chexflow` CLI in processes of their own, as a user's would."""

from __future__ import annotations

import json
import os
import resource
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
CHEXFLOW = [sys.executable, "-m", "chexflow.cli"]
CLUSTER_GROUPS = ("cluster", "katib")  # xdist groups of tests/cluster, one worker each

# The images every command names come from `chexflow images push`'s references file when there
# is one (chexflow.container_images); a user's pushes must not reach the tests (the committed
# artefacts are checked against the placeholders), and a test that pushes names its own file.
os.environ["CHEXFLOW_IMAGES_FILE"] = str(REPO / ".cache" / "no-pushed-images.json")

# A suite started in the background by a non-interactive shell (`make test &`) inherits SIGINT
# ignored, and so would every command the tests start: the Ctrl-C tests need it delivered.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """For pytest-xdist's `--dist loadgroup` (`make test`: -n 2): the cluster tests are two
    groups, each run in order by one worker against its own cluster: `katib` (tests/cluster's
    Katib modules: the Katib cluster, the machine's one kube-proxy) and `cluster` (the others:
    the k8s cluster with real pods, the kwok-only clusters). They share no fixture and no
    machine-wide resource, and mostly wait on pods and controllers, so the two run side by side
    (one group of both was the whole critical path: 2451 s of a 41.8 min run). Local tests go
    by module, and the modules sharing the trained DenseNet by fixture, so no module or session
    fixture is built twice."""
    if not config.getoption("loadgroup", False):  # set by xdist on its workers
        return
    groups = {}
    for item in items:
        path = Path(item.path).relative_to(REPO)
        if path.parts[:2] == ("tests", "cluster"):
            group = "katib" if "katib" in path.stem else "cluster"
        elif {"demo_run", "densenet_run", "densenet_eval"} & set(item.fixturenames):
            group = "densenet"
        else:
            group = path.stem
        item.add_marker(pytest.mark.xdist_group(group))
        groups[item] = group
    # Longest group first (`make test` passes --no-loadscope-reorder, so xdist hands the groups
    # out in this order): the cluster group, then the local groups by their seconds in the last
    # recorded run, else by a guess from their markers (the cluster groups always lead).
    # xdist's own order (most tests first)
    # left the few long tests (the demo's seeds, the bench) for the end, one worker idle.
    recorded = _recorded_group_seconds()
    guess: dict[str, float] = {}
    for item, group in groups.items():
        guess[group] = guess.get(group, 0.0) + (
            60 if item.get_closest_marker("slow") else 15 if item.get_closest_marker("trainer")
            else 1)
    weight = {g: (float("inf") if g in CLUSTER_GROUPS else recorded.get(g, guess[g]))
              for g in guess}
    items.sort(key=lambda item: -weight[groups[item]])


def _group_seconds_file() -> Path | None:
    """Where `make test` keeps each xdist group's seconds ($CHEXFLOW_GROUP_SECONDS)."""
    name = os.environ.get("CHEXFLOW_GROUP_SECONDS")
    return REPO / name if name else None


def _recorded_group_seconds() -> dict[str, float]:
    path = _group_seconds_file()
    try:
        return {k: float(v) for k, v in json.loads(path.read_text()).items()} if path else {}
    except (OSError, ValueError, AttributeError):
        return {}  # none yet, or not a table: the markers' guess orders the groups


def _cpu_seconds() -> tuple[float, float]:
    """The machine's (busy, idle) CPU seconds since boot, from /proc/stat (iowait is idle)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    user, nice, system, idle, iowait, irq, softirq, steal = fields
    tick = os.sysconf("SC_CLK_TCK")
    return (user + nice + system + irq + softirq + steal) / tick, (idle + iowait) / tick


_CPU_AT_START = pytest.StashKey[tuple[float, float]]()


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[_CPU_AT_START] = _cpu_seconds()


_CPU_MARK = pytest.StashKey[float]()


def _own_cpu() -> float:
    """CPU seconds of this pytest process and of the children it has waited for (the chexflow
    commands and training ranks a local test starts; not a cluster's controllers or pods)."""
    return sum(r.ru_utime + r.ru_stime for r in (resource.getrusage(resource.RUSAGE_SELF),
                                                 resource.getrusage(resource.RUSAGE_CHILDREN)))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    item.stash[_CPU_MARK] = _own_cpu()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call):
    """Each phase's CPU seconds (setup, call, teardown) as the report's `cpu_seconds` property:
    the terminal summary ranks tests by them (a session fixture's cost lands on its first user)."""
    report = (yield).get_result()
    if _CPU_MARK in item.stash:
        now = _own_cpu()
        report.user_properties.append(("cpu_seconds", now - item.stash[_CPU_MARK]))
        item.stash[_CPU_MARK] = now


def _cpu_by_test(terminalreporter, shown: int = 25) -> None:
    """The tests that used the most CPU (their own processes'), and all tests' sum."""
    cpu: dict[str, float] = {}
    for reports in terminalreporter.stats.values():
        for rep in reports:
            for name, value in getattr(rep, "user_properties", ()):
                if name == "cpu_seconds" and isinstance(rep, pytest.TestReport):
                    cpu[rep.nodeid] = cpu.get(rep.nodeid, 0.0) + value
    if not cpu:
        return
    terminalreporter.section("CPU by test (its own processes; cluster controllers not counted)")
    for nodeid, seconds in sorted(cpu.items(), key=lambda kv: -kv[1])[:shown]:
        terminalreporter.write_line(f"{seconds:8.1f} s  {nodeid}")
    terminalreporter.write_line(f"{sum(cpu.values()):8.1f} s  all {len(cpu)} tests")


def _cpu_use(terminalreporter, config: pytest.Config) -> None:
    """How busy the machine's cores were over the run: near 100% means the suite is CPU-bound
    (only removing work shortens it); idle cores mean tests wait, and more workers would help."""
    if _CPU_AT_START not in config.stash or hasattr(config, "workerinput"):
        return
    (busy0, idle0), (busy1, idle1) = config.stash[_CPU_AT_START], _cpu_seconds()
    busy, idle = busy1 - busy0, idle1 - idle0
    if busy + idle > 0:
        terminalreporter.write_line(
            f"{busy:8.1f} s  CPU busy of {busy + idle:.1f} core-seconds over the run "
            f"({100 * busy / (busy + idle):.0f}% of {os.cpu_count()} cores; the whole machine)")


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    """After pytest's slowest tests: each xdist group's time and each worker's (so the critical
    path shows), then how long each phase of `make test`'s setup took (images/phase.sh writes
    them to $CHEXFLOW_SETUP_TIMES), so a cold run shows where its minutes went."""
    _group_times(terminalreporter)
    _cpu_use(terminalreporter, config)
    _cpu_by_test(terminalreporter)
    path = Path(os.environ.get("CHEXFLOW_SETUP_TIMES", ""))
    if not path.name or not path.is_file():
        return
    rows = [line.split("\t") for line in path.read_text().splitlines()
            if line.count("\t") in (2, 3, 4)]
    terminalreporter.section("setup phases (make test)")
    for name, seconds, code, *rest in rows:
        failed = "" if code == "0" else f"  (exit {code})"
        # the machine's busy core-seconds meanwhile (phases side by side share them)
        busy = f"  ({float(rest[1]):.0f} core-s busy)" if len(rest) > 1 else ""
        terminalreporter.write_line(f"{float(seconds):8.1f} s  {name}{busy}{failed}")
    terminalreporter.write_line(f"{_setup_wall(rows):8.1f} s  setup in all (wall clock)")


def _setup_wall(rows: list[list[str]]) -> float:
    """First phase's start to last phase's end (phases run side by side); the sum of the
    phases for rows written without their start."""
    if not rows or any(len(r) < 4 for r in rows):
        return sum(float(r[1]) for r in rows)
    spans = [(float(r[3]), float(r[3]) + float(r[1])) for r in rows]
    return max(end for _, end in spans) - min(start for start, _ in spans)


def _group_times(terminalreporter, shown: int = 12) -> None:
    """Setup, call and teardown seconds summed by xdist group (the `@group` of each node id
    under --dist loadgroup) and by worker; nothing without xdist."""
    groups: dict[str, tuple[list[float], set[str]]] = {}
    workers: dict[str, float] = {}
    span: dict[str, list[float]] = {}
    for reports in terminalreporter.stats.values():
        for rep in reports:
            node = getattr(rep, "node", None)
            if not isinstance(rep, pytest.TestReport) or node is None or "@" not in rep.nodeid:
                continue
            seconds, ids = groups.setdefault(rep.nodeid.rsplit("@", 1)[1], ([0.0], set()))
            seconds[0] += rep.duration
            ids.add(rep.nodeid)
            worker = node.gateway.id
            workers[worker] = workers.get(worker, 0.0) + rep.duration
            if rep.start:
                first, last = span.setdefault(worker, [rep.start, rep.stop])
                span[worker] = [min(first, rep.start), max(last, rep.stop)]
    if not groups:
        return
    if path := _group_seconds_file():  # the next `make test` hands out the longest first
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({**_recorded_group_seconds(),
                                    **{g: round(s[0], 1) for g, (s, _) in groups.items()}},
                                   indent=1, sort_keys=True) + "\n")
    terminalreporter.section("time by xdist group")
    ranked = sorted(((s[0], name, len(ids)) for name, (s, ids) in groups.items()), reverse=True)
    for seconds, name, tests in ranked[:shown]:
        terminalreporter.write_line(f"{seconds:8.1f} s  {name} ({tests} tests)")
    if rest := ranked[shown:]:
        terminalreporter.write_line(f"{sum(r[0] for r in rest):8.1f} s  {len(rest)} other groups "
                                    f"({sum(r[2] for r in rest)} tests)")
    for worker, seconds in sorted(workers.items()):
        first, last = span.get(worker, (0.0, 0.0))
        terminalreporter.write_line(f"{seconds:8.1f} s  busy on {worker}, first test start to "
                                    f"last test end {last - first:.1f} s")


def run_chexflow(*args, check: bool = True, timeout: float = 900, env: dict | None = None,
                 cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run `chexflow ARGS...` as a user would; output is captured and shown on failure."""
    full_env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})}
    proc = subprocess.run(
        [*CHEXFLOW, *map(str, args)], capture_output=True, text=True, timeout=timeout,
        env=full_env, cwd=cwd,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"chexflow {' '.join(map(str, args))} exited {proc.returncode}\n"
            f"--- stdout ---\n{proc.stdout[-6000:]}\n--- stderr ---\n{proc.stderr[-6000:]}"
        )
    return proc


@pytest.fixture(scope="session")
def nih_raw(tmp_path_factory) -> Path:
    """A generated NIH-format dataset: 400 images of 64 px (Data_Entry_2017.csv + images/)."""
    out = tmp_path_factory.mktemp("nih-raw")
    run_chexflow("data", "synth", "--out", out, "--images", 400, "--size", 64, "--seed", 1)
    return out


@pytest.fixture(scope="session")
def nih_tfrecords(nih_raw: Path, tmp_path_factory) -> Path:
    """nih_raw preprocessed into 64 px TFRecords (70/10/20 by patient)."""
    out = tmp_path_factory.mktemp("nih-tfr") / "data"
    run_chexflow(
        "preprocess", "--csv", nih_raw / "Data_Entry_2017.csv", "--images", nih_raw / "images",
        "--out", out, "--image-size", 64, "--workers", 2, "--images-per-shard", 64,
    )
    return out


def read_json(path: Path) -> dict:
    return json.loads(Path(path).read_text())


def demo_recipe(out) -> list[str]:
    """The demo target's own command, as make would run it with DEMO_OUT=out (`make -n`
    prints the setup recipes first and the demo's last; run from `make test`, the outer make's
    flags are left out so no "Entering/Leaving directory" lines are printed)."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    proc = subprocess.run(["make", "--no-print-directory", "-n", "demo", f"DEMO_OUT={out}"],
                          cwd=REPO, capture_output=True, text=True, check=True, env=env)
    return shlex.split(proc.stdout.strip().splitlines()[-1])


def run_demo(argv: list[str], out: Path) -> tuple[dict, str]:
    """Run a demo command line; (its summary.json, its stdout)."""
    started = time.monotonic()
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=2400)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    (run_dir,) = out.glob("chexnet-train-*")
    summary = json.loads((run_dir / "summary.json").read_text())
    summary["test_wall_seconds"] = time.monotonic() - started
    return summary, proc.stdout


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory) -> tuple[dict, str, Path]:
    """What `make demo` runs once set up (seed 0), run once: (its summary.json, its stdout, its
    --out). Its training and evaluation are also the suite's trained DenseNet-121."""
    out = tmp_path_factory.mktemp("demo") / "demo"
    summary, stdout = run_demo(demo_recipe(out), out)
    return summary, stdout, out


@pytest.fixture(scope="session")
def densenet_run(demo_run) -> Path:
    """The demo's `chexflow train` folder (metrics.json, best_model.keras, ...): DenseNet-121,
    2 Horovod workers, 6 epochs on 400 generated 64 px images."""
    (run,) = Path(demo_run[0]["work_dir"]).glob("*/train-w2")
    return run


@pytest.fixture(scope="session")
def densenet_eval(demo_run) -> Path:
    """The demo's `chexflow evaluate` of densenet_run on the test split (auroc.json, roc.png,
    ...)."""
    (evaluation,) = Path(demo_run[0]["work_dir"]).glob("*/evaluate")
    return evaluation
