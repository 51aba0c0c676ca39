"""Flight model: a vectorised stand-in for Isaac Sim's Hummingbird under the Lee controller.

NavRL flies a PhysX quadrotor whose Lee velocity controller commands an acceleration of
about 2.2·(v_cmd − v) plus gravity compensation, i.e. roughly a first-order velocity
response with τ ≈ 0.45 s (navrl-task §1.7, §7). We keep exactly that closed loop and drop the
attitude and rotor lags:

* the drone is a point mass; the commanded acceleration is a = (v_cmd − v) / τ
  (τ = `velocity_time_constant`, floored at dt so the explicit step stays stable);
* the thrust per unit mass that realises it is f = a + g·ẑ. Rotors only push along the
  body's up axis and NavRL never flies inverted, so f_z is clipped at 0, and |f| is capped at
  thrust_to_weight·g by scaling the whole vector down (direction kept);
* no drag (NavRL's drag coefficient is multiplied by zeros);
* semi-implicit Euler with the env's dt: v ← v + (f − g·ẑ)·dt, then p ← p + v·dt;
* yaw is not simulated: it stays at the goal-facing yaw set at reset, as the Lee
  controller holds the current yaw.

With these rules the velocity error after τ seconds of a step command is ≈ e⁻¹ (63% reached)
as long as the thrust limit is not hit; at thrust_to_weight 3.4 a hovering drone can
accelerate sideways at up to ≈ 3.25 g.
"""

from __future__ import annotations

import torch
from torch import Tensor

GRAVITY = 9.81  # m/s², sim.yaml (navrl-task §0)


def point_mass_step(
    pos: Tensor,
    vel: Tensor,
    v_cmd: Tensor,
    *,
    dt: float,
    tau: float,
    thrust_to_weight: float,
) -> tuple[Tensor, Tensor]:
    """Advance positions and velocities [N,3] by one step towards world velocity commands."""
    thrust = commanded_thrust(vel, v_cmd, dt=dt, tau=tau, thrust_to_weight=thrust_to_weight)
    acc = torch.cat((thrust[:, :2], thrust[:, 2:] - GRAVITY), -1)
    vel = vel + acc * dt
    return pos + vel * dt, vel


def commanded_thrust(
    vel: Tensor, v_cmd: Tensor, *, dt: float, tau: float, thrust_to_weight: float
) -> Tensor:
    """Thrust per unit mass [N,3] (m/s²) after the non-negative and magnitude limits."""
    acc = (v_cmd - vel) / max(tau, dt)
    thrust = torch.cat((acc[:, :2], (acc[:, 2:] + GRAVITY).clamp_min(0.0)), -1)
    limit = thrust_to_weight * GRAVITY
    scale = (limit / thrust.norm(dim=-1, keepdim=True).clamp_min(1e-9)).clamp_max(1.0)
    return thrust * scale
