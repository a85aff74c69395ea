"""The accuracy block as the report shows it: summary.md's line, report.html's section with
each flip linked to its request pair's card, and accuracy.csv's rows."""

from rig.records import Side
from rig.report.accuracy import accuracy_markdown, accuracy_section
from rig.report.tables import accuracy_table
from rig.verdict.accuracy import accuracy_result
from rig.verdict.compare import compare_pairs
from tests.accuracy_builders import answer_record


def one_lost():
    """Two questions, both right on the reference; the candidate loses the second."""
    reference = [answer_record(Side.REFERENCE, i, f" so\n#### {i + 100}") for i in range(2)]
    candidate = [
        answer_record(Side.CANDIDATE, 0, " so\n#### 100"),
        answer_record(Side.CANDIDATE, 1, " #### 7"),
    ]
    result = accuracy_result({"q-0": "100", "q-1": "101"}, reference + candidate, "q")
    return result, compare_pairs(reference, candidate, 0.1, 16, {})


def test_the_markdown_line_says_the_flips():
    result, _ = one_lost()
    (line, blank) = accuracy_markdown(result)
    assert line.startswith("Accuracy (q, 2 questions, ") and "flips 1 / 0" in line
    assert blank == "" and accuracy_markdown(None) == []


def test_the_section_links_each_flip_to_its_pair():
    result, pairs = one_lost()
    page = accuracy_section(result, pairs)
    assert page.startswith('<section id="accuracy">')
    assert 'href="#pair-acc-q-1"' in page and "acc-q-0" not in page  # q-0 is no flip
    assert "100.0 %" in page and "50.0 %" in page
    assert accuracy_section(None, pairs) == ""


def test_the_csv_has_a_row_per_question_with_its_pair():
    result, pairs = one_lost()
    table = accuracy_table(result, pairs)
    assert list(table.question_id) == ["q-0", "q-1"]
    assert list(table.reference_right) == [True, True]
    assert list(table.candidate_right) == [True, False]
    assert table.flip.iloc[0] in ("", None) and table.flip.iloc[1] == "lost"
    assert table.div_char_index.iloc[1] == 1 and accuracy_table(None, pairs).empty
