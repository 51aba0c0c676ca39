"""The update's statistics as every sink reports them: by the names the update gives them.

`Learner.update` returns a mapping of named statistics (rl/ppo.py: loss terms, gradient
norms, what it measured), and Prometheus, the console, TensorBoard, W&B, the report and
`history.jsonl` each report every entry they are given, grouped by its name alone: a name
ending in `_loss` is a loss term, one ending in `_grad_norm` a gradient norm. A term added
to the loss reaches every sink with no edit here or there.
"""

from __future__ import annotations

from typing import Any

LOSS_SUFFIX = "_loss"
GRAD_NORM_SUFFIX = "_grad_norm"

# The fields of a progress summary and of a history row that say where training is and
# how fast it goes (ops/progress.py, pipeline/telemetry.py), not what the update computed.
ROW_FIELDS = frozenset(
    {
        "iteration",
        "iterations",
        "frames",
        "time",
        "frames_per_second",
        "policy_lag",
        "policy_version",
        "phases",
        "busy",
        "resumed_from",
        "curriculum_stage",
        "curriculum_name",
        "level_shares",
        "level_pillars",
        "level_outcomes",
        "total_frames",
        "eta_s",
    }
)
# ... and the training episodes' statistics and the checkpoints'.
ROW_PREFIXES = ("train_", "checkpoint_")


def is_row_field(key: str) -> bool:
    return key in ROW_FIELDS or key.startswith(ROW_PREFIXES)


def update_statistics(row: dict[str, Any]) -> dict[str, float]:
    """The update's statistics in a summary or history row, in its order."""
    return {
        k: v
        for k, v in row.items()
        if not is_row_field(k) and isinstance(v, int | float) and not isinstance(v, bool)
    }


def loss_terms(stats: dict[str, float]) -> dict[str, float]:
    """The loss terms by term (`critic_loss` → `critic`)."""
    return {k.removesuffix(LOSS_SUFFIX): v for k, v in stats.items() if k.endswith(LOSS_SUFFIX)}


def grad_norms(stats: dict[str, float]) -> dict[str, float]:
    """The gradient norms by parameter group (`actor_grad_norm` → `actor`)."""
    suffix = GRAD_NORM_SUFFIX
    return {k.removesuffix(suffix): v for k, v in stats.items() if k.endswith(suffix)}


def other_statistics(stats: dict[str, float]) -> dict[str, float]:
    """Every statistic that is neither a loss term nor a gradient norm."""
    return {k: v for k, v in stats.items() if not k.endswith((LOSS_SUFFIX, GRAD_NORM_SUFFIX))}
