"""NavRL's LiDAR CNN, and on the CPU its convolutions as one matrix product each.

The network is NavRL's (navrl-task §2): three 5×3 convolutions with ELUs over the
[B, 1, 36, 4] LiDAR image (36 directions × 4 elevations), a linear layer and a LayerNorm,
in the Sequential slots of NavRL's checkpoint. Its channels are few (1 → 4 → 16 → 16) and
its images small, and the CPU's convolution kernels run such layers at a tenth of the
core's matrix-product rate: the LiDAR CNN was about 70 % of a CPU update.

So on the CPU (`lowering = "matmul"`, what "auto" picks there) each convolution is one
matrix product over rows of the image: the 4 elevations of a direction and the channels
are one row of C·4 features, the 3 kernel columns with their zero padding are folded into
a [kh·C·4, C'·W'] weight, and a row of the output reads the kh rows of the input around
it (an unfold along the directions). The products are the convolution's own, plus the
exact zeros of the folded padding; only the order of the float sums differs
(tests/rl/test_lidar_cnn.py holds the two to float rounding, the update too).
"""

from __future__ import annotations

from typing import Literal

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
        """The same network with each convolution as one matrix product (module doc)."""
        batch, channels, height, width = lidar.shape
        rows = lidar.reshape(batch, channels, height, width).transpose(1, 2)
        rows = rows.reshape(batch, height, channels * width)
        for conv, act in ((self[0], self[1]), (self[2], self[3]), (self[4], self[5])):
            assert isinstance(conv, nn.Conv2d)
            rows, width = conv_rows(rows, conv, width)
            rows = act(rows)
        height, channels = rows.shape[1], rows.shape[2] // width
        # rows hold (H, C, W); NavRL's flatten reads (C, H, W)
        flat = rows.view(batch, height, channels, width).transpose(1, 2).reshape(batch, -1)
        return self[8](self[7](flat))


def conv_rows(rows: torch.Tensor, conv: nn.Conv2d, width: int) -> tuple[torch.Tensor, int]:
    """`conv` on an image held as rows [B, H, C·W] (features C-major): the output's rows
    [B, H', C'·W'] and its width W'."""
    batch, _, features = rows.shape
    out_ch, in_ch, kh, kw = conv.weight.shape
    (sh, sw), (ph, pw) = conv.stride, conv.padding
    assert isinstance(ph, int) and isinstance(pw, int) and features == in_ch * width
    out_width = (width + 2 * pw - kw) // sw + 1
    weight = torch.einsum(
        "oikl,vwl->kiwov", conv.weight, column_taps(width, out_width, kw, sw, pw, rows)
    ).reshape(kh * features, out_ch * out_width)
    windows = F.pad(rows, (0, 0, ph, ph)).unfold(1, kh, sh)  # [B, H', C·W, kh]
    out_height = windows.shape[1]
    cols = windows.transpose(2, 3).reshape(batch * out_height, kh * features)
    assert conv.bias is not None
    bias = conv.bias.repeat_interleave(out_width)
    out = torch.addmm(bias, cols, weight)
    return out.view(batch, out_height, out_ch * out_width), out_width


def column_taps(
    width: int, out_width: int, kw: int, stride: int, padding: int, like: torch.Tensor
) -> torch.Tensor:
    """[W', W, kw]: 1 where input column w meets output column v at kernel column l
    (w = v·stride + l − padding; the padding's columns meet none)."""
    v = torch.arange(out_width, device=like.device).view(-1, 1, 1)
    w = torch.arange(width, device=like.device).view(1, -1, 1)
    tap = torch.arange(kw, device=like.device).view(1, 1, -1)
    return (w == v * stride + tap - padding).to(like.dtype)
