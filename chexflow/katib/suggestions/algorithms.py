"""Katib's algorithms in one table: Katib's suggestion service, what runs each one locally, and
what serves it on chexflow's development cluster.

`service` is the suggestion service of Katib's katib-config (runtime.suggestions); `suggester`
the module of this package whose suggester runs it for chexflow's local runner and its gRPC
service (services/server.py), and `library` what that calls (None: it runs only on a cluster);
`dev_cluster` the image that serves it on `chexflow cluster up --katib`: Katib's own goptuna
image (Go), chexflow's service in the launcher image, or none (the Experiment is refused there
with Katib's "unable to get Suggestion config data").
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Algorithm:
    name: str
    service: str
    suggester: str | None
    library: str | None
    dev_cluster: str | None


GOPTUNA, CHEXFLOW = "goptuna", "chexflow"

ALGORITHMS = {a.name: a for a in (
    Algorithm("random", "hyperopt", "hyperopt", "hyperopt rand.suggest", GOPTUNA),
    Algorithm("tpe", "hyperopt", "hyperopt", "hyperopt tpe.suggest", GOPTUNA),
    Algorithm("grid", "optuna", "optuna", "optuna GridSampler", CHEXFLOW),
    Algorithm("multivariate-tpe", "optuna", "optuna", "optuna TPESampler(multivariate=True)",
              CHEXFLOW),
    Algorithm("bayesianoptimization", "skopt", "skopt", "scikit-optimize Optimizer", CHEXFLOW),
    Algorithm("cmaes", "goptuna", "cmaes", "cmaes CMA (the library Katib's goptuna CMA-ES ports)",
              GOPTUNA),
    Algorithm("sobol", "goptuna", "optuna",
              "optuna QMCSampler(qmc_type='sobol') (closest to Katib's goptuna Sobol)", GOPTUNA),
    Algorithm("hyperband", "hyperband", None, None, None),
    Algorithm("pbt", "pbt", None, None, None),
    Algorithm("enas", "enas", None, None, None),
    Algorithm("darts", "darts", None, None, None),
)}
EARLY_STOPPING = ("medianstop",)
# Katib's Python services refuse a setting they do not know; goptuna ignores it.
STRICT_SERVICES = ("hyperopt", "optuna", "skopt")


def served_on_dev_cluster(by: str) -> tuple[str, ...]:
    """The algorithms the development cluster serves with `by` (GOPTUNA or CHEXFLOW)."""
    return tuple(a.name for a in ALGORITHMS.values() if a.dev_cluster == by)

# Derived from the table: what runs here, what only on a cluster, each one's service and library.
CLUSTER_ONLY = tuple(a.name for a in ALGORITHMS.values() if not a.suggester)
SERVICE = {a.name: a.service for a in ALGORITHMS.values()}
LIBRARY = {a.name: a.library for a in ALGORITHMS.values() if a.library}
