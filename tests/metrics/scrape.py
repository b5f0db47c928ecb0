"""Reading /metrics in tests: the exposition parsed by prometheus-client's own parser."""

from __future__ import annotations

from dataclasses import dataclass

import httpx
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families


@dataclass(frozen=True)
class Scrape:
    families: dict[str, str]  # family name -> type
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float]

    def value(self, name: str, **labels: str) -> float:
        """A sample's value; 0 when the series is absent (a counter not moved yet)."""
        return self.samples.get((name, frozenset(labels.items())), 0.0)

    def has(self, name: str, **labels: str) -> bool:
        return (name, frozenset(labels.items())) in self.samples

    def series(self, name: str) -> dict[frozenset[tuple[str, str]], float]:
        return {labels: v for (n, labels), v in self.samples.items() if n == name}

    def total(self, name: str, **labels: str) -> float:
        """Sum over every series of ``name`` whose labels include ``labels``."""
        wanted = set(labels.items())
        return sum(v for ls, v in self.series(name).items() if wanted <= ls)


def parse(text: str) -> Scrape:
    families: dict[str, str] = {}
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    for family in text_string_to_metric_families(text):
        families[family.name] = family.type
        for s in family.samples:
            samples[s.name, frozenset(s.labels.items())] = s.value
    return Scrape(families, samples)


def scrape(api: TestClient | httpx.Client) -> Scrape:
    response = api.get("/metrics")
    response.raise_for_status()
    assert response.headers["content-type"].startswith("text/plain")
    return parse(response.text)
