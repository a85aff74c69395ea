"""Cache salts: vLLM's rules and the rig's salts, which must always obey them."""

import pytest

from rig.records import RequestSpec, SamplingParams
from rig.salts import cache_salt, validate_cache_salt


def assert_vllm_salt(salt: str) -> None:
    """vLLM's own rule, restated: non-empty, <= 128 chars, none of @ / \\ NUL."""
    assert 0 < len(salt) <= 128
    assert not set(salt) & {"@", "/", "\\", "\x00"}
    validate_cache_salt(salt)


@pytest.mark.parametrize("salt", ["", "a" * 129, "a@b", "a/b", "a\\b", "a\x00b"])
def test_salts_vllm_would_reject_are_rejected_up_front(salt):
    with pytest.raises(ValueError, match="cache_salt"):
        RequestSpec("r", "p", 1, 0, 0, "completions", "x", None, salt, SamplingParams(1))


def test_a_128_character_salt_is_fine():
    RequestSpec("r", "p", 1, 0, 0, "completions", "x", None, "a" * 128, SamplingParams(1))


@pytest.mark.parametrize("run_id", ["a/b@c\\d\x00e", "/" * 200, "x" * 300])
def test_forbidden_characters_and_length_are_made_safe(run_id):
    assert_vllm_salt(cache_salt(run_id, "reference", "c1-r0-0000"))


def test_short_salt_keeps_run_side_and_request():
    salt = cache_salt("run1", "candidate", "c4-r1-0002")
    assert salt == "run1.candidate.c4-r1-0002"


def test_long_run_ids_that_differ_only_at_the_start_give_different_salts():
    # An attached server outlives a run: a later run must not hit the earlier run's cache.
    tail = "-" + "scenario" * 20
    first = cache_salt("20261129-120000" + tail, "reference", "c1-r0-0000")
    second = cache_salt("20261129-130000" + tail, "reference", "c1-r0-0000")
    assert first != second
    assert_vllm_salt(first)
    assert_vllm_salt(second)
    assert first.endswith("reference.c1-r0-0000")


def test_very_long_side_or_request_id_still_gives_a_valid_salt():
    salt = cache_salt("r", "s" * 200, "q" * 200)
    assert_vllm_salt(salt)
