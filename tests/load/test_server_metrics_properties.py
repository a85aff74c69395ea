"""The bad-input sweep of /metrics text: whatever a server publishes, the parser gives its
samples, the counters or one MetricsUnreadable line, and the kernel proof; never another
exception. A finite sample written the way Prometheus writes it is never lost."""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from kernels.proof import CALLS_METRIC, INFO_METRIC, PLUGIN_METRICS, SECONDS_METRIC
from rig.load.server_metrics import (
    PREFIX_CACHE,
    MetricsUnreadable,
    ServerCounters,
    kernel_proof_from_metrics,
    metric_samples,
    parse_server_counters,
)

NAMES = (*PREFIX_CACHE, *PLUGIN_METRICS, "vllm:request_prefill_time_seconds_sum", "other_total")
VALUE = st.floats(allow_nan=True, allow_infinity=True).map(repr) | st.sampled_from(
    ("NaN", "+Inf", "-Inf", "1e400", "0x10", "1_0", "", "nan(1)")
)
LABEL_VALUE = st.text(max_size=8) | st.sampled_from(("1", "-2", "\u00b2", "0"))
LABELS = st.dictionaries(
    st.sampled_from(("pid", "kernel", "source_sha256", "backend", "engine")),
    LABEL_VALUE,
    max_size=4,
)


def _escaped(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _line(name: str, labels: dict[str, str], value: str) -> str:
    inside = ",".join(f'{key}="{_escaped(text)}"' for key, text in labels.items())
    return f"{name}{{{inside}}} {value}" if labels else f"{name} {value}"


LINE = st.builds(_line, st.sampled_from(NAMES), LABELS, VALUE) | st.text(max_size=40)
TEXT = st.lists(LINE, max_size=8).map("\n".join)


def _read(text: str) -> ServerCounters | str:
    try:
        counters = parse_server_counters(text)
    except MetricsUnreadable as exc:
        assert "\n" not in str(exc)
        return str(exc)
    kernel_proof_from_metrics(text).describe()
    return counters


@settings(max_examples=200)
@given(TEXT)
@example(_line(PREFIX_CACHE[0], {}, "1") + "\n" + _line(PREFIX_CACHE[1], {}, "0"))
@example(
    f"{_line(PREFIX_CACHE[0], {}, '1')}\n{_line(PREFIX_CACHE[1], {}, '0')}\n"
    f'{INFO_METRIC}{{pid="1",kernel="k"}} 1\n{CALLS_METRIC}{{pid="1",kernel="k"}} NaN'
)
@example(
    f"{_line(PREFIX_CACHE[0], {}, '1')}\n{_line(PREFIX_CACHE[1], {}, '0')}\n"
    f'{INFO_METRIC}{{pid="1",kernel="k"}} 1\n{CALLS_METRIC}{{pid="1",kernel="k"}} +Inf'
)
def test_any_metrics_text_gives_counters_or_one_line(text):
    _read(text)


@settings(max_examples=200)
@given(
    st.lists(
        st.tuples(st.sampled_from(NAMES), LABELS, st.floats(allow_nan=False, allow_infinity=False)),
        max_size=6,
    )
)
def test_every_well_formed_sample_is_read_with_its_labels(samples):
    text = "# HELP x y\n# TYPE x counter\n" + "\n".join(
        _line(name, labels, repr(value)) for name, labels, value in samples
    )
    read = metric_samples(text, set(NAMES))
    assert [(s.name, s.labels, s.value) for s in read] == samples


@settings(max_examples=100)
@given(st.lists(st.floats(0, 1e6), min_size=2, max_size=2), st.floats(0, 1e6))
def test_counters_sum_over_label_sets(queries, seconds):
    text = "\n".join(
        [
            _line(PREFIX_CACHE[0], {"engine": "0"}, repr(queries[0])),
            _line(PREFIX_CACHE[0], {"engine": "1"}, repr(queries[1])),
            _line(PREFIX_CACHE[1], {}, "0"),
            _line(INFO_METRIC, {"pid": "7", "kernel": "k"}, "1"),
            _line(SECONDS_METRIC, {"pid": "7"}, repr(seconds)),
        ]
    )
    counters = _read(text)
    assert counters.queries == queries[0] + queries[1] and counters.gdn_seconds == seconds
