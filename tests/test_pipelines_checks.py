"""`chexflow run` checks every value it takes before any step starts, by the steps' own rules
(chexflow.pipelines.checks over chexflow.components.steps.STEP_CHECKS): a value a step would
refuse minutes into the run is one line at once, and nothing is written or started."""

from __future__ import annotations

import contextlib
import io
import json
import math
import signal
import subprocess
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chexflow import cli
from chexflow.components import definitions
from chexflow.pipelines.commands import NOT_RUN_OPTIONS
from chexflow.pipelines.registry import pipeline_names, pipeline_parameters, run_defaults
from tests.conftest import CHEXFLOW, REPO

SPEC = REPO / "katib" / "specs" / "chexnet-random.yaml"

# (argv after `run`, the one line it gets): each value a step refused only once it ran
REFUSED = [
    (("--lr", "1e99"), "--lr 1e+99: must be <= 10.0"),
    (("--epochs", "-1"), "--epochs -1: must be >= 1"),
    (("--workers", "0"), "job 'train-w0': workers must be >= 1, got 0"),
    (("--model", "vgg16"), "--model 'vgg16': expected one of densenet121, resnet50"),
    (("--image-size", "7"), "--image-size 7: expected a whole number from 8 to 4096"),
    (("--batch-size", "0"), "--batch-size 0: must be >= 1"),
    (("--bootstrap", "-5"), "--bootstrap -5: must be >= 0"),
    (("--node-selector", "[1,2]"), '--node-selector [1,2]: expected a JSON object, e.g. '
                                   '{"key": "value"}'),
    (("scaling-study", "--worker-counts", "a,b"), '--worker-counts item "a": expected an '
                                                  "integer"),
    (("tune-then-train", "--katib-spec", "no-such-spec.yaml"),
     "{cwd}/no-such-spec.yaml: no such file (tune-op's spec_path from --katib-spec)"),
]


def _cli(argv: list[str]) -> tuple[int, str, str]:
    """`chexflow ARGV` in this process: (exit status, stdout, stderr)."""
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = cli.main(argv)
    return code, stdout.getvalue(), stderr.getvalue()


@pytest.mark.parametrize(("argv", "line"), REFUSED)
def test_each_value_a_step_refused_late_is_one_line_before_anything_starts(
        argv, line, tmp_path, monkeypatch):
    """Real runs, not dry ones: each is refused before its run folder or data exist."""
    monkeypatch.chdir(tmp_path)
    code, _, stderr = _cli(["run", *argv, "--out", str(tmp_path / "runs")])
    assert (code, stderr.splitlines()) == (
        2, [f"chexflow run: error: {line.replace('{cwd}', str(tmp_path))}"])
    assert list(tmp_path.iterdir()) == []


def test_values_that_were_tracebacks_are_one_line_from_the_command(tmp_path):
    """The same, as a user runs it: `chexflow run` in a process of its own."""
    procs = [subprocess.Popen([*CHEXFLOW, "run", *argv, "--out", str(tmp_path / f"out{i}")],
                              text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for i, (argv, _) in enumerate(REFUSED) if argv[0] in ("--lr", "--node-selector",
                                                                  "scaling-study")]
    lines = [line for argv, line in REFUSED if argv[0] in ("--lr", "--node-selector",
                                                            "scaling-study")]
    for proc, line in zip(procs, lines, strict=True):
        _, stderr = proc.communicate(timeout=300)
        assert (proc.returncode, stderr.splitlines()) == (2, [f"chexflow run: error: {line}"])
    assert list(tmp_path.iterdir()) == []


def test_the_train_step_checks_its_tuned_options_before_its_job(tmp_path):
    """Tuned values arrive only as the run goes: the step checks them before it starts its job
    (the worker refused them after starting, 19 s in)."""
    from chexflow.components.steps import Target, apply_hparams, train_step
    from chexflow.errors import ChexflowError
    from chexflow.train.options import TrainOptions

    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "manifest.json").write_text("{}")
    options = apply_hparams(TrainOptions(), json.dumps({"lr": 1e99}))
    with pytest.raises(ChexflowError, match=r"^--lr 1e\+99: must be <= 10.0$"):
        train_step(str(tmp_path / "data"), 1, options, Target(workdir=str(tmp_path / "w")))
    assert not (tmp_path / "w").exists()


def test_every_component_with_pipeline_inputs_has_its_check():
    from chexflow.components.steps import STEP_CHECKS

    unchecked = {"report_op", "scaling_report_op"}  # only earlier steps' outputs and a title
    ops = {name for name in vars(definitions) if name.endswith("_op")}
    assert ops == set(STEP_CHECKS) | unchecked


def test_dry_run_prints_the_checked_arguments_and_writes_nothing(tmp_path):
    out = tmp_path / "runs"
    proc = subprocess.run([*CHEXFLOW, "run", "tune-then-train", "--katib-spec", str(SPEC),
                           "--lr", "0.01", "--param", "tolerations=[]", "--dry-run", "--out",
                           str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    head, _, body = proc.stdout.partition("\n")
    assert head.startswith("run: tune-then-train: every parameter checked")
    shown = json.loads(body)
    assert (shown["lr"], shown["katib_spec"], shown["epochs"]) == (0.01, str(SPEC), 1)
    assert shown["raw_dir"].startswith(f"{out}/synth-data-64px-seed0")
    assert not out.exists()


# ---------------------------------------------------------------- run folders of their own


def test_a_run_started_in_the_second_of_another_gets_a_folder_of_its_own(tmp_path, nih_raw):
    """Two runs into one --out in one second: the second once took the first's folder name and
    failed ("choose a folder you can write"). The folders of the next ten minutes already there
    stand for the runs that started in the same second."""
    out = tmp_path / "runs"
    now = time.time()
    for s in range(600):
        stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now + s))
        (out / f"chexnet-train-{stamp}").mkdir(parents=True)
    proc = subprocess.Popen([*CHEXFLOW, "run", "--data", str(nih_raw), "--out", str(out)],
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        lines = iter(proc.stdout.readline, "")
        line = next((x for x in lines if " locally (kfp.local, " in x), "")
        assert line, proc.stderr.read()
        run_dir = Path(line.rsplit(" in ", 1)[1].strip())
        assert run_dir.parent == out and run_dir.name.endswith("-2"), run_dir
        assert not any((out / run_dir.name.removesuffix("-2")).iterdir())  # the other's intact
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=120)


def _allocate(parent: str, count: int) -> list[str]:
    from chexflow.folders import new_folder

    return [new_folder(Path(parent), "chexnet-train-20261201-120000").name
            for _ in range(count)]


def test_run_folders_made_by_two_processes_at_once_are_distinct(tmp_path):
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(2) as pool:
        made = [f.result() for f in [pool.submit(_allocate, str(tmp_path), 25) for _ in "ab"]]
    names = made[0] + made[1]
    assert len(set(names)) == 50 == len(list(tmp_path.iterdir()))


# ---------------------------------------------------------------- the property

# chexflow run's pipeline parameters, by pipeline: name -> annotation
PARAMS = {p: {q.name: q.type for q in pipeline_parameters(p) if q.name not in NOT_RUN_OPTIONS}
          for p in pipeline_names()}
GARBAGE = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
                  max_size=12)
JSON = st.recursive(st.none() | st.booleans() | st.integers(-10**20, 10**20)
                    | st.floats(allow_nan=False) | GARBAGE,
                    lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(GARBAGE, inner, max_size=3), max_leaves=6)
NUMBERS = (st.integers(-10**25, 10**25).map(str)
           | st.floats().map(repr)
           | st.sampled_from(["nan", "inf", "-inf", "1e99", "-0", "0", "1", "2**31", "1_000"]))


def _option_text(typ: str, default) -> st.SearchStrategy[str]:
    """What a user might type for a parameter of annotation TYP: its default, numbers in and
    out of range, garbage, and JSON of any shape."""
    valid = st.just(",".join(map(str, default)) if isinstance(default, list)
                    else json.dumps(default) if isinstance(default, dict)
                    else str(default).lower() if isinstance(default, bool) else str(default))
    shaped = JSON.map(json.dumps)
    if typ in ("int", "float"):
        return valid | NUMBERS | GARBAGE
    if typ == "list":
        return valid | st.lists(NUMBERS | GARBAGE, max_size=3).map(",".join) | shaped
    return valid | GARBAGE | shaped | NUMBERS


@st.composite
def run_argv(draw) -> tuple[str, list[str]]:
    pipeline = draw(st.sampled_from(sorted(PARAMS)))
    defaults = run_defaults(pipeline)
    names = draw(st.lists(st.sampled_from(sorted(PARAMS[pipeline])), max_size=4, unique=True))
    argv = ["run", pipeline, "--dry-run"]
    if pipeline == "tune-then-train" and "katib_spec" not in names and draw(st.booleans()):
        argv.append(f"--katib-spec={SPEC}")
    for name in names:
        typ = PARAMS[pipeline][name]
        if draw(st.booleans()):
            text = draw(_option_text(typ, defaults.get(name, "")))
            argv.append(f"--{name.replace('_', '-')}={text}")
        else:
            argv += ["--param", f"{name}={draw(JSON.map(json.dumps) | GARBAGE)}"]
    return pipeline, argv


@pytest.fixture(scope="module")
def out_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("property")


@pytest.mark.slow
@settings(max_examples=150, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(drawn=run_argv())
def test_run_refuses_in_one_line_or_accepts_any_value_before_a_step_runs(drawn, out_root):
    """The CLI itself (`chexflow run ... --dry-run`, in this process): a refusal is exit 2 and
    one line `chexflow run: error: ...`; an acceptance prints the arguments the pipeline would
    get; either way nothing is written (no run folder, no data)."""
    pipeline, argv = drawn
    out = out_root / "runs"
    code, stdout, stderr = _cli([*argv, f"--out={out}"])
    assert not out.exists()
    if code == 2:
        lines = stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("chexflow run: error: "), lines
        return
    assert code == 0 and stderr == "", stderr
    shown = json.loads(stdout.partition("\n")[2])
    assert set(PARAMS[pipeline]) <= set(shown)  # every parameter, with its value
    for name, value in shown.items():  # numbers the pipeline gets are finite
        assert not (isinstance(value, float) and not math.isfinite(value)), (name, value)

