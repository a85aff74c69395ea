"""Prompt loading: one typed record per prompt, whatever file format it came from.

Both sides of a comparison must receive byte-identical requests, so every supported format is
reduced to the same `Prompt` (an id plus chat messages) before anything is sent. Files are read
completely and validated before the first request: a bad line fails the run up front, naming the
file, the line and the problem, rather than after an hour of serving.

Supported formats, detected from the content:
- JSONL, one object per line, each with one of
  `prompt` (a string), `messages` (OpenAI chat messages), `turns` (MT-bench; first turn only)
  or `conversations` (ShareGPT);
- a JSON array of such objects (ShareGPT files are arrays of `{"id", "conversations"}`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_ROLE_LABELS = {"system": "System", "user": "User", "assistant": "Assistant"}
_SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "system": "system",
}
_PROMPT_KEYS = ("prompt", "messages", "turns", "conversations")
TOO_DEEP = "JSON nested too deeply to read"  # json's parser recurses once per level


class PromptFileError(ValueError):
    """A prompt file that cannot be used; the message names the file, the place and the problem."""


@dataclass(frozen=True)
class ChatMessage:
    role: str
    content: str


@dataclass(frozen=True)
class Prompt:
    """One request's input; `source` says where it came from (file and line, or the generator)."""

    id: str
    messages: tuple[ChatMessage, ...]
    source: str
    category: str | None = None

    @property
    def text(self) -> str:
        """The prompt for the completions endpoint.

        A single message is sent as its bare content. A conversation becomes a plain transcript
        ending in "Assistant:" so that a completion model continues as the assistant.
        """
        if len(self.messages) == 1:
            return self.messages[0].content
        turns = [f"{_ROLE_LABELS.get(m.role, m.role.title())}: {m.content}" for m in self.messages]
        if self.messages[-1].role != "assistant":
            turns.append("Assistant:")
        return "\n\n".join(turns)

    def messages_as_dicts(self) -> list[dict[str, str]]:
        """The `messages` field of a chat-completions request."""
        return [{"role": m.role, "content": m.content} for m in self.messages]


def load_prompts(path: Path, limit: int | None = None) -> list[Prompt]:
    """Read and validate every prompt in `path`, then return the first `limit` (all if None)."""
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be a positive number of prompts or None, got {limit}")
    path = Path(path)
    try:
        content = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PromptFileError(f"{path}: prompt file not found") from None
    except IsADirectoryError:
        raise PromptFileError(f"{path}: is a directory, not a prompt file") from None
    except OSError as exc:
        raise PromptFileError(f"{path}: cannot read the prompt file ({exc.strerror})") from None
    except UnicodeDecodeError as exc:
        raise PromptFileError(
            f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})"
        ) from None

    if content.lstrip().startswith("["):
        records = _json_array_records(path, content)
    else:
        records = _jsonl_records(path, content)
    if not records:
        raise PromptFileError(f"{path}: empty file, no prompts in it")

    prompts: list[Prompt] = []
    first_seen: dict[str, str] = {}
    for place, number, record in records:
        prompt = _parse_record(path, place, number, record)
        if prompt.id in first_seen:
            raise PromptFileError(
                f"{path}: {place}: duplicate id {prompt.id!r} "
                f"(first used at {first_seen[prompt.id]})"
            )
        first_seen[prompt.id] = place
        prompts.append(prompt)
    return prompts if limit is None else prompts[:limit]


def _jsonl_records(path: Path, content: str) -> list[tuple[str, int, Any]]:
    """(place, number, decoded object) per non-blank line; numbers are 1-based line numbers.
    Lines end at "\n" only: a JSON string may hold U+2028 or U+0085 as they are, which
    str.splitlines would take for line ends."""
    records = []
    for number, line in enumerate(content.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            records.append((f"line {number}", number, json.loads(line)))
        except json.JSONDecodeError as exc:
            raise PromptFileError(f"{path}: line {number}: invalid JSON ({exc.msg})") from None
        except RecursionError:
            raise PromptFileError(f"{path}: line {number}: {TOO_DEEP}") from None
    return records


def _json_array_records(path: Path, content: str) -> list[tuple[str, int, Any]]:
    """(place, number, decoded object) per array element; numbers are 1-based entry numbers."""
    try:
        entries = json.loads(content)
    except json.JSONDecodeError as exc:
        raise PromptFileError(
            f"{path}: line {exc.lineno}: invalid JSON ({exc.msg}, column {exc.colno})"
        ) from None
    except RecursionError:
        raise PromptFileError(f"{path}: {TOO_DEEP}") from None
    if not isinstance(entries, list):
        raise PromptFileError(f"{path}: expected a JSON array of prompt objects")
    return [(f"entry {number}", number, entry) for number, entry in enumerate(entries, start=1)]


def _parse_record(path: Path, place: str, number: int, record: Any) -> Prompt:
    where = f"{path}: {place}"
    if not isinstance(record, dict):
        raise PromptFileError(f"{where}: wrong type, expected a JSON object, got {_kind(record)}")
    key = next((k for k in _PROMPT_KEYS if k in record), None)
    if key is None:
        raise PromptFileError(
            f"{where}: no prompt field (expected one of {', '.join(map(repr, _PROMPT_KEYS))})"
        )
    if key == "prompt":
        messages = (ChatMessage("user", _text(where, "prompt", record["prompt"])),)
    elif key == "messages":
        messages = _chat_messages(where, record["messages"])
    elif key == "turns":
        messages = _first_turn(where, record["turns"])
    else:
        messages = _sharegpt_messages(where, record["conversations"])
    category = record.get("category")
    if category is not None and not isinstance(category, str):
        raise PromptFileError(f"{where}: wrong type for 'category', expected a string")
    return Prompt(
        id=_prompt_id(where, record, f"{path.stem}-{number}"),
        messages=messages,
        source=f"{path}, {place}",
        category=category,
    )


def _prompt_id(where: str, record: dict[str, Any], fallback: str) -> str:
    for key in ("id", "question_id"):
        if key not in record:
            continue
        value = record[key]
        if isinstance(value, bool) or not isinstance(value, str | int):
            raise PromptFileError(f"{where}: wrong type for {key!r}, expected a string or integer")
        if isinstance(value, str) and not value.strip():
            raise PromptFileError(f"{where}: empty {key!r}")
        return str(value)
    return fallback


def _text(where: str, field: str, value: Any) -> str:
    """A non-blank string; surrounding whitespace is kept because it is part of the prompt."""
    if not isinstance(value, str):
        raise PromptFileError(
            f"{where}: wrong type for {field!r}, expected a string, got {_kind(value)}"
        )
    if not value.strip():
        raise PromptFileError(f"{where}: empty prompt in {field!r}")
    return value


def _list(where: str, field: str, value: Any) -> list[Any]:
    if not isinstance(value, list):
        raise PromptFileError(
            f"{where}: wrong type for {field!r}, expected a list, got {_kind(value)}"
        )
    if not value:
        raise PromptFileError(f"{where}: empty prompt, {field!r} is an empty list")
    return value


def _chat_messages(where: str, value: Any) -> tuple[ChatMessage, ...]:
    messages = []
    for index, message in enumerate(_list(where, "messages", value)):
        field = f"messages[{index}]"
        if not isinstance(message, dict):
            raise PromptFileError(f"{where}: wrong type for {field!r}, expected an object")
        role = message.get("role")
        if not isinstance(role, str) or role not in _ROLE_LABELS:
            raise PromptFileError(
                f"{where}: {field} has role {role!r}, expected 'system', 'user' or 'assistant'"
            )
        messages.append(ChatMessage(role, _text(where, f"{field}.content", message.get("content"))))
    if not any(m.role == "user" for m in messages):
        raise PromptFileError(f"{where}: no prompt, 'messages' has no user message")
    return tuple(messages)


def _first_turn(where: str, value: Any) -> tuple[ChatMessage, ...]:
    turns = _list(where, "turns", value)
    return (ChatMessage("user", _text(where, "turns[0]", turns[0])),)


def _sharegpt_messages(where: str, value: Any) -> tuple[ChatMessage, ...]:
    """Messages up to and including the first human turn: later turns answer another model."""
    messages = []
    for index, turn in enumerate(_list(where, "conversations", value)):
        field = f"conversations[{index}]"
        if not isinstance(turn, dict):
            raise PromptFileError(f"{where}: wrong type for {field!r}, expected an object")
        speaker = turn.get("from")
        role = _SHAREGPT_ROLES.get(speaker) if isinstance(speaker, str) else None
        if role is None:
            raise PromptFileError(
                f"{where}: {field} has 'from' {speaker!r}, expected 'human', 'gpt' or 'system'"
            )
        messages.append(ChatMessage(role, _text(where, f"{field}.value", turn.get("value"))))
        if role == "user":
            return tuple(messages)
    raise PromptFileError(f"{where}: no prompt, 'conversations' has no human turn")


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__
