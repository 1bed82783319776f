"""tests/support/promql.py: what a PromQL expression reads, and what a scrape lacks of it
(the parser behind tests/e2e/test_series_from_start.py)."""

from __future__ import annotations

from tests.support.promql import (
    Matcher,
    Selector,
    adapter_rule_exprs,
    prometheus_rule_exprs,
    selectors,
    unmet,
)


def test_selectors_leave_out_functions_grouping_keywords_and_durations() -> None:
    expr = (
        'histogram_quantile(0.99, sum by (le, model) (rate(a_bucket{job=~"$job", x="y z"}[$__rate_interval])))'
        " / on () group_left max(b_total offset 5m) > bool 3 and c"
        ' unless sum(rate(d_total[5m:1m])) by (pod) or {__name__="e", f!~"g|h"}'
    )
    assert [str(s) for s in selectors(expr)] == [
        'a_bucket{job=~"$job", x="y z"}',
        "b_total{}",
        "c{}",
        "d_total{}",
        'e{f!~"g|h"}',
    ]


def test_unmet_names_each_value_a_selector_reads_without_a_series() -> None:
    samples = [
        ("m_total", {"outcome": "success", "reason": "ok"}),
        ("m_total", {"outcome": "failure", "reason": "upstream_error"}),
    ]
    both = Selector("m_total", (Matcher("job", "=", "mlpa"), Matcher("outcome", "=~", "success|failure")))
    assert unmet(both, samples) == []  # the job label is Prometheus's, not the service's
    three = Selector("m_total", (Matcher("reason", "=~", "ok|upstream_error|empty_response"),))
    assert unmet(three, samples) == [f'{three} (no series with reason="empty_response")']
    assert unmet(Selector("absent_total", ()), samples) == ["absent_total{}"]
    assert unmet(Selector("m_total", (Matcher("outcome", "=", "abort"),)), samples) == ['m_total{outcome="abort"}']
    # A matcher on an absent label reads it as empty, as Prometheus does.
    assert unmet(Selector("m_total", (Matcher("model", "=", ""),)), samples) == []


def test_the_shipped_rules_are_found() -> None:
    exprs, recorded = prometheus_rule_exprs()
    assert len(exprs) >= 10 and "mlpa:chat_availability_errors:ratio_rate5m" in recorded
    adapter = adapter_rule_exprs()
    assert {s.name for rule in adapter for s in selectors(rule.expr)} >= {"mlpa_open_streams", "mlpa_shed_requests_total"}
