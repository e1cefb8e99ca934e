"""Katib's Suggestion and EarlyStopping gRPC services (api.v1.beta1) with chexflow's code.

Katib runs its Python algorithms (hyperopt, optuna, scikit-optimize) in suggestion images of its
own; chexflow serves the same libraries through the same suggesters its local runner uses
(chexflow/katib/suggestions), so a spec's grid, multivariate-tpe or bayesianoptimization runs on
a cluster too.
katib-config's `runtime.suggestions` names the launcher image with `chexflow katib-suggestion`
for those algorithms; Katib's suggestion controller then starts one per Experiment, waits for
grpc.health.v1 to report `manager.v1beta1.Suggestion` SERVING on port 6789, calls
ValidateAlgorithmSettings once and GetSuggestions each time it needs trials, with the
Experiment's spec and every Trial so far (their assignments and observed objective).

The EarlyStopping service is medianstop (earlystopping/medianstop.py, Katib's semantics), in the
`earlystopping` image (the launcher's, whose entrypoint is `chexflow katib-earlystopping`:
katib-config gives an early-stopping service an image and nothing else). Katib starts it beside the
suggestion, on port 6788, and asks it for the rule when it creates trials: the mean of the Succeeded
trials' averages over their first start_step objective reports, read from katib-db-manager. The
trial's metrics collector checks the rule; when it fires, it ends the trial's process and calls
SetTrialStatus, which adds the EarlyStopped condition to the Trial (the pod's service account: Katib
gives it a Role for that) in the pod's namespace.

As in Katib's services, the trials are the history, and nothing else is kept between calls: each
GetSuggestions rebuilds the library's study from the request's trials, seeded from the
Experiment's name (or random_state) and the number of trials, and grid ids come from the
assignments (suggestions/), so a restarted service (a replaced suggestion pod) answers as the old
one would have: no point repeated, none forgotten. The served algorithms need no study-level
state; cmaes and sobol, which do, are Katib's goptuna's on the cluster (suggestions/algorithms.py).

The API's messages come from the kubeflow-katib wheel's `katib_api_pb2` (Katib's api.proto),
loaded by path: the package's own `__init__` needs the Katib SDK's dependencies, which the
control environment does not install.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import threading
import zlib
from concurrent import futures
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

from chexflow.errors import ChexflowError
from chexflow.katib.earlystopping.medianstop import median_rule, validate_early_stopping
from chexflow.katib.experiment.model import Collector, Experiment, Objective, format_value
from chexflow.katib.experiment.spec import SpecError, parse_parameters
from chexflow.katib.suggestions.algorithms import CHEXFLOW, served_on_dev_cluster
from chexflow.katib.suggestions.base import History, SearchSpaceExhausted, SuggestionFailed
from chexflow.katib.suggestions.libraries import make_suggester
from chexflow.katib.suggestions.validation import validate_algorithm
from chexflow.kube import load_api_client

PORT = 6789
EARLY_STOPPING_PORT = 6788
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
# the service name Katib's gRPC probes ask for (consts.DefaultGRPCService)
# the algorithms this service serves (katib-config lists it for them on the dev cluster)
SERVED = served_on_dev_cluster(CHEXFLOW)
HEALTH_SERVICE = "manager.v1beta1.Suggestion"
API = "api.v1.beta1"
PARAMETER_TYPES = {"DOUBLE": "double", "INT": "int", "DISCRETE": "discrete",
                   "CATEGORICAL": "categorical"}
DISTRIBUTIONS = {"UNIFORM": "uniform", "LOG_UNIFORM": "logUniform", "NORMAL": "normal",
                 "LOG_NORMAL": "logNormal"}
ACTIVE = ("CREATED", "RUNNING", "UNKNOWN")
WITH_RESULT = ("SUCCEEDED", "EARLYSTOPPED")
log = logging.getLogger("chexflow.katib.services.server")


class ServiceError(ChexflowError):
    """Katib's API messages are not installed, or the service cannot start."""


@cache
def api() -> ModuleType:
    """katib_api_pb2 from the installed kubeflow-katib wheel (images/install-control.sh)."""
    spec = importlib.util.find_spec("kubeflow")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = Path(folder) / "katib" / "katib_api_pb2.py"
        if path.is_file():
            module_spec = importlib.util.spec_from_file_location("katib_api_pb2", path)
            module = importlib.util.module_from_spec(module_spec)
            module_spec.loader.exec_module(module)
            return module
    raise ServiceError("Katib's API messages are missing: install kubeflow-katib==0.19.0 "
                       "without its dependencies (images/install-control.sh does)")


def experiment(msg: Any) -> Experiment:
    """The Experiment model of an api.v1.beta1.Experiment (what Katib sends)."""
    pb, spec = api(), msg.spec
    items = []
    for p in spec.parameter_specs.parameters:
        fs = p.feasible_space
        space: dict[str, Any] = {k: getattr(fs, k) for k in ("min", "max", "step")
                                 if getattr(fs, k)}
        if fs.list:
            space["list"] = list(fs.list)
        dist = pb.Distribution.Name(fs.distribution)
        if dist in DISTRIBUTIONS:
            space["distribution"] = DISTRIBUTIONS[dist]
        items.append({"name": p.name, "feasibleSpace": space, "parameterType":
                      PARAMETER_TYPES.get(pb.ParameterType.Name(p.parameter_type))})
    obj = spec.objective
    objective = Objective(
        type="maximize" if obj.type == pb.MAXIMIZE else "minimize",
        metric=obj.objective_metric_name, goal=None,
        additional=list(obj.additional_metric_names), strategies={})
    return Experiment(
        name=msg.name, namespace="", objective=objective,
        algorithm=spec.algorithm.algorithm_name,
        algorithm_settings={s.name: s.value for s in spec.algorithm.algorithm_settings},
        early_stopping=spec.early_stopping.algorithm_name or None,
        early_stopping_settings={s.name: s.value
                                 for s in spec.early_stopping.algorithm_settings},
        parallel_trial_count=spec.parallel_trial_count or 3,
        max_trial_count=spec.max_trial_count or None, max_failed_trial_count=None,
        parameters=parse_parameters(items, source=f"experiment {msg.name}"),
        trial_template={}, collector=Collector(), raw={})


class SuggestionService:
    """GetSuggestions and ValidateAlgorithmSettings of Katib's Suggestion API."""

    def history(self, exp: Experiment, trials: list[Any]) -> list[History]:
        """Katib's trials as the suggesters' history, in start order."""
        pb = api()
        known = {p.name: p for p in exp.parameters}
        out = []
        for t in sorted(trials, key=lambda t: (t.status.start_time, t.name)):
            params = {a.name: known[a.name].typed(a.value)
                      for a in t.spec.parameter_assignments.assignments if a.name in known}
            condition = pb.TrialStatus.TrialConditionType.Name(t.status.condition)
            objective = None
            if condition in WITH_RESULT:
                values = {m.name: m.value for m in t.status.observation.metrics}
                try:
                    objective = float(values[exp.objective.metric])
                except (KeyError, ValueError):
                    objective = None
            out.append(History(params, objective, condition in ACTIVE))
        return out

    def GetSuggestions(self, request: Any, context: Any) -> Any:  # noqa: N802 (gRPC's name)
        import grpc

        pb = api()
        try:
            exp = experiment(request.experiment)
        except SpecError as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        seed = zlib.crc32(exp.name.encode())  # random_state in the settings overrides it
        # points Katib gave whose Trials it has not listed yet (a slow or restarted controller
        # asks again first): the same history must not give them again, so the seed moves on
        given = request.total_request_number - request.current_request_number
        if (missing := given - len(request.trials)) > 0:
            settings = dict(exp.algorithm_settings)
            seed = int(settings.pop("random_state", seed)) + missing
            exp = dataclasses.replace(exp, algorithm_settings=settings)
        try:
            suggestions = make_suggester(exp, seed).suggest(
                self.history(exp, list(request.trials)), request.current_request_number)
        except SearchSpaceExhausted as e:
            context.abort(grpc.StatusCode.OUT_OF_RANGE, f"search space exhausted: {e}")
        except SuggestionFailed as e:
            context.abort(grpc.StatusCode.INTERNAL, str(e))
        log.info("%s: %d suggestion(s) after %d trial(s)", exp.name, len(suggestions),
                 len(request.trials))
        reply = pb.GetSuggestionsReply()
        for s in suggestions:
            assignments = reply.parameter_assignments.add()
            for name, value in s.parameters.items():
                assignments.assignments.add(name=name, value=format_value(exp.parameter(name),
                                                                          value))
        return reply

    def ValidateAlgorithmSettings(self, request: Any, context: Any) -> Any:  # noqa: N802
        import grpc

        try:
            exp = experiment(request.experiment)
        except SpecError as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        if exp.algorithm not in SERVED:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"unknown algorithm name {exp.algorithm} (this service runs "
                          f"{', '.join(SERVED)})")
        problems = validate_algorithm(exp)
        if problems:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          "; ".join(f"{path}: {msg}" for path, msg in problems))
        return api().ValidateAlgorithmSettingsReply()


class EarlyStoppingService:
    """medianstop: GetEarlyStoppingRules, SetTrialStatus, ValidateEarlyStoppingSettings."""

    def __init__(self, namespace: str | None = None, api_client: Any = None) -> None:
        self.namespace = namespace
        self.api_client = api_client
        # experiment -> Succeeded trial -> its objective reports, in order (from db-manager)
        self.logs: dict[str, dict[str, list[float]]] = {}
        self.lock = threading.Lock()

    def custom_objects(self) -> Any:
        from kubernetes import client

        if self.api_client is None:
            self.api_client = load_api_client()  # in Katib's pod: its service account
        if self.namespace is None:
            self.namespace = SERVICE_ACCOUNT_NAMESPACE.read_text().strip()
        return client.CustomObjectsApi(self.api_client)

    def ValidateEarlyStoppingSettings(self, request: Any, context: Any) -> Any:  # noqa: N802
        import grpc

        es = request.early_stopping
        exp = Experiment(
            name="", namespace="", objective=Objective("maximize", "", None, [], {}),
            algorithm="", algorithm_settings={}, early_stopping=es.algorithm_name,
            early_stopping_settings={s.name: s.value for s in es.algorithm_settings},
            parallel_trial_count=1, max_trial_count=None, max_failed_trial_count=None,
            parameters=[], trial_template={}, collector=Collector(), raw={})
        problems = validate_early_stopping(exp)
        if problems:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          "; ".join(f"{path}: {msg}" for path, msg in problems))
        return api().ValidateEarlyStoppingSettingsReply()

    def objective_logs(self, address: str, trial: str, metric: str) -> list[float]:
        """The trial's reports of `metric` from katib-db-manager, oldest first."""
        import grpc

        pb = api()
        with grpc.insecure_channel(address) as channel:
            rpc = channel.unary_unary(
                f"/{API}.DBManager/GetObservationLog",
                request_serializer=pb.GetObservationLogRequest.SerializeToString,
                response_deserializer=pb.GetObservationLogReply.FromString)
            reply = rpc(pb.GetObservationLogRequest(trial_name=trial, metric_name=metric),
                        timeout=120)
        return [float(m.metric.value) for m in reply.observation_log.metric_logs]

    def GetEarlyStoppingRules(self, request: Any, context: Any) -> Any:  # noqa: N802
        import grpc

        pb = api()
        try:
            exp = experiment(request.experiment)
        except SpecError as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        succeeded = [t.name for t in request.trials
                     if t.status.condition == pb.TrialStatus.TrialConditionType.SUCCEEDED]
        with self.lock:
            known = self.logs.setdefault(exp.name, {})
            for name in succeeded:
                if name not in known:
                    known[name] = self.objective_logs(request.db_manager_address, name,
                                                      exp.objective.metric)
            rule = median_rule(exp, list(known.values()))
        reply = pb.GetEarlyStoppingRulesReply()
        if rule is not None:
            reply.early_stopping_rules.add(
                name=rule.metric, value=str(rule.value), start_step=rule.start_step,
                comparison=pb.LESS if rule.comparison == "less" else pb.GREATER)
        log.info("%s: rule %s from %d succeeded trial(s)", exp.name, rule, len(known))
        return reply

    def SetTrialStatus(self, request: Any, context: Any) -> Any:  # noqa: N802
        import datetime

        custom = self.custom_objects()
        args = ("kubeflow.org", "v1beta1", self.namespace, "trials", request.trial_name)
        trial = custom.get_namespaced_custom_object(*args)
        now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        conditions = [*trial.get("status", {}).get("conditions", []), {
            "type": "EarlyStopped", "status": "True", "reason": "TrialEarlyStopped",
            "message": "Trial is early stopped", "lastUpdateTime": now,
            "lastTransitionTime": now}]
        custom.patch_namespaced_custom_object_status(*args, {"status": {"conditions":
                                                                        conditions}})
        log.info("trial %s/%s: EarlyStopped", self.namespace, request.trial_name)
        return api().SetTrialStatusReply()


SERVICES = {
    "Suggestion": (SuggestionService, PORT, {
        "GetSuggestions": ("GetSuggestionsRequest", "GetSuggestionsReply"),
        "ValidateAlgorithmSettings": ("ValidateAlgorithmSettingsRequest",
                                      "ValidateAlgorithmSettingsReply")}),
    "EarlyStopping": (EarlyStoppingService, EARLY_STOPPING_PORT, {
        "GetEarlyStoppingRules": ("GetEarlyStoppingRulesRequest", "GetEarlyStoppingRulesReply"),
        "SetTrialStatus": ("SetTrialStatusRequest", "SetTrialStatusReply"),
        "ValidateEarlyStoppingSettings": ("ValidateEarlyStoppingSettingsRequest",
                                          "ValidateEarlyStoppingSettingsReply")}),
}


def server(service: str = "Suggestion", address: str | None = None, workers: int = 4,
           **options: Any) -> tuple[Any, int]:
    """A started grpc.Server with one of SERVICES (its object built with `options`) and
    grpc.health.v1, and its port (address: all interfaces on the service's port)."""
    import grpc
    from grpc_health.v1 import health, health_pb2, health_pb2_grpc

    pb = api()
    cls, default_port, methods = SERVICES[service]
    impl = cls(**options)
    handlers = {name: grpc.unary_unary_rpc_method_handler(
        getattr(impl, name), request_deserializer=getattr(pb, req).FromString,
        response_serializer=getattr(pb, rep).SerializeToString)
        for name, (req, rep) in methods.items()}
    srv = grpc.server(futures.ThreadPoolExecutor(max_workers=workers))
    srv.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        f"{API}.{service}", handlers),))
    checker = health.HealthServicer()
    for name in ("", HEALTH_SERVICE, f"{API}.{service}"):
        checker.set(name, health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(checker, srv)
    address = address or f"0.0.0.0:{default_port}"
    port = srv.add_insecure_port(address)
    if port == 0:
        raise ServiceError(f"cannot listen on {address}")
    srv.start()
    return srv, port
