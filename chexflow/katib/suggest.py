"""Suggestions from the libraries Katib's suggestion services use, with Katib's settings names.

- random: hyperopt rand.suggest (random_state)
- tpe: hyperopt tpe.suggest (gamma, prior_weight, n_EI_candidates, random_state)
- grid: optuna GridSampler (random_state)
- multivariate-tpe: optuna TPESampler(multivariate=True, constant_liar=True)
  (n_startup_trials, n_ei_candidates, random_state)
- bayesianoptimization: scikit-optimize Optimizer (base_estimator, n_initial_points, acq_func,
  acq_optimizer, random_state)
- cmaes: Katib runs goptuna's CMA-ES (Go), a port of the `cmaes` library used here
  (random_state, sigma, restart_strategy none | ipop | bipop; optuna's CmaEsSampler ignores
  restarts since optuna 4.4)
- sobol: Katib runs goptuna's Sobol sampler (Go); here optuna's QMCSampler(qmc_type="sobol")
- hyperband, pbt, enas, darts: Katib's own services; validated here, run only on a cluster

`validate_algorithm` applies the ValidateAlgorithmSettings of the algorithm's Katib service.
Each call rebuilds the library's view from the sweep's trial records (completed trials with
their objective; optuna also sees running ones), as Katib's services do from the Trial list,
plus the study-level state the runner keeps (`study_attrs`), so a resumed sweep continues
where it stopped. Seeds derive from `random_state` (or the sweep's
own seed) and the number of trials so far: the same history gives the same suggestions.
"""

from __future__ import annotations

import math
import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from chexflow.katib.algorithms import ALGORITHMS
from chexflow.katib.experiment import Experiment, Parameter

# Derived from the one table of algorithms (algorithms.py).
LOCAL_ALGORITHMS = tuple(a.name for a in ALGORITHMS.values() if a.library)
CLUSTER_ONLY = tuple(a.name for a in ALGORITHMS.values() if not a.library)
SERVICE = {a.name: a.service for a in ALGORITHMS.values()}
LIBRARY = {a.name: a.library for a in ALGORITHMS.values() if a.library}
Check = Callable[[str], "str | None"]


def _int(test: Callable[[int], bool], msg: str) -> Check:
    def check(v: str) -> str | None:
        try:
            return None if test(int(v)) else msg
        except ValueError as e:
            return f"failed to validate ({v}): {e}"

    return check


def _float(test: Callable[[float], bool], msg: str) -> Check:
    def check(v: str) -> str | None:
        try:
            return None if test(float(v)) else msg
        except ValueError as e:
            return f"failed to validate ({v}): {e}"

    return check


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
# Services that refuse a setting they do not know (goptuna ignores them).
STRICT_SETTINGS = ("random", "tpe", "grid", "multivariate-tpe", "bayesianoptimization")


class SearchSpaceExhausted(Exception):
    """The algorithm has no new point to offer (grid: every combination started)."""


class SuggestionFailed(Exception):
    """The suggestion library failed (Katib marks the Experiment Failed: Suggestion has failed)."""


@dataclass
class Suggestion:
    parameters: dict[str, Any]
    optuna_attrs: dict[str, Any] = field(default_factory=dict)


@dataclass
class History:
    """What a suggester sees of one trial: its assignment and objective (None: no result)."""

    parameters: dict[str, Any]
    objective: float | None
    active: bool
    optuna_attrs: dict[str, Any] = field(default_factory=dict)


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
            if name in STRICT_SETTINGS:
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


def derived_seed(base: int, n_trials: int) -> int:
    """A seed for the call after `n_trials` trials: same history, same suggestions."""
    return int(np.random.SeedSequence([base, n_trials]).generate_state(1)[0] & 0x7FFFFFFF)


class Suggester(ABC):
    """Base: `suggest(history, n)` returns up to n new assignments.

    Parameters with one possible value (min == max, a one-item list) are not given to the
    library: every suggestion carries that value. `study_attrs` is the library's study-level
    state that the trials do not hold (optuna's QMC sample counter); the runner saves it with
    the sweep and passes it back when a sweep resumes.
    """

    def __init__(self, exp: Experiment, base_seed: int, study_attrs: dict | None = None):
        self.exp = exp
        self.params = [p for p in exp.parameters if not p.fixed]
        self.fixed = {p.name: p.snap(p.low) if p.numeric else p.values[0]
                      for p in exp.parameters if p.fixed}
        self.settings = dict(exp.algorithm_settings)
        self.base_seed = int(self.settings.pop("random_state", base_seed))
        self.study_attrs: dict[str, Any] = dict(study_attrs or {})

    def suggest(self, history: list[History], n: int) -> list[Suggestion]:
        """Up to n new assignments given every trial so far (in creation order)."""
        if self.params:
            try:
                out = self._suggest(history, n)
            except (ValueError, RuntimeError, ArithmeticError) as e:
                raise SuggestionFailed(f"{LIBRARY[self.exp.algorithm]}: {e}") from e
        else:
            out = [Suggestion({}) for _ in range(n)]
        order = [p.name for p in self.exp.parameters]
        for s in out:
            merged = {**s.parameters, **self.fixed}
            s.parameters = {name: merged[name] for name in order}
        return out

    @abstractmethod
    def _suggest(self, history: list[History], n: int) -> list[Suggestion]:
        """The library's suggestions for the parameters in self.params."""

    def _loss(self, value: float) -> float:
        return -value if self.exp.objective.maximize else value


class HyperoptSuggester(Suggester):
    """random and tpe, as Katib's hyperopt service (tpe: n_startup_jobs = request size)."""

    def __init__(self, exp: Experiment, base_seed: int, study_attrs: dict | None = None):
        super().__init__(exp, base_seed, study_attrs)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # hyperopt 0.2.7 imports the deprecated pkg_resources
            import hyperopt

        self.hp = hyperopt
        space = {p.name: self._dimension(p) for p in self.params}
        # Katib's service gives every parameter to hyperopt (a one-value choice works there);
        # here one-value parameters are left out, so the space may be empty: hyperopt's
        # Domain cannot be built over nothing, and suggest() needs none then.
        self.domain = hyperopt.Domain(None, space, pass_expr_memo_ctrl=None) if space else None
        conv = {"gamma": float, "prior_weight": float, "n_EI_candidates": int}
        self.conf = {k: conv[k](v) for k, v in self.settings.items() if k in conv}

    def _dimension(self, p: Parameter):
        hp = self.hp.hp
        if not p.numeric:
            return hp.choice(p.name, p.values)
        lo, hi, step = float(p.min), float(p.max), p.step
        if p.distribution == "logUniform":
            lo, hi = math.log(lo), math.log(hi)
            return hp.qloguniform(p.name, lo, hi, step) if step else hp.loguniform(p.name, lo, hi)
        if p.distribution in ("normal", "logNormal"):
            if p.distribution == "logNormal":
                lo, hi = math.log(lo), math.log(hi)
            mu, sigma = (lo + hi) / 2, (hi - lo) / 6
            if p.distribution == "normal":
                return hp.qnormal(p.name, mu, sigma, step) if step else hp.normal(p.name, mu, sigma)
            return (hp.qlognormal(p.name, mu, sigma, step) if step
                    else hp.lognormal(p.name, mu, sigma))
        if step:
            return hp.quniform(p.name, lo, hi, step)
        return hp.uniformint(p.name, lo, hi) if p.type == "int" else hp.uniform(p.name, lo, hi)

    def _trials(self, done: list[History]):
        trials = self.hp.Trials()
        if not done:
            return trials
        tids = list(range(len(done)))
        miscs, results = [], []
        for tid, h in zip(tids, done, strict=True):
            vals = {}
            for p in self.params:
                v = h.parameters[p.name]
                vals[p.name] = [p.values.index(str(v)) if not p.numeric else float(v)]
            miscs.append({"tid": tid, "cmd": self.domain.cmd, "workdir": self.domain.workdir,
                          "idxs": {p.name: [tid] for p in self.params}, "vals": vals})
            results.append({"loss": self._loss(h.objective), "status": self.hp.STATUS_OK})
        docs = trials.new_trial_docs(
            tids=tids, specs=[None] * len(done), results=results, miscs=miscs
        )
        for d in docs:
            d["state"] = self.hp.JOB_STATE_DONE
        trials.insert_trial_docs(docs)
        trials.refresh()
        return trials

    def _suggest(self, history: list[History], n: int) -> list[Suggestion]:
        done = [h for h in history if h.objective is not None]
        trials = self._trials(done)
        ids = trials.new_trial_ids(n)
        seed = derived_seed(self.base_seed, len(history))
        if self.exp.algorithm == "random":
            docs = self.hp.rand.suggest(ids, self.domain, trials, seed)
        elif not history:
            docs = self.hp.tpe.suggest(ids, self.domain, trials, seed, n_startup_jobs=n,
                                       **self.conf)
        else:
            docs = [
                self.hp.tpe.suggest([tid], self.domain, trials, seed + i, n_startup_jobs=n,
                                    **self.conf)[0]
                for i, tid in enumerate(ids)
            ]
        out = []
        for doc in docs:
            vals = doc["misc"]["vals"]
            params = {}
            for p in self.params:
                raw = vals[p.name][0]
                params[p.name] = p.values[int(raw)] if not p.numeric else p.snap(raw)
            out.append(Suggestion(params))
        return out


class OptunaSuggester(Suggester):
    """grid, multivariate-tpe and sobol on an optuna study rebuilt from the history."""

    def __init__(self, exp: Experiment, base_seed: int, study_attrs: dict | None = None):
        super().__init__(exp, base_seed, study_attrs)
        import optuna

        self.optuna = optuna
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.dists = {p.name: self._distribution(p) for p in self.params}
        self.grid = {p.name: p.grid() for p in self.params} if exp.algorithm == "grid" else None

    def _distribution(self, p: Parameter):
        d = self.optuna.distributions
        if not p.numeric:
            return d.CategoricalDistribution(p.values)
        log = p.distribution in ("logUniform", "logNormal")  # goptuna: normal reads as uniform
        if p.type == "int":
            step = 1 if log else int(p.step or 1)
            return d.IntDistribution(int(p.low), int(p.high), log=log, step=step)
        return d.FloatDistribution(p.low, p.high, log=log, step=None if log else p.step)

    def _sampler(self, seed: int):
        s, name, samplers = self.settings, self.exp.algorithm, self.optuna.samplers
        if name == "grid":
            return samplers.GridSampler(self.grid, seed=seed)
        if name == "multivariate-tpe":
            return samplers.TPESampler(
                multivariate=True, constant_liar=True, seed=seed,
                n_startup_trials=int(s.get("n_startup_trials", 10)),
                n_ei_candidates=int(s.get("n_ei_candidates", 24)),
            )
        return samplers.QMCSampler(qmc_type="sobol", seed=seed, warn_independent_sampling=False,
                                   warn_asynchronous_seeding=False)

    def _suggest(self, history: list[History], n: int) -> list[Suggestion]:
        optuna = self.optuna
        TrialState = optuna.trial.TrialState
        attrs = [dict(h.optuna_attrs) for h in history]
        if self.grid is not None:
            attrs = self._grid_attrs(history, attrs)
            started = {a.get("grid_id") for a in attrs} - {None}
            left = math.prod(len(v) for v in self.grid.values()) - len(started)
            if left <= 0:
                raise SearchSpaceExhausted(f"all {len(started)} grid combinations started")
            n = min(n, left)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            storage = optuna.storages.InMemoryStorage()
            study = optuna.create_study(
                storage=storage, study_name=self.exp.name,
                direction="maximize" if self.exp.objective.maximize else "minimize",
                # GridSampler shuffles the grid with its seed: keep one seed so grid ids stay.
                sampler=self._sampler(self.base_seed if self.grid is not None
                                      else derived_seed(self.base_seed, len(history))),
            )
            study_id = storage.get_study_id_from_name(self.exp.name)
            for key, value in self.study_attrs.items():
                storage.set_study_system_attr(study_id, key, value)
            for h, h_attrs in zip(history, attrs, strict=True):
                if h.objective is not None:
                    state, value = TrialState.COMPLETE, h.objective
                else:
                    state, value = (TrialState.RUNNING if h.active else TrialState.FAIL), None
                params = {k: self._optuna_value(k, h.parameters[k]) for k in self.dists}
                study.add_trial(optuna.trial.create_trial(
                    params=params, distributions=self.dists, value=value, state=state,
                    system_attrs=h_attrs,
                ))
            numbers = [study.ask(fixed_distributions=self.dists).number for _ in range(n)]
            trials = {t.number: t for t in study.get_trials(deepcopy=False)}
            self.study_attrs = _plain(storage.get_study_system_attrs(study_id))
        return [
            Suggestion({p.name: p.snap(trials[k].params[p.name]) for p in self.params},
                       _plain(trials[k].system_attrs))
            for k in numbers
        ]

    def _grid_attrs(self, history: list[History], attrs: list[dict]) -> list[dict]:
        """The trials' grid ids, from their assignments where a trial's record lacks it (a
        Katib service restarted, or a trial from elsewhere): GridSampler's shuffled grid (the
        one seed) gives every combination its id, so nothing but the trials is needed."""
        sampler = self._sampler(self.base_seed)
        names = sampler._param_names  # optuna keeps the shuffled grid in these attributes
        ids = {tuple(self._optuna_value(k, v) for k, v in zip(names, g, strict=True)): i
               for i, g in enumerate(sampler._all_grids)}
        out = []
        for h, a in zip(history, attrs, strict=True):
            grid_id = ids.get(tuple(self._optuna_value(k, h.parameters[k]) for k in names))
            if "grid_id" not in a and grid_id is not None:
                a = {**a, "grid_id": grid_id, "search_space": sampler._search_space}
            out.append(a)
        return out

    def _optuna_value(self, name: str, value: Any) -> Any:
        p = next(q for q in self.params if q.name == name)
        if not p.numeric:
            return str(value)
        return int(value) if p.type == "int" else float(value)


class CmaesSuggester(Suggester):
    """cmaes with Katib's goptuna settings on the `cmaes` library (goptuna's CMA-ES is its Go
    port): random_state, sigma, restart_strategy none | ipop | bipop (population x2 per
    restart, as goptuna's IPop(2)/BIPop(2)). Numeric parameters are searched in [min, max]
    (log scale for logUniform/logNormal); categorical ones are drawn at random.

    The optimizer is replayed from the trials: each trial records its generation, the restart
    it belongs to and the raw point (`cma:*` attributes); a generation is told once
    population-size trials of it have a result, and a stopped run restarts.
    """

    def __init__(self, exp: Experiment, base_seed: int, study_attrs: dict | None = None):
        super().__init__(exp, base_seed, study_attrs)
        self.numeric = [p for p in self.params if p.numeric]
        self.log = [p.distribution in ("logUniform", "logNormal") for p in self.numeric]
        self.bounds = np.array([[math.log(p.low), math.log(p.high)] if log else [p.low, p.high]
                                for p, log in zip(self.numeric, self.log, strict=True)])
        width = self.bounds[:, 1] - self.bounds[:, 0]
        self.sigma0 = float(self.settings.get("sigma", min(width) / 6))
        self.strategy = self.settings.get("restart_strategy", "none")

    def _cma(self, mean: np.ndarray, sigma: float, popsize: int | None, restart: int):
        from cmaes import CMA

        return CMA(mean=mean, sigma=sigma, bounds=self.bounds, population_size=popsize,
                   seed=derived_seed(self.base_seed, 2**31 + restart))

    def _replay(self, history: list[History]):
        """The optimizer after every complete generation, and its (generation, restart)."""
        rng = np.random.RandomState(self.base_seed)
        opt = self._cma(self.bounds.mean(axis=1), self.sigma0, None, 0)
        popsize0, restart, gen = opt.population_size, 0, 0
        budget = {"small": 0, "large": 0}
        regime, big_restarts = "large", 0
        while True:
            members = [h for h in history if h.optuna_attrs.get("cma:generation") == gen]
            for _ in members:
                opt.ask()  # the optimizer's random state advances as it did
            done = [h for h in members if h.objective is not None][: opt.population_size]
            if len(done) < opt.population_size:
                return opt, gen, restart
            opt.tell([(np.array(h.optuna_attrs["cma:x"]), self._loss(h.objective))
                      for h in done])
            gen += 1
            if self.strategy == "none" or not opt.should_stop():
                continue
            restart += 1
            budget[regime] += opt.population_size * opt.generation
            sigma = self.sigma0
            if self.strategy == "bipop" and budget["small"] < budget["large"]:
                regime = "small"
                popsize = math.floor(popsize0 * (2 ** big_restarts) ** (rng.uniform() ** 2))
                sigma = self.sigma0 * 10 ** (-2 * rng.uniform())
            else:
                regime, big_restarts = "large", big_restarts + 1
                popsize = popsize0 * 2 ** big_restarts
            mean = self.bounds[:, 0] + rng.rand(len(self.numeric)) * (
                self.bounds[:, 1] - self.bounds[:, 0])
            opt = self._cma(mean, sigma, max(popsize, 2), restart)

    def _suggest(self, history: list[History], n: int) -> list[Suggestion]:
        opt, gen, restart = self._replay(history)
        rng = np.random.RandomState(derived_seed(self.base_seed, len(history)))
        out = []
        for _ in range(n):
            x = opt.ask()
            params = {p.name: p.snap(math.exp(v) if log else v)
                      for p, log, v in zip(self.numeric, self.log, x, strict=True)}
            params.update({p.name: p.values[rng.randint(len(p.values))]
                           for p in self.params if not p.numeric})
            out.append(Suggestion(params, {"cma:generation": gen, "cma:restart": restart,
                                           "cma:popsize": opt.population_size,
                                           "cma:x": [float(v) for v in x]}))
        return out


class SkoptSuggester(Suggester):
    """bayesianoptimization: skopt.Optimizer with Katib's defaults (GP, 10 initial, gp_hedge).

    Running trials are told with the constant-liar value (the best loss so far), as skopt's
    own `ask(n_points)` does, so parallel trials do not repeat a running point.
    """

    def __init__(self, exp: Experiment, base_seed: int, study_attrs: dict | None = None):
        super().__init__(exp, base_seed, study_attrs)
        import skopt

        self.skopt = skopt
        self.dims = []
        for p in self.params:
            log = p.distribution in ("logUniform", "logNormal")  # Katib's skopt: no normal prior
            prior = "log-uniform" if log else "uniform"
            if p.type == "int":
                self.dims.append(skopt.space.Integer(int(p.low), int(p.high), prior, name=p.name))
            elif p.type == "double":
                self.dims.append(skopt.space.Real(p.low, p.high, prior, name=p.name))
            else:
                self.dims.append(skopt.space.Categorical(p.values, name=p.name))
        s = self.settings
        self.kwargs = {
            "base_estimator": s.get("base_estimator", "GP"),
            "n_initial_points": int(s.get("n_initial_points", 10)),
            "acq_func": s.get("acq_func", "gp_hedge"),
            "acq_optimizer": s.get("acq_optimizer", "auto"),
        }

    def _point(self, params: dict[str, Any]) -> list[Any]:
        out = []
        for p in self.params:
            v = params[p.name]
            out.append(int(v) if p.type == "int" else float(v) if p.type == "double" else str(v))
        return out

    def _suggest(self, history: list[History], n: int) -> list[Suggestion]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            opt = self.skopt.Optimizer(
                self.dims, random_state=derived_seed(self.base_seed, len(history)), **self.kwargs
            )
            done = [h for h in history if h.objective is not None]
            xs = [self._point(h.parameters) for h in done]
            ys = [self._loss(h.objective) for h in done]
            if ys:
                lie = min(ys)
                pending = [self._point(h.parameters) for h in history if h.active]
                xs += pending
                ys += [lie] * len(pending)
                opt.tell(xs, ys)
            points = opt.ask(n_points=n) if n > 1 else [opt.ask()]
        return [
            Suggestion({p.name: p.snap(v) if p.numeric else str(v)
                        for p, v in zip(self.params, point, strict=True)})
            for point in points
        ]


def _plain(attrs: dict[str, Any]) -> dict[str, Any]:
    """The JSON-serialisable attributes (the sweep state is JSON)."""
    return {k: v for k, v in attrs.items()
            if isinstance(v, (str, int, float, bool, list, dict, type(None)))}


def make_suggester(exp: Experiment, base_seed: int, study_attrs: dict | None = None
                   ) -> Suggester:
    if exp.algorithm in ("random", "tpe"):
        return HyperoptSuggester(exp, base_seed, study_attrs)
    if exp.algorithm == "bayesianoptimization":
        return SkoptSuggester(exp, base_seed, study_attrs)
    if exp.algorithm == "cmaes":
        return CmaesSuggester(exp, base_seed, study_attrs)
    return OptunaSuggester(exp, base_seed, study_attrs)
