"""`chexflow tune --cluster` before it creates an Experiment, against a recorded-request FAKE
API server under the real kubernetes client (tests/recorded_kube_fake.py): a namespace without
Katib's label is one line with the kubectl command that adds it, and a ConfigMap trial template
on the cluster that differs from the repository's is not replaced unless asked, the refusal
shown with the diff. tests/cluster/test_cluster_tune.py does the same on a real apiserver."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from chexflow.katib.cluster.kubernetes import ClusterError, ClusterSweep, cluster_experiment
from chexflow.katib.experiment.chexnet_template import CONFIG_MAP, KEY
from chexflow.katib.experiment.spec import load_experiment
from tests.katib_configmap_specs import TEMPLATES, configmap_spec
from tests.recorded_kube_fake import RecordedRequestFakeKubeApi

LABEL = "katib.kubeflow.org/metrics-collector-injection"
REFUSED = ('admission webhook "validator.experiment.katib.kubeflow.org" denied the request: '
           'Cannot create the Experiment "x" in namespace "team-a": the namespace lacks label '
           '"katib.kubeflow.org/metrics-collector-injection: enabled"')


class FakeKatibApi(RecordedRequestFakeKubeApi):
    """Namespaces, ConfigMaps and Experiments as the apiserver (and Katib's webhook) answer."""

    def __init__(self, labels: dict | None, config_maps: dict[str, dict] | None = None,
                 webhook: str = ""):
        super().__init__()
        self.labels, self.config_maps, self.webhook = labels, config_maps or {}, webhook

    def _handle(self, method, path, query, body):
        parts = path.strip("/").split("/")
        if parts[:3] == ["api", "v1", "namespaces"] and len(parts) == 4:
            if self.labels is None:
                return 403, {"kind": "Status", "reason": "Forbidden", "message": "forbidden"}
            return 200, {"kind": "Namespace", "metadata": {"name": parts[3],
                                                           "labels": self.labels}}
        if parts[:2] == ["api", "v1"] and parts[4:5] == ["configmaps"]:
            name = parts[5] if len(parts) > 5 else body["metadata"]["name"]
            if method == "GET":
                if name not in self.config_maps:
                    return 404, {"kind": "Status", "reason": "NotFound", "message": "not found"}
                return 200, {"kind": "ConfigMap", "metadata": {"name": name},
                             "data": self.config_maps[name]}
            data = self.config_maps.setdefault(name, {})
            data.update(body["data"])
            return 200, {"kind": "ConfigMap", "metadata": {"name": name}, "data": data}
        if "experiments" in parts:
            if method == "GET":
                return 404, {"kind": "Status", "reason": "NotFound", "message": "not found"}
            if self.webhook:
                return 400, {"kind": "Status", "reason": "BadRequest", "message": self.webhook}
            return 201, body
        return super()._handle(method, path, query, body)

    def sent(self, method: str) -> list[str]:
        return [r.path for r in self.requests if r.method == method]


def sweep(fake: FakeKatibApi, spec: Path, lines: list[str], update: bool = False) -> ClusterSweep:
    exp = cluster_experiment(load_experiment(spec), "team-a", [], {})
    return ClusterSweep(exp, spec.parent / "state", 10, 0.1, lines.append, fake.api_client(),
                        update_templates=update)


def shipped_data() -> dict[str, str]:
    (config_map,) = [d for d in yaml.safe_load_all(TEMPLATES.read_text()) if d]
    return config_map["data"]


@pytest.mark.parametrize("labels", [{}, {LABEL: "disabled"}])
def test_a_namespace_without_katibs_label_is_one_line_with_the_command_and_nothing_is_written(
        tmp_path, labels):
    fake = FakeKatibApi(labels)
    spec = configmap_spec("chexnet-random", tmp_path, namespace="team-a")
    with pytest.raises(ClusterError) as err:
        sweep(fake, spec, []).create(dry_run=False)
    assert str(err.value) == (
        f"namespace team-a lacks the label {LABEL}: enabled, without which Katib refuses an "
        f"Experiment there: kubectl label namespace team-a {LABEL}=enabled")
    assert fake.sent("POST") == [] and fake.sent("PATCH") == []


def test_katibs_refusal_for_the_label_is_the_same_line_where_namespaces_cannot_be_read(
        tmp_path):
    """The tune step's account (katib/rbac.yaml) may not read Namespaces: Katib's webhook
    refusal is passed on as the same line."""
    fake = FakeKatibApi(None, webhook=REFUSED)
    spec = configmap_spec("chexnet-random", tmp_path, namespace="team-a")
    with pytest.raises(ClusterError) as err:
        sweep(fake, spec, []).create(dry_run=False)
    assert str(err.value).startswith("namespace team-a lacks the label ")
    assert str(err.value).endswith(f": kubectl label namespace team-a {LABEL}=enabled")


def test_a_configmap_template_that_differs_on_the_cluster_is_refused_with_its_diff(tmp_path):
    """Another Experiment may read the cluster's template: it is not replaced unless
    --update-templates; the refusal is one line naming the key, after the unified diff."""
    ours = shipped_data()
    theirs = copy.deepcopy(ours)
    epochs = "- --epochs\n            - '{}'"
    theirs[KEY] = ours[KEY].replace(epochs.format(5), epochs.format(7))
    assert theirs[KEY] != ours[KEY]
    fake = FakeKatibApi({LABEL: "enabled"}, {CONFIG_MAP: copy.deepcopy(theirs)})
    spec = configmap_spec("chexnet-random", tmp_path, namespace="team-a")
    lines: list[str] = []
    with pytest.raises(ClusterError) as err:
        sweep(fake, spec, lines).create(dry_run=False)
    where = f"ConfigMap team-a/{CONFIG_MAP}"
    assert str(err.value) == (
        f"{where}: {KEY} on the cluster differs from {tmp_path / 'trial-templates.yaml'} (the "
        "diff above) and other Experiments may read it: rerun with --update-templates to "
        "replace it with the file's, or apply the file yourself")
    assert lines[:2] == [f"--- {where}: {KEY} (on the cluster)",
                         f"+++ {tmp_path / 'trial-templates.yaml'}: {KEY}"]
    assert "-            - '7'" in lines and "+            - '5'" in lines
    assert fake.sent("PATCH") == [] and fake.sent("POST") == []
    assert fake.config_maps[CONFIG_MAP] == theirs

    lines = []
    assert sweep(fake, spec, lines, update=True).create(dry_run=False) is None
    assert fake.config_maps[CONFIG_MAP] == ours
    assert f"{where}: updated from {tmp_path / 'trial-templates.yaml'} (the trial template " \
           "Katib reads)" in lines
    assert len(fake.sent("POST")) == 1  # the Experiment


def test_keys_the_cluster_lacks_are_added_without_asking(tmp_path):
    """Adding a template replaces nothing: a ConfigMap of an older chexflow gets the new keys;
    its own keys stay."""
    ours = shipped_data()
    fake = FakeKatibApi({LABEL: "enabled"}, {CONFIG_MAP: {KEY: ours[KEY], "mine.yaml": "kept"}})
    spec = configmap_spec("chexnet-random", tmp_path, namespace="team-a")
    lines: list[str] = []
    assert sweep(fake, spec, lines).create(dry_run=False) is None
    assert fake.config_maps[CONFIG_MAP] == {**ours, "mine.yaml": "kept"}


def test_a_spec_naming_no_namespace_goes_where_kubectl_would_put_it(tmp_path, monkeypatch):
    """The shipped specs name no namespace: without --namespace, tune --cluster uses the
    kubeconfig context's, as `kubectl apply -f` does, else `default`."""
    from chexflow.katib.cluster.kubernetes import current_namespace

    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    config = tmp_path / "kubeconfig"
    config.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": "https://10.1.2.3:6443"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u",
                                               "namespace": "team-z"}}]}))
    monkeypatch.setenv("KUBECONFIG", str(config))
    assert current_namespace() == "team-z"
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "none"))
    assert current_namespace() == "default"
