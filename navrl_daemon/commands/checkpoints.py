"""`navrl-daemon checkpoints list|verify|export|import`: the files in STATE_DIR/checkpoints.

- `list`: one entry per `.nrc` file (header fields, sizes, whether it is valid), with
  each checkpoint's evaluation (eval/results.jsonl, same iteration) and the best one
  marked (the rule of `eval_rank`).
- `verify`: loads every file (magic, lengths, checksum, weights-only load) and checks that
  its contents fit the run (kind, policy and optimiser shapes: the check `run` makes,
  pipeline/resume.py `CheckpointFit`) against `--config`, else the state dir's `config.toml`
  (the config its run resolved), else the built-in one; exit 65 and a line per bad file
  when any is not valid. Files `run` moved aside (`checkpoints/rejected/`) are not listed.
- `export --format navrl`: the policy of a checkpoint as a plain state_dict in NavRL's key
  layout (what NavRL's ROS runner loads); `--format onnx|torch-export`: the deterministic
  actor for deployment (storage/deployment.py); `--best`: the checkpoint of the best
  evaluation instead of the newest.
- `import --format navrl FILE`: a NavRL policy file (or the policy of a `.nrc` checkpoint)
  becomes checkpoint 0 of an empty state dir (a warm start: `run` trains on from those
  weights with fresh optimisers).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from navrl_daemon.commands.common import (
    config_args,
    json_arg,
    print_json,
    state_dir,
    state_dir_arg,
)
from navrl_daemon.config import Config, load_config
from navrl_daemon.errors import DataError, UsageError
from navrl_daemon.storage.checkpoint import (
    Accept,
    CheckpointDir,
    encode_checkpoint,
    load_checkpoint,
    read_header,
    verify,
)


def register(sub: Any) -> None:
    p = sub.add_parser("checkpoints", help="list, verify, export and import checkpoints")
    cmds = p.add_subparsers(dest="checkpoints_command", required=True, metavar="SUBCOMMAND")

    ls = cmds.add_parser("list", help="every checkpoint file with its header and validity")
    json_arg(state_dir_arg(config_args(ls, overrides=False)))
    ls.set_defaults(handler=handle_list)

    ver = cmds.add_parser("verify", help="exit 65 naming each file that is not valid")
    json_arg(state_dir_arg(config_args(ver, overrides=False)))
    ver.add_argument("files", nargs="*", type=Path, help="default: all in the state dir")
    ver.set_defaults(handler=handle_verify)

    exp = cmds.add_parser(
        "export", help="a checkpoint's policy: NavRL state_dict, ONNX or torch.export"
    )
    state_dir_arg(config_args(exp, overrides=False))
    exp.add_argument(
        "--format",
        choices=list(EXPORT_SUFFIX),
        default="navrl",
        help="navrl: NavRL's state_dict (.pt); onnx: the actor for ONNX Runtime (.onnx); "
        "torch-export: the actor as a torch.export program (.pt2)",
    )
    which = exp.add_mutually_exclusive_group()
    which.add_argument("--checkpoint", type=Path, help="default: the newest valid one")
    which.add_argument(
        "--best", action="store_true", help="the checkpoint with the best evaluation"
    )
    exp.add_argument("--out", type=Path, help="default: STATE_DIR/export/navrl-ITER.pt|.onnx|.pt2")
    exp.set_defaults(handler=handle_export)

    imp = cmds.add_parser("import", help="warm-start a new state dir from a NavRL policy")
    state_dir_arg(config_args(imp, overrides=False))
    imp.add_argument("--format", choices=["navrl"], default="navrl")
    imp.add_argument(
        "file", type=Path, help="NavRL state_dict (e.g. navrl_checkpoint.pt) or a .nrc checkpoint"
    )
    imp.set_defaults(handler=handle_import)


EXPORT_SUFFIX = {"navrl": ".pt", "onnx": ".onnx", "torch-export": ".pt2"}
RESULTS_FILE = Path("eval") / "results.jsonl"


def _directory(cfg: Config, args: argparse.Namespace) -> CheckpointDir:
    return CheckpointDir(state_dir(cfg, args) / "checkpoints")


def _fit(cfg: Config, args: argparse.Namespace) -> Accept:
    """The run check against the config the files were written under (see the docstring)."""
    from navrl_daemon.pipeline.resume import CheckpointFit

    saved = state_dir(cfg, args) / "config.toml"
    if args.config is None and saved.is_file():
        cfg = load_config(saved)
    return CheckpointFit(cfg)


def describe(path: Path, why: str | None) -> dict[str, Any]:
    """One `list` entry; header fields are null when the header itself is unreadable."""
    entry: dict[str, Any] = {"path": str(path), "valid": why is None, "reason": why}
    try:
        h = read_header(path)
    except DataError:
        entry.update(dict.fromkeys(("iteration", "frames", "raw_bytes", "stored_bytes"), None))
        return entry
    entry.update(
        iteration=h.iteration,
        frames=h.frames,
        policy_version=h.policy_version,
        created=h.created,
        level=h.level,
        raw_bytes=h.raw_bytes,
        stored_bytes=h.stored_bytes,
        final=bool(h.meta.get("final", False)),
    )
    return entry


def handle_list(cfg: Config, args: argparse.Namespace) -> int:
    directory = _directory(cfg, args)
    entries = [describe(p, why) for p, why in verify(directory.files(), _fit(cfg, args))]
    with_evaluations(entries, state_dir(cfg, args) / RESULTS_FILE)
    if args.json:
        print_json(entries)
        return 0
    if not entries:
        print(f"no checkpoints in {directory.path}")
        return 0
    print(
        f"{'file':<22} {'iteration':>9} {'frames':>13} {'size':>9}  {'eval reach/coll.':<18} status"
    )
    for e in entries:
        status = "valid" if e["valid"] else f"INVALID: {e['reason']}"
        size = f"{e['stored_bytes'] / 1e6:.1f} MB" if e["stored_bytes"] is not None else "?"
        ev = e["eval"]
        score = "—" if ev is None else f"{ev['reach_goal']:.3f} / {ev['collision']:.3f}"
        score += "  best" if e["best"] else ""
        frames = f"{e['frames']:,}" if e["frames"] is not None else "?"
        print(
            f"{Path(e['path']).name:<22} {e['iteration'] if e['iteration'] is not None else '?':>9}"
            f" {frames:>13} {size:>9}  {score:<18} {status}"
        )
    return 0


def with_evaluations(entries: list[dict[str, Any]], results: Path) -> None:
    """Give each `list` entry `eval` (reach_goal, collision, return of the evaluation of
    its iteration, or None) and `best` (whether it is the best-evaluated valid one)."""
    from navrl_daemon.rl.evaluate import eval_rank
    from navrl_daemon.storage.history import read_jsonl

    by_iteration = {
        row["iteration"]: row
        for row in read_jsonl(results, required=("iteration", "reach_goal", "collision")).rows
    }
    for e in entries:
        row = by_iteration.get(e["iteration"])
        e["eval"] = (
            None if row is None else {k: row.get(k) for k in ("reach_goal", "collision", "return")}
        )
        e["best"] = False
    scored = [e for e in entries if e["valid"] and e["eval"] is not None]
    if scored:
        best = max(scored, key=lambda e: eval_rank(by_iteration[e["iteration"]]))
        best["best"] = True


def handle_verify(cfg: Config, args: argparse.Namespace) -> int:
    files = args.files or _directory(cfg, args).files()
    results = verify(files, _fit(cfg, args))
    if not args.files:  # a running daemon's retention may delete listed files meanwhile
        gone = [p for p, why in results if why is not None and not os.path.lexists(p)]
        results = [(p, why) for p, why in results if p not in gone]
        if gone:
            names = ", ".join(p.name for p in gone)
            print(f"navrl-daemon: {len(gone)} file(s) pruned while verifying: {names}",
                  file=sys.stderr)  # fmt: skip
    bad = [(p, why) for p, why in results if why is not None]
    if args.json:
        print_json([{"path": str(p), "valid": why is None, "reason": why} for p, why in results])
    else:
        print(f"{len(results) - len(bad)} of {len(results)} checkpoint file(s) valid")
    for path, why in bad:
        print(f"navrl-daemon: invalid checkpoint {path}: {why}", file=sys.stderr)
    return DataError.exit_code if bad else 0


def handle_export(cfg: Config, args: argparse.Namespace) -> int:
    from navrl_daemon.rl.policy import make_policy, navrl_layout
    from navrl_daemon.storage.policy_file import (
        check_policy_layout,
        checkpoint_policy,
        save_policy_state,
    )

    if args.checkpoint is not None:
        header, state = load_checkpoint(args.checkpoint)
        source = args.checkpoint
    else:
        source, header, state = _chosen_checkpoint(cfg, args)
    policy_state = checkpoint_policy(state, source)
    # torch's conv2d in the exported graph: what ONNX Runtime and libtorch run best
    policy = make_policy(cfg, "cpu", lidar_conv="native")
    check_policy_layout(policy_state, policy.state_dict(), source)
    suffix = EXPORT_SUFFIX[args.format]
    name = f"navrl-{header.iteration:09d}{suffix}"
    out = args.out or state_dir(cfg, args) / "export" / name
    if args.format == "navrl":
        save_policy_state(out, policy_state)
    else:
        from navrl_daemon.rl.deploy import DeployedActor
        from navrl_daemon.storage.deployment import export_actor

        policy.load_state_dict(navrl_layout(policy_state))
        export_actor(DeployedActor(policy), args.format, out)
    print(f"exported {source} (iteration {header.iteration}) as {args.format} to {out}")
    return 0


def _chosen_checkpoint(cfg: Config, args: argparse.Namespace) -> tuple[Path, Any, dict[str, Any]]:
    """The newest valid checkpoint, or with --best the best-evaluated valid one."""
    directory = _directory(cfg, args)
    if not args.best:
        found = directory.newest_valid()
        if found is None:
            raise DataError(f"{directory.path}: no valid checkpoint to export")
        return found
    entries = [describe(p, why) for p, why in verify(directory.files())]
    with_evaluations(entries, state_dir(cfg, args) / RESULTS_FILE)
    best = next((e for e in entries if e["best"]), None)
    if best is None:
        raise DataError(
            f"{directory.path}: no valid checkpoint of an evaluated iteration (--best needs "
            f"eval.interval to coincide with checkpoint.interval; see {RESULTS_FILE})"
        )
    path = Path(best["path"])
    header, state = load_checkpoint(path)
    return path, header, state


def handle_import(cfg: Config, args: argparse.Namespace) -> int:
    from navrl_daemon.pipeline.resume import WARM_START, library_versions
    from navrl_daemon.rl.policy import make_policy
    from navrl_daemon.runtime.lock import StateDirLock
    from navrl_daemon.storage.policy_file import check_policy_layout, load_any_policy_state

    policy = load_any_policy_state(args.file)
    check_policy_layout(policy, make_policy(cfg, "cpu").state_dict(), args.file)
    root = state_dir(cfg, args)
    with StateDirLock(root):
        directory = CheckpointDir(root / "checkpoints")
        if directory.files():
            raise UsageError(
                f"{directory.path} already holds checkpoints; import into a new --state-dir"
            )
        state = {
            "kind": WARM_START,
            "learner": {"policy": policy},
            "source": str(args.file.resolve()),
            "versions": library_versions(),
        }
        data = encode_checkpoint(state, iteration=0, frames=0, policy_version=0)
        path = directory.write(data, 0)
    print(f"imported {args.file} as {path}: `run --state-dir {root}` starts from it")
    return 0
