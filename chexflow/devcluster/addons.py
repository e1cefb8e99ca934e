"""THE table of the local cluster's add-ons (addon.py says what one is and how to write one):
name -> its class, in start order. `chexflow cluster up` and `cluster build` get a `--NAME` flag
for each; `LocalCluster` runs them in this order and records their names and settings in
cluster.json.

Each add-on comes after those it requires (tests/test_devcluster_addons.py checks it).
"""

from __future__ import annotations

from collections.abc import Iterable

from chexflow.devcluster.addon import AddOn
from chexflow.devcluster.coscheduling import Coscheduling
from chexflow.devcluster.katib import Katib
from chexflow.devcluster.kserve import KServe
from chexflow.devcluster.kubeproxy import KubeProxy
from chexflow.devcluster.kueue import Kueue
from chexflow.devcluster.realnode import RealNodes
from chexflow.devcluster.registry import ClusterRegistry
from chexflow.devcluster.supervisor import DevClusterError
from chexflow.devcluster.trainer import Trainer

TABLE: dict[str, type[AddOn]] = {a.name: a for a in (
    RealNodes, KubeProxy, ClusterRegistry, Coscheduling, Kueue, Trainer, Katib, KServe)}


def resolve(asked: Iterable[AddOn]) -> list[AddOn]:
    """`asked` with what they require (its defaults) added, each once, in the table's order."""
    by_name: dict[str, AddOn] = {}
    for addon in asked:
        if addon.name not in TABLE:
            raise DevClusterError(f"unknown add-on {addon.name!r}: expected one of "
                                  f"{', '.join(TABLE)}")
        if addon.name in by_name:
            raise DevClusterError(f"add-on {addon.name} asked twice")
        by_name[addon.name] = addon
    for name in reversed(TABLE):  # a requirement is earlier in the table: one pass suffices
        if name in by_name:
            for needed in TABLE[name].requires:
                by_name.setdefault(needed, TABLE[needed]())
    return [by_name[name] for name in TABLE if name in by_name]


def named(names: Iterable[str]) -> list[AddOn]:
    """The add-ons of these names with their default settings, and what they require."""
    unknown = [n for n in names if n not in TABLE]
    if unknown:
        raise DevClusterError(f"unknown add-on(s) {', '.join(unknown)}: expected one of "
                              f"{', '.join(TABLE)}")
    return resolve(TABLE[n]() for n in dict.fromkeys(names))


def from_records(records: Iterable[dict]) -> list[AddOn]:
    """The add-ons cluster.json records ({"name": ..., **settings})."""
    out = []
    for record in records:
        settings = dict(record)
        name = settings.pop("name")
        if name not in TABLE:
            raise DevClusterError(f"cluster.json records add-on {name!r}, which this chexflow "
                                  f"does not have ({', '.join(TABLE)})")
        out.append(TABLE[name](**settings))
    return out


def records(addons: Iterable[AddOn]) -> list[dict]:
    """What cluster.json records of `addons`."""
    return [{"name": a.name, **a.settings()} for a in addons]
