"""LiDAR: hand-computed readings, a plain 3D slab reference, and exact grid culling."""

from __future__ import annotations

import math

import pytest
import torch

from navrl_daemon.env.navigation.lidar import (
    HORIZONTAL_BEAMS,
    LIDAR_RANGE,
    NUM_BEAMS,
    Lidar,
    PillarGrid,
    beam_directions,
)
from navrl_daemon.env.navigation.obstacles import generate_pillars

FRONT, LEFT = 0, 9  # beam columns: yaw + 0° and yaw + 90°
DOWN, LEVEL, UP10, UP20 = 0, 1, 2, 3  # elevation rows: -10°, 0°, 10°, 20°


def scan(boxes: list[list[float]], pos: list[float], yaw: float = 0.0, half: float = 25.0):
    """Readings [36,4] (distance, m) of one drone against the given boxes."""
    grid = PillarGrid.build([torch.tensor(boxes, dtype=torch.float32).reshape(-1, 5)])
    lidar = Lidar(grid, ground_half_extent=half)
    d = lidar.distances(torch.tensor([pos]), torch.tensor([yaw]), torch.zeros(1, dtype=torch.long))
    return d.reshape(HORIZONTAL_BEAMS, 4)


def test_box_ahead_side_beam_and_elevations():
    # Box face at x=2 ahead, a second box whose face is 1.5 m to the left (+y).
    d = scan([[2, -0.5, 3, 0.5, 3.0], [-0.5, 1.5, 0.5, 2.5, 3.0]], [0, 0, 1])
    assert LIDAR_RANGE - d[FRONT, LEVEL] == pytest.approx(2.0, abs=1e-5)
    assert d[FRONT, UP20] == pytest.approx(2 / math.cos(math.radians(20)), abs=1e-5)
    assert d[FRONT, DOWN] == pytest.approx(2 / math.cos(math.radians(10)), abs=1e-5)
    # 10° off the x axis the ray still meets the face x=2 (at y = 2·tan 10° < 0.5).
    assert d[1, LEVEL] == pytest.approx(2 / math.cos(math.radians(10)), abs=1e-5)
    assert d[LEFT, LEVEL] == pytest.approx(1.5, abs=1e-5)
    assert d[18, LEVEL] == LIDAR_RANGE  # behind: nothing
    assert d[27, LEVEL] == LIDAR_RANGE


def test_elevated_beam_passes_over_a_low_box():
    d = scan([[2, -0.5, 3, 0.5, 1.2]], [0, 0, 1])
    assert d[FRONT, LEVEL] == pytest.approx(2.0, abs=1e-5)
    # At x=2 the +10° beam is at 1 + 2·tan 10° = 1.35 m > 1.2 m: it passes over the top.
    assert d[FRONT, UP10] == LIDAR_RANGE
    assert d[FRONT, UP20] == LIDAR_RANGE


def test_yaw_rotates_the_pattern():
    d = scan([[-0.5, 2, 0.5, 3, 3.0]], [0, 0, 1], yaw=math.pi / 2)
    assert d[FRONT, LEVEL] == pytest.approx(2.0, abs=1e-5)
    assert d[LEFT, LEVEL] == LIDAR_RANGE


def test_inside_a_box_reads_zero():
    d = scan([[2, -0.5, 3, 0.5, 3.0]], [2.5, 0, 1])
    assert torch.all(d == 0)


def test_ground_hit_by_the_downward_beam():
    d = scan([], [0, 0, 0.5])
    assert d[:, DOWN] == pytest.approx(torch.full((36,), 0.5 / math.sin(math.radians(10))))
    assert torch.all(d[:, 1:] == LIDAR_RANGE)


def test_no_ground_outside_the_mesh():
    d = scan([], [24.5, 0, 0.5], half=25.0)
    assert d[FRONT, DOWN] == LIDAR_RANGE  # would land at x = 27.3, off the mesh
    assert d[18, DOWN] == pytest.approx(0.5 / math.sin(math.radians(10)), abs=1e-5)


def reference_cast(pos: torch.Tensor, yaw: torch.Tensor, boxes: torch.Tensor, half: float):
    """Plain 3D slab test in float64, ray by ray over all boxes, plus the ground plane."""
    dirs = beam_directions(yaw.double())
    out = torch.full((pos.shape[0], NUM_BEAMS), LIDAR_RANGE, dtype=torch.float64)
    for n in range(pos.shape[0]):
        o = pos[n].double()
        for r in range(NUM_BEAMS):
            d = dirs[n, r]
            best = math.inf
            if d[2] < 0 and o[2] >= 0:
                t = float(-o[2] / d[2])
                hit = o + t * d
                if abs(hit[0]) <= half and abs(hit[1]) <= half:
                    best = t
            for x0, y0, x1, y1, h in boxes.double().tolist():
                t_near, t_far = -math.inf, math.inf
                for a, lo, hi in ((0, x0, x1), (1, y0, y1), (2, 0.0, h)):
                    if abs(d[a]) < 1e-12:
                        if not lo <= o[a] <= hi:
                            t_near = math.inf
                        continue
                    t1, t2 = float((lo - o[a]) / d[a]), float((hi - o[a]) / d[a])
                    t_near, t_far = max(t_near, min(t1, t2)), min(t_far, max(t1, t2))
                if t_near <= t_far and t_far >= 0:
                    best = min(best, max(t_near, 0.0))
            out[n, r] = min(best, LIDAR_RANGE)
    return out


def test_matches_a_plain_3d_reference():
    g = torch.Generator().manual_seed(4)
    boxes = torch.tensor(
        [
            [1, -1, 1.8, 0.2, 2.0],
            [-3, 0.5, -2.2, 1.3, 0.8],
            [0.4, 1.6, 1.2, 2.0, 5.0],
            [-1, -3, 0, -2.6, 1.5],
        ]
    )
    pos = torch.cat((torch.rand(6, 2, generator=g) * 4 - 2, torch.rand(6, 1, generator=g) * 2.5), 1)
    pos[0] = torch.tensor([0.0, 0.0, 0.3])  # low enough for the ground
    yaw = torch.rand(6, generator=g) * 2 * math.pi - math.pi
    grid = PillarGrid.build([boxes])
    got = Lidar(grid, ground_half_extent=3.0).distances(pos, yaw, torch.zeros(6, dtype=torch.long))
    want = reference_cast(pos, yaw, boxes, half=3.0)
    torch.testing.assert_close(got.double(), want, atol=1e-4, rtol=0)
    assert (got < LIDAR_RANGE).any() and (got == LIDAR_RANGE).any()


@pytest.mark.parametrize("cell", [0.35, 1.0, 3.0])
def test_grid_culling_equals_brute_force(cell: float):
    g = torch.Generator().manual_seed(1)
    draws = generate_pillars(350, 40.0, g, num_maps=2)
    maps = [draws.boxes(0), draws.boxes(1)]
    grid = PillarGrid.build(maps, cell=cell)
    lidar = Lidar(grid, ground_half_extent=25.0)
    n = 400
    # Points over the field, the border and beyond it, at every height a drone can reach.
    xy = (torch.rand(n, 2, generator=g) * 2 - 1) * 30
    z = torch.rand(n, 1, generator=g) * 7
    pos, yaw = torch.cat((xy, z), 1), torch.rand(n, generator=g) * 7 - 3.5
    map_id = torch.arange(n) % 2
    culled = lidar.distances(pos, yaw, map_id)
    brute = lidar.cast(pos, yaw, grid.boxes[map_id])  # every box of the env's map
    assert torch.equal(culled, brute)
    assert (culled < LIDAR_RANGE).float().mean() > 0.05  # the test does see pillars
    assert grid.candidates_per_cell < grid.boxes.shape[1]


def test_pattern_layout():
    dirs = beam_directions(torch.tensor([0.0])).reshape(36, 4, 3)
    torch.testing.assert_close(dirs.norm(dim=-1), torch.ones(36, 4))
    el = torch.rad2deg(torch.asin(dirs[0, :, 2]))
    torch.testing.assert_close(el, torch.tensor([-10.0, 0.0, 10.0, 20.0]))
    az = torch.rad2deg(torch.atan2(dirs[:, 1, 1], dirs[:, 1, 0]))
    torch.testing.assert_close(az[:19], torch.arange(19.0) * 10, atol=1e-4, rtol=0)
