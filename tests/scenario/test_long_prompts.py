"""Generated long prompts: their length follows the target, a seed fixes them, and they read as a
varied document that ends in a question."""

import re

import pytest

from rig.scenario.long_prompts import build_long_prompt
from rig.scenario.prompts import ChatMessage


@pytest.mark.parametrize("target_tokens", [1000, 4000, 10000])
def test_long_prompt_length_follows_four_chars_per_token(target_tokens):
    prompt = build_long_prompt(target_tokens)
    assert prompt.id == f"long-{target_tokens}-0"
    assert 0.95 * 4 * target_tokens <= len(prompt.text) <= 1.05 * 4 * target_tokens
    words = len(prompt.text.split())
    assert 0.6 * target_tokens <= words <= 0.9 * target_tokens


def test_long_prompt_is_deterministic_and_seeded():
    assert build_long_prompt(4000, seed=7) == build_long_prompt(4000, seed=7)
    texts = {build_long_prompt(1000, seed=seed).text for seed in range(20)}
    assert len(texts) == 20


def test_long_prompt_is_varied_text_ending_in_a_question():
    prompt = build_long_prompt(10000, seed=3)
    sentences = re.split(r"(?<=\.) ", prompt.text)
    assert len(set(sentences)) > 0.6 * len(sentences)
    assert prompt.text.rstrip().endswith("Answer in one paragraph.")
    reference = re.search(r"archive reference of this collection is ([A-Z]-\d{4})\.", prompt.text)
    assert reference is not None
    assert prompt.text.count(reference.group(1)) == 1
    assert prompt.messages == (ChatMessage("user", prompt.text),)


def test_long_prompt_small_target_still_has_a_document():
    text = build_long_prompt(5).text
    assert text.startswith("# Annual report")
    assert "archive reference of this collection is" in text
    with pytest.raises(ValueError):
        build_long_prompt(0)
