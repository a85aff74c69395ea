"""The report's text formatting: escaping that leaves markup inert and bidi controls visible."""

from rig.report.format import BIDI_CONTROLS, DASH, esc


def test_markup_is_escaped_for_elements_and_attributes():
    assert esc('</textarea>"><img onerror=x>') == (
        "&lt;/textarea&gt;&quot;&gt;&lt;img onerror=x&gt;"
    )
    assert esc(None) == DASH


def test_every_bidi_control_is_shown_by_its_code_point():
    shown = esc("a\u202eb\u2066c\u2069")
    assert shown == "a⟨U+202E⟩b⟨U+2066⟩c⟨U+2069⟩"
    assert not any(char in esc(BIDI_CONTROLS) for char in BIDI_CONTROLS)
    assert esc(BIDI_CONTROLS).count("⟨U+") == len(BIDI_CONTROLS) == 12
