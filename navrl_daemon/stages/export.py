"""The policy export a trainer writes when it stops (`STATE_DIR/export/*.pt`).

It is written after the final checkpoint (the supervisor flushes once every stage's `run`
has returned, and the writer writes the final snapshot in its `run`), so a failed export
never costs the checkpoint: it is logged as an error and counted, the daemon still exits
0, and `navrl-daemon checkpoints export` writes the same policy from the checkpoint later.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import structlog
import torch

from navrl_daemon.storage.policy_file import save_policy_state

log = structlog.get_logger("export")


async def export_policy(
    path: Path,
    state: dict[str, torch.Tensor],
    *,
    on_failed: Callable[[], None],
    **fields: Any,
) -> bool:
    """Write `state` to `path`; False (logged, `on_failed` called) when the write failed."""
    try:
        await anyio.to_thread.run_sync(save_policy_state, path, state)
    except OSError as err:
        on_failed()
        log.error(
            "policy export failed: the final checkpoint holds the policy; "
            "`navrl-daemon checkpoints export` writes it again",
            path=str(path),
            error=f"{type(err).__name__}: {err}",
            **fields,
        )
        return False
    log.info("policy exported", path=str(path), **fields)
    return True
