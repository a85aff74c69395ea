"""Secrets: the one rule for what is secret and how it is kept out of everything the rig writes.

A name is secret when one of its words (split at '_' or '-') is KEY, TOKEN, SECRET, PASSWORD,
PASSWD or CREDENTIAL(S): VLLM_API_KEY, HF_TOKEN, --api-key, --hf-token; not TOKENIZERS_PARALLELISM
nor --max-num-batched-tokens. Environment variables and command-line flags with such names keep
their name and lose their value (`<redacted>`, or a digest where the value must still tell two
configurations apart, as in the golden cache key). Known secret values (an API key) are also
struck from free text: server logs, error messages.

API keys travel as pydantic `SecretStr` (whose repr and JSON dump are masked) and reach vLLM
through its environment (VLLM_API_KEY), never its argv, which any user of the machine can read.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from pydantic import SecretStr

REDACTED = "<redacted>"
API_KEY_ENV = "VLLM_API_KEY"  # vLLM reads its API key from here when --api-key is not given
_SECRET_WORD = re.compile(r"(?:^|[_-])(?:KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIALS?)(?:$|[_-])")

Mask = Callable[[str], str]


def _redact(_: str) -> str:
    return REDACTED


def digest(value: str) -> str:
    """A stand-in that still changes when the secret does, without revealing it."""
    return "sha256:" + hashlib.sha256(value.encode()).hexdigest()[:16]


def is_secret_name(name: str) -> bool:
    return bool(_SECRET_WORD.search(name.lstrip("-").upper()))


def redact_env(env: Mapping[str, str], mask: Mask = _redact) -> dict[str, str]:
    return {name: (mask(value) if is_secret_name(name) else value) for name, value in env.items()}


def redact_argv(argv: Iterable[str], mask: Mask = _redact) -> list[str]:
    """`--api-key X` and `--api-key=X` keep the flag and lose the value."""
    kept: list[str] = []
    hide_next = False
    for arg in argv:
        flag, equals, value = arg.partition("=")
        if hide_next:
            kept.append(mask(arg))
            hide_next = False
        elif arg.startswith("--") and is_secret_name(flag):
            kept.append(f"{flag}={mask(value)}" if equals else arg)
            hide_next = not equals
        else:
            kept.append(arg)
    return kept


def redact_text(text: str, secrets: Iterable[str]) -> str:
    for secret in secrets:
        if secret:
            text = text.replace(secret, REDACTED)
    return text


def redact_file(path: Path, secrets: Iterable[str]) -> None:
    """Strike known secret values from a file (a server log) in place."""
    secrets = [s for s in secrets if s]
    if not secrets or not path.exists():
        return
    data = path.read_bytes()
    cleaned = data
    for secret in secrets:
        cleaned = cleaned.replace(secret.encode(), REDACTED.encode())
    if cleaned != data:
        path.write_bytes(cleaned)


def reveal(secret: SecretStr | None) -> str | None:
    return None if secret is None else secret.get_secret_value()


def auth_headers(api_key: SecretStr | None) -> dict[str, str]:
    """The Authorization header vLLM's --api-key / VLLM_API_KEY asks for, if any."""
    return {"Authorization": f"Bearer {api_key.get_secret_value()}"} if api_key else {}
