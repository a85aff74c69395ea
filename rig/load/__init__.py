"""Requests on the wire: the same ordered greedy requests to every side at once, each token
timed on receipt (raw-socket HTTP, SSE), the untimed teacher-forced replay, and what the servers
say about themselves (/metrics: counters and the kernel proof; /version). The rig's only HTTP
client outside serve/'s health checks."""
