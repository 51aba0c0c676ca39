"""navrl-daemon: a long-running training service for NavRL's drone-navigation PPO policy."""

__version__ = "0.1.0"
