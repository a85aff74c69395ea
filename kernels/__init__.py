"""Candidate GDN prefill kernels (nsR), their vLLM plugin, proof of what ran, kernel checks,
capture and replay. kernels/README.md says how the pieces fit."""
