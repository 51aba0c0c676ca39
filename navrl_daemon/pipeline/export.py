"""The policy export a trainer writes when it stops (`STATE_DIR/export/*.pt`).

It is written after the final checkpoint (the supervisor flushes once every stage's `run`
has returned, and the writer writes the final snapshot in its `run`), so a failed export
never costs the checkpoint: it is logged as an error and counted, and the daemon still
exits 0. The log says whether a checkpoint holds the same policy (then `navrl-daemon
checkpoints export` writes it from there) or not (its checkpoint failed too: a full disk).
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
    checkpoint: Callable[[], Path | None],
    **fields: Any,
) -> bool:
    """Write `state` to `path`; False (logged, `on_failed` called) when the write failed.
    `checkpoint`: the valid checkpoint file that holds the same policy, if any, for the
    log to say whether the policy is still saved somewhere."""
    try:
        await anyio.to_thread.run_sync(save_policy_state, path, state)
    except OSError as err:
        on_failed()
        error = f"{type(err).__name__}: {err}"
        held = await anyio.to_thread.run_sync(checkpoint)
        if held is not None:
            log.error(
                "policy export failed: a checkpoint holds the same policy; "
                "`navrl-daemon checkpoints export` writes it again",
                path=str(path),
                checkpoint=str(held),
                error=error,
                **fields,
            )
        else:
            log.error(
                "policy export failed, and no checkpoint holds this policy (its checkpoint "
                "was not written either): these weights are not saved",
                path=str(path),
                error=error,
                **fields,
            )
        return False
    log.info("policy exported", path=str(path), **fields)
    return True
