"""The one redaction rule: secret names, argv, env, free text, files, digests."""

import pytest
from pydantic import SecretStr

from rig.secrets import (
    REDACTED,
    auth_headers,
    digest,
    is_secret_name,
    redact_argv,
    redact_env,
    redact_file,
    redact_text,
)


@pytest.mark.parametrize(
    "name",
    ["VLLM_API_KEY", "HF_TOKEN", "AWS_SECRET_ACCESS_KEY", "DB_PASSWORD", "--api-key", "--hf-token"],
)
def test_secret_names(name):
    assert is_secret_name(name)


@pytest.mark.parametrize(
    "name",
    ["TOKENIZERS_PARALLELISM", "--max-num-batched-tokens", "--tokenizer", "RIG_GDN_KERNEL", "KEYS"],
)
def test_names_that_only_look_secret(name):
    assert not is_secret_name(name)


def test_env_keeps_names_and_loses_secret_values():
    env = {"HF_TOKEN": "hf_abc", "VLLM_CPU_KVCACHE_SPACE": "4"}
    assert redact_env(env) == {"HF_TOKEN": REDACTED, "VLLM_CPU_KVCACHE_SPACE": "4"}


def test_argv_keeps_flags_and_loses_secret_values_in_both_spellings():
    argv = ["serve", "m", "--api-key", "sk-1", "--hf-token=hf_2", "--port", "8000"]
    assert redact_argv(argv) == [
        "serve",
        "m",
        "--api-key",
        REDACTED,
        f"--hf-token={REDACTED}",
        "--port",
        "8000",
    ]


def test_a_digest_tells_secrets_apart_without_showing_them():
    assert digest("sk-1") == digest("sk-1") != digest("sk-2")
    assert "sk-1" not in digest("sk-1")
    assert redact_env({"VLLM_API_KEY": "sk-1"}, mask=digest) == {"VLLM_API_KEY": digest("sk-1")}


def test_known_values_are_struck_from_text_and_files(tmp_path):
    assert redact_text("Bearer sk-1 failed", ["sk-1", ""]) == f"Bearer {REDACTED} failed"
    log = tmp_path / "server.log"
    log.write_bytes(b"args: sk-1\n\xff binary stays\n")
    redact_file(log, ["sk-1"])
    assert log.read_bytes() == REDACTED.encode().join([b"args: ", b"\n\xff binary stays\n"])


def test_auth_header_only_with_a_key():
    assert auth_headers(None) == {}
    assert auth_headers(SecretStr("sk-1")) == {"Authorization": "Bearer sk-1"}
