"""Imported by every interpreter of one test's run (its PYTHONPATH names this folder): a bug
planted in the rig's own SSE parsing, a KeyError on the first message that carries a token, as a
typo in the parser would raise (tests/test_faults.py: it must end the run, not become a
malformed_sse pathology of the server's)."""

import rig.load.sse

_original = rig.load.sse.StreamAccumulator._message


def _message_with_a_bug(self, message, received):
    if message.get("choices"):
        return {}["planted bug"]
    return _original(self, message, received)


rig.load.sse.StreamAccumulator._message = _message_with_a_bug
