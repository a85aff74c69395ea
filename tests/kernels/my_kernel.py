"""A kernel engineer's own GDN prefill functions, as the rig's tests point a candidate at them
(`candidate.kernel: tests.kernels.my_kernel:chunk_fwd`): FLA's contract, nothing of the rig's
plugin. `chunk_fwd` wraps ns4 and must pass; `chunk_fwd_ns3` wraps ns3 and must be caught;
`chunk_fwd_compiling` is ns4 that JIT-compiles at given calls, as a Triton kernel meeting a new
shape in a timed request does."""

import os
import time

COMPILE_AT_ENV = "RIG_TEST_COMPILE_AT_CALLS"  # e.g. "1,14": the calls (from 1) that compile
_calls = 0


def _ns(q, k, v, g, beta, ns_rounds, **keywords):
    if q.is_cuda:
        from kernels.ns_triton import chunk_gated_delta_rule
    else:
        from kernels.ns_torch import chunk_gated_delta_rule
    return chunk_gated_delta_rule(q, k, v, g, beta, ns_rounds=ns_rounds, **keywords)


def chunk_fwd(
    q,
    k,
    v,
    g,
    beta,
    initial_state=None,
    output_final_state=False,
    cu_seqlens=None,
    use_qk_l2norm_in_kernel=False,
):
    """ns4, taking only the contract's required keywords (no scale, chunk metadata or output
    buffer): the plugin passes what a function takes and fills vLLM's buffer itself."""
    return _ns(
        q,
        k,
        v,
        g,
        beta,
        4,
        initial_state=initial_state,
        output_final_state=output_final_state,
        cu_seqlens=cu_seqlens,
        use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
    )


def chunk_fwd_ns3(q, k, v, g, beta, **keywords):
    """ns3 (the seeds' bug), taking every keyword vLLM passes."""
    return _ns(q, k, v, g, beta, 3, **keywords)


def chunk_fwd_compiling(q, k, v, g, beta, **keywords):
    """ns4, and a real compilation (torch.compile, which the plugin counts) at the calls of
    this process named in RIG_TEST_COMPILE_AT_CALLS."""
    global _calls
    _calls += 1
    if str(_calls) in os.environ.get(COMPILE_AT_ENV, "").split(","):
        import torch

        def doubled(x, call=_calls):
            return x * 2 + call

        torch.compile(doubled, backend="eager", dynamic=False)(torch.ones(_calls))
    return _ns(q, k, v, g, beta, 4, **keywords)


def fla_delayed_5ms(q, k, v, g, beta, **keywords):
    """vLLM's own FLA kernel and 5 ms of host sleep per call: a planted slowdown through a
    function of one's own (GPU only; vLLM 0.26+ keeps FLA under third_party)."""
    from vllm.third_party.flash_linear_attention.ops import chunk_gated_delta_rule

    result = chunk_gated_delta_rule(q=q, k=k, v=v, g=g, beta=beta, **keywords)
    time.sleep(0.005)
    return result


def wrong_signature(x, y):
    """Not the contract: the rig must refuse it before a server starts."""
    return x, y
