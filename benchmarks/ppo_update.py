"""PPO update throughput per update path: frames (N·T rows) per second, as JSON.

NavRL's shape: T = 32 steps, 4 epochs × 16 minibatches, over 64/256/1024 envs; on the CPU
and, when present, CUDA; for each `ppo.update_path` that runs there (rl/fast_update.py):
eager (NavRL's loop), fused (no host sync per minibatch) and, on CUDA, cuda_graph; a
`_compiled` suffix (`--paths cuda_graph_compiled`) adds ppo.compile to a fast path. Each
path starts from the same policy, Adam state and batch: its first update (which for
cuda_graph includes the capture) is timed apart and its losses are compared with the
eager path's (`max_stat_rel_diff`); then `--repeats` further updates of each path are
timed, the paths taking turns. Ratios are fast path vs eager at the same scale, in the
same process. `eager_ulp` is the eager
path on the batch with every LiDAR value moved by one float32 ulp: how far rounding alone
carries the update's statistics over 64 Adam steps, the yardstick for "float tolerance".

Run: `.venv/bin/python benchmarks/ppo_update.py [--num-envs 1024] [--devices cuda]`; the
CPU learning runs' shape: `--num-envs 256 --minibatches 4 --mirror --threads 1 --paths fused
fused_compiled`.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import torch
from tensordict import TensorDict

from navrl_daemon.config import PPOConfig
from navrl_daemon.rl import ppo
from navrl_daemon.rl.fast_update import FastUpdate
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


def make_update(path: str, policy: NavRLPolicy, optimizers: dict, device: torch.device):
    if path in ("eager", "eager_ulp"):
        return lambda batch, cfg, gen: ppo.update(policy, optimizers, batch, cfg, gen)
    compiled = path.endswith("_compiled")
    base = path.removesuffix("_compiled")
    if base not in ("fused", "cuda_graph"):
        raise SystemExit(f"unknown path {path!r}")
    fast = FastUpdate(policy, optimizers, device, graphs=base == "cuda_graph", compile=compiled)
    return lambda batch, cfg, gen: fast(batch, cfg, gen)


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


class PathRun:
    """One path's policy, optimisers, batch and generator, and its timings."""

    def __init__(self, device: torch.device, num_envs: int, cfg: PPOConfig, path: str) -> None:
        torch.manual_seed(0)  # every path: the same policy, batch and minibatch draws
        self.device, self.cfg, self.path = device, cfg, path
        policy = NavRLPolicy().to(device)
        self.batch = rollout_batch(policy, num_envs, cfg.rollout_length)
        if path == "eager_ulp":
            lidar = self.batch.get(("agents", "observation", "lidar"))
            lidar.copy_(torch.nextafter(lidar, torch.full_like(lidar, float("inf"))))
        self.update = make_update(path, policy, ppo.make_optimizers(policy, cfg), device)
        self.generator = torch.Generator(device=device).manual_seed(0)
        self.frames = num_envs * cfg.rollout_length
        self.seconds: list[float] = []
        self.first_s, self.first = self.timed()

    def timed(self) -> tuple[float, dict[str, float]]:
        sync(self.device)
        t0 = time.perf_counter()
        stats = self.update(self.batch, self.cfg, self.generator)
        sync(self.device)
        return time.perf_counter() - t0, stats

    def result(self) -> dict[str, object]:
        return {
            "path": self.path,
            "frames_per_s": spread([self.frames / s for s in self.seconds]),
            "update_s": spread(self.seconds),
            "first_update_s": self.first_s,
            "first_stats": {k: self.first[k] for k in ppo.STAT_NAMES},
            "minibatch_updates": self.first["minibatch_updates"],
        }


def compare(device: torch.device, num_envs: int, cfg: PPOConfig, repeats: int, paths: list[str]):
    """Every path at one scale; the timed updates of the paths take turns."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    runs = [PathRun(device, num_envs, cfg, p) for p in paths]
    for _ in range(repeats):
        for run in runs:
            run.seconds.append(run.timed()[0])
    results = {run.path: run.result() for run in runs}
    eager = results["eager"]
    frames = num_envs * cfg.rollout_length
    out: dict[str, object] = {
        "device": str(device),
        "num_envs": num_envs,
        "frames": frames,
        "minibatch_size": frames // cfg.minibatches,
        "gpu_max_allocated_mib": (
            torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None
        ),
        "paths": results,
    }
    for path, run in results.items():
        if path == "eager":
            continue
        out[f"ratio_{path}_vs_eager"] = (
            eager["update_s"]["median"] / run["update_s"]["median"]  # type: ignore[index]
        )
        out[f"max_stat_rel_diff_{path}"] = max(
            abs(run["first_stats"][k] - eager["first_stats"][k])  # type: ignore[index]
            / max(abs(eager["first_stats"][k]), 1e-8)  # type: ignore[index]
            for k in ppo.STAT_NAMES
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-envs", type=int, nargs="+", default=[64, 256, 1024])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--devices", nargs="+", default=None, help="default: cpu (+ cuda)")
    parser.add_argument("--paths", nargs="+", default=None, help="default: all that run there")
    parser.add_argument("--minibatches", type=int, default=16, help="per epoch (NavRL: 16)")
    parser.add_argument("--mirror", action="store_true", help="ppo.mirror: reflected rows too")
    parser.add_argument("--threads", type=int, default=None, help="torch's CPU threads")
    args = parser.parse_args()

    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = PPOConfig(rollout_length=32, epochs=4, minibatches=args.minibatches, mirror=args.mirror)
    devices = args.devices or ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    results = []
    for name in devices:
        device = torch.device(name)
        paths = args.paths or ["eager", "eager_ulp", "fused"] + (
            ["cuda_graph"] if name == "cuda" else []
        )
        if "eager" not in paths:
            paths = ["eager", *paths]
        compare(device, 16, PPOConfig(epochs=1, minibatches=2, mirror=cfg.mirror), 1, paths)  # init
        results += [compare(device, n, cfg, args.repeats, paths) for n in args.num_envs]
    doc = {
        "benchmark": "ppo_update",
        "rollout_length": cfg.rollout_length,
        "epochs": cfg.epochs,
        "minibatches": cfg.minibatches,
        "mirror": cfg.mirror,
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "cpu": platform.processor() or platform.machine(),
        "cuda_device": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "results": results,
    }
    print(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
