"""The greedy-margin figure: margins and shares computed from each side's teacher-forced replay
(pure), and the figure drawn only when some replayed position has a top-k."""

from __future__ import annotations

import base64
import math

import pytest

from rig.records import TokenLogprob
from rig.report.plots import margin_figure, position_margin, side_margins

PNG_MAGIC = b"\x89PNG"


def _positions(margins: list[float]) -> list[TokenLogprob]:
    """One position per margin: token 1 chosen at -0.1, runner-up `margin` nats behind it, and
    a third token further back."""
    return [TokenLogprob(1, -0.1, {1: -0.1, 2: -0.1 - m, 3: -0.1 - m - 5.0}) for m in margins]


def test_position_margin_is_top_one_minus_top_two():
    assert position_margin(TokenLogprob(7, -0.2, {7: -0.2, 8: -1.5, 9: -0.9})) == pytest.approx(0.7)
    # the forced token behind the side's best (a replay past a divergence): the side's own gap
    assert position_margin(TokenLogprob(7, -2.0, {7: -2.0, 8: -0.5})) == pytest.approx(1.5)
    # the forced token outside the top-k
    assert position_margin(TokenLogprob(7, -9.0, {8: -0.5, 9: -0.75})) == pytest.approx(0.25)


def test_position_margin_skips_positions_without_a_runner_up():
    assert position_margin(TokenLogprob(7, -0.2, {7: -0.2})) is None
    assert position_margin(TokenLogprob(7, -0.2, {})) is None
    assert position_margin(TokenLogprob(7, -math.inf, {7: -math.inf, 8: -math.inf})) is None


def test_shares_per_side_over_every_replayed_completion():
    replayed = {
        "candidate": {
            ("a", (1, 1)): _positions([0.3, 8.0]),
            ("c", (1,)): [TokenLogprob(1, -0.1, {1: -0.1})],  # no runner-up
        },
        "reference": {
            ("a", (1, 1, 1, 1)): _positions([0.1, 0.5, 2.0, 3.0]),
            ("b", (1, 1, 1, 1)): _positions([0.2, 0.9, 4.0, 6.0]),
        },
        "reference-aa": {("a", (1,)): []},
    }
    measured = side_margins(replayed)
    assert [m.side for m in measured] == ["reference", "candidate"]  # reference first
    reference, candidate = measured
    assert sorted(reference.margins) == pytest.approx([0.1, 0.2, 0.5, 0.9, 2.0, 3.0, 4.0, 6.0])
    assert reference.shares == pytest.approx({0.25: 2 / 8, 1.0: 4 / 8})
    assert sorted(candidate.margins) == pytest.approx([0.3, 8.0])
    assert candidate.shares == pytest.approx({0.25: 0.0, 1.0: 0.5})


def test_figure_present_with_a_replay_absent_without():
    replayed = {
        "reference": {("a", (1, 1, 1, 1)): _positions([0.1, 0.5, 2.0, math.inf])},
        "candidate": {("a", (1, 1)): _positions([0.2, 12.0])},
    }
    png = margin_figure(side_margins(replayed), near_tie_margin=0.25)
    assert png is not None and base64.b64decode(png).startswith(PNG_MAGIC)
    assert side_margins({}) == []
    assert side_margins({"reference": {}, "candidate": {}}) == []
    assert margin_figure(side_margins({}), near_tie_margin=0.25) is None


def test_null_logprobs_from_a_broken_kernel_are_skipped_not_fatal():
    """vLLM answers NaN logprobs as null (seen with ns3 on the tiny model); read as NaN."""
    assert position_margin(TokenLogprob(7, None, {7: None, 8: -1.5})) is None
    assert position_margin(TokenLogprob(7, -0.2, {7: -0.2, 8: None, 9: -0.9})) == pytest.approx(0.7)
    assert position_margin(TokenLogprob(7, -0.2, {7: -0.2, 8: math.nan, 9: -0.9})) == pytest.approx(
        0.7
    )
