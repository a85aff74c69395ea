"""The `vllm serve` arguments that request a GDN prefill backend, per vLLM version."""

import pytest

from kernels.backends import (
    UnsupportedVllmError,
    expected_reference_kernel,
    gdn_backend_args,
    parse_vllm_version,
)


@pytest.mark.parametrize("version", ["0.22.0", "0.26.0", "0.32.0+cpu", "0.33.0", "0.33.1.dev5+g12"])
@pytest.mark.parametrize("backend", ["triton", "flashinfer", "cutedsl"])
def test_read_versions_take_the_flag(version, backend):
    assert gdn_backend_args(version, backend) == ["--gdn-prefill-backend", backend]


def test_auto_leaves_the_choice_to_vllm():
    assert gdn_backend_args("0.26.0", "auto") == []


@pytest.mark.parametrize("version", ["0.21.9", "0.34.0", "1.0.0"])
def test_versions_outside_the_read_range_are_refused(version):
    with pytest.raises(UnsupportedVllmError, match=r"needs vllm>=0.22,<0.34"):
        gdn_backend_args(version, "triton")


def test_bad_inputs_say_what_is_wrong():
    with pytest.raises(UnsupportedVllmError, match="known: triton, flashinfer, cutedsl"):
        gdn_backend_args("0.26.0", "fla")
    with pytest.raises(UnsupportedVllmError, match="cannot read a vLLM version"):
        parse_vllm_version("dev")
    assert parse_vllm_version("v0.26") == (0, 26, 0)


def test_expected_reference_kernel():
    assert expected_reference_kernel("triton", "cuda") == "vllm-triton"
    assert expected_reference_kernel("cutedsl", "cuda") == "vllm-cutedsl"
    assert expected_reference_kernel("triton", "cpu") == "vllm-cpu-native"
    assert expected_reference_kernel("auto", "cuda") is None
