"""Real filesystems for disk-fault tests: a small tmpfs mounted on a temp dir, and a
read-only bind mount of a directory (root ignores permission bits; a mount it cannot).

Mounting needs root (CI runs as root); where it is not permitted the test is skipped with
the reason. `navrl_daemon.testing.full_disk.fill` then takes every free byte of one.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Callable[[str], Path]]:
    """`small_disk("8m")` → the mount point of a fresh tmpfs of that size."""
    mounted: list[Path] = []

    def mount(size: str) -> Path:
        point = tmp_path / f"disk{len(mounted)}"
        point.mkdir()
        proc = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(point)],
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip() or proc.returncode}")
        mounted.append(point)
        return point

    yield mount
    for point in reversed(mounted):
        subprocess.run(["umount", "-l", str(point)], check=False)


@pytest.fixture
def read_only(tmp_path: Path) -> Iterator[Callable[[Path], Path]]:
    """`read_only(d)` bind-mounts directory `d` read-only onto itself until the test ends."""
    mounted: list[Path] = []

    def mount(directory: Path) -> Path:
        for args in (["--bind"], ["-o", "remount,bind,ro"]):
            proc = subprocess.run(
                ["mount", *args, str(directory), str(directory)], capture_output=True, text=True
            )
            if proc.returncode != 0:
                if mounted[-1:] != [directory] and args == ["-o", "remount,bind,ro"]:
                    subprocess.run(["umount", "-l", str(directory)], check=False)
                pytest.skip(f"cannot bind-mount read-only here: {proc.stderr.strip()}")
            if args == ["--bind"]:
                mounted.append(directory)
        return directory

    yield mount
    for point in reversed(mounted):
        subprocess.run(["umount", "-l", str(point)], check=False)
