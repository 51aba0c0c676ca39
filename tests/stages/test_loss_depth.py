"""The loss stays close to the loop: from the trainer's loop (`Trainer.run`) to the actor
loss is at most MAX_CALLS calls, counted on a real update of a real learner
(navrl_daemon/testing/traced_iteration.py, which benchmarks/code_shape.py measures with too):
the trainer's coroutines down to the compute thread's hop, then the frames on the compute
thread down to the actor loss. Pass-through hops (a class that only stores arguments, a
function that only forwards) each add one."""

from __future__ import annotations

import pytest

from navrl_daemon.testing import TINY
from navrl_daemon.testing.traced_iteration import trace_iteration

# The compute thread's hop, the trainer's update (its weights' lock, stream and rollback),
# the learner's (schedules, the update path), ppo.update, its losses, the actor loss.
MAX_CALLS = 6


@pytest.mark.usefixtures("one_torch_thread")
def test_the_actor_loss_is_six_calls_from_the_trainer_loop() -> None:
    chain = trace_iteration(TINY).loss_chain
    assert chain[0] == "trainer.Trainer.run"
    assert chain[-1].endswith(".actor_loss")
    calls = chain[1:]  # from the loop down to the actor loss
    assert len(calls) <= MAX_CALLS, " → ".join(chain)
