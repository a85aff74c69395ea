"""The `rig` console script: one command for the pipeline's entry points.

rig run SCENARIO [--set k=v ...]      python -m rig.run
rig plan SCENARIO [--assume-gpus N [--assume-gpu-gib G]]
                                      python -m rig.run --plan: preflight and the plan only
                                      (N GPUs of G GiB each: TP sized to them)
rig compare RUN_A RUN_B               python -m rig.run.compare_runs
rig bisect RUN_DIR [--request-id ID]  python -m rig.run.bisect
"""

from __future__ import annotations

import sys
from collections.abc import Callable


def _run(argv: list[str]) -> int:
    from rig.run.pipeline import main

    return main(argv)


def _plan(argv: list[str]) -> int:
    from rig.run.pipeline import main

    return main([*argv, "--plan"])


def _compare(argv: list[str]) -> int:
    from rig.run.compare_runs import main

    return main(argv)


def _bisect(argv: list[str]) -> int:
    from rig.run.bisect import main

    return main(argv)


COMMANDS: dict[str, Callable[[list[str]], int]] = {
    "run": _run,
    "plan": _plan,
    "compare": _compare,
    "bisect": _bisect,
}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help") or args[0] not in COMMANDS:
        print(
            __doc__.strip(),
            file=sys.stderr if args and args[0] not in ("-h", "--help") else sys.stdout,
        )
        return 0 if args and args[0] in ("-h", "--help") else 2
    return COMMANDS[args[0]](args[1:])


if __name__ == "__main__":
    sys.exit(main())
