"""Requests on the wire: the same ordered greedy requests to every side at once, each token
timed on receipt (raw-socket HTTP, SSE), and the servers' prefix-cache counters."""
