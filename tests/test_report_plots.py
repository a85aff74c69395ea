"""The greedy-margin figure: margins and shares computed from records (pure), and the figure
drawn only when some timed record carries logprobs."""

from __future__ import annotations

import base64
import math

import pytest

from rig.records import TokenLogprob
from rig.report_plots import margin_figure, position_margin, side_margins

PNG_MAGIC = b"\x89PNG"


def _positions(margins: list[float]) -> list[TokenLogprob]:
    """One position per margin: token 1 chosen at -0.1, runner-up `margin` nats behind it, and
    a third token further back."""
    return [TokenLogprob(1, -0.1, {1: -0.1, 2: -0.1 - m, 3: -0.1 - m - 5.0}) for m in margins]


def test_position_margin_is_chosen_minus_best_other():
    assert position_margin(TokenLogprob(7, -0.2, {7: -0.2, 8: -1.5, 9: -0.9})) == pytest.approx(0.7)
    # the chosen token behind its runner-up (a sampled or mis-ranked token): negative
    assert position_margin(TokenLogprob(7, -2.0, {7: -2.0, 8: -0.5})) == pytest.approx(-1.5)


def test_position_margin_skips_positions_without_a_runner_up():
    assert position_margin(TokenLogprob(7, -0.2, {7: -0.2})) is None
    assert position_margin(TokenLogprob(7, -0.2, {})) is None
    assert position_margin(TokenLogprob(7, -math.inf, {7: -math.inf, 8: -0.1})) is None


def test_shares_per_side_leave_out_warmup_and_records_without_logprobs(make_record):
    records = [
        make_record("reference", "a", logprobs=_positions([0.1, 0.5, 2.0, 3.0])),
        make_record("reference", "b", logprobs=_positions([0.2, 0.9, 4.0, 6.0])),
        make_record("reference", "w", warmup=True, logprobs=_positions([0.01] * 50)),
        make_record("candidate", "a", logprobs=_positions([0.3, 8.0])),
        make_record("candidate", "b", logprobs=None),
        make_record("candidate", "c", logprobs=[TokenLogprob(1, -0.1, {1: -0.1})]),
    ]
    measured = side_margins(records)
    assert [m.side for m in measured] == ["reference", "candidate"]
    reference, candidate = measured
    assert sorted(reference.margins) == pytest.approx([0.1, 0.2, 0.5, 0.9, 2.0, 3.0, 4.0, 6.0])
    assert reference.shares == pytest.approx({0.25: 2 / 8, 1.0: 4 / 8})
    assert sorted(candidate.margins) == pytest.approx([0.3, 8.0])
    assert candidate.shares == pytest.approx({0.25: 0.0, 1.0: 0.5})


def test_figure_present_with_logprobs_absent_without(make_record):
    with_logprobs = [
        make_record("reference", "a", logprobs=_positions([0.1, 0.5, 2.0, math.inf])),
        make_record("candidate", "a", logprobs=_positions([0.2, 12.0])),
    ]
    png = margin_figure(side_margins(with_logprobs), near_tie_margin=0.25)
    assert png is not None and base64.b64decode(png).startswith(PNG_MAGIC)
    without = [make_record("reference", "a"), make_record("candidate", "a")]
    assert side_margins(without) == []
    assert margin_figure(side_margins(without), near_tie_margin=0.25) is None


def test_null_logprobs_from_a_broken_kernel_are_skipped_not_fatal():
    """vLLM answers NaN logprobs as null (seen with ns3 on the tiny model)."""
    assert position_margin(TokenLogprob(7, None, {7: None, 8: -1.5})) is None
    assert position_margin(TokenLogprob(7, -0.2, {7: -0.2, 8: None, 9: -0.9})) == pytest.approx(0.7)
