"""From request records to the verdict: pairs compared, teacher-forced drift, perf intervals,
the speed word and the gates. It computes on what load/ gathered; it speaks to no server."""
