"""Run kernels/ns_triton.py under Triton's CPU interpreter: `python -m
tests.kernels.triton_interpreter` sets TRITON_INTERPRET=1 before the kernels are defined
(importing this module changes nothing) and fixes two things so that BF16 behaves as on the
GPU: the interpreter keeps BF16 as raw uint16 bits and its tl.dot multiplies those bits
(`patch_bf16_dot` widens BF16 operands to FP32 first: the GPU's BF16 x BF16 -> FP32 dot, with
exact products), and its FP32 -> BF16 cast truncates (`patch_bf16_cast` rounds to nearest
even, as the GPU's conversion does)."""

import os


def patch_bf16_cast() -> None:
    import numpy as np
    import torch
    import triton.language as tl
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    original = builder.cast_impl
    if getattr(original, "rounds_bf16", False):
        return

    def cast_impl(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            rounded = torch.from_numpy(np.ascontiguousarray(src.data)).to(torch.bfloat16)
            return interpreter.TensorHandle(
                rounded.view(torch.int16).numpy().view(np.uint16), tl.bfloat16
            )
        return original(self, src, dst_type)

    cast_impl.rounds_bf16 = True
    builder.cast_impl = cast_impl


def patch_bf16_dot() -> None:
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

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


# (label, lengths or "correlated", NS rounds, head dim, the k-first walk's columns of V per
# program or "v-first")
CASES = [
    ("varlen-k128", [1, 63, 64, 65, 200], 4, 128, 32),
    ("varlen-k128-v-first", [1, 63, 64, 65, 200], 4, 128, "v-first"),
    ("long-v-first", [700, 130, 5], 4, 64, "v-first"),
    ("empty-sequence-v-first", [130, 0, 70], 4, 64, "v-first"),
    ("one-token", [1], 4, 64, 64),
    ("long-bv16", [700, 130, 5], 4, 64, 16),
    ("long-bv64", [700, 130, 5], 4, 64, 64),
    ("empty-sequence", [130, 0, 70], 4, 64, 32),
    ("correlated-ns4", "correlated", 4, 64, 64),
    ("correlated-ns3", "correlated", 3, 64, 64),
]


def main() -> None:
    """Every case of CASES through the interpreted kernel; one JSON line: per case, [output,
    final state] max abs error against the float64 recurrence and against the PyTorch nsR."""
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported: it decides at definition
    import functools
    import json

    import torch

    patch_bf16_cast()
    patch_bf16_dot()
    from kernels import ns_triton
    from kernels.accuracy import gdn_error
    from kernels.cases import Shape, correlated_key_inputs, random_inputs
    from kernels.functions import run_fla_contract
    from kernels.ns_torch import chunk_gdn_ns
    from kernels.recurrence import gdn_recurrence

    results = {}
    for label, lengths, rounds, head_dim, walk in CASES:
        ns_triton.WALK_FORM = "v-first" if walk == "v-first" else "k-first"
        ns_triton.WALK_BLOCK_V = None if walk == "v-first" else walk
        shape = Shape(heads=1, value_heads=2, head_dim=head_dim)
        if lengths == "correlated":
            inputs = correlated_key_inputs(shape)
        else:
            inputs = random_inputs(
                lengths, shape, torch.bfloat16, seed=len(lengths), log_decay_range=(1e-4, 1e-2)
            )
        kernel = functools.partial(ns_triton.chunk_gated_delta_rule, ns_rounds=rounds)
        result = run_fla_contract(kernel, inputs)
        errors = {
            "truth": gdn_error(result, gdn_recurrence(inputs)),
            "torch": gdn_error(result, chunk_gdn_ns(inputs, rounds)),
        }
        results[label] = {
            name: [e.output.max_abs, e.state.max_abs, e.finite] for name, e in errors.items()
        }
    print(json.dumps(results))


if __name__ == "__main__":
    main()
