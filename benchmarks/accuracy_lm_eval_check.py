"""Cross-check of the rig's gsm8k scoring against lm-eval-harness's own code: 50 fixed
completions, each scored by lm_eval's RegexFilter (the strict and flexible filters of its
gsm8k.yaml, read from the installed lm_eval) and exact_match_hf_evaluate, and by
rig.verdict.accuracy; prints the agreement and exits 1 on any disagreement.

lm_eval is not a dependency of the rig; run this with an interpreter that has it and the rig:

    python3 -m venv /tmp/lmeval-venv
    /tmp/lmeval-venv/bin/pip install lm_eval==0.4.13
    PYTHONPATH=$PWD /tmp/lmeval-venv/bin/python benchmarks/accuracy_lm_eval_check.py
"""

from __future__ import annotations

import importlib.resources
import sys

import yaml
from lm_eval.api.metrics import exact_match_hf_evaluate
from lm_eval.filters.extraction import RegexFilter

from rig.verdict.accuracy import extract, is_right

TEMPLATES = (
    " {a} + {b} = {s}.\n#### {s}",
    " The sum is {s}.",
    " {a} and {b} make {s}, so the answer is {s}.",
    " It costs ${s}.\n#### ${s}",
    " #### {s},000",
    " {s}",
    " I am not sure.",
    "",
    " #### -{s}\nQuestion: next",
    " First {a}, then {b}: {s}.0 in all.\n#### {s}.0",
)


def completions() -> list[tuple[str, str]]:
    """(completion, reference answer) pairs: ten formats over five sums, some wrong."""
    rows = []
    for i in range(5):
        a, b = 3 + 7 * i, 1200 + 45 * i
        for n, template in enumerate(TEMPLATES):
            said = a + b + (1 if (i + n) % 4 == 0 else 0)  # every fourth one wrong
            text = template.format(a=a, b=b, s=f"{said:,}" if n % 3 == 0 else said)
            rows.append((text, f"{a} + {b} = {a + b}\n#### {a + b}"))
    return rows


def main() -> int:
    task = importlib.resources.files("lm_eval") / "tasks" / "gsm8k" / "gsm8k.yaml"
    config = yaml.safe_load(task.read_text())
    metric = config["metric_list"][0]
    filters = {f["name"]: f["filter"][0] for f in config["filter_list"]}
    rows = completions()
    disagree = 0
    for mode, name in (("strict", "strict-match"), ("flexible", "flexible-extract")):
        spec = filters[name]
        regex = RegexFilter(spec["regex_pattern"], spec.get("group_select", 0))
        theirs = [out[0] for out in regex.apply([[text] for text, _ in rows], [{}] * len(rows))]
        right = 0
        for (text, reference), answer in zip(rows, theirs, strict=True):
            score = exact_match_hf_evaluate(
                [answer],
                [reference],
                regexes_to_ignore=metric["regexes_to_ignore"],
                ignore_case=metric["ignore_case"],
                ignore_punctuation=metric["ignore_punctuation"],
            )["exact_match"]
            ours = extract(text, mode)
            same = ours == answer and is_right(ours, reference) == bool(score)
            disagree += not same
            right += bool(score)
            if not same:
                print(f"DISAGREE {mode}: {text!r}: lm_eval {answer!r} {score}, rig {ours!r}")
        print(
            f"{mode}: {len(rows)} completions, lm_eval right on {right}, rig agrees on "
            f"{len(rows) - disagree}"
        )
    print("agreement: all" if not disagree else f"disagreements: {disagree}")
    return 1 if disagree else 0


if __name__ == "__main__":
    sys.exit(main())
