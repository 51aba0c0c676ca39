"""`STATE_DIR/config.toml`, the resolved config of the run on a state dir, and the configs
of its earlier runs: a run that resumes with changed settings keeps the replaced file as
`STATE_DIR/configs/config-<UTC time it was written>.toml`, so `report` can show what
changed and when."""

from __future__ import annotations

import time
from pathlib import Path

from navrl_daemon.storage.atomic import write_atomic

CONFIG_FILE = "config.toml"
EARLIER_DIR = "configs"


def record_run_config(state_dir: Path, text: str) -> Path | None:
    """Write `text` as the state dir's config.toml; a different one already there is kept
    in configs/ first (its path is returned). Same text: nothing else changes."""
    current = state_dir / CONFIG_FILE
    try:
        old = current.read_text()
    except FileNotFoundError:
        old = None
    kept = None
    if old is not None and old != text:
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(current.stat().st_mtime))
        kept = state_dir / EARLIER_DIR / f"config-{stamp}.toml"
        write_atomic(kept, old.encode())
    write_atomic(current, text.encode())
    return kept


def earlier_configs(state_dir: Path) -> list[Path]:
    """The kept configs, oldest first (their names sort by time)."""
    return sorted((state_dir / EARLIER_DIR).glob("config-*.toml"))
