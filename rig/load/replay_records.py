"""The teacher-forced replay's records: the sequences replayed (each reference prompt and greedy
completion, as token ids) and each side's answer along them, and replay.jsonl, which keeps them
for the report and `rig compare`. The client that fills them is replay_client; the drift
computed from them is rig.verdict.drift."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from rig.records import CompletionKey, TokenLogprob

REPLAY_FILE = "replay.jsonl"


@dataclass(frozen=True)
class ForcedSequence:
    """One sequence to replay: the reference's prompt and greedy completion, as token ids."""

    prompt_id: str
    prompt_token_ids: tuple[int, ...]
    completion_token_ids: tuple[int, ...]

    @property
    def key(self) -> CompletionKey:
        return (self.prompt_id, self.completion_token_ids)


@dataclass(frozen=True)
class ForcedLogprobs:
    """One side's answer along one forced sequence, or why there is none: the forced token's
    logprob at every position (index i: token i given tokens < i) and the side's top-k at every
    completion position."""

    logprobs: tuple[float | None, ...] = ()
    top: tuple[dict[int, float], ...] = ()
    error: str | None = None

    def to_json(self) -> dict:
        return {**asdict(self), "top": [{str(t): v for t, v in top.items()} for top in self.top]}

    @classmethod
    def from_json(cls, data: dict) -> ForcedLogprobs:
        top = tuple({int(t): v for t, v in position.items()} for position in data["top"])
        return cls(tuple(data["logprobs"]), top, data["error"])


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
