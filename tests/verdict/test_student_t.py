"""Student's t quantiles against the printed tables."""

import pytest

from rig.verdict.student_t import t_quantile


@pytest.mark.parametrize(
    ("probability", "df", "expected"),
    [(0.975, 1, 12.706), (0.975, 2, 4.303), (0.975, 4, 2.776), (0.975, 30, 2.042),
     (0.995, 4, 4.604), (0.995, 10, 3.169)],
)  # fmt: skip
def test_t_quantiles_match_the_tables(probability, df, expected):
    assert t_quantile(probability, df) == pytest.approx(expected, abs=1e-3)
