"""Learning benchmark (issue #13): how good a policy `navrl-daemon run` trains in a budget,
next to NavRL's published checkpoint on the same eval, as JSON and a PNG curve.

Runs the real daemon (`python -m navrl_daemon run`, a subprocess on a fresh state dir)
with evaluations every `--eval-every` iterations (default: the config's `eval.interval`,
on which a curriculum's promotions are decided), and stops it with SIGTERM once
`--budget-s` seconds of wall clock have passed since its launch (or at `--frames`,
whichever comes first). Its evaluation rows (`eval/results.jsonl`: frames, reach_goal,
collision, return, ...) become the curve, each with the wall seconds since launch. Then,
in this process and after the daemon has stopped (so they take no CPU from it), the same
evaluation is run on: the untrained policy (the daemon's initial weights: frames 0), the
daemon's final exported policy and NavRL's published checkpoint. With `env.curriculum` the
daemon evaluates at its current stage; these three evaluate the env section itself (the
curriculum's target), so the last two compare like with like.

`goal` in the JSON is issue #13's verdict: the bar is NavRL's checkpoint on this eval
(reach_goal at least, collision at most); `first_eval_at_bar` is the first evaluation of
the target env that clears it, with its frames and wall seconds since launch; `met` says
whether that, or the final export, cleared it within `--goal-s` seconds (default 480: the
issue's 8 minutes of training). On a CPU that verdict is always false; `frames_goal` is
issue #23's CPU goal, per frame: reach_goal >= `--goal-bar` (0.9) with collision <= 1 -
bar, on the training maps and on held-out maps both, within `--goal-frames` (20 M)
frames, by an evaluation of the target env (its held-out numbers from
`eval.held_out_seed`) or by the final export.

`frames_to_reach` (issue #23) gives, per bar b of `--reach-bars` (default 0.5 and 0.9),
the first evaluation of the target env with reach_goal >= b and collision <= 1 - b, with
its frames and seconds (None: never). An evaluation is of the target env when it flies
what the curriculum's last stage's evaluations fly (`env.target_stages` in the JSON):
every one without a curriculum; with one, those at the last stage and at any stage whose
evaluation is the same (e.g. local hops evaluated on NavRL's crossing, as the last stage
is). `held_out` evaluates the final export, the untrained policy and NavRL's checkpoint on
`--held-out-maps` maps drawn from `--held-out-seed` (default 1000): maps the run never
trained on. The daemon's own `eval.held_out_seed`, when
set, adds `held_out_reach_goal` / `held_out_collision` to every curve point.

The curve's evaluations fly `eval.num_envs` drones; a share of 64 drones is good to about
±0.05 (one binomial standard error at 0.8), as wide as the gap the verdict is about.
`--final-drones N` flies the final evaluations (the final export, NavRL's checkpoint, the
held-out maps) with N drones instead (`eval.final_episodes` in the JSON): 256 narrow it to
about ±0.025; on the 2-core CPU one evaluation at 350 pillars took 30–49 s instead of 11.5 s
(one torch thread), after the training.

The final export and NavRL's checkpoint fly the same drones (the evaluation is
deterministic), so they are also compared drone by drone: `paired_with_navrl` (on the
training maps and held out) gives, for reach_goal and collision, both shares, the export's
minus NavRL's with its paired 95 % interval, the drones only one of them reached (or
collided on) and McNemar's exact p-value (navrl_daemon/analysis/paired.py). Where both fail
the same hard crossings the paired interval is narrower than two separate ones. Every
evaluation there also keeps its drones' outcomes (`outcomes`, one of "RCOT" per drone).

The machine's load average goes into the JSON: on a shared CPU the curve per second
depends on it; the curve per frame does not (the run is deterministic under its seed up
to the SIGTERM point and the evaluations it skipped).

A daemon that exits with an error, or fails to stop after the budget's SIGTERM, does not
lose the sitting: the JSON is still written from what is on disk (the evaluations, and as
`final` the newest valid checkpoint's policy when the daemon wrote no export), with
`budget.error` holding the exit code and the log's tail; the exit status is then 1.

A SIGTERM or SIGINT (Ctrl-C) to this script ends the sitting as the budget does: the
daemon gets one SIGTERM and the JSON is written, with `budget.ended_by` naming the signal;
a second one during the final evaluations ends the script at once. (Before, the script
died and its daemon trained on alone, to `--frames`.)

A run can go on in several sittings: `--keep-state DIR` keeps the daemon's state dir, and
a later `--resume --keep-state DIR` with the same config and overrides lets the daemon
resume it from its last checkpoint for another `--budget-s`. The curve is then the whole
run's, its seconds the daemon's wall time summed over the sittings (`DIR.launches.jsonl`).

A lever is measured against its control on the same frames by a fork: `--fork-from SRC
--keep-state DST KEY=VALUE...` copies the kept run SRC (it may still be running) into the
new folder DST, as of SRC's newest valid checkpoint (its evaluation and history rows past
that iteration are dropped, SRC is left as it is), and resumes DST with the overrides
given, e.g. SRC's recipe plus `ppo.epochs=8` (with `run.allow_config_change=true`, which
a fork adds). The daemon restores the envs' episodes where
the env section is unchanged, and starts new ones where it is not. `--fork-at ITER` forks
as of SRC's checkpoint of that iteration instead (the copy leaves out the newer ones): a
fork at a point in the past of a run that went on.

A recipe is a config file plus, at most, a few overrides: `config/navrl.toml` (NavRL's full
task, the shipped recipe), `config/navrl-static.toml` (its static-task form) and
`config/navrl-original.toml` (NavRL's own settings). Run:
`benchmarks/learning.py --config config/navrl.toml --budget-s 7000 --frames 40000000`
on a GPU (NavRL's 1024 envs); on a CPU add `env.num_envs=256 ppo.rollout_length=128` (the
same frames per update) and, for speed, `ppo.update_path=fused ppo.compile=true`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from navrl_daemon.analysis.curves import at_bar, first_at_bar
from navrl_daemon.analysis.paired import compare_outcomes
from navrl_daemon.config import Config, load_config
from navrl_daemon.ops.intervals import share_interval
from navrl_daemon.rl.eval_config import eval_steps, evaluation_key
from navrl_daemon.storage.checkpoint import CheckpointDir, checkpoint_iteration
from navrl_daemon.storage.history import DAEMON_FILE, HISTORY_FILE, RESULTS_FILE, cut_rows

if TYPE_CHECKING:
    import torch

# torch, tensordict and torchrl (~5 s to import) are imported where a sitting flies a
# policy: `--check-config` only reads configs.

REPO = Path(__file__).resolve().parents[1]
NAVRL_CHECKPOINT = REPO / "tests" / "data" / "navrl_checkpoint.pt"
CURVE_KEYS = (
    "reach_goal",
    "collision",
    "return",
    "episode_len",
    "truncated",
    "out_of_bounds",
    "held_out_reach_goal",
    "held_out_collision",
    "held_out_out_of_bounds",
)


# The daemon's command line; a test puts a stand-in here.
DAEMON = [sys.executable, "-m", "navrl_daemon", "run"]
# How long the daemon may take to stop after SIGTERM before it is killed.
STOP_WAIT_S = 600.0
# A stalled daemon's stack dump (navrl_daemon/cli.py), and the time it is given.
STACKS_SIGNAL = signal.SIGUSR2
STACKS_WAIT_S = 2.0


def train(
    cfg_path: Path,
    overrides: list[str],
    state: Path,
    budget_s: float,
    frames: int | None,
    log_path: Path,
    *,
    stall_s: float = 0.0,
    stop_wait_s: float | None = None,
) -> dict[str, Any]:
    """The daemon, until the budget: its exit code, wall seconds and why it ended.

    A daemon that fails (its own error, or a stop that went wrong after the budget's
    SIGTERM) does not lose the run: its evaluations and checkpoints are on disk, so the
    caller still reports them; `error` then holds the exit code and the log's tail.
    `stall_s` (0: off): a daemon whose log has not grown for that long is stalled: its
    threads' tracebacks go to its log (SIGUSR2, `navrl-daemon`'s stack dump), then it
    is stopped as at the budget (`ended_by` "stalled"). `stop_wait_s` (default
    STOP_WAIT_S): how long a stop may take before the daemon is killed."""
    args = [*DAEMON, "--config", str(cfg_path), "--state-dir", str(state), *overrides]
    if frames is not None:
        args.append(f"run.total_frames={frames}")
    t0 = time.time()
    signals: list[int] = []
    stalled = False
    with log_path.open("w") as log, _stop_signals(signals):
        # A session of its own: a Ctrl-C in the terminal reaches this script only, which
        # passes one SIGTERM on (a second signal would cut the daemon's update short).
        proc = subprocess.Popen(
            args, cwd=REPO, stderr=log, stdout=subprocess.DEVNULL, start_new_session=True
        )
        grown_at, size = t0, 0
        while proc.poll() is None and time.time() - t0 < budget_s and not signals:
            time.sleep(0.2)
            now, new_size = time.time(), log_path.stat().st_size
            if new_size != size:
                grown_at, size = now, new_size
            elif stall_s and now - grown_at > stall_s:
                stalled = True
                proc.send_signal(STACKS_SIGNAL)
                time.sleep(STACKS_WAIT_S)  # the dump is written from the daemon's handler
                break
        if stalled:
            ended = "stalled"
        elif proc.poll() is not None:
            ended = "frames"
        else:
            ended = signal.Signals(signals[0]).name if signals else "budget"
        stop_s = time.time() - t0
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=STOP_WAIT_S if stop_wait_s is None else stop_wait_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
    result: dict[str, Any] = {
        "launched": t0,
        "stop_s": round(stop_s, 1),
        "wall_s": round(time.time() - t0, 1),
        "ended_by": ended,
        "exit_code": code,
        "log": str(log_path),
    }
    if code != 0 or stalled:
        tail = log_path.read_text()[-6000 if stalled else -3000 :]
        what = "daemon exited with"
        if stalled:
            what = f"daemon stalled (log silent for {stall_s:g} s), exited with"
        result["error"] = f"{what} {code}:\n{tail}"
    return result


@contextlib.contextmanager
def _stop_signals(received: list[int]) -> Iterator[None]:
    """While training: SIGTERM and SIGINT to this script are noted in `received` (the
    caller stops its daemon cleanly and still writes the report) instead of killing the
    script and leaving the daemon running on its own."""
    stops = (signal.SIGTERM, signal.SIGINT)
    before = {s: signal.signal(s, lambda signum, _frame: received.append(signum)) for s in stops}
    try:
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


def evaluate_policy(
    cfg: Config, state: dict[str, torch.Tensor] | None, map_seed: int | None = None
) -> dict[str, Any]:
    """The daemon's evaluation (same env, layout, seed and step cap) of `state`, or of the
    daemon's initial weights when None; on maps of `map_seed` when given."""
    import torch

    from navrl_daemon.rl.evaluate import evaluate_outcomes
    from navrl_daemon.rl.evaluations import make_eval_env
    from navrl_daemon.rl.policy import make_policy, navrl_layout
    from navrl_daemon.storage.policy_file import check_policy_layout

    device = torch.device(cfg.run.device if cfg.run.device != "auto" else "cpu")
    torch.manual_seed(cfg.run.seed)  # as the daemon does before building its policy
    policy = make_policy(cfg, device)
    if state is not None:
        check_policy_layout(state, policy.state_dict(), Path("policy"))
        policy.load_state_dict(navrl_layout(state))  # acting reads the actor's path only
    env = make_eval_env(cfg, device, map_seed=map_seed)
    t0 = time.perf_counter()
    result, outcomes = evaluate_outcomes(env, policy, seed=cfg.eval.seed, max_steps=eval_steps(cfg))
    return {**_round(result), "seconds": round(time.perf_counter() - t0, 2), "outcomes": outcomes}


def paired_with_navrl(
    final: dict[str, Any] | None, navrl: dict[str, Any] | None
) -> dict[str, Any] | None:
    """The final export against NavRL's checkpoint drone by drone (both flew the same
    drones): `compare_outcomes`, A the export. None without either."""
    if final is None or navrl is None:
        return None
    return compare_outcomes(final["outcomes"], navrl["outcomes"])


def fork_state(src: Path, dst: Path, at: int | None = None) -> int:
    """Copy the kept state dir `src` to the new folder `dst` as of `src`'s newest valid
    checkpoint (with `at`: its checkpoint of that iteration, the newer ones left out of the
    copy), for a resume there with other overrides; that checkpoint's iteration.

    `src` may belong to a running daemon: its lock and address are not copied, a
    checkpoint written during the copy fails its checks in `dst` and the one before it is
    taken, and rows logged past the checkpoint (evaluations, history) are dropped, so the
    fork's curve is the source's up to the fork and its own after it. The launches file
    beside `src` is copied beside `dst` with it (the curve's seconds)."""
    if not src.is_dir():
        raise ValueError(f"--fork-from {src}: not a kept state dir")
    running = shutil.ignore_patterns("lock", DAEMON_FILE)

    def left_out(folder: str, names: list[str]) -> set[str]:
        """The running daemon's files, and with `at` the checkpoints newer than it."""
        out = set(running(folder, names))
        if at is not None and Path(folder) == src / "checkpoints":
            newer = CheckpointDir(Path(folder)).files()
            out |= {p.name for p in newer if checkpoint_iteration(p) > at}
        return out

    shutil.copytree(src, dst, ignore=left_out)
    found = CheckpointDir(dst / "checkpoints").newest_valid()
    if found is None or (at is not None and found[1].iteration != at):
        shutil.rmtree(dst)
        which = "no valid checkpoint" if at is None else f"no valid checkpoint of iteration {at}"
        kept = CheckpointDir(src / "checkpoints")
        valid = [checkpoint_iteration(p) for p in kept.files() if kept.problem(p) is None]
        listed = ", ".join(map(str, valid)) or "none"
        raise ValueError(f"--fork-from {src}: {which} to fork from (valid: {listed})")
    at = found[1].iteration
    for name in (RESULTS_FILE, HISTORY_FILE):
        cut_rows(dst / name, at)
    launches = src.with_name(src.name + ".launches.jsonl")
    if launches.exists():
        shutil.copy(launches, dst.with_name(dst.name + ".launches.jsonl"))
    return at


def training_seconds(t: float, launches: list[tuple[float, float]]) -> float:
    """Wall seconds the daemon ran before time `t`, over all launches (start, stop) of the
    run (one unless it was resumed)."""
    return sum(max(0.0, min(t, stop) - start) for start, stop in launches)


def _round(row: dict[str, Any]) -> dict[str, Any]:
    return {k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}


def load_average() -> dict[str, float]:
    one, five, fifteen = os.getloadavg()
    return {"1m": one, "5m": five, "15m": fifteen}


def plot(result: dict[str, Any], path: Path) -> None:
    from navrl_daemon.ops.plots import Series, curves_plot, write_png

    curve = result["curve"]
    frames = [row["frames"] for row in curve]
    right = max([*frames, (result.get("final") or {}).get("frames", 0)])
    panels = []
    episodes = result["eval"]["episodes"]
    for key, title in (
        ("reach_goal", "eval reach_goal (95 % band)"),
        ("collision", "eval collision (95 % band)"),
        ("return", "eval return"),
    ):
        share = key != "return"  # a share of episodes: its 95 % interval shaded
        bands = [share_interval(row[key], episodes) for row in curve] if share else None
        ys = [row[key] for row in curve]
        series = [Series("navrl-daemon", frames, ys, markers=True, band=bands)]
        final = result.get("final")
        if final is not None:
            band = [share_interval(final[key], final["episodes"])] if share else None
            series.append(
                Series("final export", [final["frames"]], [final[key]], markers=True, band=band)
            )
        navrl = result.get("navrl_checkpoint")
        if navrl is not None:
            series.append(Series("NavRL checkpoint", [0, right], [navrl[key], navrl[key]]))
        panels.append((title, series))
    budget = result["budget"]
    path.parent.mkdir(parents=True, exist_ok=True)
    write_png(path, curves_plot(panels, xlabel=f"frames ({budget['wall_s']:.0f} s wall)"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", type=Path, default=REPO / "config" / "default.toml")
    p.add_argument("--budget-s", type=float, default=300.0, help="wall clock of the daemon")
    p.add_argument("--frames", type=int, help="also stop at this many frames")
    p.add_argument(
        "--eval-every",
        type=int,
        help="iterations between evals (default: the config's eval.interval)",
    )
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "learning.json")
    p.add_argument("--navrl-checkpoint", type=Path, default=NAVRL_CHECKPOINT)
    p.add_argument("--goal-s", type=float, default=480.0, help="issue #13: seconds to the bar")
    p.add_argument(
        "--reach-bars", type=float, nargs="+", default=[0.5, 0.9], help="frames_to_reach bars"
    )
    p.add_argument(
        "--goal-frames",
        type=float,
        default=20e6,
        help="issue #23's CPU goal (frames_goal): frames to the bar on both map sets",
    )
    p.add_argument(
        "--stall-s",
        type=float,
        default=0.0,
        help="a daemon whose log is silent this long is stalled: stack dump, stop (0: off)",
    )
    p.add_argument(
        "--stop-wait-s",
        type=float,
        default=STOP_WAIT_S,
        help="seconds a daemon may take to stop after its SIGTERM before it is killed",
    )
    p.add_argument("--goal-bar", type=float, default=0.9, help="frames_goal's reach bar")
    p.add_argument("--held-out-seed", type=int, default=1000, help="map seed never trained on")
    p.add_argument("--held-out-maps", type=int, default=16, help="held-out maps (drones split)")
    p.add_argument(
        "--keep-state",
        type=Path,
        help="the daemon's state dir (checkpoints, exports, eval results) is kept here "
        "(a new folder) for `eval --probe` or diagnose.py; default: a temporary one",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="go on with the run kept in --keep-state (the daemon resumes from its last "
        "checkpoint; same config and overrides): a long CPU run in several sittings",
    )
    p.add_argument(
        "--fork-from",
        type=Path,
        metavar="SRC",
        help="copy the kept run SRC into --keep-state DST (a new folder) as of SRC's newest "
        "checkpoint and go on there with these overrides: a lever against its control",
    )
    p.add_argument(
        "--fork-at",
        type=int,
        metavar="ITER",
        help="with --fork-from: fork as of SRC's checkpoint of this iteration instead",
    )
    p.add_argument(
        "--final-drones",
        type=int,
        default=0,
        metavar="N",
        help="drones of the final evaluations (the final export, NavRL's checkpoint, the "
        "held-out maps); default eval.num_envs, as the curve's. More drones, a narrower "
        "verdict: the reach of 64 drones is good to about +-0.05",
    )
    p.add_argument(
        "--check-config",
        action="store_true",
        help="load the run's configs (the daemon's, the final and held-out evaluations'), "
        "print its curriculum stages as JSON and exit: a recipe checked, nothing run",
    )
    p.add_argument("overrides", nargs="*", help="KEY=VALUE config overrides")
    args = p.parse_args()
    if args.fork_at is not None and args.fork_from is None:
        p.error("--fork-at ITER picks the checkpoint of --fork-from SRC: name SRC")
    if args.final_drones < 0:
        p.error("--final-drones N: N >= 1, or 0 for eval.num_envs")
    if args.fork_from is not None:
        if args.resume:
            p.error("--fork-from resumes the copy itself: leave out --resume")
        if args.keep_state is None or args.keep_state.exists():
            p.error("--fork-from SRC copies SRC into --keep-state DST: name a new folder")
    if args.resume and (args.keep_state is None or not args.keep_state.is_dir()):
        p.error("--resume goes on with the run in --keep-state DIR: name an existing one")
    if not args.resume and args.keep_state is not None and args.keep_state.exists():
        p.error(f"--keep-state {args.keep_state} exists: name a new folder (or --resume it)")
    launches_file = (
        args.keep_state.with_name(args.keep_state.name + ".launches.jsonl")
        if args.keep_state
        else None
    )
    every = [] if args.eval_every is None else [f"eval.interval={args.eval_every}"]
    overrides = [*args.overrides, *every, "metrics.port=0"]
    if args.fork_from is not None:  # a fork trains its lever on SRC's weights on purpose
        overrides.append("run.allow_config_change=true")
    cfg = load_config(args.config, overrides, environ={})  # a bad config fails here, not later
    drones = [f"eval.num_envs={args.final_drones}"] if args.final_drones else []
    final_cfg = load_config(args.config, [*overrides, *drones], environ={}) if drones else cfg
    held_cfg = load_config(
        args.config, [*overrides, *drones, f"eval.num_maps={args.held_out_maps}"], environ={}
    )
    if args.check_config:
        targets = target_stages(cfg)  # builds every stage's env config
        stages = [stage.name for stage in cfg.env.curriculum]
        checked = {"config": "ok", "stages": stages, "num_envs": cfg.env.num_envs}
        checked["num_obstacles"] = cfg.env.num_obstacles
        checked["num_maps"] = cfg.env.navigation.num_maps
        checked["eval_num_maps"] = cfg.eval.num_maps or cfg.env.navigation.num_maps
        checked["target_stages"] = None if targets is None else sorted(targets)
        checked["eval_num_obstacles"] = cfg.eval.num_obstacles or cfg.env.num_obstacles
        checked["held_out_maps"] = held_cfg.eval.num_maps
        checked["lr_schedule"] = cfg.ppo.lr_schedule
        checked["torch_threads"] = cfg.run.torch_threads
        checked["min_level"] = cfg.env.navigation.min_level  # the floor, and each stage's own
        checked["stage_min_levels"] = [stage.min_level for stage in cfg.env.curriculum]
        # each stage's moving obstacles (count, speeds), as its env resolves them
        stage_envs = [cfg.env.stage_env(i) for i in range(len(cfg.env.curriculum))]
        checked["stage_dynamic_obstacles"] = [
            [env.num_dynamic_obstacles, list(env.navigation.dynamic_speed_range)]
            for env in stage_envs
        ]
        checked["eval_interval"] = cfg.eval.interval
        checked["seed"] = cfg.run.seed
        if args.fork_from is not None:  # what the run would fork (nothing is copied here)
            checked["fork"] = {"from": str(args.fork_from), "at": args.fork_at}
        print(json.dumps(checked))
        return
    if args.fork_from is not None:
        try:
            at = fork_state(args.fork_from, args.keep_state, args.fork_at)
        except ValueError as err:
            p.error(str(err))
        print(f"forked {args.fork_from} at iteration {at} into {args.keep_state}", flush=True)
    import torch

    from navrl_daemon.storage.history import read_results
    from navrl_daemon.storage.policy_file import load_any_policy_state

    if cfg.run.torch_threads:  # the evaluations here run as the daemon's do
        torch.set_num_threads(cfg.run.torch_threads)
    load_before = load_average()
    with tempfile.TemporaryDirectory(prefix="navrl-learning-") as tmp:
        state = args.keep_state or Path(tmp) / "state"
        # Beside the JSON from the start: a sitting killed from outside leaves its log.
        daemon_log = args.out.with_suffix(".daemon.log")
        daemon_log.parent.mkdir(parents=True, exist_ok=True)
        budget = train(
            args.config,
            overrides,
            state,
            args.budget_s,
            args.frames,
            daemon_log,
            stall_s=args.stall_s,
            stop_wait_s=args.stop_wait_s,
        )
        load_after = load_average()
        budget.pop("log")
        rows = list(read_results(state / RESULTS_FILE))
        launched = budget.pop("launched")
        launches = [(launched, launched + budget["wall_s"])]
        if launches_file is not None:
            earlier = launches_file.read_text().splitlines() if launches_file.exists() else []
            launches = [tuple(json.loads(line)) for line in earlier] + launches
            launches_file.write_text("".join(json.dumps(list(w)) + "\n" for w in launches))
        final_state, final_at = final_policy(state, daemon_log)
        final = (
            None if final_state is None else {**final_at, **evaluate_policy(final_cfg, final_state)}
        )
    untrained = evaluate_policy(cfg, None)  # the curve's first point
    navrl_state = None
    navrl = None
    if args.navrl_checkpoint.exists():
        navrl_state = load_any_policy_state(args.navrl_checkpoint)
        navrl = evaluate_policy(final_cfg, navrl_state)
    held_out = {
        "map_seed": args.held_out_seed,
        "maps": args.held_out_maps,
        **{
            name: evaluate_policy(held_cfg, policy, map_seed=args.held_out_seed)
            for name, policy in (("final", final_state), ("navrl_checkpoint", navrl_state))
            if policy is not None
        },
        "untrained": evaluate_policy(held_cfg, None, map_seed=args.held_out_seed),
    }
    curve = [{"frames": 0, "iteration": 0, "seconds": 0.0, **_pick(untrained)}]
    curve += [
        {
            "frames": row["frames"],
            "iteration": row["iteration"],
            "seconds": round(training_seconds(row["time"], launches), 1),
            **_pick(row),
            **({"curriculum_stage": row["curriculum_stage"]} if "curriculum_stage" in row else {}),
        }
        for row in rows
    ]
    targets = target_stages(cfg)
    goal = goal_check(
        curve,
        final,
        navrl,
        targets=targets,
        within_s=args.goal_s,
        final_s=training_seconds(launched + budget["stop_s"], launches),
    )
    result = {
        "benchmark": "learning",
        "config": str(args.config),
        "overrides": overrides,
        "env": {
            "num_envs": cfg.env.num_envs,
            "num_obstacles": cfg.env.num_obstacles,
            "num_dynamic_obstacles": cfg.env.num_dynamic_obstacles,
            "curriculum_stages": len(cfg.env.curriculum),
            # the stages whose evaluations fly the target's (goal, frames_to_reach)
            "target_stages": None if targets is None else sorted(targets),
        },
        "eval": {
            "layout": cfg.eval.layout,
            "episodes": cfg.eval.num_envs,
            "final_episodes": final_cfg.eval.num_envs,  # the final export's, NavRL's, held out
            "max_steps": eval_steps(cfg),
            "seed": cfg.eval.seed,
            "num_obstacles": cfg.eval.num_obstacles or cfg.env.num_obstacles,
        },
        "budget": {"budget_s": args.budget_s, "frames": args.frames, **budget},
        "curve": curve,
        "final": final,
        "navrl_checkpoint": navrl,
        "held_out": held_out,
        "paired_with_navrl": {
            "training_maps": paired_with_navrl(final, navrl),
            "held_out": paired_with_navrl(held_out.get("final"), held_out.get("navrl_checkpoint")),
        },
        "frames_to_reach": frames_to_reach(curve, args.reach_bars, targets=targets),
        "goal": goal,
        "frames_goal": frames_goal(
            curve,
            final,
            held_out.get("final"),
            bar=args.goal_bar,
            within_frames=args.goal_frames,
            targets=targets,
        ),
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(),
            "device": cfg.run.device,
            "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
            "load_average_before": load_before,
            "load_average_after": load_after,
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    plot(result, args.out.with_suffix(".png"))
    summary = ("budget", "final", "navrl_checkpoint", "held_out", "paired_with_navrl")
    summary += ("frames_to_reach", "goal", "frames_goal")
    print(json.dumps({k: drop_outcomes(result[k]) for k in summary}, indent=1))
    print(
        json.dumps(
            [{k: r.get(k) for k in ("frames", "seconds", "reach_goal", "collision")} for r in curve]
        )
    )
    if "error" in budget:  # reported above; the exit status still says the run failed
        raise SystemExit(budget["error"])


def target_stages(cfg: Config) -> set[int] | None:
    """The curriculum stages whose evaluations fly what the last stage's fly (equal
    `evaluation_key`s): the last one, and e.g. stages of local hops evaluated on NavRL's
    crossing as the last stage is. None without a curriculum: every evaluation counts."""
    stages = cfg.env.curriculum
    if not stages:
        return None

    def key(index: int) -> dict[str, Any]:
        return evaluation_key(cfg.model_copy(update={"env": cfg.env.stage_env(index)}))

    target = key(len(stages) - 1)
    return {i for i in range(len(stages)) if key(i) == target}


def goal_check(
    curve: list[dict[str, Any]],
    final: dict[str, Any] | None,
    navrl: dict[str, Any] | None,
    *,
    targets: set[int] | None,
    within_s: float,
    final_s: float,
) -> dict[str, Any] | None:
    """Issue #13's verdict: did an evaluation of the target env (at a stage of `targets`,
    see `target_stages`) or the final export reach NavRL's reach_goal with no more
    collisions, within `within_s` seconds of launch? None without NavRL's numbers."""
    if navrl is None:
        return None
    bar = {"reach_goal": navrl["reach_goal"], "collision": navrl["collision"]}

    def at_bar(row: dict[str, Any]) -> bool:
        return row["reach_goal"] >= bar["reach_goal"] and row["collision"] <= bar["collision"]

    target = [r for r in curve if targets is None or r.get("curriculum_stage") in targets]
    first = next((r for r in target if at_bar(r)), None)
    final_at_bar = None if final is None else at_bar(final)
    met = (first is not None and first["seconds"] <= within_s) or (
        bool(final_at_bar) and final_s <= within_s
    )
    return {
        "bar": bar,
        "within_s": within_s,
        "target_stage_evals": len(target),
        "first_eval_at_bar": None
        if first is None
        else {k: first[k] for k in ("frames", "seconds", "reach_goal", "collision")},
        "final_at_bar": final_at_bar,
        "met": met,
    }


def frames_goal(
    curve: list[dict[str, Any]],
    final: dict[str, Any] | None,
    held_out_final: dict[str, Any] | None,
    *,
    bar: float,
    within_frames: float,
    targets: set[int] | None,
) -> dict[str, Any]:
    """Issue #23's CPU goal, per frame (so the same on any device): a policy that reaches
    its goal in at least `bar` of the episodes with at most 1 - `bar` collisions, on its
    training maps and on held-out maps both, within `within_frames` frames. Met by an
    evaluation of the target env at the bar on both map sets (the curve's held-out
    numbers, `eval.held_out_seed`), or by the final export's evaluations (its own drones,
    `--final-drones`) when it stopped within the frames."""
    held_at_bar = (
        r for r in curve if r["frames"] <= within_frames and at_bar(r, bar, prefix="held_out_")
    )
    first = first_at_bar(held_at_bar, bar, targets=targets)  # and at the bar on its own maps
    keys = ("frames", "seconds", "reach_goal", "collision")
    keys += ("held_out_reach_goal", "held_out_collision")
    final_check = None
    if final is not None:
        final_check = {
            "frames": final.get("frames"),
            "training_maps": at_bar(final, bar),
            "held_out": held_out_final is not None and at_bar(held_out_final, bar),
        }
    final_met = bool(
        final_check
        and final_check["training_maps"]
        and final_check["held_out"]
        and final_check["frames"] is not None
        and final_check["frames"] <= within_frames
    )
    return {
        "bar": bar,
        "within_frames": within_frames,
        "first_eval_at_bar": None if first is None else {k: first[k] for k in keys},
        "final": final_check,
        "met": first is not None or final_met,
    }


def frames_to_reach(
    curve: list[dict[str, Any]], bars: list[float], *, targets: set[int] | None
) -> dict[str, Any]:
    """Per bar b: the first evaluation of the target env (at a stage of `targets`) with
    reach_goal >= b and collision <= 1 - b; None where none did. Held-out numbers, when
    the curve has them, get the same treatment under `held_out`."""

    def first(prefix: str, bar: float) -> dict[str, Any] | None:
        row = first_at_bar(curve, bar, prefix=prefix, targets=targets)
        keys = ("frames", "seconds", f"{prefix}reach_goal", f"{prefix}collision")
        return None if row is None else {k: row[k] for k in keys}

    out: dict[str, Any] = {str(b): first("", b) for b in bars}
    if any("held_out_reach_goal" in row for row in curve):
        out["held_out"] = {str(b): first("held_out_", b) for b in bars}
    return out


def final_policy(state: Path, log: Path) -> tuple[dict[str, torch.Tensor] | None, dict[str, Any]]:
    """The policy the sitting ended with, and where it came from.

    The daemon's export when its log says it wrote one in this sitting; else (a daemon
    that failed, or failed to stop in time) the newest valid checkpoint's policy, the
    last one that was safe. A stale export from an earlier sitting is never used."""
    from navrl_daemon.storage.policy_file import load_any_policy_state

    exported = state / "export" / "policy.pt"
    at = exported_at(log)
    if at["iteration"] is not None and exported.exists():
        return load_any_policy_state(exported), {**at, "source": "export"}
    found = CheckpointDir(state / "checkpoints").newest_valid()
    if found is None:
        return None, {}
    path, header, saved = found
    policy = dict(saved.get("learner", {}).get("policy", {}))
    at = {"iteration": header.iteration, "frames": header.frames, "source": path.name}
    return policy or None, at


def exported_at(log: Path) -> dict[str, Any]:
    """Iteration and frames of the daemon's final export, from its log."""
    for line in reversed(log.read_text().splitlines()):
        if '"policy exported"' in line:
            event = json.loads(line)
            return {"iteration": event["iteration"], "frames": event["frames"]}
    return {"iteration": None, "frames": None}


def drop_outcomes(value: Any) -> Any:
    """`value` without the per-drone `outcomes` strings (the printed summary's; the JSON
    keeps them)."""
    if isinstance(value, dict):
        return {k: drop_outcomes(v) for k, v in value.items() if k != "outcomes"}
    return value


def _pick(row: dict[str, Any]) -> dict[str, Any]:
    return {k: round(float(row[k]), 4) for k in CURVE_KEYS if k in row}


if __name__ == "__main__":
    main()
