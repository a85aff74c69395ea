"""The vLLM servers of both sides: hardware, placement, the installation that serves a side,
the `vllm serve` argv, preflight, and the processes with their logs."""
