"""Suggestions from the libraries Katib's suggestion services use, with Katib's settings names.

- random: hyperopt rand.suggest (random_state)
- tpe: hyperopt tpe.suggest (gamma, prior_weight, n_EI_candidates, random_state)
- grid: optuna GridSampler (random_state)
- multivariate-tpe: optuna TPESampler(multivariate=True, constant_liar=True)
  (n_startup_trials, n_ei_candidates, random_state)
- bayesianoptimization: scikit-optimize Optimizer (base_estimator, n_initial_points, acq_func,
  acq_optimizer, random_state)
- cmaes: Katib runs goptuna's CMA-ES (Go); the closest maintained Python equivalent is
  optuna's CmaEsSampler (random_state, sigma, restart_strategy)
- sobol: Katib runs goptuna's Sobol sampler (Go); here optuna's QMCSampler(qmc_type="sobol")
  (random_state)

Each call rebuilds the library's view from the sweep's trial records (completed trials with
their objective; optuna also sees running ones), as Katib's services do from the Trial list,
so a resumed sweep continues where it stopped. Seeds derive from `random_state` (or the sweep's
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

from chexflow.katib.spec import Experiment, Parameter

LOCAL_ALGORITHMS = (
    "random", "tpe", "grid", "multivariate-tpe", "bayesianoptimization", "cmaes", "sobol",
)
CLUSTER_ONLY = ("hyperband", "pbt", "enas", "darts")
OPTUNA = ("grid", "multivariate-tpe", "cmaes", "sobol")
LIBRARY = {
    "random": "hyperopt rand.suggest",
    "tpe": "hyperopt tpe.suggest",
    "grid": "optuna GridSampler",
    "multivariate-tpe": "optuna TPESampler(multivariate=True)",
    "bayesianoptimization": "scikit-optimize Optimizer",
    "cmaes": "optuna CmaEsSampler (closest to Katib's goptuna CMA-ES)",
    "sobol": "optuna QMCSampler(qmc_type='sobol') (closest to Katib's goptuna Sobol)",
}


def _int_ge(n: int) -> Callable[[str], str | None]:
    def check(v: str) -> str | None:
        try:
            ok = int(v) >= n
        except ValueError:
            return f"{v!r} is not an integer"
        return None if ok else f"{v} must be at least {n}"

    return check


def _float_in(lo: float, hi: float, lo_open: bool = True) -> Callable[[str], str | None]:
    def check(v: str) -> str | None:
        try:
            x = float(v)
        except ValueError:
            return f"{v!r} is not a number"
        ok = (x > lo if lo_open else x >= lo) and x < hi
        return None if ok else f"{v} must be in ({lo}, {hi})"

    return check


def _one_of(*choices: str) -> Callable[[str], str | None]:
    return lambda v: None if v in choices else f"{v!r}: expected one of {', '.join(choices)}"


SETTINGS: dict[str, dict[str, Callable[[str], str | None]]] = {
    "random": {"random_state": _int_ge(0)},
    "tpe": {
        "gamma": _float_in(0, 1),
        "prior_weight": _float_in(0, math.inf),
        "n_EI_candidates": _int_ge(1),
        "random_state": _int_ge(0),
    },
    "grid": {"random_state": _int_ge(0)},
    "multivariate-tpe": {
        "n_startup_trials": _int_ge(0),
        "n_ei_candidates": _int_ge(1),
        "random_state": _int_ge(0),
    },
    "bayesianoptimization": {
        "base_estimator": _one_of("GP", "RF", "ET", "GBRT"),
        "n_initial_points": _int_ge(1),
        "acq_func": _one_of("gp_hedge", "LCB", "EI", "PI", "EIps", "PIps"),
        "acq_optimizer": _one_of("auto", "sampling", "lbfgs"),
        "random_state": _int_ge(0),
    },
    "cmaes": {
        "random_state": _int_ge(0),
        "sigma": _float_in(0, math.inf),
        "restart_strategy": _one_of("none", "ipop", "bipop"),
    },
    "sobol": {"random_state": _int_ge(0)},
}


class SearchSpaceExhausted(Exception):
    """The algorithm has no new point to offer (grid: every combination started)."""


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
    """Katib's ValidateAlgorithmSettings for the local algorithms, as (field, message)."""
    name, path = exp.algorithm, "spec.algorithm"
    if name in CLUSTER_ONLY:
        return [(f"{path}.algorithmName", f"{name} runs in Katib's own service: use --cluster")]
    if name not in SETTINGS:
        return [(f"{path}.algorithmName", f"unknown algorithm {name!r}; local algorithms: "
                 + ", ".join(LOCAL_ALGORITHMS))]
    out = []
    for i, (key, value) in enumerate(exp.algorithm_settings.items()):
        check = SETTINGS[name].get(key)
        if check is None:
            out.append((f"{path}.algorithmSettings[{i}].name",
                        f"unknown setting {key} for algorithm {name}"))
        elif (msg := check(value)) is not None:
            out.append((f"{path}.algorithmSettings[{i}].value", f"{key}: {msg}"))
    for i, p in enumerate(exp.parameters):
        ppath = f"spec.parameters[{i}].feasibleSpace"
        if name in OPTUNA + ("bayesianoptimization",) and p.distribution in ("normal", "logNormal"):
            out.append((f"{ppath}.distribution",
                        f"{p.distribution} is not supported by {name} ({LIBRARY[name]})"))
        if name == "grid" and p.type == "double" and not p.step:
            out.append((f"{ppath}.step", "grid needs a step for double parameters"))
    if name == "cmaes" and sum(p.numeric for p in exp.parameters) < 2:
        out.append(("spec.parameters", "cmaes needs at least 2 int or double parameters"))
    return out


def derived_seed(base: int, n_trials: int) -> int:
    """A seed for the call after `n_trials` trials: same history, same suggestions."""
    return int(np.random.SeedSequence([base, n_trials]).generate_state(1)[0] & 0x7FFFFFFF)


def format_value(p: Parameter, value: Any) -> str:
    """The string Katib substitutes for `${trialParameters.X}`."""
    v = p.snap(value)
    return repr(v) if isinstance(v, float) else str(v)


class Suggester(ABC):
    """Base: `suggest(history, n)` returns up to n new assignments."""

    def __init__(self, exp: Experiment, base_seed: int):
        self.exp = exp
        self.params = exp.parameters
        self.settings = dict(exp.algorithm_settings)
        self.base_seed = int(self.settings.pop("random_state", base_seed))

    @abstractmethod
    def suggest(self, history: list[History], n: int) -> list[Suggestion]:
        """Up to n new assignments given every trial so far (in creation order)."""

    def _loss(self, value: float) -> float:
        return -value if self.exp.objective.maximize else value


class HyperoptSuggester(Suggester):
    """random and tpe, as Katib's hyperopt service (tpe: n_startup_jobs = request size)."""

    def __init__(self, exp: Experiment, base_seed: int):
        super().__init__(exp, base_seed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # hyperopt 0.2.7 imports the deprecated pkg_resources
            import hyperopt

        self.hp = hyperopt
        space = {p.name: self._dimension(p) for p in self.params}
        self.domain = hyperopt.Domain(None, space, pass_expr_memo_ctrl=None)
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

    def suggest(self, history: list[History], n: int) -> list[Suggestion]:
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
    """grid, multivariate-tpe, cmaes and sobol on an optuna study rebuilt from the history."""

    def __init__(self, exp: Experiment, base_seed: int):
        super().__init__(exp, base_seed)
        import optuna

        self.optuna = optuna
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.dists = {p.name: self._distribution(p) for p in self.params}
        self.grid = {p.name: p.grid() for p in self.params} if exp.algorithm == "grid" else None

    def _distribution(self, p: Parameter):
        d = self.optuna.distributions
        if not p.numeric:
            return d.CategoricalDistribution(p.values)
        log = p.distribution == "logUniform"
        if p.type == "int":
            step = 1 if log else int(p.step or 1)
            return d.IntDistribution(int(p.min), int(p.max), log=log, step=step)
        return d.FloatDistribution(p.min, p.max, log=log, step=None if log else p.step)

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
        if name == "cmaes":
            restart = s.get("restart_strategy", "none")
            kwargs: dict[str, Any] = {"seed": seed}
            if "sigma" in s:
                kwargs["sigma0"] = float(s["sigma"])
            if restart != "none":
                kwargs["restart_strategy"] = restart
            return samplers.CmaEsSampler(**kwargs, warn_independent_sampling=False)
        return samplers.QMCSampler(qmc_type="sobol", seed=seed, warn_independent_sampling=False,
                                   warn_asynchronous_seeding=False)

    def suggest(self, history: list[History], n: int) -> list[Suggestion]:
        optuna = self.optuna
        TrialState = optuna.trial.TrialState
        if self.grid is not None:
            started = {h.optuna_attrs.get("grid_id") for h in history} - {None}
            left = math.prod(len(v) for v in self.grid.values()) - len(started)
            if left <= 0:
                raise SearchSpaceExhausted(f"all {len(started)} grid combinations started")
            n = min(n, left)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            study = optuna.create_study(
                direction="maximize" if self.exp.objective.maximize else "minimize",
                # GridSampler shuffles the grid with its seed: keep one seed so grid ids stay.
                sampler=self._sampler(self.base_seed if self.grid is not None
                                      else derived_seed(self.base_seed, len(history))),
            )
            for h in history:
                if h.objective is not None:
                    state, value = TrialState.COMPLETE, h.objective
                else:
                    state, value = (TrialState.RUNNING if h.active else TrialState.FAIL), None
                params = {k: self._optuna_value(k, v) for k, v in h.parameters.items()}
                study.add_trial(optuna.trial.create_trial(
                    params=params, distributions=self.dists, value=value, state=state,
                    system_attrs=dict(h.optuna_attrs),
                ))
            out = []
            for _ in range(n):
                trial = study.ask(fixed_distributions=self.dists)
                frozen = study._storage.get_trial(trial._trial_id)
                params = {p.name: p.snap(trial.params[p.name]) for p in self.params}
                attrs = {k: v for k, v in frozen.system_attrs.items()
                         if isinstance(v, (str, int, float, bool, list, dict, type(None)))}
                out.append(Suggestion(params, attrs))
        return out

    def _optuna_value(self, name: str, value: Any) -> Any:
        p = next(q for q in self.params if q.name == name)
        if not p.numeric:
            return str(value)
        return int(value) if p.type == "int" else float(value)


class SkoptSuggester(Suggester):
    """bayesianoptimization: skopt.Optimizer with Katib's defaults (GP, 10 initial, gp_hedge).

    Running trials are told with the constant-liar value (the best loss so far), as skopt's
    own `ask(n_points)` does, so parallel trials do not repeat a running point.
    """

    def __init__(self, exp: Experiment, base_seed: int):
        super().__init__(exp, base_seed)
        import skopt

        self.skopt = skopt
        self.dims = []
        for p in self.params:
            prior = "log-uniform" if p.distribution == "logUniform" else "uniform"
            if p.type == "int":
                self.dims.append(skopt.space.Integer(int(p.min), int(p.max), prior, name=p.name))
            elif p.type == "double":
                self.dims.append(skopt.space.Real(p.min, p.max, prior, name=p.name))
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

    def suggest(self, history: list[History], n: int) -> list[Suggestion]:
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


def make_suggester(exp: Experiment, base_seed: int) -> Suggester:
    if exp.algorithm in ("random", "tpe"):
        return HyperoptSuggester(exp, base_seed)
    if exp.algorithm == "bayesianoptimization":
        return SkoptSuggester(exp, base_seed)
    return OptunaSuggester(exp, base_seed)
