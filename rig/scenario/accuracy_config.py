"""The scenario's `accuracy:` key: graded questions sent to both sides, scored, flips counted.

Character equality says whether the text moved; a graded task says whether the answers are
still right. The same questions go to both sides through the rig's own load (greedy, a salt of
their own per request), and rig/verdict/accuracy.py pairs them question by question.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from rig.scenario.strict import StrictModel

# lm-eval-harness's gsm8k task stops at these (its generation_kwargs.until)
GSM8K_STOP = ("Question:", "</s>", "<|im_end|>")
# The questions' block number: no timed repeat has it, so the speed and the resume tell it apart
ACCURACY_REPEAT = -1


class AccuracyConfig(StrictModel):
    """A task, its shots and questions, how they are sent and what fails the run."""

    task: Literal["gsm8k"] = Field(
        "gsm8k", description="the graded task: gsm8k (GSM8K's test split, 1,319 questions)"
    )
    path: Path | None = Field(
        None, description="your own JSONL of questions instead of the task's (docs/accuracy.md)"
    )
    shots: int = Field(5, ge=0, le=5, description="worked examples before each question")
    questions: int | None = Field(None, gt=0, description="the first N questions; default all")
    max_tokens: int = Field(256, gt=0)
    stop: list[str] = Field(default_factory=lambda: list(GSM8K_STOP))
    concurrency: int | None = Field(
        None, gt=0, le=4096, description="the questions' C; default the highest timed level's"
    )
    replace_timed_levels: bool = Field(
        False, description="true: the questions instead of workload.concurrency's timed levels"
    )
    answer: Literal["strict", "flexible"] = Field(
        "strict",
        description="which extracted answer the verdict scores: strict ('#### N') or flexible "
        "(the last number), as lm-eval-harness's gsm8k filters",
    )
    alpha: float = Field(0.05, gt=0, lt=1, description="McNemar's significance level")
    max_drop_pt: float | None = Field(
        0.0,
        ge=0,
        description="accuracy the candidate may lose, in points, before a significant loss "
        "fails the run; null: shown, never gated",
    )

    @property
    def source(self) -> str:
        """Where the questions come from, as the report names it."""
        return str(self.path) if self.path is not None else self.task
