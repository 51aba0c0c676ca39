"""NavRL's LiDAR CNN, and on the CPU its convolutions as one matrix product each.

The network is NavRL's (navrl-task §2): three 5×3 convolutions with ELUs over the
[B, 1, 36, 4] LiDAR image (36 directions × 4 elevations), a linear layer and a LayerNorm,
in the Sequential slots of NavRL's checkpoint. Its channels are few (1 → 4 → 16 → 16) and
its images small, and the CPU's convolution kernels run such layers at a tenth of the
core's matrix-product rate: the LiDAR CNN was about 70 % of a CPU update.

So on the CPU (`lowering = "matmul"`, what "auto" picks there) each convolution runs as
a few large matrix products over rows of the image: the 4 elevations of a direction and
the channels are one row of C·4 features, and the 3 kernel columns with their zero
padding are folded into the weight. With stride s, s consecutive rows of the padded image
are viewed as one row of s·C·4 features (a free reshape), and an output row is the sum of
⌈kh/s⌉ products of such rows, each a view of the input shifted by one row: no copy of
the input per kernel row (an unfold) is made, and the backward pass accumulates into the
same views. The products are the convolution's own, plus exact zeros of the folded
padding; only the order of the float sums differs (tests/rl/test_lidar_cnn.py holds the
two to float rounding, a whole PPO update too). The products run as two custom ops
(`navrl::conv_rows` and its backward), which torch.compile calls as they are, fusing the
padding, slicing and ELUs around them.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

# How the convolutions run: "native" (torch's conv2d), "matmul" (one product per layer, as
# above) or "auto" (matmul on the CPU, native elsewhere: a GPU's kernels run the native
# layers well, and its paths stay as they were measured).
Lowering = Literal["auto", "native", "matmul"]
LOWERINGS: tuple[Lowering, ...] = ("auto", "native", "matmul")


class LidarCNN(nn.Sequential):
    """[B,1,36,4] → [B,128]; feature maps 4×36×4 → 16×18×4 → 16×9×2, flattened C,H,W."""

    def __init__(self, lowering: Lowering = "auto") -> None:
        super().__init__(
            nn.Conv2d(1, 4, kernel_size=(5, 3), padding=(2, 1)),
            nn.ELU(),
            nn.Conv2d(4, 16, kernel_size=(5, 3), stride=(2, 1), padding=(2, 1)),
            nn.ELU(),
            nn.Conv2d(16, 16, kernel_size=(5, 3), stride=(2, 2), padding=(2, 1)),
            nn.ELU(),
            nn.Flatten(start_dim=-3),  # NavRL's Rearrange "n c w h -> n (c w h)"
            nn.Linear(16 * 9 * 2, 128),
            nn.LayerNorm(128),
        )
        if lowering not in LOWERINGS:
            raise ValueError(f"lowering must be one of {LOWERINGS}, got {lowering!r}")
        self.lowering = lowering

    def forward(self, lidar: torch.Tensor) -> torch.Tensor:
        if self.lowering == "matmul" or (self.lowering == "auto" and lidar.device.type == "cpu"):
            return self.matmul_forward(lidar)
        return super().forward(lidar)

    def matmul_forward(self, lidar: torch.Tensor) -> torch.Tensor:
        """The same network with each convolution as matrix products (module doc)."""
        batch, channels, height, width = lidar.shape
        rows = lidar.reshape(batch, channels, height, width).transpose(1, 2)
        rows = rows.reshape(batch, height, channels * width)
        for conv, act in ((self[0], self[1]), (self[2], self[3]), (self[4], self[5])):
            assert isinstance(conv, nn.Conv2d)
            rows, width = conv_as_rows(rows, conv, width)
            rows = act(rows)
        height, channels = rows.shape[1], rows.shape[2] // width
        # rows hold (H, C, W); NavRL's flatten reads (C, H, W)
        flat = rows.view(batch, height, channels, width).transpose(1, 2).reshape(batch, -1)
        return self[8](self[7](flat))


def conv_as_rows(rows: torch.Tensor, conv: nn.Conv2d, width: int) -> tuple[torch.Tensor, int]:
    """`conv` on an image held as rows [B, H, C·W] (features C-major): the output's rows
    [B, H', C'·W'] and its width W'."""
    batch, height, _ = rows.shape
    (kh, _), (stride, _), (pad, _) = conv.kernel_size, conv.stride, conv.padding
    assert isinstance(pad, int) and conv.bias is not None
    weight, out_width = row_weights(conv, width)
    padded_height = height + 2 * pad
    extra = -padded_height % stride  # whole groups of `stride` rows: a free reshape
    padded = F.pad(rows, (0, 0, pad, pad + extra))
    out = torch.ops.navrl.conv_rows(padded, weight, conv.bias.repeat_interleave(out_width), stride)
    out_height = (padded_height - kh) // stride + 1
    return out.view(batch, (padded_height + extra) // stride, -1)[:, :out_height], out_width


def row_weights(conv: nn.Conv2d, width: int) -> tuple[torch.Tensor, int]:
    """`conv`'s weight as [J, s·C·W, C'·W'] for rows of width W (stride s, J = ⌈kh/s⌉):
    block j takes the s input rows j·s … j·s+s−1 below an output row (kernel rows past kh
    are zeros), and the output's width W'."""
    out_ch, in_ch, kh, kw = conv.weight.shape
    (stride, col_stride), (_, col_pad) = conv.stride, conv.padding
    assert isinstance(col_pad, int)
    out_width = (width + 2 * col_pad - kw) // col_stride + 1
    taps = column_taps(width, out_width, kw, col_stride, col_pad, conv.weight)
    per_row = torch.einsum("oikl,vwl->kiwov", conv.weight, taps)  # [kh, C, W, C', W']
    blocks = -(-kh // stride)
    per_row = F.pad(per_row.reshape(kh, -1), (0, 0, 0, blocks * stride - kh))
    return per_row.reshape(blocks, stride * in_ch * width, out_ch * out_width), out_width


def column_taps(
    width: int, out_width: int, kw: int, stride: int, padding: int, like: torch.Tensor
) -> torch.Tensor:
    """[W', W, kw]: 1 where input column w meets output column v at kernel column l
    (w = v·stride + l − padding; the padding's columns meet none)."""
    v = torch.arange(out_width, device=like.device).view(-1, 1, 1)
    w = torch.arange(width, device=like.device).view(1, -1, 1)
    tap = torch.arange(kw, device=like.device).view(1, 1, -1)
    return (w == v * stride + tap - padding).to(like.dtype)


# The products themselves, as custom ops: torch.compile (ppo.compile) calls them as they
# are instead of tracing their in-place accumulations into copies.


@torch.library.custom_op("navrl::conv_rows", mutates_args=())
def conv_rows(
    rows: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, stride: int
) -> torch.Tensor:
    """rows [B, Hp, K] (Hp a multiple of `stride`) viewed as [B·Hp/s, s·K]; weight
    [J, s·K, N]: output row r = bias + Σ_j view[r + j] @ weight[j], [B·Hp/s, N]. The last
    J − 1 rows, which would read past the input, are zeros (they are padding rows)."""
    view = rows.reshape(-1, stride * rows.shape[2])
    valid = view.shape[0] - weight.shape[0] + 1
    out = rows.new_empty(view.shape[0], weight.shape[2])
    out[valid:].zero_()
    head = out[:valid]
    torch.addmm(bias, view[:valid], weight[0], out=head)
    for j in range(1, weight.shape[0]):
        head.addmm_(view[j : j + valid], weight[j])
    return out


@conv_rows.register_fake
def _(rows: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, stride: int) -> torch.Tensor:
    return rows.new_empty(rows.shape[0] * rows.shape[1] // stride, weight.shape[2])


@torch.library.custom_op("navrl::conv_rows_backward", mutates_args=())
def conv_rows_backward(
    grad: torch.Tensor, rows: torch.Tensor, weight: torch.Tensor, stride: int, input_grad: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The gradients of `conv_rows` (rows' is empty without `input_grad`: the LiDAR)."""
    view = rows.reshape(-1, stride * rows.shape[2])
    valid = view.shape[0] - weight.shape[0] + 1
    grad = grad[:valid]
    grad_weight = torch.empty_like(weight)
    for j in range(weight.shape[0]):
        torch.mm(view[j : j + valid].t(), grad, out=grad_weight[j])
    if not input_grad:
        return rows.new_empty(0), grad_weight, grad.sum(0)
    grad_rows = torch.zeros_like(view)
    for j in range(weight.shape[0]):
        grad_rows[j : j + valid].addmm_(grad, weight[j].t())
    return grad_rows.view(rows.shape), grad_weight, grad.sum(0)


@conv_rows_backward.register_fake
def _(
    grad: torch.Tensor, rows: torch.Tensor, weight: torch.Tensor, stride: int, input_grad: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    grad_rows = rows.new_empty(rows.shape) if input_grad else rows.new_empty(0)
    return grad_rows, weight.new_empty(weight.shape), weight.new_empty(weight.shape[2])


def _save_inputs(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    rows, weight, _, stride = inputs
    ctx.save_for_backward(rows, weight)
    ctx.stride = stride


def _conv_rows_grad(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
    rows, weight = ctx.saved_tensors
    input_grad = bool(ctx.needs_input_grad[0])
    grad_rows, grad_weight, grad_bias = torch.ops.navrl.conv_rows_backward(
        grad.contiguous(), rows, weight, ctx.stride, input_grad
    )
    return (grad_rows if input_grad else None), grad_weight, grad_bias, None


conv_rows.register_autograd(_conv_rows_grad, setup_context=_save_inputs)
