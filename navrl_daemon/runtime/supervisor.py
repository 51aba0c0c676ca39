"""A generic supervisor: runs stages in one task group, owns the shutdown.

Knows no RL and no particular stage. Lifecycle: starting → running → draining → stopped.

- First stop signal (SIGINT, SIGTERM or SIGHUP; runtime/signals.py): `shutdown.stop` is
  set; stages finish what is in flight at their next safe boundary and close their
  output channels, so the pipeline drains upstream-first.
- Second signal: `shutdown.abort` is set as well; compute in worker threads stops at the
  next minibatch or step boundary (never mid-write).
- Stages get `shutdown_timeout_s` from the first stop to return; past it they are
  cancelled (and the run ends with `StageFailed`: they were late).
- Then every stage's `flush(deadline)` runs in turn, shielded, under the flushes' own deadline:
  `shutdown_timeout_s` from the moment the stages ended. A late stage therefore never
  costs the final checkpoint its time; a whole stop takes at most twice the timeout.
- A stage that raises stops the daemon: the others are told to stop, flushes still run,
  and `run()` raises `StageFailed` naming the stage.
"""

from __future__ import annotations

import enum
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import anyio
import structlog

from navrl_daemon.errors import NavrlError, StageFailed
from navrl_daemon.runtime.signals import StopSignals

log = structlog.get_logger("supervisor")


class Stage(Protocol):
    name: str

    async def run(self) -> None: ...

    async def flush(self, deadline: float) -> None:
        """Persist what must not be lost; `deadline` is a `time.monotonic()` value."""
        ...


class State(enum.StrEnum):
    STARTING = "starting"
    RUNNING = "running"
    DRAINING = "draining"
    STOPPED = "stopped"


@dataclass
class Shutdown:
    """What stages look at to know when to stop. `abort` is a threading.Event so compute
    running in worker threads can poll it."""

    stop: anyio.Event = field(default_factory=anyio.Event)
    abort: threading.Event = field(default_factory=threading.Event)
    reason: str | None = None
    deadline: float = math.inf

    def request(self, reason: str, timeout_s: float) -> None:
        if not self.stop.is_set():
            self.reason = reason
            self.deadline = time.monotonic() + timeout_s
            self.stop.set()
        else:
            self.abort.set()

    @property
    def stopping(self) -> bool:
        return self.stop.is_set()


class Supervisor:
    def __init__(
        self,
        stages: Sequence[Stage],
        *,
        shutdown_timeout_s: float,
        shutdown: Shutdown | None = None,
        on_state: Callable[[State], None] | None = None,
        signals: StopSignals | None = None,
    ) -> None:
        """`signals`: the process's stop signals, taken while the stages run; without
        them only `request_stop` (or a failing stage) stops the pipeline."""
        self.stages = list(stages)
        self.shutdown = shutdown or Shutdown()
        self.timeout_s = shutdown_timeout_s
        self._on_state = on_state
        self._signals = signals
        self.state = State.STARTING
        self.failed: list[tuple[str, BaseException]] = []
        self.late: list[str] = []
        self._stages_done = False

    def set_state(self, state: State) -> None:
        if state != self.state:
            self.state = state
            log.info("state", state=str(state))
            if self._on_state is not None:
                self._on_state(state)

    def request_stop(self, reason: str) -> None:
        first = not self.shutdown.stopping
        self.shutdown.request(reason, self.timeout_s)
        if first:
            self.set_state(State.DRAINING)
            log.info("stop requested", reason=reason, timeout_s=self.timeout_s)
        else:
            log.warning("second stop request: aborting in-flight work", reason=reason)

    async def run(self) -> None:
        """Run every stage to completion, then flush them all. Raises StageFailed."""
        async with anyio.create_task_group() as outer:
            if self._signals is not None:
                outer.start_soon(self._watch_signals, self._signals)
            outer.start_soon(self._deadline_watch, outer.cancel_scope)
            with anyio.CancelScope() as self._stages_scope:
                async with anyio.create_task_group() as tg:
                    for stage in self.stages:
                        tg.start_soon(self._run_stage, stage, name=stage.name)
                    self.set_state(State.RUNNING)
            self._stages_done = True
            self.set_state(State.DRAINING)
            await self._flush_all()
            outer.cancel_scope.cancel()
        self.set_state(State.STOPPED)
        if self.failed:
            name, err = self.failed[0]
            failure = StageFailed(f"stage {name} failed: {type(err).__name__}: {err}")
            if isinstance(err, NavrlError):  # bad data found mid-run is still exit 65
                failure.exit_code = err.exit_code
            raise failure from err
        if self.late:
            raise StageFailed(
                f"stage(s) {', '.join(self.late)} did not stop within "
                f"run.shutdown_timeout_s = {self.timeout_s}"
            )

    async def _run_stage(self, stage: Stage) -> None:
        structlog.contextvars.bind_contextvars(stage=stage.name)
        try:
            await stage.run()
        except anyio.get_cancelled_exc_class():
            raise
        except Exception as err:
            self.failed.append((stage.name, err))
            log.exception("stage failed", failed_stage=stage.name)
            self.request_stop(f"stage {stage.name} failed")
            # Downstream stages would wait forever on a dead producer: cut them loose.
            self.shutdown.abort.set()
            self._stages_scope.cancel()
        else:
            log.info("stage finished", finished_stage=stage.name)

    async def _deadline_watch(self, scope: anyio.CancelScope) -> None:
        await self.shutdown.stop.wait()
        await anyio.sleep(max(0.0, self.shutdown.deadline - time.monotonic()))
        if not self._stages_done and not self._stages_scope.cancel_called:
            log.error("shutdown deadline passed: cancelling stages", timeout_s=self.timeout_s)
            self.late.append("(pipeline)")
            self.shutdown.abort.set()
            self._stages_scope.cancel()

    async def _flush_all(self) -> None:
        deadline = time.monotonic() + self.timeout_s
        for stage in self.stages:
            left = deadline - time.monotonic()
            with anyio.CancelScope(shield=True), anyio.move_on_after(max(left, 0.0)) as scope:
                try:
                    await stage.flush(deadline)
                    log.info("flushed", flushed_stage=stage.name)
                except Exception as err:
                    self.failed.append((stage.name, err))
                    log.exception("flush failed", failed_stage=stage.name)
            if scope.cancelled_caught:
                self.late.append(stage.name)
                log.error("flush did not finish before the deadline", late_stage=stage.name)

    async def _watch_signals(self, signals: StopSignals) -> None:
        while True:
            self.request_stop(await signals.next())
