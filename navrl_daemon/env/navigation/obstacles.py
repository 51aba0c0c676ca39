"""NavRL's obstacles: the static pillar map (navrl-task §1.2) and the moving obstacles
(navrl-task §1.3).

Pillars are drawn once per map with NavRL's modified Orbit `discrete_obstacles_terrain` rules,
in 0.1 m pixels on the inner grid of the field, and turned into axis-aligned boxes for the
LiDAR. Dynamic obstacles are kinematic points with a size; they move every env step, shared
by all envs of a map, and are never reset (NavRL keeps one global set for the whole run).

Everything is drawn from an explicit `torch.Generator`; nothing touches the global RNG.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from navrl_daemon.host_copy import host_copy

# --- navrl-task §1.2: pillars ------------------------------------------------------------------
PIXEL = 0.1  # horizontal and vertical scale of the height field, m
SIDES_PX = (4, 8)  # arange(int(0.4/0.1), int(1.1/0.1), 4): each side 0.4 m or 0.8 m
LATTICE_PX = 4  # corners on arange(0, n_px, 4): a 0.4 m lattice
HEIGHT_BINS = (1.0, 1.5, 2.0, 4.0, 6.0)  # m, bin edges
HEIGHT_PROBS = (0.10, 0.15, 0.20, 0.55)
GAP_REJECT_PX = (2, 10)  # reject a placement whose gap measure d is in [2, 10] px
MAX_TRIES = 100_000  # per pillar; the last draw is kept if none is accepted
TRY_BATCH = 64  # candidates tested at once (ours; NavRL tries one at a time)

# --- navrl-task §1.3: dynamic obstacles -----------------------------------------------------------
DYN_CATEGORIES = 8  # 0-3 floating cuboids, 4-7 standing cylinders
DYN_WIDTH_STEP = 0.25  # side (cuboids) or diameter (cylinders) = 0.25 * (category % 4 + 1)
CUBOID_HEIGHT = 1.0
CYLINDER_HEIGHT = 5.0
CYLINDER_Z = 2.5  # cylinder centres stay at this height
DYN_Z_RANGE = (0.0, 4.5)  # map_range z: origin and goal heights of the cuboids
LOCAL_RANGE = (5.0, 5.0, 4.5)  # env_dyn.local_range: goal box around the origin
GOAL_REACHED = 0.5  # m (3D): closer than this to its goal, an obstacle draws a new one
RETARGET_PERIOD_S = 2.0  # velocity re-aimed every int(2.0 / dt) steps
# Ours: the minimum origin spacing shrinks by this factor after every batch of failed
# attempts (NavRL shrinks it after each 0.1 s of wall-clock time; docs/navrl-task.md lists
# where we differ).
ORIGIN_TRIES_PER_RELAX = 100
ORIGIN_RELAX_FACTOR = 0.8


# ======================================================================= static pillars


def field_pixels(field_size: float) -> int:
    """Inner height-field pixels per side: NavRL's 40 m field gives 401 vertices, 399 pixels."""
    return max(round(field_size / PIXEL) - 1, max(SIDES_PX))


@dataclass(frozen=True)
class PillarDraws:
    """The generator's accepted draws per map, in inner-grid pixels (index × 0.1 − F/2 = m).

    corner_px [M,P,2] (x, y) low corner, size_px [M,P,2] (x side, y side), height [M,P] m,
    tries [M,P] draws used per pillar (MAX_TRIES means none was accepted, last draw kept).
    """

    corner_px: Tensor
    size_px: Tensor
    height: Tensor
    tries: Tensor
    field_size: float

    @property
    def num_maps(self) -> int:
        return self.corner_px.shape[0]

    def boxes(self, map_index: int = 0, count: int | None = None) -> Tensor:
        """Boxes [B,5] = (x0, y0, x1, y1, height) in metres of one map, disjoint in x-y.

        Later pillars overwrite the heights of earlier ones where they overlap (the height
        field is painted in order), so an overlapped earlier pillar is cut into the pieces
        that stay visible; B >= P when pillars overlap.

        `count` keeps only the first `count` pillars. Each pillar was placed against the
        earlier ones only, so that prefix is itself a map the generator could have drawn
        with `count` pillars: the density levels of `env.navigation.map_levels`.
        """
        k = self.corner_px.shape[1] if count is None else count
        corner, size = self.corner_px[map_index, :k], self.size_px[map_index, :k]
        pieces, owner = _visible_pieces(torch.cat((corner, corner + size), -1))
        metres = pieces.to(torch.float64) * PIXEL - self.field_size / 2
        height = self.height[map_index, :k].to(torch.float64)[owner]
        return torch.cat((metres, height[:, None]), -1).to(torch.float32)


def generate_pillars(
    num_pillars: int, field_size: float, generator: torch.Generator, num_maps: int = 1
) -> PillarDraws:
    """Place pillars one after another with NavRL's spacing rule, all maps at once.

    Each pillar draws its height once, then footprints and corners in batches of TRY_BATCH
    until one passes the spacing test against every earlier pillar of its map.
    """
    n_px = field_pixels(field_size)
    lattice = torch.arange(0, n_px, LATTICE_PX)
    corner = torch.zeros(num_maps, num_pillars, 2, dtype=torch.long)
    size = torch.zeros(num_maps, num_pillars, 2, dtype=torch.long)
    tries = torch.zeros(num_maps, num_pillars, dtype=torch.long)
    height = _draw_heights(num_maps, num_pillars, generator)
    for p in range(num_pillars):
        c, s, t = _place_one(corner[:, :p], n_px, lattice, generator)
        corner[:, p], size[:, p], tries[:, p] = c, s, t
    return PillarDraws(corner, size, height, tries, field_size)


def _draw_heights(num_maps: int, num_pillars: int, generator: torch.Generator) -> Tensor:
    """Heights: a bin by HEIGHT_PROBS, uniform within it in 0.1 m units, rounded to 0.1 m."""
    probs = torch.tensor(HEIGHT_PROBS, dtype=torch.float64)
    bins = torch.tensor(HEIGHT_BINS, dtype=torch.float64) / PIXEL
    count = num_maps * num_pillars
    if count == 0:
        return torch.zeros(num_maps, num_pillars)
    idx = torch.multinomial(probs, count, replacement=True, generator=generator)
    u = torch.rand(count, dtype=torch.float64, generator=generator)
    units = bins[idx] + u * (bins[idx + 1] - bins[idx])
    return (torch.round(units) * PIXEL).to(torch.float32).reshape(num_maps, num_pillars)


def _place_one(
    prev_corner: Tensor, n_px: int, lattice: Tensor, gen: torch.Generator
) -> tuple[Tensor, Tensor, Tensor]:
    """Draw candidates until each map accepts one: corner [M,2], size [M,2], tries [M]."""
    num_maps = prev_corner.shape[0]
    corner = torch.zeros(num_maps, 2, dtype=torch.long)
    size = torch.zeros(num_maps, 2, dtype=torch.long)
    tries = torch.zeros(num_maps, dtype=torch.long)
    pending = torch.ones(num_maps, dtype=torch.bool)
    sides = torch.tensor(SIDES_PX)
    while bool(pending.any()):
        cand_size = sides[torch.randint(len(SIDES_PX), (num_maps, TRY_BATCH, 2), generator=gen)]
        cand = lattice[torch.randint(len(lattice), (num_maps, TRY_BATCH, 2), generator=gen)]
        cand = torch.minimum(cand, n_px - cand_size)  # pushed back inside the field
        ok = spacing_ok(cand, cand_size, prev_corner)
        left = MAX_TRIES - tries  # [M]
        ok &= torch.arange(TRY_BATCH)[None, :] < left[:, None]
        accepted = ok.any(-1)
        # First accepted candidate; a map out of tries keeps its last allowed draw.
        used = torch.where(accepted, ok.int().argmax(-1) + 1, left.clamp(max=TRY_BATCH))
        done = pending & (accepted | (tries + used >= MAX_TRIES))
        pick = (used - 1).clamp(min=0)
        rows = torch.arange(num_maps)
        corner[done] = cand[rows, pick][done]
        size[done] = cand_size[rows, pick][done]
        tries[pending] += used[pending]
        pending &= ~done
    return corner, size, tries


def spacing_ok(corner: Tensor, size: Tensor, prev_corner: Tensor) -> Tensor:
    """NavRL's "no narrow gap" test of candidates [M,T,2] against earlier pillars [M,P,2].

    dx = |x_prev − x_new| − w_new and dy = |y_prev − y_new| − l_new (pixels; the *new*
    pillar's sizes, as NavRL does). Both negative: overlap, fine. Otherwise the candidate is
    rejected if 2 <= sqrt(dx² + dy²) <= 10. Returns [M,T]: accepted by every earlier pillar.
    """
    # x and y apart, in int32 (a field is well under 2^15 px): [M,T,P] each, exact, ~6x
    # faster than one int64 [M,T,P,2] tensor reduced over its last dim (450 pillars).
    prev, new, side = (t.to(torch.int32) for t in (prev_corner, corner, size))
    dx = (prev[:, None, :, 0] - new[:, :, None, 0]).abs_().sub_(side[:, :, None, 0])
    dy = (prev[:, None, :, 1] - new[:, :, None, 1]).abs_().sub_(side[:, :, None, 1])
    overlap = (dx < 0) & (dy < 0)
    d2 = dx.mul_(dx).add_(dy.mul_(dy))
    lo, hi = GAP_REJECT_PX
    reject = ~overlap & (d2 >= lo * lo) & (d2 <= hi * hi)
    return ~reject.any(-1)


def _visible_pieces(rects: Tensor) -> tuple[Tensor, Tensor]:
    """Cut rects [P,4] (x0,y0,x1,y1, painted in order) into disjoint visible pieces.

    The visible part of pillar j is its rect minus every later rect, and set difference does
    not depend on order, so only pillars that overlap an earlier one need a pass.
    Returns pieces [B,4] and their owning pillar index [B].
    """
    count = rects.shape[0]
    pieces, owner = rects.clone(), torch.arange(count)
    if count < 2:
        return pieces, owner
    later = torch.triu(torch.ones(count, count, dtype=torch.bool), diagonal=1)
    cutters = (_overlaps(rects[:, None], rects[None, :]) & later).any(0)
    for k in torch.nonzero(cutters).flatten().tolist():
        pieces, owner = _subtract(pieces, owner, rects[k], k)
    return pieces, owner


def _overlaps(a: Tensor, b: Tensor) -> Tensor:
    """Whether rects a and b [...,4] share interior area."""
    return (
        (a[..., 0] < b[..., 2])
        & (b[..., 0] < a[..., 2])
        & (a[..., 1] < b[..., 3])
        & (b[..., 1] < a[..., 3])
    )


def _subtract(pieces: Tensor, owner: Tensor, cut: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """Remove rect `cut` (pillar k) from every piece of an earlier pillar that it overlaps."""
    hit = _overlaps(pieces, cut) & (owner < k)
    o = pieces[hit]
    x0, y0, x1, y1 = o.unbind(-1)
    cx0, cy0, cx1, cy1 = cut.tolist()
    mx0, mx1 = x0.clamp(min=cx0), x1.clamp(max=cx1)
    parts = torch.stack(
        (
            torch.stack((x0, y0, mx0, y1), -1),  # left of the cut
            torch.stack((mx1, y0, x1, y1), -1),  # right of the cut
            torch.stack((mx0, y0, mx1, y0.clamp(min=cy0)), -1),  # below it
            torch.stack((mx0, y1.clamp(max=cy1), mx1, y1), -1),  # above it
        ),
        1,
    )  # [H,4,4]
    keep = (parts[..., 2] > parts[..., 0]) & (parts[..., 3] > parts[..., 1])
    parts_owner = owner[hit][:, None].expand(-1, 4)
    return (
        torch.cat((pieces[~hit], parts[keep])),
        torch.cat((owner[~hit], parts_owner[keep])),
    )


# ===================================================================== dynamic obstacles


def dynamic_sizes(num: int) -> tuple[Tensor, Tensor]:
    """Per-obstacle (width, width, height) [D,3] and is_cylinder [D]; index = category·(D/8)+k."""
    per = num // DYN_CATEGORIES
    cat = torch.arange(DYN_CATEGORIES).repeat_interleave(per)
    width = DYN_WIDTH_STEP * (cat % 4 + 1).to(torch.float32)
    cylinder = cat >= 4
    height = torch.where(cylinder, CYLINDER_HEIGHT, CUBOID_HEIGHT)
    return torch.stack((width, width, height), -1), cylinder


class DynamicObstacles:
    """NavRL's moving obstacles for M maps at once; tensors [M,D,3] on the env device.

    Each env step: obstacles within 0.5 m (3D) of their goal draw a new goal near their
    origin; every int(2/dt) steps all re-aim at their current goal with a new speed; then
    pos += vel·dt. The step counter is global (shared by the maps, never reset).
    """

    def __init__(
        self,
        origin: Tensor,
        field_size: float,
        dt: float,
        speed_range: tuple[float, float],
    ) -> None:
        if origin.shape[1] % DYN_CATEGORIES:
            raise ValueError(
                f"dynamic obstacles come in {DYN_CATEGORIES} categories: "
                f"count must be a multiple of 8, got {origin.shape[1]}"
            )
        self.origin = origin
        self.count = origin.shape[1]
        self.size, self.is_cylinder = (t.to(origin.device) for t in dynamic_sizes(self.count))
        self.field_size = field_size
        self.dt = dt
        self.speed_range = (float(speed_range[0]), float(speed_range[1]))
        self.retarget_period = max(1, int(RETARGET_PERIOD_S / dt))
        # State tensors, updated in place (a captured env step reads and writes them at
        # fixed addresses); the step counter is a device scalar for the same reason.
        self.pos = origin.clone()
        self.goal = origin.clone()  # distance 0: every obstacle draws a goal at step 0
        self.vel = torch.zeros_like(origin)
        self.step_count = torch.zeros((), dtype=torch.long, device=origin.device)

    @classmethod
    def generate(
        cls,
        num_maps: int,
        num: int,
        field_size: float,
        dt: float,
        speed_range: tuple[float, float],
        generator: torch.Generator,
        device: torch.device | str = "cpu",
    ) -> DynamicObstacles:
        origin = place_dynamic_origins(num_maps, num, field_size, generator)
        return cls(origin.to(device), field_size, dt, speed_range)

    def step(self, generator: torch.Generator) -> None:
        """One kinematic step (navrl-task §1.3), drawing from the env's step generator.

        The same kernels and draws at every step, whatever its number: the re-aim is
        decided on the device (`torch.where` on the step counter) and its speeds are drawn
        at every step, used only at a re-aim. So a CUDA graph of the step replays right at
        any step; the speeds keep NavRL's distribution, U(speed_range) at each re-aim.
        """
        if self.count == 0:
            return
        near = (self.pos - self.goal).norm(dim=-1, keepdim=True) < GOAL_REACHED
        torch.where(near, self._draw_goals(generator), self.goal, out=self.goal)
        lo, hi = self.speed_range
        u = torch.rand(self.pos.shape[:-1], generator=generator, device=self.pos.device)
        heading = self.goal - self.pos
        heading = heading / heading.norm(dim=-1, keepdim=True).clamp_min(1e-6)
        retarget = self.step_count % self.retarget_period == 0
        torch.where(retarget, heading * (lo + (hi - lo) * u)[..., None], self.vel, out=self.vel)
        self.pos.add_(self.vel * self.dt)
        self.step_count.add_(1)

    def _draw_goals(self, generator: torch.Generator) -> Tensor:
        u = torch.rand(self.pos.shape, generator=generator, device=self.pos.device)
        rx, ry, rz = LOCAL_RANGE
        # [quirk, navrl-task §1.3] z offset starts at -local_range[1] and spans 2·local_range[2].
        offset = torch.stack(
            (rx * (2 * u[..., 0] - 1), ry * (2 * u[..., 1] - 1), -ry + 2 * rz * u[..., 2]), -1
        )
        goal = self.origin + offset
        half = self.field_size / 2
        xy = goal[..., :2].clamp(-half, half)
        z = goal[..., 2].clamp(*DYN_Z_RANGE)
        z = torch.where(self.is_cylinder, CYLINDER_Z, z)
        return torch.cat((xy, z[..., None]), -1)

    def state_dict(self) -> dict[str, Tensor]:
        copy = host_copy if self.pos.device.type == "cpu" else Tensor.clone
        return {
            "pos": copy(self.pos),
            "goal": copy(self.goal),
            "vel": copy(self.vel),
            "step_count": copy(self.step_count),
        }

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        """Copies `state_dict` output into the state tensors (their addresses stay)."""
        for name in ("pos", "goal", "vel", "step_count"):
            getattr(self, name).copy_(torch.as_tensor(state[name]))


def place_dynamic_origins(
    num_maps: int, num: int, field_size: float, generator: torch.Generator
) -> Tensor:
    """Origins [M,D,3]: x,y uniform over the field, spread apart; z per category (navrl-task §1.3).

    The required 2D spacing starts at 2·sqrt((F/2)²/D) and shrinks ×0.8 after every
    ORIGIN_TRIES_PER_RELAX failed draws, so placement always ends and is reproducible.
    """
    half = field_size / 2
    xy = torch.zeros(num_maps, num, 2)
    if num == 0:
        return torch.zeros(num_maps, 0, 3)
    start_spacing = 2 * math.sqrt(half * half / num)
    for k in range(num):
        xy[:, k] = _place_origin(xy[:, :k], half, start_spacing, generator)
    _, cylinder = dynamic_sizes(num)
    z_lo, z_hi = DYN_Z_RANGE
    z = z_lo + (z_hi - z_lo) * torch.rand(num_maps, num, generator=generator)
    z = torch.where(cylinder, CYLINDER_Z, z)
    return torch.cat((xy, z[..., None]), -1)


def _place_origin(prev: Tensor, half: float, spacing: float, generator: torch.Generator) -> Tensor:
    """One origin per map [M,2], more than `spacing` from every earlier one (relaxing)."""
    num_maps = prev.shape[0]
    out = torch.zeros(num_maps, 2)
    pending = torch.ones(num_maps, dtype=torch.bool)
    need = torch.full((num_maps,), spacing)
    while bool(pending.any()):
        cand = (2 * torch.rand(num_maps, ORIGIN_TRIES_PER_RELAX, 2, generator=generator) - 1) * half
        dist = (cand[:, :, None, :] - prev[:, None, :, :]).norm(dim=-1)  # [M,T,k]
        ok = (dist > need[:, None, None]).all(-1)
        accepted = ok.any(-1) & pending
        first = ok.int().argmax(-1)
        out[accepted] = cand[torch.arange(num_maps), first][accepted]
        pending &= ~accepted
        need = torch.where(pending, need * ORIGIN_RELAX_FACTOR, need)
    return out
