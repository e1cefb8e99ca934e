"""chexflow's Katib Suggestion service over real gRPC on loopback, with the requests Katib's
suggestion controller sends (api.v1.beta1 messages from the kubeflow-katib wheel): health as
Katib's probe asks it, ValidateAlgorithmSettings, and GetSuggestions reading the trial list.
The same service on the real Katib: tests/cluster/test_cluster_katib.py."""

from __future__ import annotations

import json
import zlib

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from chexflow.katib.services.server import API, HEALTH_SERVICE, api, server

LR = {"name": "lr", "type": "DOUBLE", "min": "0.001", "max": "0.1", "dist": "LOG_UNIFORM"}
OPT = {"name": "optimizer", "type": "CATEGORICAL", "list": ["adam", "sgd"]}
BATCH = {"name": "batch", "type": "DISCRETE", "list": ["8", "16", "32"]}


@pytest.fixture(scope="module")
def channel():
    srv, port = server("Suggestion", "127.0.0.1:0")
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        yield ch
    srv.stop(None)


def _call(channel, method: str, request):
    pb = api()
    reply = {"GetSuggestions": pb.GetSuggestionsReply,
             "ValidateAlgorithmSettings": pb.ValidateAlgorithmSettingsReply}[method]
    rpc = channel.unary_unary(f"/{API}.Suggestion/{method}",
                              request_serializer=type(request).SerializeToString,
                              response_deserializer=reply.FromString)
    return rpc(request, timeout=60)


def _experiment(name: str, algorithm: str, params: list[dict], settings: dict | None = None,
                max_trials: int = 6):
    """An api.v1.beta1.Experiment as Katib's ConvertExperiment builds it."""
    pb = api()
    exp = pb.Experiment(name=name)
    spec = exp.spec
    spec.objective.type = pb.MAXIMIZE
    spec.objective.objective_metric_name = "val_auroc"
    spec.algorithm.algorithm_name = algorithm
    for k, v in (settings or {}).items():
        spec.algorithm.algorithm_settings.add(name=k, value=v)
    spec.parallel_trial_count, spec.max_trial_count = 2, max_trials
    for p in params:
        ps = spec.parameter_specs.parameters.add(name=p["name"],
                                                 parameter_type=pb.ParameterType.Value(p["type"]))
        fs = ps.feasible_space
        fs.min, fs.max, fs.step = p.get("min", ""), p.get("max", ""), p.get("step", "")
        fs.list.extend(p.get("list", []))
        if "dist" in p:
            fs.distribution = pb.Distribution.Value(p["dist"])
    return exp


def _trial(name: str, assignments: dict, condition: str, auroc: float | None = None,
           start: str = "2026-11-25T12:00:00Z"):
    pb = api()
    t = pb.Trial(name=name)
    for k, v in assignments.items():
        t.spec.parameter_assignments.assignments.add(name=k, value=v)
    t.status.condition = pb.TrialStatus.TrialConditionType.Value(condition)
    t.status.start_time = start
    if auroc is not None:
        t.status.observation.metrics.add(name="val_auroc", value=str(auroc))
    return t


def _suggest(channel, exp, trials=(), n=2) -> list[dict]:
    request = api().GetSuggestionsRequest(experiment=exp, trials=list(trials),
                                          current_request_number=n,
                                          total_request_number=len(trials) + n)
    reply = _call(channel, "GetSuggestions", request)
    return [{a.name: a.value for a in pa.assignments} for pa in reply.parameter_assignments]


def test_health_is_serving_for_the_service_name_katibs_probe_asks_for(channel):
    stub = health_pb2_grpc.HealthStub(channel)
    for service in (HEALTH_SERVICE, ""):
        reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_validate_accepts_katibs_settings_and_refuses_others_as_invalid_argument(channel):
    pb = api()
    good = _experiment("bo", "bayesianoptimization", [LR], {"n_initial_points": "3"})
    assert _call(channel, "ValidateAlgorithmSettings",
                 pb.ValidateAlgorithmSettingsRequest(experiment=good)) == \
        pb.ValidateAlgorithmSettingsReply()
    for algorithm, settings, words in (
            ("bayesianoptimization", {"n_initial_points": "-1"}, "n_initial_points"),
            ("multivariate-tpe", {"n_ei_candidates": "x"}, "failed to validate (x)"),
            ("grid", {}, "step"),  # Katib's grid needs a step on doubles
            ("hyperband", {}, "unknown algorithm name hyperband")):
        bad = _experiment("bad", algorithm, [LR], settings)
        with pytest.raises(grpc.RpcError) as e:
            _call(channel, "ValidateAlgorithmSettings",
                  pb.ValidateAlgorithmSettingsRequest(experiment=bad))
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (algorithm, e.value)
        assert words in e.value.details(), (algorithm, e.value.details())


@pytest.mark.parametrize("algorithm", ["bayesianoptimization", "multivariate-tpe"])
def test_suggestions_lie_in_the_search_space_and_follow_the_trials_katib_sends(
        channel, algorithm):
    exp = _experiment(f"space-{algorithm}", algorithm, [LR, OPT, BATCH],
                      {"random_state": "7"})
    first = _suggest(channel, exp)
    assert len(first) == 2
    trials = [_trial(f"t{i}", a, "SUCCEEDED", 0.6 + i / 10, f"2026-11-25T12:0{i}:00Z")
              for i, a in enumerate(first)]
    trials.append(_trial("running", first[0], "RUNNING"))
    trials.append(_trial("failed", first[1], "FAILED"))
    more = _suggest(channel, exp, trials, n=3)
    assert len(more) == 3
    for a in first + more:
        assert set(a) == {"lr", "optimizer", "batch"}
        assert 0.001 <= float(a["lr"]) <= 0.1
        assert a["optimizer"] in ("adam", "sgd") and a["batch"] in ("8", "16", "32")
    # the same request gives the same suggestions (random_state; history from the trials)
    assert _suggest(channel, exp, trials, n=3) == more


def test_grid_skips_the_points_katibs_trials_already_hold_and_ends_at_the_grid(channel):
    exp = _experiment("grid-2x3", "grid", [OPT, BATCH], max_trials=6)
    seen = _suggest(channel, exp, n=4)
    trials = [_trial(f"t{i}", a, "SUCCEEDED" if i % 2 else "RUNNING", 0.7)
              for i, a in enumerate(seen)]
    rest = _suggest(channel, exp, trials, n=2)
    points = {(a["optimizer"], a["batch"]) for a in seen + rest}
    assert len(points) == 6  # every combination once
    with pytest.raises(grpc.RpcError) as e:
        _suggest(channel, exp, trials + [_trial(f"r{i}", a, "SUCCEEDED", 0.7)
                                         for i, a in enumerate(rest)], n=1)
    assert e.value.code() == grpc.StatusCode.OUT_OF_RANGE


class _DBManager:
    """katib-db-manager's GetObservationLog for the test: the objective reports of each trial
    (the real db-manager answers these on the real Katib: tests/cluster)."""

    def __init__(self, logs: dict[str, list[float]]):
        self.logs, self.asked = logs, []

    def GetObservationLog(self, request, context):  # noqa: N802
        pb = api()
        self.asked.append((request.trial_name, request.metric_name))
        reply = pb.GetObservationLogReply()
        for i, v in enumerate(self.logs[request.trial_name]):
            reply.observation_log.metric_logs.add(
                time_stamp=f"2026-11-25T12:00:0{i}Z",
                metric=pb.Metric(name=request.metric_name, value=str(v)))
        return reply


@pytest.fixture
def db_manager():
    from concurrent import futures

    pb = api()
    manager = _DBManager({"t0": [0.6, 0.8, 0.9, 0.2], "t1": [0.7, 0.7, 0.4], "t2": [0.1]})
    srv = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    srv.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        f"{API}.DBManager", {"GetObservationLog": grpc.unary_unary_rpc_method_handler(
            manager.GetObservationLog,
            request_deserializer=pb.GetObservationLogRequest.FromString,
            response_serializer=pb.GetObservationLogReply.SerializeToString)}),))
    port = srv.add_insecure_port("127.0.0.1:0")
    srv.start()
    yield manager, f"127.0.0.1:{port}"
    srv.stop(None)


def _es_call(channel, method: str, request):
    pb = api()
    reply = {
        "GetEarlyStoppingRules": pb.GetEarlyStoppingRulesReply,
        "ValidateEarlyStoppingSettings": pb.ValidateEarlyStoppingSettingsReply}[method]
    rpc = channel.unary_unary(f"/{API}.EarlyStopping/{method}",
                              request_serializer=type(request).SerializeToString,
                              response_deserializer=reply.FromString)
    return rpc(request, timeout=60)


def test_medianstop_rule_is_the_mean_of_succeeded_trials_first_start_step_reports(db_manager):
    """Katib's medianstop: from min_trials_required Succeeded trials on, the rule is the mean of
    their averages over their first start_step reports (read from db-manager once per trial);
    maximize stops a trial whose best is LESS than it from start_step on."""
    manager, address = db_manager
    pb = api()
    srv, port = server("EarlyStopping", "127.0.0.1:0")
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            exp = _experiment("es", "random", [LR])
            exp.spec.early_stopping.algorithm_name = "medianstop"
            for k, v in (("min_trials_required", "2"), ("start_step", "2")):
                exp.spec.early_stopping.algorithm_settings.add(name=k, value=v)

            def rules(*trials):
                return _es_call(ch, "GetEarlyStoppingRules", pb.GetEarlyStoppingRulesRequest(
                    experiment=exp, trials=list(trials), db_manager_address=address)
                ).early_stopping_rules

            assert not rules(_trial("t0", {"lr": "0.01"}, "SUCCEEDED", 0.9),
                             _trial("t2", {"lr": "0.02"}, "FAILED"))
            (rule,) = rules(_trial("t0", {"lr": "0.01"}, "SUCCEEDED", 0.9),
                            _trial("t1", {"lr": "0.05"}, "SUCCEEDED", 0.7),
                            _trial("t2", {"lr": "0.02"}, "FAILED"),
                            _trial("t3", {"lr": "0.03"}, "RUNNING"))
            assert rule.name == "val_auroc" and rule.start_step == 2
            assert rule.comparison == pb.LESS
            assert float(rule.value) == pytest.approx(((0.6 + 0.8) / 2 + (0.7 + 0.7) / 2) / 2)
            assert manager.asked == [("t0", "val_auroc"), ("t1", "val_auroc")]

            good = pb.EarlyStoppingSpec(algorithm_name="medianstop")
            good.algorithm_settings.add(name="start_step", value="3")
            _es_call(ch, "ValidateEarlyStoppingSettings",
                     pb.ValidateEarlyStoppingSettingsRequest(early_stopping=good))
            for name, value, words in (("start_step", "0", "must be an integer of at least 1"),
                                       ("patience", "3", "unknown setting patience")):
                bad = pb.EarlyStoppingSpec(algorithm_name="medianstop")
                bad.algorithm_settings.add(name=name, value=value)
                with pytest.raises(grpc.RpcError) as e:
                    _es_call(ch, "ValidateEarlyStoppingSettings",
                             pb.ValidateEarlyStoppingSettingsRequest(early_stopping=bad))
                assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert words in e.value.details()
    finally:
        srv.stop(None)



def test_a_restarted_early_stopping_service_reads_katibs_db_again_and_gives_the_same_rule(
        db_manager):
    """The medianstop service's per-trial reports are a cache of katib-db-manager's logs: a
    new service (a replaced pod) asks db-manager again and gives the old one's rule."""
    manager, address = db_manager
    pb = api()
    exp = _experiment("es-restart", "random", [LR])
    exp.spec.early_stopping.algorithm_name = "medianstop"
    exp.spec.early_stopping.algorithm_settings.add(name="min_trials_required", value="2")
    request = pb.GetEarlyStoppingRulesRequest(
        experiment=exp, db_manager_address=address,
        trials=[_trial("t0", {"lr": "0.01"}, "SUCCEEDED", 0.9),
                _trial("t1", {"lr": "0.05"}, "SUCCEEDED", 0.7)])
    answers = []
    for _ in range(2):  # the first service, then a new one in its place
        srv, port = server("EarlyStopping", "127.0.0.1:0")
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            answers.append(list(_es_call(ch, "GetEarlyStoppingRules", request)
                                .early_stopping_rules))
        srv.stop(None)
    assert answers[0] == answers[1] and len(answers[0]) == 1
    assert manager.asked == [("t0", "val_auroc"), ("t1", "val_auroc")] * 2


def _katib_round(channel, exp, points: list[dict], n: int = 4) -> list[dict] | str:
    """One request of Katib's suggestion controller for n more trials, with every Trial so far
    (the previous request's still Running, the earlier ones Succeeded with an objective that
    depends on the assignment only): the suggestions (appended to `points`) or the error code."""
    trials = []
    for i, a in enumerate(points):
        running = i >= len(points) - n
        auroc = 0.5 + zlib.crc32(json.dumps(a, sort_keys=True).encode()) % 1000 / 4000
        trials.append(_trial(f"{exp.name}-{i:03d}", a, "RUNNING" if running else "SUCCEEDED",
                             None if running else auroc,
                             f"2026-11-25T12:{i // 60:02d}:{i % 60:02d}Z"))
    try:
        new = _suggest(channel, exp, trials, n=n)
    except grpc.RpcError as e:
        return e.code().name
    points += new
    return new


GRID_LR = {"name": "lr", "type": "DISCRETE", "list": ["0.001", "0.01", "0.1"]}
RESTART_CASES = {"grid": [GRID_LR, OPT, BATCH], "multivariate-tpe": [LR, OPT, BATCH],
                 "bayesianoptimization": [LR, OPT, BATCH]}


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", sorted(RESTART_CASES))
def test_a_restarted_service_continues_as_an_uninterrupted_one_without_repeats(algorithm):
    """A Suggestion service restarted mid-Experiment (Katib's suggestion pod replaced: a new
    server with nothing in memory) answers as the uninterrupted one does for the same trials:
    the same suggestions, never a point a trial already holds, and the grid's end (18
    combinations: 4+4+4+4+2, then OUT_OF_RANGE) at the same request."""
    from chexflow.katib.services.server import SERVED

    assert set(RESTART_CASES) == set(SERVED)  # every algorithm this service serves
    settings = {"random_state": "3"}
    # the model (GP, TPE), not only its random start, answers after the restart
    if algorithm == "bayesianoptimization":
        settings.update(n_initial_points="3", acq_optimizer="sampling")
    elif algorithm == "multivariate-tpe":
        settings["n_startup_trials"] = "3"
    exp = _experiment(f"restart-{algorithm}", algorithm, RESTART_CASES[algorithm], settings,
                      max_trials=24)
    # skopt's GP takes seconds a call: the others get four requests of two
    rounds, restart_at, n = (6, 4, 4) if algorithm == "grid" else (4, 2, 2)
    runs = {}
    for name, spans in (("uninterrupted", [(0, rounds)]),
                        ("restarted", [(0, restart_at), (restart_at, rounds)])):
        points: list[dict] = []
        answers = []
        for first, last in spans:  # a new service (nothing in memory) for each span
            srv, port = server("Suggestion", "127.0.0.1:0")
            with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
                answers += [_katib_round(ch, exp, points, n) for _ in range(first, last)]
            srv.stop(None)
        runs[name] = (answers, points)
    assert runs["restarted"] == runs["uninterrupted"]
    answers, points = runs["restarted"]
    if algorithm == "grid":
        assert [len(a) if isinstance(a, list) else a for a in answers] == [
            4, 4, 4, 4, 2, "OUT_OF_RANGE"]
    keys = [json.dumps(a, sort_keys=True) for a in points]
    assert len(set(keys)) == len(keys), keys


@pytest.mark.parametrize("settings", [{}, {"random_state": "3"}])
@pytest.mark.parametrize("algorithm", ["multivariate-tpe", "bayesianoptimization"])
def test_a_point_given_before_its_trial_is_listed_is_not_given_again(channel, algorithm,
                                                                     settings):
    """Katib's controller may ask again before it has made the Trial of the point it was just
    given (seen with katib-controller or db-manager SIGKILLed): the same trials, one point more
    given (total_request_number - current_request_number above the trials sent), a new point."""
    pb = api()
    exp = _experiment(f"gap-{algorithm}", algorithm, [LR], settings, max_trials=8)
    trials = [_trial("t1", {"lr": "0.01"}, "SUCCEEDED", 0.7),
              _trial("t2", {"lr": "0.05"}, "SUCCEEDED", 0.6, start="2026-11-25T12:00:01Z")]

    def ask(given: int) -> dict:
        request = pb.GetSuggestionsRequest(experiment=exp, trials=trials,
                                           current_request_number=1,
                                           total_request_number=given + 1)
        (point,) = _call(channel, "GetSuggestions", request).parameter_assignments
        return {a.name: a.value for a in point.assignments}

    first = ask(given=2)  # every point given so far is a trial sent
    assert ask(given=2) == first  # the same request: the same answer (a restart gives it too)
    assert ask(given=3) != first  # `first` given, its Trial not listed yet
