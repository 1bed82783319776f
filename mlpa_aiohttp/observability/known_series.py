"""Series that exist from start, at zero, for the label values known up front.

A labelled metric has no series until its first `.labels(...)`. Whatever reads it then sees
nothing rather than zero: prometheus-adapter serves no value, and an HPA that cannot read
a metric does not scale down; `increase()` and `rate()` need two samples of a series, so a
counter whose first sample is already 1 reads 0 and an alert on its first event never
fires. A metric therefore declares the label values it knows before its first event, in
one `known=` argument at its definition (metrics.py), and its constructor asks for each
of those series once (`_RememberedChildren`). In multiprocess mode asking is enough:
prometheus-client writes the child's key into the worker's file at 0 when the child is
made, so the aggregated /metrics has the series before any worker counted anything
(tests/e2e/test_series_from_start.py reads a fresh gunicorn's /metrics to check it).

Where it stops, and why (docs/operations.md, "Series from start"): the values declared are
fixed sets (reasons, outcomes, repair sites) and the loaded catalogue's names; `each`
multiplies its sets, so it is kept to small ones whose every combination the service
produces (service type x repair site: 13 x 3). Labels that go together are declared as
rows (a reason with its outcome), not multiplied. Labels left out are left empty, which
Prometheus reads as no label: `mlpa_chat_availability_total` gets one zero series per
reason, not one per reason, model, service type and purpose (about 27,000), and country or
Firefox version labels get none.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class KnownLabels:
    """Label values a metric has before its first event: every combination of `each`'s
    value lists, joined with each of `rows` (label values that go together)."""

    each: Mapping[str, Sequence[str]]
    rows: Sequence[Mapping[str, str]] = ({},)

    def label_names(self) -> set[str]:
        return set(self.each) | {name for row in self.rows for name in row}

    def label_sets(self, label_names: Sequence[str]) -> Iterator[tuple[str, ...]]:
        """Each known series' values in the metric's label order; labels not declared are
        empty. Raises ValueError for a declared label the metric does not have."""
        unknown = self.label_names() - set(label_names)
        if unknown:
            raise ValueError(f"known labels {sorted(unknown)} are not labels of the metric ({', '.join(label_names)})")
        names = list(self.each)
        for values in itertools.product(*(self.each[name] for name in names)):
            combination = dict(zip(names, values, strict=True))
            for row in self.rows:
                labels = {**combination, **row}
                yield tuple(labels.get(name, "") for name in label_names)


def known(**each: Sequence[str]) -> KnownLabels:
    """Every combination of these labels' values, e.g. `known(reason=SHED_REASONS)`."""
    return KnownLabels(each)


def known_rows(rows: Sequence[Mapping[str, str]], **each: Sequence[str]) -> KnownLabels:
    """These label sets (each one series), times every combination of `each`."""
    return KnownLabels(each, tuple(rows))
