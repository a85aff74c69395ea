"""StrictModel: a typo in a key is an error, and a resolved scenario does not change."""

import pytest
from pydantic import ValidationError

from rig.scenario.strict import StrictModel


class _Knob(StrictModel):
    size: int = 1


def test_an_unknown_key_is_an_error():
    with pytest.raises(ValidationError, match="extra_forbidden|Extra inputs"):
        _Knob.model_validate({"sise": 2})


def test_a_model_does_not_change():
    knob = _Knob(size=2)
    with pytest.raises(ValidationError, match="frozen"):
        knob.size = 3
    assert knob.model_copy(update={"size": 3}).size == 3 and knob.size == 2
