"""Flight model: first-order velocity tracking and the thrust limit."""

from __future__ import annotations

import math

import pytest
import torch

from navrl_daemon.env.navigation.dynamics import GRAVITY, commanded_thrust, point_mass_step

DT, TAU = 0.016, 0.45


def fly(v_cmd: list[float], steps: int, twr: float = 3.4):
    pos, vel = torch.zeros(1, 3), torch.zeros(1, 3)
    cmd = torch.tensor([v_cmd])
    for _ in range(steps):
        pos, vel = point_mass_step(pos, vel, cmd, dt=DT, tau=TAU, thrust_to_weight=twr)
    return pos, vel


def test_step_response_reaches_63_percent_after_tau():
    _, vel = fly([2.0, 0.0, 0.0], round(TAU / DT))
    assert vel[0, 0] / 2.0 == pytest.approx(1 - math.exp(-1), abs=0.02)
    assert vel[0, 1:].abs().max() < 1e-6  # hover: gravity exactly compensated


def test_hover_holds_position():
    pos, vel = fly([0.0, 0.0, 0.0], 100)
    assert pos.abs().max() < 1e-6 and vel.abs().max() < 1e-6


def test_position_integrates_velocity():
    pos, vel = fly([1.0, 0.0, 0.0], 2000)
    assert vel[0, 0] == pytest.approx(1.0, abs=1e-4)
    assert pos[0, 0] == pytest.approx(2000 * DT - TAU, abs=0.05)  # lag of one τ


def test_thrust_limit_respected():
    g = torch.Generator().manual_seed(0)
    vel = torch.randn(256, 3, generator=g) * 3
    cmd = torch.randn(256, 3, generator=g) * 20
    twr = 1.5
    thrust = commanded_thrust(vel, cmd, dt=DT, tau=TAU, thrust_to_weight=twr)
    assert torch.all(thrust.norm(dim=-1) <= twr * GRAVITY * (1 + 1e-6))
    assert torch.all(thrust[:, 2] >= 0)  # rotors never push down
    # A limited command keeps its direction.
    want = (cmd - vel) / TAU + torch.tensor([0, 0, GRAVITY])
    big = (want.norm(dim=-1) > twr * GRAVITY) & (want[:, 2] > 0)
    cos = torch.nn.functional.cosine_similarity(thrust[big], want[big])
    assert big.any() and torch.all(cos > 1 - 1e-5)


def test_limited_climb_and_free_fall():
    _, vel = fly([0.0, 0.0, 50.0], 10, twr=1.2)
    # Climb acceleration is capped at (TWR - 1)·g.
    assert vel[0, 2] == pytest.approx(10 * DT * 0.2 * GRAVITY, rel=1e-4)
    _, vel = fly([0.0, 0.0, -50.0], 10, twr=1.2)
    # Thrust cannot go negative: at most free fall.
    assert vel[0, 2] == pytest.approx(-10 * DT * GRAVITY, rel=1e-4)
