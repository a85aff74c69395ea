"""Kernel names: ns1..ns8 resolve, anything else fails naming the known kernels."""

import pytest

from kernels.registry import (
    UnknownKernelError,
    known_kernel_names,
    resolve_kernel,
    sha256_of_files,
)


@pytest.mark.parametrize("rounds", range(1, 9))
def test_ns_names_resolve_to_their_round_count(rounds):
    spec = resolve_kernel(f"ns{rounds}")
    assert (spec.name, spec.ns_rounds) == (f"ns{rounds}", rounds)
    assert spec.cpu_op().ns_rounds == rounds


@pytest.mark.parametrize("name", ["ns0", "ns9", "ns04", "fla", "NS4", ""])
def test_unknown_names_list_the_known_kernels(name):
    with pytest.raises(UnknownKernelError) as error:
        resolve_kernel(name)
    message = str(error.value)
    assert repr(name) in message
    assert all(known in message for known in known_kernel_names())


def test_source_hash_follows_file_contents(tmp_path):
    first, second = tmp_path / "a.py", tmp_path / "b.py"
    first.write_text("x = 1\n")
    second.write_text("y = 2\n")
    before = sha256_of_files([first, second])
    assert before == sha256_of_files([first, second])
    second.write_text("y = 3\n")
    assert sha256_of_files([first, second]) != before


def test_cpu_and_cuda_sources_hash_differently():
    spec = resolve_kernel("ns4")
    assert spec.source_sha256("cpu") != spec.source_sha256("cuda")
    assert len(spec.source_sha256("cpu")) == 64
