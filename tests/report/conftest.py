"""The report tests' shared run: one synthetic outcome and its files, per test module."""

import pytest

from rig.report.files import write_report
from tests.report.test_files import build_outcome


@pytest.fixture(scope="module")
def outcome(make_record, tmp_path_factory):
    return build_outcome(make_record, tmp_path_factory.mktemp("report"))


@pytest.fixture(scope="module")
def written(outcome):
    """Written once per module: the plot makes write_report take about a second."""
    return write_report(outcome)
