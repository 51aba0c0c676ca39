"""Stop, crash and continue: `run` resumes from the newest valid checkpoint, exactly.

Real processes (navrl_daemon/testing/forked.py), real signals, real files. The kill -9 loop
here runs 10 trials; the benchmark `benchmarks/kill9_resume.py` runs the same loop 100+ times.
"""

from __future__ import annotations

import json
import resource
import shutil
import signal
from collections import Counter
from pathlib import Path

import pytest
import torch

from navrl_daemon.storage.checkpoint import CheckpointDir, encode_checkpoint, load_checkpoint
from navrl_daemon.testing import forked
from navrl_daemon.testing.daemon_process import Daemon, crash_and_resume, last_trained_is_kept
from tests.conftest import TINY, navrl_cli
from tests.storage.test_checkpoint_file import nrc

FRAMES_PER_ITERATION = 64  # TINY: 8 envs x 8 steps


def events(stderr: str) -> list[dict]:
    return [json.loads(x) for x in stderr.splitlines() if x.startswith("{")]


def run(state: Path, *overrides: str, **kw) -> list[dict]:
    proc = navrl_cli("run", "--state-dir", str(state), *TINY, *overrides, **kw)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return events(proc.stderr)


def exported(state: Path) -> dict[str, torch.Tensor]:
    return torch.load(state / "export" / "policy.pt", weights_only=True)


def test_sigterm_then_resume_is_bitwise_identical_to_one_run(tmp_path: Path) -> None:
    """N iterations + SIGTERM + N more == 2N uninterrupted, bit for bit (lag 0, CPU)."""
    common = ("eval.interval=2", "checkpoint.interval=3")
    d = Daemon(tmp_path / "a", *common, "run.total_frames=100000000")
    d.wait_for("progress", count=5)
    d.proc.send_signal(signal.SIGTERM)
    code, _ = d.finish()
    assert code == 0
    written = [e["iteration"] for e in d.events if e["event"] == "checkpoint written"]
    n = next(e["iteration"] for e in d.events if e["event"] == "policy exported")
    # The last completed iteration is on disk: the final snapshot, or the interval one
    # when the stop came right after it.
    assert n >= 5 and max(written) == n
    total = f"run.total_frames={2 * n * FRAMES_PER_ITERATION}"
    resumed = run(tmp_path / "a", *common, total)
    start = next(e for e in resumed if e["event"] == "resumed from checkpoint")
    assert (start["iteration"], start["env_restored"]) == (n, True)
    run(tmp_path / "b", *common, total)
    a, b = exported(tmp_path / "a"), exported(tmp_path / "b")
    assert list(a) == list(b)
    different = [k for k in a if not torch.equal(a[k], b[k])]
    assert not different, different


@pytest.mark.parametrize(
    ("update_path", "reset_mode"), [("eager", "indexed"), ("fused", "indexed"), ("eager", "masked")]
)
def test_resume_from_an_interval_checkpoint_after_kill9_is_also_exact(
    tmp_path: Path, update_path: str, reset_mode: str
) -> None:
    """A crash loses the iterations since the last interval checkpoint, nothing else;
    with the fused update (rl/fast_update.py) as well as NavRL's eager one, and with the
    env's masked reset (env/navigation/env.py) as well as torchrl's indexed one."""
    common = (
        "checkpoint.interval=2",
        f"ppo.update_path={update_path}",
        f"env.navigation.reset_mode={reset_mode}",
    )
    log = run(tmp_path / "a", *common, "run.total_frames=640")  # checkpoints 2, 4, ..., 10
    plans = [e for e in log if e["event"] == "execution plan"]
    assert [(e["update_path"], e["reset"]) for e in plans] == [(update_path, reset_mode)]
    (tmp_path / "a" / "checkpoints" / "ckpt-000000010.nrc").unlink()  # as if killed at 9
    resumed = run(tmp_path / "a", *common, "run.total_frames=960")
    start = next(e for e in resumed if e["event"] == "resumed from checkpoint")
    assert start["iteration"] == 8
    run(tmp_path / "b", *common, "run.total_frames=960")
    a, b = exported(tmp_path / "a"), exported(tmp_path / "b")
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize(
    "extra",
    [
        ("env.navigation.num_maps=2", "env.navigation.map_levels=[0,2,4]"),
        (
            "env.navigation.spawn=border",
            "env.spawn_margin=1.0",
            "env.navigation.crossing_share=0.5",
        ),
        (
            "env.navigation.map_levels=[0,2,4]",
            "env.navigation.spawn=local",
            "env.navigation.crossing_share=0.5",
        ),
        ("env.navigation.map_levels=[0,2,4]", "env.navigation.min_level=1"),
        ("env.navigation.safety_weight=3.0",),
        ("ppo.mirror=true", "env.navigation.map_levels=[0,2,4]"),
        ("env.navigation.map_levels=[0,2,4]", "eval.num_obstacles=2", "eval.interval=4"),
        ("ppo.separate_critic=true",),
        (
            "ppo.target_kl=0.001",
            "ppo.feature_extractor_max_grad_norm=0.05",
            "ppo.mirror=true",
            "ppo.dual_clip=3",
        ),
        # Goals within reach at the start: hold counts run and hops end at the goal.
        (
            "env.navigation.map_levels=[0,2,4]",
            "env.navigation.spawn=local",
            "env.goal_distance=[0.1, 0.3]",
            "env.navigation.reach_hold=3",
        ),
    ],
    ids=[
        "density-levels",
        "crossing-share",
        "hops-and-crossings",
        "min-level",
        "safety-weight",
        "mirror",
        "eval-pillars",
        "separate-critic",
        "update-guards",
        "reach-hold",
    ],
)
def test_resume_is_exact_with_density_levels_and_a_spawn_mix(
    tmp_path: Path, extra: tuple[str, ...]
) -> None:
    """Per-env density levels (env.navigation.map_levels), the spawn mix
    (env.navigation.crossing_share), hops ended at the goal (env.navigation.reach_hold), a
    reward weight (env.navigation.safety_weight), mirrored minibatches (ppo.mirror),
    evaluations at fewer pillars than training (eval.num_obstacles), a critic of its own
    (ppo.separate_critic) and the update's guards (ppo.target_kl,
    ppo.feature_extractor_max_grad_norm) keep the resume exact: the levels and the hold
    counts travel in the env state."""
    common = ("checkpoint.interval=2", *extra)
    run(tmp_path / "b", *common, "run.total_frames=768")  # checkpoints 2, 4, ..., 12
    # Resumed from that run's own checkpoint 8 (as a crash at 9 leaves it; the crash
    # itself: the test above), it ends bit for bit where the run did.
    checkpoints = tmp_path / "a" / "checkpoints"
    checkpoints.mkdir(parents=True)
    shutil.copy(tmp_path / "b" / "checkpoints" / "ckpt-000000008.nrc", checkpoints)
    resumed = run(tmp_path / "a", *common, "run.total_frames=768")
    start = next(e for e in resumed if e["event"] == "resumed from checkpoint")
    assert (start["iteration"], start["env_restored"]) == (8, True)
    a, b = exported(tmp_path / "a"), exported(tmp_path / "b")
    assert all(torch.equal(a[k], b[k]) for k in a)
    _, snap = load_checkpoint(tmp_path / "b" / "checkpoints" / "ckpt-000000012.nrc")
    assert snap["collector"]["env"]["level"].shape == (8,)


def test_a_resumed_runs_history_counts_each_ended_episode_once(tmp_path: Path) -> None:
    """The episodes a checkpoint's rollout ended are in that iteration's history row; the
    resumed run must not count them again in its first row. Run + resume and one
    uninterrupted run (bit for bit the same episodes) write the same training rows."""
    common = ("checkpoint.interval=4", "log.summary_interval=1", "env.max_episode_length=6")
    run(tmp_path / "a", *common, "run.total_frames=512")
    resumed = run(tmp_path / "a", *common, "run.total_frames=768")
    start = next(e for e in resumed if e["event"] == "resumed from checkpoint")
    assert (start["iteration"], start["env_restored"]) == (8, True)
    run(tmp_path / "b", *common, "run.total_frames=768")
    keys = ("iteration", "train_episodes", "train_reach_goal", "train_collision", "train_return")

    def rows(state: Path) -> list[tuple]:
        lines = (state / "history.jsonl").read_text().splitlines()
        return [tuple(json.loads(x).get(k) for k in keys) for x in lines]

    a, b = rows(tmp_path / "a"), rows(tmp_path / "b")
    assert [r[0] for r in a] == list(range(1, 13)) and sum(r[1] or 0 for r in b) > 0
    assert a == b


def test_the_stage_switch_rule_is_not_env_state_a_resume_with_another_is_exact(
    tmp_path: Path,
) -> None:
    """env.stage_switch says what a later promotion does, not what the env holds: a run
    resumed (or forked) with the other rule restores its episodes, and without a
    promotion it trains bit for bit as the uninterrupted run."""
    # No evaluations, so no promotion.
    stages = ('env.curriculum=[{name = "a", promote = {reach_goal = 0.0}}, {}]', "eval.interval=0")
    run(tmp_path / "a", *stages, "checkpoint.interval=4", "run.total_frames=512")
    resumed = run(tmp_path / "a", *stages, "env.stage_switch=episodes", "run.total_frames=768")
    start = next(e for e in resumed if e["event"] == "resumed from checkpoint")
    assert (start["iteration"], start["env_restored"]) == (8, True)
    run(tmp_path / "b", *stages, "run.total_frames=768")
    a, b = exported(tmp_path / "a"), exported(tmp_path / "b")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_an_env_change_keeps_the_envs_density_levels_while_they_mean_the_same(
    tmp_path: Path,
) -> None:
    """A resume with another env key (here the reward's weight) starts new episodes at the
    density levels the checkpoint's envs had reached, not all at the sparsest one; with
    other `map_levels` the levels start over."""
    levels = (
        "env.num_envs=16",
        "env.navigation.map_levels=[0,2,4]",
        "env.max_episode_length=6",  # short episodes: levels move within the run
        "env.goal_distance=[0.1, 0.3]",  # goals within reach at the start: some move up
    )
    state = tmp_path / "state"
    run(state, *levels, "run.total_frames=1280", "checkpoint.interval=5")
    _, snap = load_checkpoint(state / "checkpoints" / "ckpt-000000010.nrc")
    saved = snap["collector"]["env"]["level"]
    want = (torch.bincount(saved, minlength=3) / saved.numel()).tolist()
    assert want[0] < 1.0, "no env left level 0: the test shows nothing"
    resumed = run(
        state,
        *levels,
        "env.navigation.safety_weight=2.0",
        "run.allow_config_change=true",
        "run.total_frames=1408",
    )
    start = next(e for e in resumed if e["event"] == "resumed from checkpoint")
    assert (start["iteration"], start["env_restored"]) == (10, False)
    kept = next(e for e in resumed if e["event"] == "density levels kept")
    assert kept["level_shares"] == pytest.approx(want, abs=1e-4)
    other = tuple(x.replace("[0,2,4]", "[0,3,4]") for x in levels)
    again = run(
        state,
        *other,
        "env.navigation.safety_weight=2.0",
        "run.allow_config_change=true",
        "run.total_frames=1536",
    )
    assert not [e for e in again if e["event"] == "density levels kept"]


def test_levels_go_on_with_the_curriculum_stage_and_start_over_with_it(tmp_path: Path) -> None:
    """With a curriculum the levels follow its progress: kept where the run goes on at
    the stage it had reached, back at the floor where a changed stage starts it over."""

    def curriculum(length: int) -> str:
        never = "promote = {reach_goal = 1.0, collision = 0.0, evals = 99}"
        return f'env.curriculum=[{{name = "a", max_episode_length = {length}, {never}}}, {{}}]'

    levels = (
        "env.num_envs=16",
        "env.navigation.map_levels=[0,2,4]",
        "env.goal_distance=[0.1, 0.3]",
        "eval.interval=0",
        "checkpoint.interval=5",
    )
    state = tmp_path / "state"
    run(state, *levels, curriculum(6), "run.total_frames=1280")
    on = run(
        state,
        *levels,
        curriculum(6),
        "env.navigation.safety_weight=2.0",
        "run.allow_config_change=true",
        "run.total_frames=1408",
    )
    assert [e["stage"] for e in on if e["event"] == "curriculum resumed"] == [0]
    kept = next(e for e in on if e["event"] == "density levels kept")
    assert kept["level_shares"][0] < 1.0  # some envs had left level 0: kept, not reset
    over = run(
        state,
        *levels,
        curriculum(7),
        "env.navigation.safety_weight=2.0",
        "run.allow_config_change=true",
        "run.total_frames=1536",
    )
    assert not [e for e in over if e["event"] in ("curriculum resumed", "density levels kept")]


def test_kill9_at_random_moments_always_resumes_from_a_valid_checkpoint(tmp_path: Path) -> None:
    counts = crash_and_resume(tmp_path / "state", 10, seed=1, plant_temp_at=4)
    assert counts["trials"] == 10
    assert counts["resumed"] >= 5  # most starts found a checkpoint to continue from
    assert counts["temp_files_removed"] == counts["temp_files_left"] >= 1
    # After the crashes, a clean run goes on from where they got to and stops cleanly.
    d = Daemon(tmp_path / "state", "run.total_frames=100000000")
    d.wait_for("progress", count=2)
    d.proc.send_signal(signal.SIGTERM)
    assert d.finish()[0] == 0
    assert "resumed from checkpoint" in d.names()
    assert last_trained_is_kept(d.events), [e for e in d.events if "iteration" in e][-4:]


def write_evil(path: Path, marker: Path) -> None:
    """A well-formed NRC1 container whose payload is a pickle that would create `marker`."""
    import os
    import pickle

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    path.write_bytes(nrc(pickle.dumps({"kind": "full", "x": Evil()}), iteration=99))


def test_bad_newest_files_are_skipped_by_name_and_never_executed(tmp_path: Path) -> None:
    state = tmp_path / "state"
    run(state, "run.total_frames=192", "checkpoint.interval=1")  # checkpoints 1, 2, 3
    ckpts = state / "checkpoints"
    marker = tmp_path / "pwned"
    write_evil(ckpts / "ckpt-000000099.nrc", marker)
    good = (ckpts / "ckpt-000000003.nrc").read_bytes()
    (ckpts / "ckpt-000000050.nrc").write_bytes(good[: len(good) // 2])  # truncated
    flipped = bytearray(good)
    flipped[-100] ^= 0xFF
    (ckpts / "ckpt-000000040.nrc").write_bytes(bytes(flipped))  # checksum
    (ckpts / "ckpt-000000030.nrc").write_bytes(b"PK\x03\x04 a zip, not ours")  # foreign
    log = run(state, "run.total_frames=256", "checkpoint.interval=1")
    skipped = {Path(e["file"]).name: e["reason"] for e in log if e["event"].startswith("skipping")}
    assert "weights_only" in skipped["ckpt-000000099.nrc"]
    assert "truncated" in skipped["ckpt-000000050.nrc"]
    assert "checksum mismatch" in skipped["ckpt-000000040.nrc"]
    assert "bad magic" in skipped["ckpt-000000030.nrc"]
    start = next(e for e in log if e["event"] == "resumed from checkpoint")
    assert Path(start["path"]).name == "ckpt-000000003.nrc"
    assert not marker.exists()


def test_a_finished_run_started_again_writes_nothing_and_says_so(tmp_path: Path) -> None:
    """Started again, a finished run (`run.total_frames` reached) rewrote config.toml and
    export/policy.pt and appended to TensorBoard's events, though the docs say it writes
    nothing: it says it is finished and exits 0, every file as it was."""
    state = tmp_path / "state"
    run(state, "run.total_frames=192")

    def files() -> dict[str, tuple[int, int]]:
        found = (p for p in state.rglob("*") if p.is_file() and p.name != "lock")
        return {str(p.relative_to(state)): (p.stat().st_mtime_ns, p.stat().st_size) for p in found}

    before = files()
    assert "export/policy.pt" in before and "config.toml" in before
    log = run(state, "run.total_frames=192")
    assert files() == before
    (finished,) = [e for e in log if e["event"].startswith("run already finished")]
    assert (finished["frames"], finished["total_frames"]) == (192, 192)
    assert not [e for e in log if e["event"] in ("policy exported", "checkpoint written")]


def test_no_valid_checkpoint_among_several_refuses_to_start_over(tmp_path: Path) -> None:
    state = tmp_path / "state"
    (state / "checkpoints").mkdir(parents=True)
    (state / "checkpoints" / "ckpt-000000007.nrc").write_bytes(b"NRC1\x00")
    proc = navrl_cli("run", "--state-dir", str(state), *TINY, "run.total_frames=64")
    assert proc.returncode == 65
    assert "ckpt-000000007.nrc" in proc.stderr and "no valid checkpoint" in proc.stderr
    assert (state / "checkpoints" / "ckpt-000000007.nrc").exists()  # nothing deleted


# Writes past 1.5 MB fail with EFBIG (Python ignores SIGXFSZ): a full disk for every
# checkpoint (~2 MB here), while logs, eval results and the policy export still fit.
FILE_SIZE_LIMIT = {resource.RLIMIT_FSIZE: (1_500_000, 1_500_000)}


def run_on_a_full_disk(state: Path, *overrides: str) -> list[dict]:
    args = ["run", "--state-dir", str(state), *TINY, *overrides]
    proc = forked.run(args, timeout=300, rlimits=FILE_SIZE_LIMIT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return events(proc.stderr)


def test_write_errors_are_logged_counted_and_training_goes_on(tmp_path: Path) -> None:
    state = tmp_path / "state"
    log = run_on_a_full_disk(state, "run.total_frames=384", "checkpoint.interval=2")
    failed = [e for e in log if e["event"].startswith("checkpoint write failed")]
    # iterations 2, 4, 6 and the final one is 6 too: three attempts, three failures.
    assert [e["iteration"] for e in failed] == [2, 4, 6]
    assert all("EFBIG" in e["error"] for e in failed)
    assert failed[-1]["failures"] == 3
    assert any(e["event"] == "policy exported" and e["iteration"] == 6 for e in log)
    assert not list((state / "checkpoints").glob(".tmp-*"))  # no half-written leftovers


def test_a_failed_write_keeps_every_earlier_checkpoint(tmp_path: Path) -> None:
    state = tmp_path / "state"
    run(state, "run.total_frames=128", "checkpoint.interval=1")
    before = {p.name: p.read_bytes() for p in (state / "checkpoints").glob("ckpt-*")}
    assert sorted(before) == ["ckpt-000000001.nrc", "ckpt-000000002.nrc"]
    run_on_a_full_disk(state, "run.total_frames=256", "checkpoint.keep_last=1")
    after = {p.name: p.read_bytes() for p in (state / "checkpoints").glob("ckpt-*")}
    assert after == before  # every write failed; nothing pruned, nothing damaged


@pytest.mark.parametrize("update_path", ["eager", "fused"])
def test_divergence_rolls_back_then_gives_up_with_exit_1(tmp_path: Path, update_path) -> None:
    """A learning rate of 1e30 blows the weights up at once: every update is non-finite,
    so each time the streak passes ppo.max_nonfinite_updates the trainer reloads the last
    valid checkpoint, and after 3 rollbacks to the same file it stops (exit 1). The fused
    update skips the same steps on the device (rl/fast_update.py)."""
    state = tmp_path / "state"
    run(state, "run.total_frames=128", "checkpoint.interval=1", f"ppo.update_path={update_path}")
    good = load_checkpoint(state / "checkpoints" / "ckpt-000000002.nrc")[1]["learner"]["policy"]
    proc = navrl_cli(
        "run",
        "--state-dir",
        str(state),
        *TINY,
        "run.total_frames=100000000",
        "checkpoint.interval=1000",
        "ppo.actor_lr=1e30",
        "ppo.feature_extractor_lr=1e30",
        "ppo.max_nonfinite_updates=1",
        "run.allow_config_change=true",
        f"ppo.update_path={update_path}",
    )
    assert proc.returncode == 1, proc.stderr[-3000:]
    log = events(proc.stderr)
    rollbacks = [e for e in log if "ROLLED BACK" in e["event"]]
    assert len(rollbacks) == 3
    assert all(Path(e["checkpoint"]).name == "ckpt-000000002.nrc" for e in rollbacks)
    assert "rolled back to ckpt-000000002.nrc 3 times" in proc.stderr
    # Whatever was written after the blow-up is finite; the good file is still there.
    for path in CheckpointDir(state / "checkpoints").files():
        policy = load_checkpoint(path)[1]["learner"]["policy"]
        assert all(torch.isfinite(v).all() for v in policy.values() if v.is_floating_point())
    kept = load_checkpoint(state / "checkpoints" / "ckpt-000000002.nrc")[1]["learner"]["policy"]
    assert all(torch.equal(kept[k], good[k]) for k in good)


def test_checkpoint_holds_everything_exact_resume_needs(tmp_path: Path) -> None:
    state = tmp_path / "state"
    run(state, "run.total_frames=64")
    header, snap = load_checkpoint(state / "checkpoints" / "ckpt-000000001.nrc")
    assert (header.iteration, header.frames, header.meta["final"]) == (1, 64, True)
    assert snap["kind"] == "full"
    assert set(snap["learner"]) == {
        "policy",
        "optimizers",
        "generator",
        "version",
        "nonfinite_streak",
    }
    assert set(snap["learner"]["optimizers"]) == {"feature_extractor", "actor", "critic"}
    assert any("value_norm" in k for k in snap["learner"]["policy"])
    # sampler: the generator the actions are drawn from (the collector's own)
    assert set(snap["collector"]) == {"env", "td", "rng", "sampler"}
    assert set(snap["collector"]["rng"]) == {"torch", "cuda", "numpy", "python"}
    assert snap["config"]["env"]["num_envs"] == 8
    assert {"torch", "tensordict", "torchrl", "navrl_daemon"} <= set(snap["versions"])
    # The resolved config in the checkpoint is the one in the state dir.
    assert snap["config"]["ppo"]["rollout_length"] == 8
    assert encode_checkpoint(snap, iteration=1, frames=64, policy_version=1)  # re-encodable


def test_a_checkpoint_from_before_the_newer_env_keys_still_restores_the_env(
    tmp_path: Path,
) -> None:
    """Checkpoints written before `env.curriculum`, `env.reset_mode`, `env.map_levels`,
    `env.crossing_share`, `env.collect_path`, `env.reach_hold`, `env.min_level` and
    `env.safety_weight` existed lack the keys (and the env state its hold counts); with
    today's defaults (what they ran on the CPU) the episodes go on."""
    state = tmp_path / "state"
    run(state, "run.total_frames=64")
    path = state / "checkpoints" / "ckpt-000000001.nrc"
    header, snap = load_checkpoint(path)
    env = snap["config"]["env"]
    env.update(env.pop("navigation"))  # format 1 held every env key in the env section
    keys = ("curriculum", "reset_mode", "map_levels", "crossing_share", "collect_path")
    for key in (*keys, "reach_hold", "min_level", "safety_weight"):
        del env[key]
    del snap["collector"]["env"]["held"]
    snap["snapshot_version"] = 1  # the format those files are in
    path.write_bytes(
        encode_checkpoint(
            snap,
            iteration=header.iteration,
            frames=header.frames,
            policy_version=header.policy_version,
            meta=header.meta,
        )
    )
    resumed = run(state, "run.total_frames=128")
    start = next(e for e in resumed if e["event"] == "resumed from checkpoint")
    assert (start["iteration"], start["env_restored"]) == (1, True)
    assert not [e for e in resumed if "new episodes start" in e["event"]]


def test_a_checkpoint_of_state_format_1_resumes_the_run_where_it_was(tmp_path: Path) -> None:
    """A file the code before named parts wrote (tests/data: curriculum stage 1, density
    levels) resumes a run of its settings with its episodes and its stage, and trains on."""
    from tests.rl.test_run_state import FORMAT_1, FORMAT_1_RUN

    state = tmp_path / "state"
    (state / "checkpoints").mkdir(parents=True)
    shutil.copy(FORMAT_1, state / "checkpoints" / "ckpt-000000004.nrc")
    settings = [x for x in FORMAT_1_RUN if x not in TINY]  # run() adds TINY
    log = run(state, *settings, "eval.interval=0", "run.total_frames=384")
    start = next(e for e in log if e["event"] == "resumed from checkpoint")
    assert (start["iteration"], start["env_restored"]) == (4, True)
    assert next(e for e in log if e["event"] == "curriculum resumed")["stage"] == 1
    assert [e["iteration"] for e in log if e["event"] == "checkpoint written"] == [6]


def test_rerunning_a_finished_run_leaves_its_final_checkpoint_alone(tmp_path: Path) -> None:
    state = tmp_path / "state"
    first = run(state, "run.total_frames=192")
    assert [e["iteration"] for e in first if e["event"] == "checkpoint written"] == [3]
    final = state / "checkpoints" / "ckpt-000000003.nrc"
    before = (final.read_bytes(), final.stat().st_mtime_ns, final.stat().st_ino)
    again = run(state, "run.total_frames=192")  # nothing left to train
    assert not [e for e in again if e["event"] == "checkpoint written"]
    assert (final.read_bytes(), final.stat().st_mtime_ns, final.stat().st_ino) == before


def archived_segments(state: Path) -> Counter:
    """(iteration, env) → how many times the archive holds it."""
    from navrl_daemon.storage.archive import ArchiveFile, archive_files

    seen: Counter = Counter()
    for path in archive_files(state / "archive"):
        with ArchiveFile.open(path) as f:
            f.verify()
            seen.update(zip(f.rows["iteration"].tolist(), f.rows["env"].tolist(), strict=True))
    return seen


def test_the_iterations_redone_after_a_crash_are_not_archived_twice(tmp_path: Path) -> None:
    """A crash after iteration 5's rollout was archived but before its checkpoint: the run
    resumes from 4 and redoes that rollout, which used to land in the archive a second time
    (a new file). The archive numbers rollouts from 0: rollout i is trained into i + 1."""
    state = tmp_path / "state"
    common = ("checkpoint.interval=2", "archive.interval=1", "archive.on_full=block")
    run(state, *common, "run.total_frames=320")  # rollouts 0..4 archived, checkpoints 2, 4, 5
    (state / "checkpoints" / "ckpt-000000005.nrc").unlink()  # as if killed before it
    log = run(state, *common, "run.total_frames=448")
    assert next(e for e in log if e["event"] == "resumed from checkpoint")["iteration"] == 4
    seen = archived_segments(state)
    assert set(seen.values()) == {1}, [k for k, n in seen.items() if n > 1]
    assert sorted({it for it, _ in seen}) == [0, 1, 2, 3, 4, 5, 6]
    assert len(seen) == 7 * 8  # every env of every iteration
    skipped = [e["iteration"] for e in log if e["event"].startswith("rollout already archived")]
    assert skipped == [4]


def test_a_run_killed_before_its_first_checkpoint_archives_no_rollout_twice(
    tmp_path: Path,
) -> None:
    """A kill -9 after rollouts were archived but before any checkpoint: the restart finds
    no checkpoint and starts over from rollout 0, which used to be archived a second time
    (the kill -9 loop hit it on a loaded machine). Rollouts 0..2 archived, no checkpoint."""
    state = tmp_path / "state"
    common = ("checkpoint.interval=100", "archive.interval=1", "archive.on_full=block")
    run(state, *common, "run.total_frames=192")  # rollouts 0..2, the final checkpoint 3
    for path in (state / "checkpoints").glob("ckpt-*.nrc"):
        path.unlink()  # as if killed before the first one
    log = run(state, *common, "run.total_frames=320")
    assert any(e["event"] == "no checkpoint: starting a new run" for e in log)
    start = next(e for e in log if e["event"].startswith("archive holds rollouts"))
    assert (start["resumed_from"], start["archived_through"]) == (0, 2)
    seen = archived_segments(state)
    assert set(seen.values()) == {1}, [k for k, n in seen.items() if n > 1]
    assert sorted({it for it, _ in seen}) == [0, 1, 2, 3, 4]
    skipped = [e["iteration"] for e in log if e["event"].startswith("rollout already archived")]
    assert skipped == [0, 1, 2]
