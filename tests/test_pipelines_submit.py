"""`chexflow submit` as a user runs it: a host where no Kubeflow Pipelines API answers (a closed
port, a name that does not resolve, a web server that is something else) is one line; an
unknown pipeline lists the known ones; against FakeKfpApi (a recorded-request FAKE of the KFP
API's endpoints, tests/kfp_fake.py) the run carries chexflow's service account and the
pipeline's `namespace` parameter set to --namespace unless --param says otherwise."""

from __future__ import annotations

import pytest

from chexflow.pipelines.registry import pipeline_names
from chexflow.ports import free_port
from tests.conftest import run_chexflow
from tests.kfp_fake import FakeKfpApi, NotKfp


def submit(*args, home) -> tuple[int, list[str], str]:
    """`chexflow submit ARGS`; kfp's client keeps its context in HOME/.config/kfp."""
    proc = run_chexflow("submit", *args, check=False, timeout=120, env={"HOME": str(home)})
    return proc.returncode, proc.stderr.strip().splitlines(), proc.stdout


def test_a_closed_port_is_one_line(tmp_path):
    port = free_port()
    code, err, _ = submit("chexnet-train", "--host", f"http://127.0.0.1:{port}", home=tmp_path)
    assert code == 2
    assert err == [f"chexflow submit: error: --host http://127.0.0.1:{port}: no Kubeflow "
                   "Pipelines API there: connection refused"]


def test_a_name_that_does_not_resolve_is_one_line(tmp_path):
    code, err, _ = submit("chexnet-train", "--host", "http://kfp.invalid:8888", home=tmp_path)
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith("chexflow submit: error: --host http://kfp.invalid:8888: no "
                             "Kubeflow Pipelines API there: cannot resolve its name")


def test_a_web_server_that_is_not_the_kfp_api_is_one_line(tmp_path):
    with NotKfp() as web:
        code, err, _ = submit("chexnet-train", "--host", web.url, home=tmp_path)
        assert [path for _, path, _ in web.requests] == ["/apis/v2beta1/healthz"]
    assert code == 2
    assert err == [f"chexflow submit: error: --host {web.url}: answers HTTP but is not the "
                   "Kubeflow Pipelines API (GET /apis/v2beta1/healthz: HTTP 200 OK, text/html); "
                   "give the address of its ml-pipeline service, e.g. http://localhost:8888 "
                   "after kubectl port-forward -n kubeflow svc/ml-pipeline 8888"]


def test_an_unknown_pipeline_lists_the_known_ones(tmp_path):
    code, err, _ = submit("nope", "--host", "http://127.0.0.1:1", home=tmp_path)
    assert code == 2
    assert err == [f"chexflow submit: error: pipeline nope: not one of "
                   f"{', '.join(pipeline_names())} (or give a compiled pipeline .yaml)"]


@pytest.mark.parametrize("extra, namespace", [([], "team-a"),
                                              (["--param", "namespace=jobs-b"], "jobs-b")])
def test_the_run_gets_chexflows_account_and_its_namespace_as_the_jobs_namespace(
        tmp_path, extra, namespace):
    """The run is made in --namespace with service account chexflow-launcher (mpijob/rbac.yaml),
    and the pipeline's `namespace` parameter, where its steps create the jobs, is --namespace
    too unless --param namespace=... is given."""
    with FakeKfpApi() as kfp:
        code, err, out = submit("chexnet-train", "--host", kfp.url, "--namespace", "team-a",
                                "--param", "raw_dir=/mnt/chexflow/nih", *extra, home=tmp_path)
        assert code == 0, err
        (experiment,) = kfp.posted("/apis/v2beta1/experiments")
        (run,) = kfp.posted("/apis/v2beta1/runs")
    assert experiment["namespace"] == "team-a"
    assert run["service_account"] == "chexflow-launcher"
    assert run["runtime_config"]["parameters"]["namespace"] == namespace
    assert run["runtime_config"]["parameters"]["raw_dir"] == "/mnt/chexflow/nih"
    assert f"submitted chexnet-train.yaml: run r-1  {kfp.url}/#/runs/details/r-1" in out


def test_a_parameter_the_pipeline_lacks_is_refused_before_any_request(tmp_path):
    with FakeKfpApi() as kfp:
        code, err, _ = submit("chexnet-train", "--host", kfp.url, "--param", "nope=1",
                              home=tmp_path)
        assert kfp.requests == []
    assert code == 2 and len(err) == 1
    assert err[0].startswith("chexflow submit: error: --param nope: not a parameter of "
                             "chexnet-train (its parameters: raw_dir, ")
