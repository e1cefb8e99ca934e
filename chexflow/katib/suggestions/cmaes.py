"""cmaes: Katib runs goptuna's CMA-ES (Go), a port of the `cmaes` library used here (settings
random_state, sigma, restart_strategy none | ipop | bipop; optuna's CmaEsSampler ignores
restarts since optuna 4.4)."""

from __future__ import annotations

import math

import numpy as np

from chexflow.katib.experiment.model import Experiment
from chexflow.katib.suggestions.base import History, Suggester, Suggestion, derived_seed
from chexflow.katib.suggestions.search_space import log_scale


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
        self.log = [log_scale(p) for p in self.numeric]
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
