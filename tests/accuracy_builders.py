"""A graded question's answer record, for the accuracy tests of verdict/ and report/."""

from rig.records import RequestRecord


def answer_record(side: str, index: int, text: str, error: str | None = None) -> RequestRecord:
    """Question q-<index>'s answer on `side`, as the accuracy block (repeat -1) records it."""
    return RequestRecord(
        side=side, request_id=f"acc-q-{index}", prompt_id=f"q-{index}", level=4, repeat=-1,
        index=index, cache_salt=f"s.{side}.{index}", sent_at=0.0, ttft_s=0.1, itl_s=[],
        e2el_s=0.2, text=text, token_ids=None, finish_reason="stop", prompt_tokens=10,
        output_tokens=3, logprobs=None, http_status=200, error=error, task="q",
    )  # fmt: skip
