"""Cache salts: the one home of vLLM's rules for them and of how the rig makes them.

Every request of a run carries a salt of its own, so no prefix-cache hit can hide the prefill
path. vLLM refuses a salt that breaks its rules (vllm.entrypoints.generate.base.protocol.
validate_cache_salt); the rig checks them before anything is sent.
"""

from __future__ import annotations

import hashlib
import re

MAX_CACHE_SALT_CHARS = 128
CACHE_SALT_FORBIDDEN = ("@", "/", "\\", "\x00")
_FORBIDDEN_PATTERN = re.compile("[" + re.escape("".join(CACHE_SALT_FORBIDDEN)) + "]")


def validate_cache_salt(salt: str) -> None:
    """Raise ValueError for a salt vLLM would reject: empty, too long, or a forbidden character."""
    if not isinstance(salt, str) or not salt:
        raise ValueError(f"cache_salt must be a non-empty string, got {salt!r}")
    if len(salt) > MAX_CACHE_SALT_CHARS:
        raise ValueError(f"cache_salt {salt!r} is longer than {MAX_CACHE_SALT_CHARS} characters")
    if any(char in salt for char in CACHE_SALT_FORBIDDEN):
        raise ValueError(f"cache_salt {salt!r} contains one of '@', '/', '\\', NUL")


def cache_salt(run_id: str, side: str, request_id: str) -> str:
    """A salt unique within the run that obeys vLLM's rules. Forbidden characters become '_';
    a longer salt keeps its tail behind a digest of the whole, so two runs whose long run ids
    differ only at the start still get different salts (an attached server outlives a run)."""
    salt = _FORBIDDEN_PATTERN.sub("_", f"{run_id}.{side}.{request_id}")
    if len(salt) > MAX_CACHE_SALT_CHARS:
        digest = hashlib.sha256(salt.encode()).hexdigest()[:16]
        salt = f"{digest}.{salt[-(MAX_CACHE_SALT_CHARS - len(digest) - 1) :]}"
    return salt
