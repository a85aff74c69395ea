"""`python -m rig.run SCENARIO`: the pipeline's entry (rig/run/pipeline.py)."""

import sys

from rig.run.pipeline import main

sys.exit(main())
