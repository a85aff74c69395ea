"""qwen35-deep: qwen35-control's writing block plus silent ones (too large to build here; the
construction of silent layers is checked on the tiny model in test_tiny_model.py)."""

from rig.models.embedded import EMBEDDED_MODELS
from rig.models.qwen35_control import QWEN35_CONTROL_PARAMS
from rig.models.qwen35_deep import QWEN35_DEEP_PARAMS
from rig.models.tiny_model import default_params


def test_its_writing_layers_are_qwen35_control():
    deep = default_params(**QWEN35_DEEP_PARAMS)
    assert deep.writing() == default_params(**QWEN35_CONTROL_PARAMS)
    assert deep.key() != deep.writing().key()  # its own cache folder


def test_it_runs_four_3_to_1_blocks():
    block = ("linear_attention",) * 3 + ("full_attention",)
    assert default_params(**QWEN35_DEEP_PARAMS).layer_types == block * 4
    assert "qwen35-deep" in EMBEDDED_MODELS
