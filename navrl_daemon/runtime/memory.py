"""How much memory a device has free, and a start-up check against it.

A config far beyond the machine (`env.num_envs = 1048576` asks for tens of GB of rollout
buffers) must be refused with a message before anything is allocated, not end in a
traceback or the OOM killer half an hour later.
"""

from __future__ import annotations

from pathlib import Path

import torch

from navrl_daemon.errors import ConfigError

GB = 1e9


def available_bytes(device: torch.device) -> tuple[int, str]:
    """Bytes that can still be allocated on `device`, and where the number comes from."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free), f"free memory of {device}"
    available, source = _meminfo_available(), "MemAvailable in /proc/meminfo"
    left = _cgroup_left()
    if left is not None and left < available:
        return left, "the memory left under this cgroup's limit"
    return available, source


def require(need: int, what: str, device: torch.device, *, fix: str) -> None:
    """ConfigError (78) if `need` bytes (`what`: what needs them) do not fit in what
    `device` has free."""
    free, source = available_bytes(device)
    if need > free:
        raise ConfigError(
            f"{what} need at least {need / GB:.1f} GB, but {device} has {free / GB:.1f} GB "
            f"available ({source}); {fix}"
        )


def _meminfo_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise OSError("no MemAvailable in /proc/meminfo")


def _cgroup_left() -> int | None:
    """Limit minus usage of this process's memory cgroup (v2, else v1), if it has a limit."""
    for limit_file, usage_file in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        (
            "/sys/fs/cgroup/memory/memory.limit_in_bytes",
            "/sys/fs/cgroup/memory/memory.usage_in_bytes",
        ),
    ):
        try:
            limit = Path(limit_file).read_text().strip()
            usage = int(Path(usage_file).read_text())
        except (OSError, ValueError):
            continue
        if limit.isdigit() and int(limit) < 1 << 60:  # v1 writes a huge number for "none"
            return max(0, int(limit) - usage)
        return None
    return None
