"""The requests a kube-apiserver served while a benchmark phase ran, by verb and resource, from
its own counter (`apiserver_request_total` on /metrics): which API traffic its CPU went to."""

from __future__ import annotations

from collections import Counter

from prometheus_client.parser import text_string_to_metric_families

METRIC = "apiserver_request"  # the family's name; its samples are apiserver_request_total


def request_counts(api) -> Counter:
    """(verb, resource[/subresource]) -> requests served so far (every code, every scope)."""
    response = api.call_api("/metrics", "GET", auth_settings=["BearerToken"],
                            _preload_content=False)
    counts: Counter = Counter()
    for family in text_string_to_metric_families(response[0].data.decode()):
        if family.name != METRIC:
            continue
        for sample in family.samples:
            if sample.name.endswith("_total"):
                labels = sample.labels
                resource = labels.get("resource") or "-"
                if labels.get("subresource"):
                    resource += "/" + labels["subresource"]
                counts[(labels.get("verb", "-").lower(), resource)] += int(sample.value)
    return counts


class ApiRequests:
    """A context: on exit, `result` maps "verb resource" to the requests served within it,
    most first (those under `least` left out)."""

    def __init__(self, api, least: int = 10):
        self.api, self.least = api, least
        self.result: dict[str, int] = {}

    def __enter__(self) -> ApiRequests:
        self._before = request_counts(self.api)
        return self

    def __exit__(self, *_exc) -> None:
        served = request_counts(self.api) - self._before
        self.result = {f"{verb} {resource}": n for (verb, resource), n in served.most_common()
                       if n >= self.least}
