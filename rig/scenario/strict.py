"""The base of every scenario model: an unknown key is an error (a typo must not pass silently),
and a resolved scenario does not change."""

from pydantic import BaseModel, ConfigDict


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
