"""Each Katib suggestion service's ValidateAlgorithmSettings: `validate_algorithm(exp)` gives
Katib's messages as (field, message). The settings names are Katib's:

- random: random_state; tpe: gamma, prior_weight, n_EI_candidates, random_state (hyperopt)
- grid: random_state; multivariate-tpe: n_startup_trials, n_ei_candidates, random_state (optuna)
- bayesianoptimization: base_estimator, n_initial_points, acq_func, acq_optimizer,
  random_state (skopt)
- cmaes: random_state, sigma, restart_strategy none | ipop | bipop; sobol: none (goptuna, which
  ignores any other setting)
- hyperband, pbt: Katib's own services' rules (run only on a cluster)
"""

from __future__ import annotations

import math
from collections.abc import Callable

from chexflow.katib.experiment.model import Experiment
from chexflow.katib.suggestions.algorithms import SERVICE, STRICT_SERVICES

Check = Callable[[str], "str | None"]


def _parsed(parse: Callable[[str], float], test: Callable, msg: str) -> Check:
    """A check of a setting's value read by `parse` (int or float), Katib's message otherwise."""
    def check(v: str) -> str | None:
        try:
            return None if test(parse(v)) else msg
        except ValueError as e:
            return f"failed to validate ({v}): {e}"

    return check


def _int(test: Callable[[int], bool], msg: str) -> Check:
    return _parsed(int, test, msg)


def _float(test: Callable[[float], bool], msg: str) -> Check:
    return _parsed(float, test, msg)


def _one_of(what: str, *choices: str) -> Check:
    return lambda v: None if v in choices else f"{what} {v} is not supported"


def _at_least(name: str, n: int) -> Check:
    word = "great or equal than zero" if n == 0 else "great than zero"
    return _int(lambda x: x >= n, f"{name} should be {word}")


RANDOM_STATE = _at_least("random_state", 0)
# Each service's ValidateAlgorithmSettings: setting -> check (message as Katib's service says).
SETTINGS: dict[str, dict[str, Check]] = {
    "random": {"random_state": RANDOM_STATE},
    "tpe": {
        "gamma": _float(lambda x: 0 < x < 1, "gamma should be in the range of (0, 1)"),
        "prior_weight": _float(lambda x: x > 0, "prior_weight should be great than zero"),
        "n_EI_candidates": _at_least("n_EI_candidates", 1),
        "random_state": RANDOM_STATE,
    },
    "grid": {"random_state": RANDOM_STATE},
    "multivariate-tpe": {
        "n_startup_trials": _at_least("n_startup_trials", 0),
        "n_ei_candidates": _at_least("n_ei_candidates", 0),
        "random_state": RANDOM_STATE,
    },
    "bayesianoptimization": {
        "base_estimator": _one_of("base_estimator", "GP", "RF", "ET", "GBRT"),
        "n_initial_points": _at_least("n_initial_points", 0),
        "acq_func": _one_of("acq_func", "gp_hedge", "LCB", "EI", "PI", "EIps", "PIps"),
        "acq_optimizer": _one_of("acq_optimizer", "auto", "sampling", "lbfgs"),
        "random_state": RANDOM_STATE,
    },
    # goptuna parses these three and ignores any other setting.
    "cmaes": {
        "random_state": _int(lambda x: True, ""),
        "sigma": _float(lambda x: x > 0, "sigma must be greater than 0"),
        "restart_strategy": lambda v: (None if v in ("ipop", "bipop", "none")
                                       else f"invalid restart_strategy: '{v}'"),
    },
    "sobol": {},
}


def validate_algorithm(exp: Experiment) -> list[tuple[str, str]]:
    """Katib's ValidateAlgorithmSettings of the algorithm's service, as (field, message)."""
    name, path = exp.algorithm, "spec.algorithm"
    if name not in SERVICE:
        return [(f"{path}.algorithmName", f"unable to get Suggestion config data for algorithm "
                 f"{name} (Katib's algorithms: {', '.join(SERVICE)})")]
    if name == "hyperband":
        return _validate_hyperband(exp)
    if name == "pbt":
        return _validate_pbt(exp)
    if name not in SETTINGS:
        return []
    out = []
    for i, (key, value) in enumerate(exp.algorithm_settings.items()):
        check = SETTINGS[name].get(key)
        if check is None:
            if SERVICE[name] in STRICT_SERVICES:
                out.append((f"{path}.algorithmSettings[{i}].name",
                            f"unknown setting {key} for algorithm {name}"))
        elif (msg := check(value)) is not None:
            out.append((f"{path}.algorithmSettings[{i}].value", msg))
    service = SERVICE[name]
    for i, p in enumerate(exp.parameters):
        ppath = f"spec.parameters[{i}].feasibleSpace"
        if service == "optuna" and p.numeric and p.distribution in ("normal", "logNormal"):
            out.append((f"{ppath}.distribution", f"Unsupported distribution {p.distribution} "
                        f"for parameter {p.name}. The Optuna suggestion service supports only "
                        "UNIFORM and LOG_UNIFORM"))
        if name == "grid" and p.type == "double" and not p.step:
            out.append((f"{ppath}.step", f"Param {p.name} step is nil; For discrete search "
                        "space, all parameters must include step"))
        if service != "hyperopt" and p.type == "int":
            for key in ("min", "max", "step"):
                v = getattr(p, key)
                if v is not None and v != int(v):
                    out.append((f"{ppath}.{key}", f"{v:g} is not an integer ({service} reads "
                                "int bounds as integers)"))
    if service == "goptuna":
        seen: set[str] = set()
        for i, p in enumerate(exp.parameters):
            if p.name in seen:
                out.append((f"spec.parameters[{i}].name",
                            f"Detect duplicated parameter name: {p.name}"))
            seen.add(p.name)
    if name == "cmaes" and sum(p.numeric for p in exp.parameters) < 2:
        out.append(("spec.parameters",
                    "CMA-ES only supports two or more dimensional continuous search space."))
    if name == "grid" and not out and exp.max_trial_count is not None:
        combos = math.prod(len(p.grid()) for p in exp.parameters)
        if exp.max_trial_count > combos:
            out.append(("spec.maxTrialCount", f"Max Trial Count: {exp.max_trial_count} > all "
                        f"possible search combinations: {combos}"))
    return out


def _validate_hyperband(exp: Experiment) -> list[tuple[str, str]]:
    """Katib's hyperband service: r_l, resource_name, eta and the parallel trial count."""
    s, path = exp.algorithm_settings, "spec.algorithm.algorithmSettings"
    if "r_l" not in s or "resource_name" not in s:
        return [(path, "r_l and resource_name must be set.")]
    try:
        r_l = float(s["r_l"])
    except ValueError:
        r_l = -1.0
    if r_l <= 0:
        return [(path, "r_l must be a positive float number.")]
    try:
        eta = int(float(s.get("eta", "3")))
    except ValueError:
        return [(path, f"eta {s['eta']!r} is not a number")]
    eta = eta if eta > 0 else 3
    s_max = int(math.log(r_l) / math.log(eta)) if eta > 1 else 0
    need = int(math.ceil(eta ** s_max))
    if exp.parallel_trial_count < need:
        return [("spec.parallelTrialCount", f"parallelTrialCount must be not less than {need}.")]
    if s["resource_name"] not in {p.name for p in exp.parameters}:
        return [(path, "value of resource_name setting must be in parameters.")]
    return []


def _validate_pbt(exp: Experiment) -> list[tuple[str, str]]:
    """Katib's pbt service: n_population >= 5, thresholds within [0, 1]."""
    s, path = exp.algorithm_settings, "spec.algorithm.algorithmSettings"
    missing = [k for k in ("n_population", "truncation_threshold") if k not in s]
    if missing:
        return [(path, f"Required params missing: {', '.join(missing)}")]
    try:
        if int(s["n_population"]) < 5:
            return [(path, "Param(n_population) should be >= 5")]
        if not 0 <= float(s["truncation_threshold"]) <= 1:
            return [(path, "Param(truncation_threshold) should be between 0 and 1, inclusive")]
        if "resample_probability" in s and not 0 <= float(s["resample_probability"]) <= 1:
            return [(path, "Param(resample_probability) should be null to perturb at 0.8 or "
                     "1.2, or be between 0 and 1, inclusive, to resample")]
    except ValueError as e:
        return [(path, f"failed to validate: {e}")]
    return []
