"""ppo.update's maths without a host sync per minibatch, and on CUDA replayed as a graph.

NavRL's update (rl/ppo.py, the "eager" path) asks the host after every minibatch whether
the loss and the clipped gradient norms are finite, so a bad minibatch cannot move Adam's
moments. On a GPU that sync, and the hundreds of small ops of each minibatch step (about
600 dispatched in a one-minibatch eager update with foreach Adam, GAE included, counted on
the CPU), bound the update. The paths here compute the same losses, clipping and Adam
step, with two changes of mechanism and none of maths:

- "fused": Adam runs as torch's fused kernel and is told a minibatch was not finite
  through the `found_inf` flag that torch.amp's GradScaler uses: the kernel then leaves
  parameters and moments alone and the step count is put back, all on the device. The
  statistics are summed on the device, masked by the same flag, and read once per update.
- "cuda_graph": the fused path's whole minibatch step (gather, forward, backward, two
  clips, three Adam steps, statistics) captured once as a CUDA graph and replayed; the
  host only copies each minibatch's row indices in and replays. Learning rates and the
  entropy coefficient, which schedules change between updates, are device scalars the
  graph reads; a graph is captured again when the optimiser state it reads is replaced
  (a checkpoint loaded) or a captured constant of the config changes.

The KL early stop (`ppo.target_kl`) is a device flag here: once a minibatch's KL is over
the bar, that step and every later one of the update is skipped through the same
`found_inf`, so the update still reads nothing on the host; their forward and backward
passes run all the same (the eager path stops instead). The steps and statistics match.

Minibatches come from the same generator draws as the eager path (`ppo.minibatch_indices`
per epoch), so on one batch the paths differ only by float rounding (fused vs unfused
Adam): tests/rl/test_fast_update.py holds them to that on the CPU, and on a GPU when there
is one. Optimiser param_groups keep the eager path's plain values between updates (floats
for `lr`, `fused`/`capturable` off), so checkpoints are the same whichever path wrote them.

Every path runs the same losses and minibatch step (`ppo.tensor_losses`, then
`ppo.minibatch_step`: an update's extra terms, backward and clips); the paths differ in how
the optimisers step and how the statistics reach the host. The fast paths cover uniform frame
minibatches in one process, and an extra term (`aux_loss`) everywhere but in a CUDA graph,
which would not see the data the host hands such a term. The rule picks the eager path
for anything else, and for `auto` on a CPU, where there is no launch overhead to save
(benchmarks/throughput.py and ppo_update.py measure both; docs/throughput.md). The rule
itself is `update_path` of config/execution_plan.py, the one place that decides whether a
path can run. `build_update` makes a learner's fast update once, from the path resolved for
what the learner is built with: a `FastUpdate`, or None where the path is "eager" (the
learner then calls ppo.update, which takes a reducer, an extra loss term and any
minibatch source).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import torch
from tensordict import TensorDictBase

from navrl_daemon.config import NOT_FAST, NOT_GRAPH, PPOConfig, UpdatePath
from navrl_daemon.config.execution_plan import compile_step, update_path
from navrl_daemon.rl import ppo
from navrl_daemon.rl.data_parallel import DataParallel
from navrl_daemon.rl.graphs import Replay, StepCapture, capture_graph
from navrl_daemon.rl.policy import NavRLPolicy

AuxLoss = ppo.AuxLoss


def build_update(
    cfg: PPOConfig,
    policy: NavRLPolicy,
    optimizers: dict[str, torch.optim.Optimizer],
    device: torch.device,
    *,
    reducer: DataParallel | None = None,
    aux_loss: AuxLoss | None = None,
    minibatches: ppo.MinibatchSource = ppo.frame_minibatches,
) -> FastUpdate | None:
    """A learner's fast update, its path resolved once (None: the eager path, ppo.update):
    ConfigError (exit 78) if `cfg.update_path` cannot run with these."""
    why_not = None
    if reducer is not None:
        why_not = NOT_FAST["reducer"]
    elif minibatches is not ppo.frame_minibatches:
        why_not = NOT_FAST["env_groups"]
    why_not_graph = NOT_GRAPH["aux_loss"] if aux_loss is not None else None
    path = update_path(cfg.update_path, device, why_not=why_not, why_not_graph=why_not_graph).value
    compile_step(cfg.compile, path)
    if path == "eager":
        return None
    return FastUpdate(
        policy,
        optimizers,
        device,
        graphs=path == "cuda_graph",
        fallback=cfg.update_path == "auto",
        compile=cfg.compile,
        aux_loss=aux_loss,
    )


# The losses of a flat minibatch: `ppo.tensor_losses` of its `loss_inputs`, or the same
# through torch.compile.
LossFunction = Callable[[TensorDictBase, PPOConfig, float | torch.Tensor], ppo.Losses]


def compiled_losses(policy: NavRLPolicy) -> LossFunction:
    """`ppo.tensor_losses` of `policy` through torch.compile: one graph (fullgraph), shapes
    static (a minibatch's size never changes within a run). The PPO constants of `cfg` are
    guarded on: a config that changes them compiles again."""

    def tensor_losses(*inputs: torch.Tensor | float | PPOConfig) -> ppo.Losses:
        return ppo.tensor_losses(policy, *inputs)  # type: ignore[arg-type]

    compiled = torch.compile(tensor_losses, fullgraph=True, dynamic=False)

    def losses(
        mb: TensorDictBase, cfg: PPOConfig, entropy_coef: float | torch.Tensor
    ) -> ppo.Losses:
        return compiled(*ppo.loss_inputs(mb), entropy_coef, cfg)

    return losses


class FastUpdate:
    """The "fused" or "cuda_graph" update of one learner's policy and optimisers."""

    def __init__(
        self,
        policy: NavRLPolicy,
        optimizers: dict[str, torch.optim.Optimizer],
        device: torch.device,
        graphs: bool,
        fallback: bool = False,
        compile: bool = False,
        aux_loss: AuxLoss | None = None,
    ) -> None:
        """`graphs`: capture the step (cuda_graph), else run it as it is (fused).
        `fallback`: if a capture fails, go on with the fused path instead of raising (what
        `auto` asks for; an explicit `cuda_graph` raises); `capture_error` then says why
        (the trainer logs it). `compile`: the step's forward pass and losses through
        torch.compile (ppo.compile), compiled at the first step, before any capture.
        `aux_loss`: extra loss terms per minibatch (never with `graphs`)."""
        self.policy = policy
        self.optimizers = optimizers
        self.device = device
        self.requested: UpdatePath = "cuda_graph" if graphs else "fused"
        self.graphs = graphs
        # No warning where a capture fails: the trainer logs `capture_error`.
        self.capture = StepCapture(self._capture_step, fallback=fallback)
        self.aux_loss = aux_loss
        # The steps' statistics (ppo.Step.names), summed on the device; sized by the
        # first step, which names its terms.
        self.names: tuple[str, ...] = ppo.STAT_NAMES
        self.sums: torch.Tensor | None = None
        self.applied = torch.zeros((), device=device, dtype=torch.long)
        # ppo.target_kl: 1.0 once a minibatch's KL passed the bar (the rest are skipped);
        # the steps it skipped.
        self.kl_halted = torch.zeros((), device=device)
        self.kl_stopped = torch.zeros((), device=device, dtype=torch.long)
        # 1.0 forces every step to be skipped: the warm-up before a capture.
        self.force_skip = torch.zeros((), device=device)
        self.entropy_coef = torch.zeros((), device=device)
        self.lrs = {name: torch.zeros((), device=device) for name in optimizers}
        self._replay: Replay | None = None
        self._key: tuple[object, ...] | None = None
        self._flat: TensorDictBase | None = None
        self._idx: torch.Tensor | None = None
        self._losses = compiled_losses(policy) if compile else None

    # ------------------------------------------------------------------------ public

    @property
    def capture_error(self) -> str | None:
        """Why the step's capture failed, where `fallback` went on fused."""
        return self.capture.capture_error

    @property
    def captures(self) -> int:
        return self.capture.captures

    @property
    def path(self) -> UpdatePath:
        """The path resolved (a failed capture under "auto" goes on fused: capture_error)."""
        return self.requested

    def __call__(
        self,
        batch: TensorDictBase,
        cfg: PPOConfig,
        generator: torch.Generator | None,
        abort: threading.Event | None = None,
        release: Callable[[], None] | None = None,
        progress: Callable[[int, int], None] | None = None,
    ) -> dict[str, float]:
        """What ppo.update returns, for the same arguments (no reducer, no aux loss).
        Reads `batch` to the end: `release` is never called (the caller releases it).
        `progress(done, total)`: the minibatch steps launched (they run on asynchronously)."""
        advantages, targets = ppo.advantages_and_targets(self.policy, batch, cfg)
        data = ppo.update_data(batch, advantages, targets)
        flat = data.reshape(-1)
        rows = flat.shape[0]
        self._zero_counts()
        self.entropy_coef.fill_(cfg.entropy_coef)
        # The graph and the compiled losses read the coefficient from the device scalar (a
        # float would be baked in); the plain fused step takes the float, as eager does.
        entropy_coef = self.entropy_coef if self._losses is not None else cfg.entropy_coef
        steps, total = 0, cfg.epochs * cfg.minibatches
        with self._fused_optimizers():
            if self.graphs:
                self._prepare_graph(flat, cfg, rows // cfg.minibatches)
            for idx in self._minibatch_rows(rows, cfg, generator):
                if abort is not None and abort.is_set():
                    break
                if self._replay is not None:
                    assert self._idx is not None
                    self._idx.copy_(idx, non_blocking=True)
                    self._replay()
                else:
                    self._step(flat[idx], cfg, entropy_coef)
                steps += 1
                if progress is not None:
                    progress(steps, total)
        if self._replay is None:
            self._zero_grad()
        applied = int(self.applied.item())  # the update's one host sync for statistics
        kl_stopped = int(self.kl_stopped.item())
        sums = self.sums.tolist() if self.sums is not None else []
        means = [s / applied for s in sums] if applied else [float("nan")] * len(self.names)
        return {
            **dict(zip(self.names, means, strict=True)),
            "minibatch_updates": applied,
            "nonfinite_updates": steps - applied - kl_stopped,
            "kl_stopped_steps": kl_stopped,
        }

    # ------------------------------------------------------------------------ the step

    def _zero_counts(self) -> None:
        if self.sums is not None:
            self.sums.zero_()
        self.applied.zero_()
        self.kl_halted.zero_()
        self.kl_stopped.zero_()

    def _step(self, mb: TensorDictBase, cfg: PPOConfig, entropy_coef: float | torch.Tensor) -> None:
        """One minibatch: `ppo.minibatch_step`, a masked Adam step, statistics. Nothing
        here reads a device value on the host, so it can be captured."""
        if self._losses is not None:
            losses = self._losses(mb, cfg, entropy_coef)
        else:
            losses = ppo.tensor_losses(self.policy, *ppo.loss_inputs(mb), entropy_coef, cfg)
        step = ppo.minibatch_step(
            self.policy, self.optimizers, mb, cfg, losses, aux_loss=self.aux_loss
        )
        kl_bar = ppo.kl_stop_bar(cfg)
        if kl_bar is not None:  # from this minibatch on, every step is skipped
            halt = (step.measured[0] > kl_bar).float()
            self.kl_halted.copy_(torch.maximum(self.kl_halted, halt))
        bad = (~step.finite()).float()
        found_inf = torch.maximum(torch.maximum(bad, self.force_skip), self.kl_halted)
        for opt in self.optimizers.values():
            opt.found_inf = found_inf  # type: ignore[attr-defined]  # GradScaler's protocol
            try:
                opt.step()
            finally:
                del opt.found_inf  # type: ignore[attr-defined]
        with torch.no_grad():
            ok = found_inf == 0
            stats = step.stats(mb, cfg)
            if self.sums is None:
                self.names, self.sums = step.names, torch.zeros_like(stats)
            elif step.names != self.names:
                raise ValueError(f"loss terms {step.names} after {self.names}: aux_loss "
                                 "must name the same terms every minibatch")  # fmt: skip
            self.sums += torch.where(ok, stats, torch.zeros_like(stats))
            self.applied += ok.long()
            self.kl_stopped += (self.kl_halted > 0).long()

    def _minibatch_rows(
        self, rows: int, cfg: PPOConfig, generator: torch.Generator | None
    ) -> Iterator[torch.Tensor]:
        """The eager path's minibatch rows, from the same generator draws."""
        for _ in range(cfg.epochs):
            yield from ppo.minibatch_indices(rows, cfg.minibatches, generator, self.device)

    def _zero_grad(self) -> None:
        for opt in self.optimizers.values():
            opt.zero_grad(set_to_none=True)

    # ------------------------------------------------------------------------ optimisers

    @contextmanager
    def _fused_optimizers(self) -> Iterator[None]:
        """Fused (and on CUDA capturable) Adam for the update's duration; the groups' own
        values back afterwards, so a checkpoint looks the same whichever path ran."""
        saved = []
        capturable = self.graphs  # on CUDA only; fused alone needs only device step counts
        for name, opt in self.optimizers.items():
            for group in opt.param_groups:
                saved.append((group, {k: group[k] for k in ("fused", "capturable", "foreach")}))
                self.lrs[name].fill_(float(group["lr"]))
                group.update(fused=True, capturable=capturable, foreach=False)
            for state in opt.state.values():
                step = state.get("step")
                if isinstance(step, torch.Tensor) and step.device != self.device:
                    state["step"] = step.to(self.device, torch.float32)
        try:
            yield
        finally:
            for group, values in saved:
                group.update(values)

    @contextmanager
    def _tensor_lrs(self) -> Iterator[None]:
        """During a capture, each group's lr is the device scalar the graph will read."""
        saved = []
        for name, opt in self.optimizers.items():
            for group in opt.param_groups:
                saved.append((group, group["lr"]))
                group["lr"] = self.lrs[name]
        try:
            yield
        finally:
            for group, lr in saved:
                group["lr"] = lr

    # ------------------------------------------------------------------------ the graph

    def _prepare_graph(self, flat: TensorDictBase, cfg: PPOConfig, size: int) -> None:
        """Copy this update's batch into the graph's input buffers; capture if needed."""
        key = self._graph_key(flat, cfg, size)
        if self._replay is not None and key == self._key:
            assert self._flat is not None
            self._flat.update_(flat)
            return
        self._replay = None
        self._flat = flat.clone()
        self._idx = torch.zeros(size, dtype=torch.long, device=self.device)
        static_flat, idx = self._flat, self._idx

        def step() -> None:
            self._step(static_flat[idx], cfg, self.entropy_coef)

        try:
            with self._tensor_lrs():
                self._replay = self.capture(step)
        finally:
            if self._replay is None:  # failed: the warm-up's skip flag and buffers dropped
                self.force_skip.fill_(0.0)
                self._flat = self._idx = None
        if self._replay is None:  # under `fallback`: fused from now on
            self.graphs = False
            return
        # Again: the warm-up creates Adam's state on a first update.
        self._key = self._graph_key(flat, cfg, size)

    def _graph_key(self, flat: TensorDictBase, cfg: PPOConfig, size: int) -> tuple[object, ...]:
        """What a captured graph depends on besides its buffers: shapes, the constants
        baked into its kernels, and the identity of every optimiser state tensor."""
        state = tuple(
            t.data_ptr()
            for opt in self.optimizers.values()
            for s in opt.state.values()
            for t in s.values()
            if isinstance(t, torch.Tensor)
        )
        params = tuple(p.data_ptr() for p in self.policy.parameters())
        baked = (
            cfg.clip_ratio,
            cfg.dual_clip,
            cfg.value_clip,
            cfg.huber_delta,
            cfg.max_grad_norm,
            cfg.mirror,
            cfg.feature_extractor_max_grad_norm,
            cfg.target_kl,
        )
        hyper = tuple(
            (g["betas"], g["eps"], g["weight_decay"], g["amsgrad"], g["maximize"])
            for opt in self.optimizers.values()
            for g in opt.param_groups
        )
        shapes = tuple((k, tuple(v.shape)) for k, v in flat.items(True, True))
        return (size, shapes, baked, hyper, params, state)

    def _capture_step(
        self,
        step: Callable[[], None],
        *,
        warmup_runs: int,
        generators: Sequence[torch.Generator],
    ) -> Replay:
        """The minibatch step's `Capture`: a CUDA graph whose warm-up runs are skipped Adam
        steps (maths-neutral), the counts zeroed before the capture."""

        def warmup() -> None:
            self.force_skip.fill_(1.0)
            step()

        def prepare() -> None:
            self.force_skip.fill_(0.0)
            self._zero_counts()

        return capture_graph(
            warmup, prepare, step, self.device, warmup_runs=warmup_runs, generators=generators
        )
