"""bayesianoptimization with scikit-optimize's Optimizer, as Katib's skopt service (settings
base_estimator, n_initial_points, acq_func, acq_optimizer, random_state)."""

from __future__ import annotations

import warnings
from typing import Any

from chexflow.katib.experiment.model import Experiment
from chexflow.katib.suggestions.base import History, Suggester, Suggestion, derived_seed
from chexflow.katib.suggestions.search_space import library_value, log_scale


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
            prior = "log-uniform" if log_scale(p) else "uniform"  # Katib's skopt: no normal prior
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
        return [library_value(p, params[p.name]) for p in self.params]

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
