"""rig: serving-equivalence test rig for LLM kernels in vLLM.

Pipeline, one module per stage, data flowing one way:
scenario -> servers -> load -> compare (+ drift) -> metrics -> report, driven by run.
"""
