"""NavRL's LiDAR (navrl-task §1.6): 36×4 rays cast analytically against the ground and the pillars.

Beam (i, j) has azimuth 10·i° counter-clockwise from the drone's yaw and elevation
[-10, 0, 10, 20]° (j); beams are flattened i-major, so a scan [N,144] reshapes to [N,36,4].
Rays hit the ground plane z=0 only where NavRL's terrain mesh exists (the field plus its
border ring) and the pillars as boxes [x0,x1]×[y0,y1]×[0,h] (slab test); a ray starting
inside a box reads 0. Dynamic obstacles are invisible to it, as in NavRL.

Cost is kept bounded by a `PillarGrid`: a uniform 2D grid built once per map whose cells list
every box within the LiDAR range of any point of the cell. Testing only those candidates
gives exactly the brute-force answer: a box that any ray can hit within range lies within
range horizontally, and points outside the grid have no box within range at all.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

# --- navrl-task §0 (drone.yaml) and §1.6 ----------------------------------------------------------
LIDAR_RANGE = 4.0  # m; misses and hits beyond it read as the range
HORIZONTAL_BEAMS = 36  # 360° / lidar_hres 10°
HORIZONTAL_STEP_DEG = 10.0
VERTICAL_ANGLES_DEG = (-10.0, 0.0, 10.0, 20.0)  # linspace(lidar_vfov -10, 20, lidar_vbeams 4)
NUM_BEAMS = HORIZONTAL_BEAMS * len(VERTICAL_ANGLES_DEG)

# Ours: grid cell side, and a cap on the number of cells for very large fields.
GRID_CELL = 1.0
GRID_MAX_CELLS_PER_SIDE = 512
# Elements of one [N,144,K] temporary above which the box test runs in env chunks.
CHUNK_ELEMENTS = 1 << 25
_NULL_BOX = (1e6, 1e6, 1e6 + 1.0, 1e6 + 1.0, 1.0)  # padding: never within range of anything


def beam_directions(yaw: Tensor) -> Tensor:
    """Unit ray directions [N,144,3] in the world for drones with the given yaw [N]."""
    head = headings(yaw)[:, :, None, :]  # [N,36,1,2]
    el = torch.deg2rad(torch.tensor(VERTICAL_ANGLES_DEG, device=yaw.device, dtype=yaw.dtype))
    xy = head * torch.cos(el)[:, None]  # [N,36,4,2]
    z = torch.sin(el).expand(*xy.shape[:-1])
    return torch.cat((xy, z[..., None]), -1).reshape(yaw.shape[0], NUM_BEAMS, 3)


def headings(yaw: Tensor) -> Tensor:
    """Horizontal unit directions [N,36,2] of the beam columns: 10·i° CCW from the yaw."""
    step = math.radians(HORIZONTAL_STEP_DEG)
    az = torch.arange(HORIZONTAL_BEAMS, device=yaw.device, dtype=yaw.dtype) * step
    az = az + yaw[:, None]
    return torch.stack((torch.cos(az), torch.sin(az)), -1)


def safe_inverse(x: Tensor) -> Tensor:
    """1/x with (near-)zeros replaced by a tiny positive value: slabs never see 0·inf."""
    return 1.0 / torch.where(x.abs() < 1e-12, torch.full_like(x, 1e-12), x)


class Lidar:
    """Casts the beam pattern for drones on their maps: `distances` uses the culling grid,
    `cast` tests any given boxes (the brute-force reference uses all of a map's boxes).

    The four beams of a column share one horizontal direction, so the pillar test is done in
    horizontal distance s: the x-y slabs once per column [N,36,K], the z slab [0,h] once per
    elevation [N,K,4] (z(s) = z0 + s·tan(el)), then intersected; t = s / cos(el).
    """

    def __init__(self, grid: PillarGrid, ground_half_extent: float, range_: float = LIDAR_RANGE):
        self.grid = grid
        self.ground_half_extent = ground_half_extent
        self.range = range_
        device = grid.boxes.device
        el = torch.deg2rad(torch.tensor(VERTICAL_ANGLES_DEG, dtype=torch.float64))
        self._inv_tan = safe_inverse(torch.tan(el)).to(device, torch.float32)  # [4]
        self._sec = (1.0 / torch.cos(el)).to(device, torch.float32)
        # Ground: horizontal distance to z=0 per unit height, for the downward beams only.
        down = el < 0
        cot = torch.where(down, 1.0 / torch.tan(-el).clamp_min(1e-12), torch.inf)
        self._ground_per_height = cot.to(device, torch.float32)

    def distances(self, pos: Tensor, yaw: Tensor, map_id: Tensor) -> Tensor:
        """Hit distances [N,144] in [0, range] for drones at pos [N,3] with yaw [N]."""
        return self.cast(pos, yaw, self.grid.candidates(pos, map_id))

    def cast(self, pos: Tensor, yaw: Tensor, boxes: Tensor) -> Tensor:
        """Hit distances [N,144] in [0, range] against the ground and boxes [N,K,5]."""
        head = headings(yaw)
        n, k = pos.shape[0], boxes.shape[1]
        step = max(1, CHUNK_ELEMENTS // max(1, NUM_BEAMS * k))
        if n <= step:
            s = self._box_ranges(pos, head, boxes)
        else:
            s = torch.cat(
                [
                    self._box_ranges(pos[i : i + step], head[i : i + step], boxes[i : i + step])
                    for i in range(0, n, step)
                ]
            )
        s = torch.minimum(s, self._ground_ranges(pos, head))
        return (s * self._sec).reshape(n, NUM_BEAMS).clamp_max(self.range)

    def _ground_ranges(self, pos: Tensor, head: Tensor) -> Tensor:
        """Horizontal distance [N,36,4] to z=0 where the hit lies on the terrain mesh, else inf."""
        s = pos[:, 2, None] * self._ground_per_height  # [N,4]; inf for level/up beams
        hit_xy = pos[:, None, None, :2] + s[:, None, :, None] * head[:, :, None, :]
        on_mesh = (hit_xy.abs() <= self.ground_half_extent).all(-1)
        s = s[:, None, :].expand_as(on_mesh)
        return torch.where(on_mesh & (s >= 0), s, torch.inf)

    def _box_ranges(self, pos: Tensor, head: Tensor, boxes: Tensor) -> Tensor:
        """Horizontal distance [N,36,4] to the nearest box hit (0 inside a box, inf if none)."""
        inv = safe_inverse(head)  # [N,36,2]
        ox, oy, oz = pos[:, 0, None, None], pos[:, 1, None, None], pos[:, 2, None]
        ax = (boxes[:, None, :, 0] - ox) * inv[..., 0:1]  # [N,36,K]
        bx = (boxes[:, None, :, 2] - ox) * inv[..., 0:1]
        ay = (boxes[:, None, :, 1] - oy) * inv[..., 1:2]
        by = (boxes[:, None, :, 3] - oy) * inv[..., 1:2]
        near = torch.maximum(torch.minimum(ax, bx), torch.minimum(ay, by)).clamp_min_(0)
        far = torch.minimum(torch.maximum(ax, bx), torch.maximum(ay, by))
        za = (-oz * self._inv_tan)[:, None, :]  # [N,1,4]: where the beam is at z=0
        zb = (boxes[..., 4, None] - oz[:, None]) * self._inv_tan  # [N,K,4]: at z=h
        near = torch.maximum(near[..., None], torch.minimum(za, zb)[:, None])  # [N,36,K,4]
        far = torch.minimum(far[..., None], torch.maximum(za, zb)[:, None])
        return near.masked_fill_(near > far, torch.inf).amin(2)


class PillarGrid:
    """Pillar boxes of every map, padded, with a per-map 2D culling grid.

    boxes [M,B+1,5] (the last slot of each map is a far-away null box), cells [M,C,K]
    indices into boxes: every box within `reach` (2D rect-to-cell distance) of a cell.
    """

    def __init__(
        self, boxes: Tensor, cells: Tensor, lo: tuple[float, float], cell: float, nx: int, ny: int
    ) -> None:
        self.boxes = boxes
        self.cells = cells
        self.lo = lo
        self.cell = cell
        self.nx, self.ny = nx, ny

    @property
    def candidates_per_cell(self) -> int:
        return self.cells.shape[-1]

    @classmethod
    def build(
        cls,
        boxes: Sequence[Tensor],
        reach: float = LIDAR_RANGE,
        device: torch.device | str = "cpu",
        cell: float = GRID_CELL,
    ) -> PillarGrid:
        """Grid over the boxes' bounding square grown by `reach`; `boxes` is one [B_m,5] per map."""
        boxes = [b.detach().to("cpu", torch.float32).reshape(-1, 5) for b in boxes]
        every = torch.cat(boxes) if boxes else torch.zeros(0, 5)
        if every.shape[0]:
            lo_x = float(every[:, 0].min()) - reach
            lo_y = float(every[:, 1].min()) - reach
            hi_x = float(every[:, 2].max()) + reach
            hi_y = float(every[:, 3].max()) + reach
        else:
            lo_x = lo_y = hi_x = hi_y = 0.0
        side = max(hi_x - lo_x, hi_y - lo_y)
        cell = max(cell, side / GRID_MAX_CELLS_PER_SIDE)
        nx = max(1, math.ceil((hi_x - lo_x) / cell))
        ny = max(1, math.ceil((hi_y - lo_y) / cell))
        width = max(b.shape[0] for b in boxes) + 1 if boxes else 1
        tables = [_cell_table(b, (lo_x, lo_y), cell, nx, ny, reach, null=width - 1) for b in boxes]
        k = max(1, *(t.shape[1] for t in tables)) if tables else 1
        null = torch.tensor(_NULL_BOX)
        padded_boxes = torch.stack(
            [torch.cat((b, null.expand(width - b.shape[0], 5))) for b in boxes]
        )
        padded_cells = torch.stack(
            [torch.cat((t, torch.full((t.shape[0], k - t.shape[1]), width - 1)), 1) for t in tables]
        )
        return cls(padded_boxes.to(device), padded_cells.to(device), (lo_x, lo_y), cell, nx, ny)

    def cell_of(self, xy: Tensor) -> Tensor:
        """Flat cell index [N] of points [N,2]; points off the grid use the nearest edge cell."""
        ix = ((xy[:, 0] - self.lo[0]) / self.cell).floor().clamp(0, self.nx - 1).long()
        iy = ((xy[:, 1] - self.lo[1]) / self.cell).floor().clamp(0, self.ny - 1).long()
        return ix * self.ny + iy

    def candidates(self, pos: Tensor, map_id: Tensor) -> Tensor:
        """Boxes [N,K,5] that can be within `reach` of each drone (positions [N,3])."""
        idx = self.cells[map_id, self.cell_of(pos[:, :2])]  # [N,K]
        return self.boxes[map_id[:, None], idx]


def _cell_table(
    boxes: Tensor, lo: tuple[float, float], cell: float, nx: int, ny: int, reach: float, null: int
) -> Tensor:
    """[nx·ny, K] box indices within `reach` of each cell, padded with `null`.

    Each box visits the cells of its bounding square grown by reach, keeps those whose
    rect-to-rect distance is within reach, and the (cell, box) pairs are grouped by cell.
    """
    count = boxes.shape[0]
    if count == 0:
        return torch.full((nx * ny, 1), null, dtype=torch.long)
    reach = reach + 1e-4  # float safety: a superset never changes the answer
    ix0 = ((boxes[:, 0] - reach - lo[0]) / cell).floor().long()
    iy0 = ((boxes[:, 1] - reach - lo[1]) / cell).floor().long()
    ix1 = ((boxes[:, 2] + reach - lo[0]) / cell).floor().long()
    iy1 = ((boxes[:, 3] + reach - lo[1]) / cell).floor().long()
    span = int(max((ix1 - ix0).max(), (iy1 - iy0).max())) + 1
    off = torch.arange(span)
    ix = (ix0[:, None, None] + off[None, :, None]).expand(count, span, span)
    iy = (iy0[:, None, None] + off[None, None, :]).expand(count, span, span)
    cx0 = lo[0] + ix * cell
    cy0 = lo[1] + iy * cell
    gap_x = torch.maximum(cx0 - boxes[:, 2, None, None], boxes[:, 0, None, None] - (cx0 + cell))
    gap_y = torch.maximum(cy0 - boxes[:, 3, None, None], boxes[:, 1, None, None] - (cy0 + cell))
    near = gap_x.clamp_min(0) ** 2 + gap_y.clamp_min(0) ** 2 <= reach * reach
    near &= (ix >= 0) & (ix < nx) & (iy >= 0) & (iy < ny) & (ix <= ix1[:, None, None])
    near &= iy <= iy1[:, None, None]
    box_id = torch.arange(count)[:, None, None].expand(count, span, span)
    cell_id, box_id = (ix * ny + iy)[near], box_id[near]
    order = torch.argsort(cell_id * count + box_id)
    cell_id, box_id = cell_id[order], box_id[order]
    per_cell = torch.bincount(cell_id, minlength=nx * ny)
    first = torch.cumsum(per_cell, 0) - per_cell
    rank = torch.arange(cell_id.shape[0]) - first[cell_id]
    table = torch.full((nx * ny, max(1, int(per_cell.max()))), null, dtype=torch.long)
    table[cell_id, rank] = box_id
    return table
