"""The layers' operands under torch.autocast.

The layers run custom kernels (autograd Functions over Triton launches), which autocast does not see. So
each layer takes its input and parameters in the dtype autocast runs products in, as nn.Linear takes its
operands there: fp32 master weights, 16-bit products, and the weights' gradients reach them through the
casts.
"""

from __future__ import annotations

import torch


def autocast_dtype(x: torch.Tensor) -> torch.dtype | None:
    """The dtype autocast runs products in on x's device, or None where autocast is off there."""
    device = x.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else None


def cast_to(dtype: torch.dtype | None, *tensors: torch.Tensor | None) -> tuple:
    """The tensors in dtype (None stays None), or as they are for dtype None."""
    if dtype is None:
        return tensors
    return tuple(None if t is None else t.to(dtype) for t in tensors)


def in_autocast_dtype(x: torch.Tensor, *tensors: torch.Tensor | None) -> tuple:
    """(x, *tensors) in x's autocast dtype, or as they are where autocast is off."""
    return cast_to(autocast_dtype(x), x, *tensors)
