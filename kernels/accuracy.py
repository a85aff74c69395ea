"""Error metrics between two GDN results: the numbers every kernel check and replay prints."""

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TensorError:
    """How far `actual` is from `expected`.

    max_abs: worst element. head_rel_l2: worst value head's ||actual - expected|| / ||expected||
    (dim 1 is the value head in outputs [T, HV, V] and states [N, HV, K, V]); a head whose
    expected norm is 0 counts its absolute norm. finite: no NaN/inf in `actual`.
    """

    max_abs: float
    head_rel_l2: float
    finite: bool


def tensor_error(actual: torch.Tensor, expected: torch.Tensor) -> TensorError:
    a = actual.double().to(expected.device)
    e = expected.double()
    finite = bool(torch.isfinite(a).all())
    if a.numel() == 0:
        return TensorError(max_abs=0.0, head_rel_l2=0.0, finite=finite)
    diff = torch.nan_to_num(a - e, nan=math.inf)
    per_head_diff = diff.transpose(0, 1).reshape(diff.shape[1], -1).norm(dim=1)
    per_head_ref = e.transpose(0, 1).reshape(e.shape[1], -1).norm(dim=1)
    rel = per_head_diff / torch.where(per_head_ref > 0, per_head_ref, 1.0)
    return TensorError(
        max_abs=float(diff.abs().max()),
        head_rel_l2=float(rel.max()),
        finite=finite,
    )


@dataclass(frozen=True)
class GdnError:
    """Errors of one GDN result (output and final state) against another."""

    output: TensorError
    state: TensorError

    @property
    def finite(self) -> bool:
        return self.output.finite and self.state.finite


def gdn_error(
    actual: tuple[torch.Tensor, torch.Tensor], expected: tuple[torch.Tensor, torch.Tensor]
) -> GdnError:
    """actual/expected: (output [T, HV, V], final states [N, HV, K, V])."""
    return GdnError(
        output=tensor_error(actual[0], expected[0]), state=tensor_error(actual[1], expected[1])
    )
