"""grid (GridSampler), multivariate-tpe (TPESampler(multivariate=True, constant_liar=True):
n_startup_trials, n_ei_candidates, random_state) and sobol (Katib runs goptuna's Sobol sampler
in Go; here optuna's QMCSampler(qmc_type="sobol")), as Katib's optuna service."""

from __future__ import annotations

import math
import warnings
from typing import Any

from chexflow.katib.experiment.model import Experiment, Parameter
from chexflow.katib.suggestions.base import (
    History,
    SearchSpaceExhausted,
    Suggester,
    Suggestion,
    derived_seed,
)
from chexflow.katib.suggestions.search_space import library_value, log_scale


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
        log = log_scale(p)
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
        return library_value(next(q for q in self.params if q.name == name), value)


def _plain(attrs: dict[str, Any]) -> dict[str, Any]:
    """The JSON-serialisable attributes (the sweep state is JSON)."""
    return {k: v for k, v in attrs.items()
            if isinstance(v, (str, int, float, bool, list, dict, type(None)))}
