"""replay.jsonl: the teacher-forced replay's sequences (each reference prompt and greedy
completion, as token ids) and each side's answer along them (rig.records.ForcedSequence and
ForcedLogprobs), kept for the report and `rig compare`. The client that fills them is
replay_client; the drift computed from them is rig.verdict.drift."""

from __future__ import annotations

import json
from pathlib import Path

from rig.records import CompletionKey, ForcedLogprobs, ForcedSequence, TokenLogprob

REPLAY_FILE = "replay.jsonl"


def write_replay(
    path: Path, sequences: list[ForcedSequence], forced: dict[str, dict[int, ForcedLogprobs]]
) -> None:
    """replay.jsonl: one line per side and replayed sequence, with the completion's token ids,
    the forced logprobs at its positions and the side's top-k there (token id -> logprob)."""
    with open(path, "w", encoding="utf-8") as handle:
        for side, answers in forced.items():
            for index, answer in sorted(answers.items()):
                sequence = sequences[index]
                start = len(sequence.prompt_token_ids)
                row = {
                    "side": side,
                    "prompt_id": sequence.prompt_id,
                    "prompt_tokens": start,
                    "completion_token_ids": list(sequence.completion_token_ids),
                    "logprobs": list(answer.logprobs[start:]),
                    "top": answer.to_json()["top"],
                    "error": answer.error,
                }
                handle.write(json.dumps(row) + "\n")


def read_replay(path: Path) -> dict[str, dict[CompletionKey, list[TokenLogprob]]]:
    """replay.jsonl back as rig.verdict.drift.forced_positions gives it, per side; empty
    without the file."""
    replayed: dict[str, dict[CompletionKey, list[TokenLogprob]]] = {}
    if not Path(path).exists():
        return replayed
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            row = json.loads(line) if line.strip() else None
            if row is None or row["error"] is not None:
                continue
            completion = tuple(row["completion_token_ids"])
            positions = zip(completion, row["logprobs"], row["top"], strict=False)
            replayed.setdefault(row["side"], {})[(row["prompt_id"], completion)] = [
                TokenLogprob(token, logprob, {int(t): v for t, v in top.items()})
                for token, logprob, top in positions
            ]
    return replayed
