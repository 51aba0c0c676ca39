"""A seed or a state dir path that cannot work is bad config: exit 78 with a line that
names it, before anything is created, never a traceback (issue #69: a seed of 2**64 and
state dirs with a NUL byte, a 0xFF byte or a 300-byte component crashed `run` with exit 1).

Real subprocesses, as a user's shell would start them: the 0xFF byte reaches the daemon
as a raw byte of its argv."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import TINY, navrl_cli

SHORT = [*TINY, "run.total_frames=64", "eval.interval=0"]


def assert_refused(proc, *needles: str) -> None:  # type: ignore[no-untyped-def]
    assert proc.returncode == 78, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    for needle in needles:
        assert needle in proc.stderr, proc.stderr[-3000:]


def test_a_seed_beyond_64_bits_exits_78_before_the_state_dir_is_made(tmp_path: Path) -> None:
    state = tmp_path / "state"
    proc = navrl_cli("run", "--state-dir", str(state), *SHORT, f"run.seed={2**64}")
    assert_refused(proc, "run.seed: Input should be less than or equal to 9223372036854775807")
    assert not state.exists()
    ok = navrl_cli("config", "show", f"run.seed={2**63 - 1}")
    assert ok.returncode == 0, ok.stderr[-3000:]


def test_a_state_dir_with_a_nul_byte_exits_78(tmp_path: Path) -> None:
    # No argv holds a NUL: it comes from a TOML string's escape (file or override).
    value = f'run.state_dir="{tmp_path}/a\\u0000b"'
    proc = navrl_cli("run", *SHORT, value)
    assert_refused(proc, "run.state_dir: ", "NUL byte")
    assert list(tmp_path.iterdir()) == []


def test_a_state_dir_that_is_not_utf8_exits_78(tmp_path: Path) -> None:
    state = os.fsdecode(os.fsencode(tmp_path) + b"/caf\xff")  # as argv hands it to Python
    proc = navrl_cli("run", "--state-dir", state, *SHORT)
    assert_refused(proc, "--state-dir ", "byte 0xff", "UTF-8")
    assert list(tmp_path.iterdir()) == []
    from_env = navrl_cli("run", *SHORT, env={"NAVRL_RUN__STATE_DIR": f'"{state}"'})
    assert_refused(from_env, "run.state_dir: ", "byte 0xff", "NAVRL_RUN__STATE_DIR")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("where", ["last", "middle"])
def test_a_state_dir_component_over_255_bytes_exits_78(tmp_path: Path, where: str) -> None:
    long = "é" * 128  # 256 bytes in UTF-8, 128 characters
    state = tmp_path / long if where == "last" else tmp_path / long / "state"
    proc = navrl_cli("run", "--state-dir", str(state), *SHORT)
    assert_refused(proc, "--state-dir ", "component of 256 bytes", "255")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("where", ["last", "middle", "dangling"])
def test_a_state_dir_through_a_broken_symlink_exits_78_saying_so(
    tmp_path: Path, where: str
) -> None:
    """A state dir that is (or lies under) a symlink pointing at itself said "cannot
    create it: File exists"; the message now says what the link does."""
    link = tmp_path / "link"
    link.symlink_to("link" if where != "dangling" else tmp_path / "gone" / "state")
    state = link / "state" if where == "middle" else link
    proc = navrl_cli("run", "--state-dir", str(state), *SHORT)
    needle = "does not exist" if where == "dangling" else "symbolic links loop"
    assert_refused(proc, f"state dir {state}: ", needle)
    assert "File exists" not in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link"]
