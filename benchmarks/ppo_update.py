"""PPO update throughput per variant, its FLOPs and how close it runs to the machine's
peak, as JSON.

A variant is an update path with an option, `PATH[+native|+matmul]`:
- PATH: `eager` (NavRL's loop), `fused` (no host sync per minibatch), `cuda_graph` (CUDA),
  `_compiled` adds ppo.compile (rl/fast_update.py);
- `+native` / `+matmul`: how the LiDAR CNN's convolutions run (ppo.lidar_conv; without
  it "auto": matmul on the CPU).
The first variant is the baseline every other is compared with (`ratio_vs_baseline`:
baseline seconds / variant seconds, medians over `--repeats` timed updates that take
turns). Each variant starts from the same policy, Adam state and batch; its first
update (compilation, capture) is timed apart, and its statistics are compared with the
baseline's first update (`max_stat_rel_diff`). `eager_ulp`, when listed, is the eager
path on the batch with every LiDAR value moved by one float32 ulp: how far rounding alone
carries the statistics over the update's Adam steps, the yardstick for "float rounding".

Per scale and thread count it also reports (`--flops`, on by default on the CPU): the
update's FLOPs by torch's FLOP counter (convolutions and matrix products, forward and
backward, counted with the native convolutions: the network's own arithmetic), split
into the LiDAR CNN and the rest; the machine's float32 peak in the same run (a 4096³
matrix product); each variant's achieved FLOP/s and its fraction of that peak; and the
seconds of one minibatch step split into the LiDAR CNN, the MLPs and heads, the loss
and the rest, and the optimisers, per convolution lowering.

Runs: NavRL's shape (T = 32, 4 epochs × 16 minibatches) by default,
`.venv/bin/python benchmarks/ppo_update.py [--num-envs 1024] [--devices cuda]`; the CPU
learning runs' shape (config/navrl.toml at 256 envs × 128 steps, one and two threads,
the recipe before the matmul lowering, `fused_compiled+native`, as the baseline):
`--cpu-recipe`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from tensordict import TensorDict
from torch.utils.flop_counter import FlopCounterMode

from navrl_daemon.config import PPOConfig, load_config
from navrl_daemon.rl import ppo
from navrl_daemon.rl.fast_update import FastUpdate
from navrl_daemon.rl.lidar_cnn import Lowering
from navrl_daemon.rl.policy import NavRLPolicy, observation
from navrl_daemon.runtime import heap

ROOT = Path(__file__).resolve().parents[1]
CPU_RECIPE_VARIANTS = [
    "fused_compiled+native",  # the CPU recipe before the matmul lowering
    "fused_compiled+matmul",  # the CPU recipe now
]


@dataclass(frozen=True)
class Variant:
    name: str
    path: str  # eager, eager_ulp, fused, cuda_graph
    compiled: bool
    lidar_conv: Lowering

    @classmethod
    def parse(cls, name: str) -> Variant:
        path, *options = name.split("+")
        compiled = path.endswith("_compiled")
        path = path.removesuffix("_compiled")
        if path not in ("eager", "eager_ulp", "fused", "cuda_graph"):
            raise SystemExit(f"unknown update path in {name!r}")
        if compiled and path.startswith("eager"):
            raise SystemExit(f"{name!r}: the eager path does not compile")
        unknown = set(options) - {"native", "matmul"}
        if unknown:
            raise SystemExit(f"unknown options {sorted(unknown)} in {name!r}")
        conv: Lowering = (
            "native" if "native" in options else "matmul" if "matmul" in options else "auto"
        )
        return cls(name, path, compiled, conv)


def random_observation(shape: tuple[int, ...], device: torch.device) -> TensorDict:
    lidar = 4.0 * torch.rand(*shape, 1, 36, 4, device=device)
    lidar[lidar < 2.0] = 0.0  # most beams hit nothing in the pillar field
    return TensorDict(
        {
            "state": torch.randn(*shape, 8, device=device),
            "lidar": lidar,
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


def cpu_name() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def make_update(variant: Variant, policy: NavRLPolicy, optimizers: dict, device: torch.device):
    if variant.path.startswith("eager"):
        return lambda batch, cfg, gen: ppo.update(policy, optimizers, batch, cfg, gen)
    fast = FastUpdate(
        policy, optimizers, device, graphs=variant.path == "cuda_graph", compile=variant.compiled
    )
    return lambda batch, cfg, gen: fast(batch, cfg, gen)


class VariantRun:
    """One variant's policy, optimisers, batch and generator, and its timings."""

    def __init__(self, device: torch.device, num_envs: int, cfg: PPOConfig, variant: Variant):
        torch.manual_seed(0)  # every variant: the same policy, batch and minibatch draws
        self.device, self.cfg, self.variant = device, cfg, variant
        policy = NavRLPolicy(lidar_conv=variant.lidar_conv).to(device)
        self.batch = rollout_batch(policy, num_envs, cfg.rollout_length)
        if variant.path == "eager_ulp":
            lidar = self.batch.get(("agents", "observation", "lidar"))
            lidar.copy_(torch.nextafter(lidar, torch.full_like(lidar, float("inf"))))
        self.update = make_update(variant, policy, ppo.make_optimizers(policy, cfg), device)
        self.generator = torch.Generator(device=device).manual_seed(0)
        self.frames = num_envs * cfg.rollout_length
        self.seconds: list[float] = []
        self.cpu_seconds: list[float] = []
        self.first_s, self.first = self.timed()

    def timed(self) -> tuple[float, dict[str, float]]:
        """An update's wall seconds and statistics; its CPU seconds (all threads of this
        process: steadier than the wall on a shared machine) to `cpu_seconds`."""
        sync(self.device)
        t0, c0 = time.perf_counter(), time.process_time()
        stats = self.update(self.batch, self.cfg, self.generator)
        sync(self.device)
        self.cpu_seconds.append(time.process_time() - c0)
        return time.perf_counter() - t0, stats

    def result(self, flops: float | None, peak: dict[str, float] | None) -> dict[str, object]:
        out: dict[str, object] = {
            "variant": self.variant.name,
            "frames_per_s": spread([self.frames / s for s in self.seconds]),
            "update_s": spread(self.seconds),
            "update_cpu_s": spread(self.cpu_seconds[1:]),
            "first_update_s": self.first_s,
            "first_stats": {k: self.first[k] for k in ppo.STAT_NAMES},
            "minibatch_updates": self.first["minibatch_updates"],
        }
        if flops is not None:
            for clock, seconds in (("wall", self.seconds), ("cpu", self.cpu_seconds[1:])):
                achieved = flops / statistics.median(seconds)
                out[f"achieved_gflop_per_{clock}_s"] = achieved / 1e9
                if peak is not None:
                    out[f"fraction_of_peak_{clock}"] = achieved / peak[clock]
        return out


def count_flops(num_envs: int, cfg: PPOConfig, device: torch.device) -> dict[str, float]:
    """FLOPs of one update (native convolutions): the advantages' value pass plus
    epochs × minibatches minibatch steps, each counted once; the LiDAR CNN's share."""
    torch.manual_seed(0)
    policy = NavRLPolicy(lidar_conv="native").to(device)
    batch = rollout_batch(policy, num_envs, cfg.rollout_length)
    optimizers = ppo.make_optimizers(policy, cfg)
    counter = FlopCounterMode(display=False)
    with counter:
        advantages, targets = ppo.advantages_and_targets(policy, batch, cfg)
    gae = counter.get_total_flops()
    flat = ppo.update_data(batch, advantages, targets).reshape(-1)
    rows = flat.shape[0] // cfg.minibatches
    counter = FlopCounterMode(display=False)
    with counter:
        mb = flat[:rows]
        losses = ppo.tensor_losses(policy, *ppo.loss_inputs(mb), cfg.entropy_coef, cfg)
        ppo.minibatch_step(policy, optimizers, mb, cfg, losses)
    step = counter.get_total_flops()
    lidar = observation(flat[:rows])[1]
    if cfg.mirror:
        lidar = torch.cat((lidar, lidar))
    counter = FlopCounterMode(display=False)
    with counter:  # the LiDAR CNN's forward and backward passes alone, as in the step
        policy.feature_extractor.module[0](lidar).sum().backward()
    cnn = counter.get_total_flops()
    steps = cfg.epochs * cfg.minibatches
    total = gae + steps * step
    return {
        "update_flops": float(total),
        "minibatch_step_flops": float(step),
        "lidar_cnn_share": steps * cnn / total,
        "flops_per_frame": total / (num_envs * cfg.rollout_length),
    }


def matmul_peak(device: torch.device, repeats: int = 3) -> dict[str, float]:
    """float32 FLOP/s of a 4096³ matrix product at the current thread count, by the wall
    and per CPU second of this process."""
    n = 4096
    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    out = torch.empty(n, n, device=device)
    torch.mm(a, b, out=out)
    wall, cpu = [], []
    for _ in range(repeats):
        sync(device)
        t0, c0 = time.perf_counter(), time.process_time()
        torch.mm(a, b, out=out)
        sync(device)
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    flops = 2 * n**3
    return {"wall": flops / statistics.median(wall), "cpu": flops / statistics.median(cpu)}


def step_split(
    num_envs: int, cfg: PPOConfig, device: torch.device, lowering: Lowering, repeats: int
) -> dict[str, float]:
    """Seconds of one eager minibatch step (its 2B rows with ppo.mirror) and its parts,
    medians of `repeats`: the LiDAR CNN's and the MLPs' forward and backward passes alone,
    the optimisers' steps, and the loss and the rest (the step less those)."""
    torch.manual_seed(0)
    policy = NavRLPolicy(lidar_conv=lowering).to(device)
    batch = rollout_batch(policy, num_envs, cfg.rollout_length)
    optimizers = ppo.make_optimizers(policy, cfg)
    advantages, targets = ppo.advantages_and_targets(policy, batch, cfg)
    flat = ppo.update_data(batch, advantages, targets).reshape(-1)
    mb = flat[: flat.shape[0] // cfg.minibatches]
    state, lidar, dynamic = observation(mb)
    if cfg.mirror:
        state, lidar, dynamic = (torch.cat((t, t)) for t in (state, lidar, dynamic))
    cnn, mlp, _, trunk = policy.feature_extractor.module
    cnn_out = torch.randn(lidar.shape[0], 128, device=device)

    def whole() -> None:
        losses = ppo.tensor_losses(policy, *ppo.loss_inputs(mb), cfg.entropy_coef, cfg)
        ppo.minibatch_step(policy, optimizers, mb, cfg, losses)
        for opt in optimizers.values():
            opt.step()

    def cnn_pass() -> None:
        cnn(lidar).sum().backward()

    def mlp_pass() -> None:
        dyn = mlp(dynamic.reshape(-1, *dynamic.shape[-3:]))
        feature = trunk(torch.cat((cnn_out, dyn, state), -1))
        alpha, beta = policy.beta_head(feature)
        (alpha.sum() + beta.sum() + policy.value(feature).sum()).backward()

    def optimisers() -> None:
        for opt in optimizers.values():
            opt.step()

    def timed(fn: Callable[[], None]) -> float:
        fn()
        seconds = []
        for _ in range(repeats):
            sync(device)
            t0 = time.perf_counter()
            fn()
            sync(device)
            seconds.append(time.perf_counter() - t0)
        return statistics.median(seconds)

    step = timed(whole)
    parts = {"lidar_cnn_s": timed(cnn_pass), "mlps_s": timed(mlp_pass)}
    parts["optimisers_s"] = timed(optimisers)
    parts["loss_and_rest_s"] = step - sum(parts.values())
    return {"step_s": step, **parts}


def compare(
    device: torch.device,
    num_envs: int,
    cfg: PPOConfig,
    repeats: int,
    variants: list[Variant],
    flops: dict[str, float] | None,
    peak: dict[str, float] | None,
) -> dict[str, object]:
    """Every variant at one scale; the timed updates of the variants take turns."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    runs = [VariantRun(device, num_envs, cfg, v) for v in variants]
    for _ in range(repeats):
        for run in runs:
            run.seconds.append(run.timed()[0])
    total = flops["update_flops"] if flops else None
    results = {run.variant.name: run.result(total, peak) for run in runs}
    base = results[variants[0].name]
    frames = num_envs * cfg.rollout_length
    out: dict[str, object] = {
        "device": str(device),
        "num_envs": num_envs,
        "frames": frames,
        "minibatch_size": frames // cfg.minibatches,
        "baseline": variants[0].name,
        "gpu_max_allocated_mib": (
            torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None
        ),
        "variants": results,
    }
    for name, run in results.items():
        if name == variants[0].name:
            continue
        for clock in ("update_s", "update_cpu_s"):
            out[f"ratio_vs_baseline_{clock}_{name}"] = (
                base[clock]["median"] / run[clock]["median"]  # type: ignore[index]
            )
        out[f"max_stat_rel_diff_{name}"] = max(
            abs(run["first_stats"][k] - base["first_stats"][k])  # type: ignore[index]
            / max(abs(base["first_stats"][k]), 1e-8)  # type: ignore[index]
            for k in ppo.STAT_NAMES
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-envs", type=int, nargs="+", default=None)
    parser.add_argument("--rollout-length", type=int, default=None, help="T (NavRL: 32)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--devices", nargs="+", default=None, help="default: cpu (+ cuda)")
    parser.add_argument(
        "--paths", nargs="+", default=None, help="variants; the first is the baseline"
    )
    parser.add_argument("--minibatches", type=int, default=None, help="per epoch (NavRL: 16)")
    parser.add_argument("--mirror", action="store_true", help="ppo.mirror: reflected rows too")
    parser.add_argument("--config", type=Path, default=None, help="the [ppo] section of a config")
    parser.add_argument("--threads", type=int, nargs="+", default=None, help="torch's CPU threads")
    parser.add_argument("--split-repeats", type=int, default=3, help="0: no step split")
    parser.add_argument(
        "--cpu-recipe",
        action="store_true",
        help="config/navrl.toml at 256 envs x 128 steps, 1 and 2 threads, today's recipe "
        "against its pre-matmul baseline",
    )
    args = parser.parse_args()

    heap.pin_mmap_threshold()  # as the daemon does: large tensors mapped afresh
    if args.cpu_recipe:
        args.config = args.config or ROOT / "config" / "navrl.toml"
        args.num_envs = args.num_envs or [256]
        args.rollout_length = args.rollout_length or 128
        args.threads = args.threads or [1, 2]
        args.paths = args.paths or CPU_RECIPE_VARIANTS
        args.devices = args.devices or ["cpu"]
    cfg = load_config(args.config).ppo if args.config else PPOConfig(minibatches=16)
    update = {"rollout_length": args.rollout_length or (cfg.rollout_length if args.config else 32)}
    if args.minibatches:
        update["minibatches"] = args.minibatches
    if args.mirror:
        update["mirror"] = True
    cfg = cfg.model_copy(update=update)
    devices = args.devices or ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    results = []
    for name in devices:
        device = torch.device(name)
        names = args.paths or ["eager", "eager_ulp", "fused"] + (
            ["cuda_graph"] if name == "cuda" else []
        )
        variants = [Variant.parse(n) for n in names]
        small = PPOConfig(epochs=1, minibatches=2, mirror=cfg.mirror)
        compare(device, 16, small, 1, variants, None, None)  # initialisation
        for threads in args.threads or [torch.get_num_threads()]:
            torch.set_num_threads(threads)
            peak = matmul_peak(device)
            for num_envs in args.num_envs or [64, 256, 1024]:
                flops = count_flops(num_envs, cfg, device) if device.type == "cpu" else None
                row = compare(device, num_envs, cfg, args.repeats, variants, flops, peak)
                row.update(threads=threads, flops=flops)
                row["peak_gflop_per_s"] = {clock: v / 1e9 for clock, v in peak.items()}
                if args.split_repeats:
                    row["step_split_eager"] = {
                        conv: step_split(num_envs, cfg, device, conv, args.split_repeats)
                        for conv in ("native", "matmul")
                    }
                results.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)  # progress
    doc = {
        "benchmark": "ppo_update",
        "ppo": {k: getattr(cfg, k) for k in ("rollout_length", "epochs", "minibatches", "mirror")},
        "torch": torch.__version__,
        "cpu": cpu_name(),
        "load_average_end": list(os.getloadavg()),
        "cuda_device": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "results": results,
    }
    print(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
