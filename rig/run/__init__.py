"""The orchestration: phases, state on disk, the golden cache, replay, the manifest and bisect;
`python -m rig.run SCENARIO` runs the whole pipeline (rig/run/pipeline.py)."""
