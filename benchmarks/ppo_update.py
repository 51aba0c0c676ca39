"""PPO update throughput: frames (N·T rows) per second of `ppo.update`, printed as JSON.

NavRL's shape: T = 32 steps, 4 epochs × 16 minibatches, over 64/256/1024 envs; on the CPU
and, when present, CUDA. Each repeat starts from the same fresh policy and Adam state, so
repeats differ only in timing noise. Run: `.venv/bin/python benchmarks/ppo_update.py`.
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import statistics
import time

import torch
from tensordict import TensorDict

from navrl_daemon.config import PPOConfig
from navrl_daemon.rl import ppo
from navrl_daemon.rl.policy import NavRLPolicy


def random_observation(shape: tuple[int, ...], device: torch.device) -> TensorDict:
    return TensorDict(
        {
            "state": torch.randn(*shape, 8, device=device),
            "lidar": 4.0 * torch.rand(*shape, 1, 36, 4, device=device),
            "direction": torch.randn(*shape, 1, 3, device=device),
            "dynamic_obstacle": torch.randn(*shape, 1, 5, 10, device=device),
        },
        batch_size=shape,
        device=device,
    )


def rollout_batch(policy: NavRLPolicy, num_envs: int, steps: int) -> TensorDict:
    """A [N, T] batch with the collector's keys; the policy fills actions and values."""
    device = next(policy.parameters()).device
    shape = (num_envs, steps)
    td = TensorDict(
        {"agents": {"observation": random_observation(shape, device)}},
        batch_size=shape,
        device=device,
    )
    with torch.no_grad():
        policy.act(td, deterministic=False)
    terminated = torch.rand(*shape, 1, device=device) < 0.01
    truncated = torch.zeros_like(terminated)
    td["next"] = TensorDict(
        {
            "agents": {
                "observation": random_observation(shape, device),
                "reward": torch.randn(*shape, 1, device=device),
            },
            "terminated": terminated,
            "truncated": truncated,
            "done": terminated | truncated,
        },
        batch_size=shape,
        device=device,
    )
    return td


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_updates(
    device: torch.device, num_envs: int, cfg: PPOConfig, repeats: int
) -> dict[str, object]:
    torch.manual_seed(0)
    base = NavRLPolicy().to(device)
    batch = rollout_batch(base, num_envs, cfg.rollout_length)
    seconds = []
    for i in range(repeats):
        policy = copy.deepcopy(base)
        optimizers = ppo.make_optimizers(policy, cfg)
        generator = torch.Generator(device=device).manual_seed(i)
        sync(device)
        t0 = time.perf_counter()
        stats = ppo.update(policy, optimizers, batch, cfg, generator)
        sync(device)
        seconds.append(time.perf_counter() - t0)
    frames = num_envs * cfg.rollout_length
    fps = [frames / s for s in seconds]
    return {
        "device": str(device),
        "num_envs": num_envs,
        "frames": frames,
        "minibatch_size": frames // cfg.minibatches,
        "frames_per_s": {
            "median": statistics.median(fps),
            "min": min(fps),
            "max": max(fps),
        },
        "update_s": {
            "median": statistics.median(seconds),
            "min": min(seconds),
            "max": max(seconds),
        },
        "repeats": repeats,
        "minibatch_updates": stats["minibatch_updates"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-envs", type=int, nargs="+", default=[64, 256, 1024])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--devices", nargs="+", default=None, help="default: cpu (+ cuda)")
    args = parser.parse_args()

    cfg = PPOConfig(rollout_length=32, epochs=4, minibatches=16)
    devices = args.devices or ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    results = []
    for name in devices:
        device = torch.device(name)
        time_updates(device, 16, PPOConfig(epochs=1, minibatches=2), repeats=1)  # warm-up
        results += [time_updates(device, n, cfg, args.repeats) for n in args.num_envs]
    doc = {
        "benchmark": "ppo_update",
        "rollout_length": cfg.rollout_length,
        "epochs": cfg.epochs,
        "minibatches": cfg.minibatches,
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "cpu": platform.processor() or platform.machine(),
        "cuda_device": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "results": results,
    }
    print(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
