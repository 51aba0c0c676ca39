"""Example env backend for navrl-daemon: NavRL's quick-demo world, a 2D field of round pillars.

Registered under the `navrl_daemon.backends` entry point as "navrl-2d" (pyproject.toml), so
`env.backend = "navrl-2d"` selects it; see env.py for the task and `env.options`.
"""

from navrl_2d.env import Planar2DEnv, PlanarOptions, make_env

__all__ = ["Planar2DEnv", "PlanarOptions", "make_env"]
