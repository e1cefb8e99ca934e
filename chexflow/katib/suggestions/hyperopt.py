"""random and tpe with hyperopt (rand.suggest, tpe.suggest), as Katib's hyperopt service:
settings gamma, prior_weight, n_EI_candidates, random_state."""

from __future__ import annotations

import math
import warnings

from chexflow.katib.experiment.model import Experiment, Parameter
from chexflow.katib.suggestions.base import History, Suggester, Suggestion, derived_seed


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
