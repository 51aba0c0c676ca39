"""`checkpoints list|verify|export|import` and `eval` on checkpoints, as a user runs them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict

from navrl_daemon.rl.policy import NavRLPolicy
from navrl_daemon.storage.checkpoint import encode_checkpoint, load_checkpoint
from tests.conftest import TINY, navrl_cli


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A state dir after 3 iterations with a checkpoint each (read-only for the tests)."""
    state = tmp_path_factory.mktemp("trained") / "state"
    proc = navrl_cli(
        "run", "--state-dir", str(state), *TINY, "run.total_frames=192", "checkpoint.interval=1"
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return state


def copy_state(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


def test_list_json_describes_every_file(trained: Path) -> None:
    proc = navrl_cli("checkpoints", "list", "--state-dir", str(trained), "--json")
    assert proc.returncode == 0, proc.stderr
    entries = json.loads(proc.stdout)
    assert [e["iteration"] for e in entries] == [1, 2, 3]
    assert [e["frames"] for e in entries] == [64, 128, 192]
    for e in entries:
        assert e["valid"] is True and e["reason"] is None
        assert Path(e["path"]).exists()
        assert e["stored_bytes"] == Path(e["path"]).stat().st_size - len_header(Path(e["path"]))
        assert e["raw_bytes"] > 0
    # Interval 1: the last iteration already had its snapshot, so no separate final one.
    assert [e["final"] for e in entries] == [False, False, False]


def len_header(path: Path) -> int:
    data = path.read_bytes()
    return 8 + int.from_bytes(data[4:8], "little")


def test_verify_is_0_when_all_valid_and_65_naming_each_bad_file(
    trained: Path, tmp_path: Path
) -> None:
    ok = navrl_cli("checkpoints", "verify", "--state-dir", str(trained))
    assert ok.returncode == 0, ok.stderr
    assert "3 of 3" in ok.stdout
    state = copy_state(trained, tmp_path / "state")
    ckpts = state / "checkpoints"
    data = (ckpts / "ckpt-000000002.nrc").read_bytes()
    (ckpts / "ckpt-000000002.nrc").write_bytes(data[:-10])
    (ckpts / "ckpt-000000001.nrc").write_bytes(b"garbage")
    bad = navrl_cli("checkpoints", "verify", "--state-dir", str(state), "--json")
    assert bad.returncode == 65
    lines = bad.stderr.strip().splitlines()
    assert len(lines) == 2
    assert "ckpt-000000001.nrc" in lines[0] and "bad magic" in lines[0]
    assert "ckpt-000000002.nrc" in lines[1] and "truncated" in lines[1]
    doc = json.loads(bad.stdout)
    assert [d["valid"] for d in doc] == [False, False, True]
    listed = json.loads(
        navrl_cli("checkpoints", "list", "--state-dir", str(state), "--json").stdout
    )
    assert listed[0]["iteration"] is None and listed[0]["valid"] is False
    assert listed[1]["iteration"] == 2 and listed[1]["valid"] is False


def test_export_round_trip_gives_identical_outputs(trained: Path, tmp_path: Path) -> None:
    out = tmp_path / "navrl.pt"
    proc = navrl_cli("checkpoints", "export", "--state-dir", str(trained), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    _, state = load_checkpoint(trained / "checkpoints" / "ckpt-000000003.nrc")
    exported = torch.load(out, weights_only=True)
    # A plain state_dict in NavRL's layout: loads strictly into a fresh NavRL-layout model.
    fresh, original = NavRLPolicy(), NavRLPolicy()
    fresh.load_state_dict(exported, strict=True)
    original.load_state_dict(state["learner"]["policy"], strict=True)
    td = TensorDict(
        {
            ("agents", "observation", "state"): torch.randn(16, 8),
            ("agents", "observation", "lidar"): torch.rand(16, 1, 36, 4) * 4,
            ("agents", "observation", "direction"): torch.randn(16, 1, 3),
            ("agents", "observation", "dynamic_obstacle"): torch.randn(16, 1, 5, 10),
        },
        batch_size=[16],
    )
    with torch.no_grad():
        a = fresh.act(td.clone(), deterministic=True)
        b = original.act(td.clone(), deterministic=True)
    for key in (("agents", "action"), "sample_log_prob", "state_value"):
        assert torch.equal(a[key], b[key]), key


def test_import_then_eval_equals_eval_of_the_navrl_file(
    tmp_path: Path, navrl_checkpoint: Path
) -> None:
    state = tmp_path / "state"
    imp = navrl_cli("checkpoints", "import", "--state-dir", str(state), str(navrl_checkpoint))
    assert imp.returncode == 0, imp.stderr
    ckpt = state / "checkpoints" / "ckpt-000000000.nrc"
    assert ckpt.exists()
    common = [
        "--config",
        "config/navrl-original.toml",
        "--episodes",
        "8",
        "--json",
        "run.device=cpu",
    ]
    common += ["eval.max_steps=300"]
    a = navrl_cli("eval", "--checkpoint", str(navrl_checkpoint), *common)
    b = navrl_cli("eval", "--checkpoint", str(ckpt), *common)
    assert a.returncode == 0 and b.returncode == 0, (a.stderr, b.stderr)
    ra, rb = json.loads(a.stdout), json.loads(b.stdout)
    for key in ("reach_goal", "collision", "return", "episode_len", "unfinished"):
        assert ra[key] == rb[key], key
    # Importing twice into the same state dir would hide the run it started: refused.
    again = navrl_cli("checkpoints", "import", "--state-dir", str(state), str(navrl_checkpoint))
    assert again.returncode == 2 and "already holds checkpoints" in again.stderr


def test_run_warm_starts_from_an_imported_policy(tmp_path: Path, navrl_checkpoint: Path) -> None:
    state = tmp_path / "state"
    navrl_cli("checkpoints", "import", "--state-dir", str(state), str(navrl_checkpoint))
    proc = navrl_cli("run", "--state-dir", str(state), *TINY, "run.total_frames=128")
    assert proc.returncode == 0, proc.stderr[-2000:]
    start = next(
        json.loads(x)
        for x in proc.stderr.splitlines()
        if x.startswith("{") and '"resumed from checkpoint"' in x
    )
    assert (start["kind"], start["iteration"], start["env_restored"]) == ("warm_start", 0, False)
    # Two updates of the NavRL weights, not of a random init: still close to NavRL's.
    trained = torch.load(state / "export" / "policy.pt", weights_only=True)
    navrl = torch.load(navrl_checkpoint, weights_only=True, map_location="cpu")
    key = "actor.module.0.module.alpha_layer.weight"
    assert not torch.equal(trained[key], navrl[key])
    assert (trained[key] - navrl[key]).abs().max() < 0.05


def test_import_refuses_a_file_that_is_not_navrl_layout(tmp_path: Path) -> None:
    bad = tmp_path / "bad.pt"
    torch.save({"w": torch.zeros(3)}, bad)
    proc = navrl_cli("checkpoints", "import", "--state-dir", str(tmp_path / "s"), str(bad))
    assert proc.returncode == 65 and "not NavRL's policy layout" in proc.stderr
    assert not (tmp_path / "s" / "checkpoints").exists() or not any(
        (tmp_path / "s" / "checkpoints").iterdir()
    )


def reencode(src: Path, dst: Path, iteration: int, change) -> None:
    """A valid container (magic, checksum, weights-only load) with contents `change`d."""
    header, state = load_checkpoint(src)
    change(state)
    dst.write_bytes(
        encode_checkpoint(
            state, iteration=iteration, frames=header.frames, policy_version=iteration
        )
    )


def test_verify_and_run_share_one_check_of_the_contents(trained: Path, tmp_path: Path) -> None:
    """Right container, wrong contents: a wrong-shaped policy tensor, an offline run's
    checkpoint in an online run, a wrong-shaped optimiser moment. `verify` used to pass
    them and `run` exit 65 on them; now both refuse them by the same check, and `run`
    falls back to the older valid checkpoint with a warning, as for a corrupt file."""
    state = copy_state(trained, tmp_path / "state")
    ckpts = state / "checkpoints"
    newest = ckpts / "ckpt-000000003.nrc"
    key = "actor.module.0.module.alpha_layer.weight"

    def wrong_shape(s: dict) -> None:
        s["learner"]["policy"][key] = torch.zeros(3, 3)

    def offline_kind(s: dict) -> None:
        s["kind"] = "offline"

    def wrong_moment(s: dict) -> None:
        moments = s["learner"]["optimizers"]["actor"]["state"]
        moments[0]["exp_avg"] = torch.zeros(7)

    reencode(newest, ckpts / "ckpt-000000004.nrc", 4, wrong_shape)
    reencode(newest, ckpts / "ckpt-000000005.nrc", 5, offline_kind)
    reencode(newest, ckpts / "ckpt-000000006.nrc", 6, wrong_moment)
    proc = navrl_cli("checkpoints", "verify", "--state-dir", str(state), "--json")
    assert proc.returncode == 65, proc.stderr
    reasons = {Path(d["path"]).name: d["reason"] for d in json.loads(proc.stdout)}
    assert reasons["ckpt-000000003.nrc"] is None
    assert "does not fit this run's policy" in reasons["ckpt-000000004.nrc"]
    assert key in reasons["ckpt-000000004.nrc"]
    assert "kind 'offline' does not fit this run" in reasons["ckpt-000000005.nrc"]
    assert "exp_avg of shape (7,)" in reasons["ckpt-000000006.nrc"]
    assert proc.stderr.count("invalid checkpoint") == 3

    run_resumes_past_4_to_6(state)


def run_resumes_past_4_to_6(state: Path) -> list[dict]:
    """`run` on a state dir whose checkpoints 4-6 are bad: it sets them aside (kept, in
    `rejected/`), resumes from 3, and leaves a directory `verify` passes. Its log lines."""
    run = navrl_cli("run", "--state-dir", str(state), *TINY, "run.total_frames=256")
    assert run.returncode == 0, run.stderr[-3000:]
    log = [json.loads(x) for x in run.stderr.splitlines() if x.startswith("{")]
    skipped = sorted(Path(e["file"]).name for e in log if e["event"].startswith("skipping"))
    assert skipped == ["ckpt-000000004.nrc", "ckpt-000000005.nrc", "ckpt-000000006.nrc"]
    start = next(e for e in log if e["event"] == "resumed from checkpoint")
    assert Path(start["path"]).name == "ckpt-000000003.nrc"
    rejected = state / "checkpoints" / "rejected"
    assert sorted(p.name for p in rejected.iterdir()) == skipped
    assert navrl_cli("checkpoints", "verify", "--state-dir", str(state)).returncode == 0
    return log


def test_verify_of_a_live_dir_skips_files_pruned_while_it_reads(
    trained: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """A running daemon's retention deletes old checkpoints at any moment: one listed and
    then gone is not an invalid checkpoint (exit 0, named as pruned); a file named on the
    command line that is missing still is (65)."""
    import signal

    from navrl_daemon import cli
    from navrl_daemon.commands import checkpoints

    state = copy_state(trained, tmp_path / "state")
    oldest = sorted((state / "checkpoints").glob("ckpt-*.nrc"))[0]
    real = checkpoints.verify

    def pruned_meanwhile(files, accept):
        oldest.unlink()  # after the listing, before the read
        return real(files, accept)

    monkeypatch.setattr(checkpoints, "verify", pruned_meanwhile)
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        assert cli.main(["checkpoints", "verify", "--state-dir", str(state)]) == 0
        assert f"1 file(s) pruned while verifying: {oldest.name}" in capsys.readouterr().err
        monkeypatch.setattr(checkpoints, "verify", real)
        args = ["checkpoints", "verify", "--state-dir", str(state), str(oldest)]
        assert cli.main(args) == 65
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
