"""One rank of the data-parallel update check: `python -m tests.distributed.update_worker DIR`.

Reads DIR/batch.pt (the whole [N, T] rollout, the initial weights, how many updates),
takes this rank's N / WORLD_SIZE envs, runs the PPO updates with the DataParallel reducer
over gloo, then plants a one-ulp drift on rank 1 and records what `check_same` says.
Writes DIR/rank{RANK}.pt: the trained weights, the returned stats, the drift message.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from navrl_daemon.config import load_config
from navrl_daemon.rl import ppo
from navrl_daemon.rl.data_parallel import DataParallel, RanksDiverged
from navrl_daemon.rl.policy import make_policy


def main(directory: Path) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    saved = torch.load(directory / "batch.pt", weights_only=False)
    cfg = load_config(overrides=saved["overrides"], environ={})
    policy = make_policy(cfg, "cpu")
    policy.load_state_dict(saved["policy"])
    batch = saved["batch"]
    share = batch.shape[0] // world
    mine = batch[rank * share : (rank + 1) * share]
    generator = torch.Generator().manual_seed(saved["seed"])
    optimizers = ppo.make_optimizers(policy, cfg.ppo)
    stats = []
    for _ in range(saved["updates"]):
        stats.append(
            ppo.update(policy, optimizers, mine, cfg.ppo, generator, reducer=DataParallel())
        )
    trained = {k: v.clone() for k, v in policy.state_dict().items()}
    reducer = DataParallel()
    reducer.check_same(policy)  # in step: passes
    if rank == 1:  # a rank that drifted, by one ulp of one weight
        with torch.no_grad():
            w = next(policy.critic.parameters()).view(-1)
            w[0] = torch.nextafter(w[0], w[0] + 1)
    try:
        reducer.check_same(policy)
        diverged = None
    except RanksDiverged as err:
        diverged = str(err)
    torch.save(
        {"policy": trained, "stats": stats, "diverged": diverged},
        directory / f"rank{rank}.pt",
    )
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main(Path(sys.argv[1]))
