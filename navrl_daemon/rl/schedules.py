"""Learning-rate and entropy schedules: pure functions of how many frames were trained.

NavRL trains with constant learning rates and a constant entropy coefficient; that is the
default ("constant") and returns the configured numbers untouched, so a default run is
bit for bit what it was without schedules. "linear" moves a value from its start to its
final setting over `schedule_frames` trained frames and holds it there.

The frame count is the learner's version (updates applied, saved in every checkpoint)
times the frames of one update (`Learner.trained_frames`), and the learner sets the
values before each update (`Learner.apply_schedules`), so a resumed run continues the
same schedule exactly.

"kl_adaptive" (rsl_rl's rule for large batches) is not a function of frames: after each
update the learner measures the KL the update caused and scales every lr by 1.5 up or
down (`kl_adapted_lr`); the rates live in the optimisers' param groups, which
checkpoints save, so a resumed run goes on with the same rates.
"""

from __future__ import annotations

from navrl_daemon.config import PPOConfig

# rsl_rl's kl_adaptive rule: the factor on the learning rates, and the band around
# desired_kl outside of which it applies.
KL_LR_FACTOR = 1.5
KL_BAND = 2.0


def progress(frames: int, span: int) -> float:
    """Fraction of the schedule done after `frames` trained frames: 0 → 1, then 1."""
    if span < 1:
        raise ValueError(f"a schedule needs a span of at least 1 frame, got {span}")
    return min(1.0, max(frames, 0) / span)


def lr_scale(ppo: PPOConfig, frames: int, span: int) -> float:
    """Factor on every configured learning rate: 1 − (1 − lr_final_fraction)·progress."""
    if ppo.lr_schedule != "linear":  # constant, or kl_adaptive (set after each update)
        return 1.0
    return 1.0 - (1.0 - ppo.lr_final_fraction) * progress(frames, span)


def entropy_coef(ppo: PPOConfig, frames: int, span: int) -> float:
    """entropy_coef → entropy_coef_final, linearly over the span; NavRL's when constant."""
    if ppo.entropy_schedule == "constant":
        return ppo.entropy_coef
    start, final = ppo.entropy_coef, ppo.entropy_coef_final
    return start + (final - start) * progress(frames, span)


def kl_adapted_lr(ppo: PPOConfig, lr: float, kl: float) -> float:
    """The actor's next lr under "kl_adaptive": ÷1.5 above 2·desired_kl, ×1.5 below
    desired_kl/2, unchanged in between (and for a non-finite kl), within [lr_min, lr_max]."""
    if kl > ppo.desired_kl * KL_BAND:
        lr = lr / KL_LR_FACTOR
    elif kl < ppo.desired_kl / KL_BAND:
        lr = lr * KL_LR_FACTOR
    return min(max(lr, ppo.lr_min), ppo.lr_max)
