"""Run kernels/ns_triton.py under Triton's CPU interpreter (TRITON_INTERPRET=1, set before
triton is imported). The interpreter keeps BF16 as raw uint16 bits and its tl.dot multiplies
those bits; `patch_bf16_dot` makes it widen BF16 operands to FP32 first, which is what the
GPU's BF16 x BF16 -> FP32 dot computes (products of BF16 values are exact in FP32)."""

import os

os.environ["TRITON_INTERPRET"] = "1"

import numpy as np  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.runtime import interpreter  # noqa: E402


def patch_bf16_dot() -> None:
    builder = interpreter.InterpreterBuilder
    original = builder.create_dot
    if getattr(original, "widens_bf16", False):
        return

    def widen(handle):
        if handle.dtype.scalar != tl.bfloat16:
            return handle
        bits = handle.data.astype(np.uint32) << 16
        return interpreter.TensorHandle(bits.view(np.float32), tl.float32)

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        return original(self, widen(a), widen(b), d, input_precision, max_num_imprecise_acc)

    create_dot.widens_bf16 = True
    builder.create_dot = create_dot


patch_bf16_dot()


def main() -> None:
    """Check cases through the interpreted kernel: print one JSON line of errors vs fp64."""
    import functools
    import json
    import sys

    import torch

    from kernels import ns_triton
    from kernels.accuracy import gdn_error
    from kernels.cases import Shape, correlated_key_inputs, random_inputs
    from kernels.ns_torch import chunk_gdn_ns
    from kernels.recurrence import gdn_recurrence
    from kernels.runners import run_fla_contract

    case, rounds, segment = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    ns_triton.SEGMENT_CHUNKS = segment
    shape = Shape(heads=1, value_heads=2, head_dim=64)
    if case == "correlated":
        inputs = correlated_key_inputs(shape)
    else:
        lengths = [int(n) for n in case.split(",")]
        inputs = random_inputs(
            lengths, shape, torch.bfloat16, seed=len(lengths), log_decay_range=(1e-4, 1e-2)
        )
    kernel = functools.partial(ns_triton.chunk_gated_delta_rule, ns_rounds=rounds)
    result = run_fla_contract(kernel, inputs)
    errors = {
        "truth": gdn_error(result, gdn_recurrence(inputs)),
        "torch": gdn_error(result, chunk_gdn_ns(inputs, rounds)),
    }
    print(json.dumps({name: [e.output.max_abs, e.state.max_abs] for name, e in errors.items()}))


if __name__ == "__main__":
    main()
