"""Cached prompt tokens in summary.md and report.html: by turn for a conversation workload,
and each request's; nothing for a workload of single requests."""

from __future__ import annotations

from dataclasses import replace

from rig.report.html import render_html
from rig.report.markdown import render_markdown
from rig.report.prefix_hits import hits_html, hits_markdown
from rig.verdict.prefix_hits import hits_by_turn


def turn_records(make_record, candidate_hits=(0, 1280)):
    records = []
    for side, hits in (("reference", (0, 1280)), ("candidate", candidate_hits)):
        for turn, cached in enumerate(hits):
            records.append(
                make_record(
                    side,
                    f"c1-r0-{turn:04d}",
                    "text",
                    conversation_id="talk",
                    turn=turn,
                    cached_tokens=cached,
                    prompt_tokens=1446,
                )
            )
    return records


def test_markdown_has_a_row_per_turn(make_record):
    lines = hits_markdown(tuple(hits_by_turn(turn_records(make_record))))
    assert "| 1 | 1 | 1,446 | 1,280 | 1,280 |" in lines
    assert lines[0].startswith("Prefix-cache hits by turn")


def test_html_marks_a_side_whose_hits_differ_and_lists_each_request(make_record):
    records = turn_records(make_record, candidate_hits=(0, 640))
    page = hits_html(tuple(hits_by_turn(records)), records)
    assert "Cached prompt tokens by conversation turn" in page
    assert page.count(" bad") == 2  # the turn's row and the request's cell
    assert "c1-r0-0001" in page and "talk" in page


def test_single_requests_show_no_turn_tables(make_record):
    plain = [make_record("reference", "c1-r0-0000", "text")]
    assert hits_markdown(()) == [] and hits_html(tuple(hits_by_turn(plain)), plain) == ""


def test_whole_reports_carry_the_turn_tables(outcome, make_record):
    talk = replace(outcome, records=turn_records(make_record))
    assert talk.turn_hits == tuple(hits_by_turn(talk.records))  # computed once, in the outcome
    assert "Prefix-cache hits by turn" in render_markdown(talk)
    page = render_html(talk)
    assert "conversation turns hit by design" in page and "talk" in page


def test_html_does_not_mark_a_request_only_one_side_ran(make_record):
    """A block the reference ran again after a JIT compile: its requests show "—" for the
    candidate, not a difference."""
    rerun = make_record(
        "reference", "c4-r1-0001", "text", conversation_id="talk", turn=1, cached_tokens=1280
    )
    records = [*turn_records(make_record), rerun]
    page = hits_html(tuple(hits_by_turn(records)), records)
    assert "c4-r1-0001" in page and "—" in page
    assert " bad" not in page
