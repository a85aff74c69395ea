"""Count the JIT compilations of a vLLM process, which the rig reads around each block of load:
a Triton kernel or a torch.compile graph built while a block runs makes it slow for a reason
that is not the kernel's speed.

Two hooks, each optional (a runtime without it is skipped) and installed once per process:
Triton's `knobs.runtime.jit_post_compile_hook`, chained with the hook set before it (vLLM's
jit_monitor chains the same way, so either may come first), and torch._dynamo's
`on_compile_end`. Each compilation is published at once (PrefillCounter.compiled).
"""

from kernels.prefill_counter import PrefillCounter

_counter: PrefillCounter | None = None  # where the installed hooks count
_installed: set[str] = set()  # the hooks this process has: "triton", "dynamo"


def count_compilations(counter: PrefillCounter) -> None:
    """Count this process's JIT compilations in `counter` from now on."""
    global _counter
    _counter = counter
    for name, install in (("triton", _hook_triton), ("dynamo", _hook_dynamo)):
        if name in _installed:
            continue
        try:
            install()
        except (ImportError, AttributeError):  # no such runtime, or too old for the hook
            continue
        _installed.add(name)


def _compiled() -> None:
    if _counter is not None:
        _counter.compiled()


def _hook_triton() -> None:
    from triton import knobs

    previous = knobs.runtime.jit_post_compile_hook

    def count_triton_compilation(**kwargs):
        _compiled()  # first: a previous hook may raise (vLLM's jit_monitor in error mode)
        return previous(**kwargs) if previous is not None else None

    knobs.runtime.jit_post_compile_hook = count_triton_compilation


def _count_dynamo_compilation(*_args) -> None:
    """torch 2.6+ passes CallbackArgs, earlier versions nothing."""
    _compiled()


def _hook_dynamo() -> None:
    from torch._dynamo.callback import on_compile_end

    on_compile_end(_count_dynamo_compilation)
