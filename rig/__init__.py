"""rig: serving-equivalence test rig for LLM kernels in vLLM.

The packages follow the pipeline, data flowing one way:
scenario -> models -> serve -> load -> verdict -> report, driven by run.
"""

from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent
