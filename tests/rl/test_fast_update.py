"""The fused and CUDA-graph updates against NavRL's eager update, on the same batches.

Runs on the CPU ("fused") in CI; every CUDA case runs where a GPU is present
(benchmarks/device/gpu_session.sh runs this file there) and is skipped otherwise.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch._dynamo.utils import counters as dynamo_counters

from navrl_daemon.config import Config, PPOConfig
from navrl_daemon.config.execution_plan import update_path
from navrl_daemon.errors import ConfigError
from navrl_daemon.rl import fast_update, ppo
from navrl_daemon.rl.fast_update import FastUpdate
from navrl_daemon.rl.learner import Learner
from navrl_daemon.rl.policy import NavRLPolicy
from navrl_daemon.testing.host_reads import CountHostReads

SMALL = PPOConfig(epochs=2, minibatches=4)
CUDA = torch.cuda.is_available()

PATHS = [
    pytest.param("cpu", False, id="fused-cpu"),
    # The graph path's bookkeeping on the CPU, with a stand-in for the capture (below).
    pytest.param("cpu", True, id="graph-standin-cpu"),
    pytest.param(
        "cuda", False, id="fused-cuda", marks=pytest.mark.skipif(not CUDA, reason="no CUDA")
    ),
    pytest.param(
        "cuda", True, id="graph-cuda", marks=pytest.mark.skipif(not CUDA, reason="no CUDA")
    ),
]
# Fused vs for-loop/foreach Adam: the same maths, rounded differently.
TOL = {"rtol": 1e-4, "atol": 1e-5}


@pytest.fixture(autouse=True)
def _no_tf32_on_cuda(request):
    """The CUDA cases compare two paths at TOL, and cuDNN's convolutions use TF32 by
    default: it rounds their inputs to 10 mantissa bits, so weights that fused and
    for-each Adam leave a float32 ulp apart can round ~1e-3 apart at the next step, far
    above TOL. A guess at the `fused-cuda-mirror` failure seen once on an H200 (no
    traceback came back). With TF32 off, what is left between the paths is their maths."""
    if "cuda" not in request.node.name:
        yield
        return
    # Not monkeypatch: it takes the old value from the instance __dict__, where these
    # modules (flags behind __getattr__/__setattr__) keep none, so its undo raises.
    before = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = before


@pytest.fixture(autouse=True)
def _graph_standin_on_cpu(monkeypatch, request):
    """On a CPU, `capture_graph` becomes a stand-in that runs the warm-up and preparation
    as the real one does and returns a "replay" that runs the step eagerly on the same
    static buffers. So everything of the graph path but CUDA's capture itself runs in CI:
    the batch copied into static buffers, rows copied into the index buffer, device-scalar
    learning rates and entropy coefficient, the maths-neutral warm-up, re-captures."""
    if "graph-standin-cpu" not in request.node.name:
        return

    def standin(warmup, prepare, step, device, *, warmup_runs, generators):
        assert device.type == "cpu"
        for _ in range(warmup_runs):
            warmup()
        prepare()
        return step

    monkeypatch.setattr(fast_update, "capture_graph", standin)


def _pair(make_batch, device: str, seed: int = 0, separate_critic: bool = False):
    torch.manual_seed(seed)
    base = NavRLPolicy(separate_critic=separate_critic)
    batch = make_batch(base, num_envs=8, steps=6, seed=seed).to(device)
    return base.to(device), batch


def _eager(policy, batch, cfg, seed):
    opts = ppo.make_optimizers(policy, cfg)
    stats = ppo.update(policy, opts, batch, cfg, torch.Generator(batch.device).manual_seed(seed))
    return stats, opts


def _assert_close_stats(fast: dict[str, float], eager: dict[str, float]) -> None:
    assert fast.keys() == eager.keys()
    assert fast["minibatch_updates"] == eager["minibatch_updates"]
    assert fast["nonfinite_updates"] == eager["nonfinite_updates"]
    assert fast["kl_stopped_steps"] == eager["kl_stopped_steps"]
    for name in ppo.STAT_NAMES:
        # value_clipped counts rows beyond a threshold: within the paths' rounding a row
        # may sit on either side of it (one row of a 12-row minibatch, over 8 steps: 0.01).
        slack = 0.011 if name == "value_clipped" else 1e-5
        assert fast[name] == pytest.approx(eager[name], rel=1e-4, abs=slack), name


def _assert_close_weights(a: NavRLPolicy, b: NavRLPolicy) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    for key in sa:
        torch.testing.assert_close(sa[key], sb[key], **TOL, msg=key)


@pytest.mark.parametrize(
    ("mirror", "separate"),
    [(False, False), (True, False), (False, True)],
    ids=["plain", "mirror", "separate-critic"],
)
@pytest.mark.parametrize(("device", "graphs"), PATHS)
def test_one_update_matches_eager(make_batch, device, graphs, mirror, separate):
    """Also with ppo.mirror, whose reflected rows are built inside the captured step, and
    with ppo.separate_critic (a fourth optimiser, the critic's clip over its extractor)."""
    cfg = SMALL.model_copy(update={"mirror": mirror, "separate_critic": separate})
    base, batch = _pair(make_batch, device, separate_critic=separate)
    eager_policy, fast_policy = copy.deepcopy(base), copy.deepcopy(base)
    eager_stats, eager_opts = _eager(eager_policy, batch, cfg, seed=3)

    opts = ppo.make_optimizers(fast_policy, cfg)
    fast = FastUpdate(fast_policy, opts, torch.device(device), graphs)
    stats = fast(batch, cfg, torch.Generator(device).manual_seed(3))

    _assert_close_stats(stats, eager_stats)
    _assert_close_weights(fast_policy, eager_policy)
    for name, opt in opts.items():
        mine, theirs = opt.state_dict()["state"], eager_opts[name].state_dict()["state"]
        for i in theirs:
            assert float(mine[i]["step"]) == float(theirs[i]["step"]) == 8.0
            torch.testing.assert_close(mine[i]["exp_avg_sq"], theirs[i]["exp_avg_sq"], **TOL)
    assert fast.captures == (1 if graphs else 0)


@pytest.mark.parametrize("target_kl", [1e-9, 1.0], ids=["kl-stop", "kl-loose"])
@pytest.mark.parametrize(("device", "graphs"), PATHS)
def test_the_update_guards_match_eager(make_batch, device, graphs, target_kl):
    """ppo.target_kl and ppo.feature_extractor_max_grad_norm: the fast paths skip the
    steps from the one over the KL bar on (a device flag, no host read) where eager
    stops; same steps taken, same weights, same statistics."""
    guards = {"target_kl": target_kl, "feature_extractor_max_grad_norm": 1e-3, "dual_clip": 3.0}
    cfg = SMALL.model_copy(update=guards)
    base, batch = _pair(make_batch, device, seed=5)
    eager_policy, fast_policy = copy.deepcopy(base), copy.deepcopy(base)
    eager_stats, _ = _eager(eager_policy, batch, cfg, seed=3)
    opts = ppo.make_optimizers(fast_policy, cfg)
    fast = FastUpdate(fast_policy, opts, torch.device(device), graphs)
    stats = fast(batch, cfg, torch.Generator(device).manual_seed(3))

    stopped = 7 if target_kl < 1e-3 else 0
    assert stats["kl_stopped_steps"] == eager_stats["kl_stopped_steps"] == stopped
    _assert_close_stats(stats, eager_stats)
    _assert_close_weights(fast_policy, eager_policy)
    # The extractor's gradients were clipped (its norm is far above 1e-3).
    assert stats["feature_extractor_grad_norm"] > 1e-2


@pytest.mark.parametrize(("device", "graphs"), PATHS)
def test_consecutive_updates_follow_schedules_like_eager(make_batch, device, graphs):
    """Learning rate and entropy coefficient change between updates: a graph reads them
    from device scalars, so it is captured once and still follows them."""
    _follow_schedules(make_batch, device, graphs, compile=False)


@pytest.mark.parametrize(
    ("device", "graphs"),
    [
        # Compiling takes ~40 s on a 2-core machine; the second case hits inductor's cache.
        pytest.param("cpu", False, id="fused-cpu-compiled"),
        pytest.param("cpu", True, id="graph-standin-cpu-compiled"),
        pytest.param(
            "cuda",
            True,
            id="graph-cuda-compiled",
            marks=pytest.mark.skipif(not CUDA, reason="no CUDA"),
        ),
    ],
)
def test_a_compiled_step_follows_schedules_like_eager(make_batch, device, graphs):
    """ppo.compile: the step's forward pass and losses through torch.compile give NavRL's
    eager updates, within float rounding, across schedule changes (the entropy
    coefficient is a device scalar the compiled code reads, not a constant baked in)."""
    _follow_schedules(make_batch, device, graphs, compile=True)


def _follow_schedules(make_batch, device: str, graphs: bool, compile: bool) -> None:
    base, batch = _pair(make_batch, device, seed=1)
    eager_policy, fast_policy = copy.deepcopy(base), copy.deepcopy(base)
    eager_opts = ppo.make_optimizers(eager_policy, SMALL)
    fast_opts = ppo.make_optimizers(fast_policy, SMALL)
    fast = FastUpdate(fast_policy, fast_opts, torch.device(device), graphs, compile=compile)
    compiles = []
    g_eager, g_fast = (torch.Generator(device).manual_seed(5) for _ in range(2))
    for i, (scale, coef) in enumerate([(1.0, 1e-3), (0.5, 0.02), (0.25, 0.0)]):
        cfg = SMALL.model_copy(update={"entropy_coef": coef})
        for opts in (eager_opts, fast_opts):
            for name, lr in ppo.learning_rates(cfg).items():
                for group in opts[name].param_groups:
                    group["lr"] = lr * scale
        eager = ppo.update(eager_policy, eager_opts, batch, cfg, g_eager)
        stats = fast(batch, cfg, g_fast)
        compiles.append(dynamo_counters["stats"]["unique_graphs"])
        _assert_close_stats(stats, eager)
        _assert_close_weights(fast_policy, eager_policy)
        assert stats["entropy_loss"] == pytest.approx(eager["entropy_loss"], rel=1e-4, abs=1e-7), i
    assert fast.captures == (1 if graphs else 0)
    if compile:  # compiled once: a new entropy coefficient or lr compiles nothing again
        assert compiles[0] >= 1 and compiles[1:] == [compiles[0]] * 2, compiles


@pytest.mark.parametrize(("device", "graphs"), PATHS)
def test_nonfinite_minibatches_are_skipped_on_device_as_eager_skips_them(
    make_batch, device, graphs
):
    """One NaN frame poisons exactly the minibatches that hold it, in both paths: Adam's
    moments and step counts stay where they were, and the statistics leave them out."""
    base, batch = _pair(make_batch, device, seed=2)
    batch["agents", "observation", "state"][2, 3, 0] = float("nan")
    eager_policy, fast_policy = copy.deepcopy(base), copy.deepcopy(base)
    eager_stats, _ = _eager(eager_policy, batch, SMALL, seed=4)
    opts = ppo.make_optimizers(fast_policy, SMALL)
    stats = FastUpdate(fast_policy, opts, torch.device(device), graphs)(
        batch, SMALL, torch.Generator(device).manual_seed(4)
    )
    # every epoch has exactly one minibatch with frame (2, 3) (none is dropped: 48 / 4)
    assert eager_stats["nonfinite_updates"] == SMALL.epochs
    _assert_close_stats(stats, eager_stats)
    assert all(math.isfinite(stats[name]) for name in ppo.STAT_NAMES)
    _assert_close_weights(fast_policy, eager_policy)
    for name, opt in opts.items():
        for state in opt.state.values():
            assert float(state["step"]) == SMALL.epochs * (SMALL.minibatches - 1), name


@pytest.mark.parametrize(("device", "graphs"), PATHS)
def test_all_nonfinite_leaves_weights_and_adam_alone(make_batch, device, graphs):
    base, batch = _pair(make_batch, device, seed=3)
    policy = copy.deepcopy(base)
    opts = ppo.make_optimizers(policy, SMALL)
    fast = FastUpdate(policy, opts, torch.device(device), graphs)
    fast(batch, SMALL, torch.Generator(device).manual_seed(0))  # Adam has state now
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    adam_before = copy.deepcopy(opts["critic"].state_dict()["state"])

    batch["next", "agents", "reward"][2, 3, 0] = float("nan")
    stats = fast(batch, SMALL, torch.Generator(device).manual_seed(1))
    assert stats["minibatch_updates"] == 0
    assert stats["nonfinite_updates"] == SMALL.epochs * SMALL.minibatches
    assert math.isnan(stats["actor_loss"])
    after = policy.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    for i, state in opts["critic"].state_dict()["state"].items():
        assert torch.equal(state["step"], adam_before[i]["step"])
        assert torch.equal(state["exp_avg"], adam_before[i]["exp_avg"])


@pytest.mark.parametrize(("device", "graphs"), PATHS)
def test_optimizers_look_eager_between_updates(make_batch, device, graphs):
    """Checkpoints hold what the eager path would write, and an eager learner loads them."""
    base, batch = _pair(make_batch, device)
    policy = copy.deepcopy(base)
    opts = ppo.make_optimizers(policy, SMALL)
    FastUpdate(policy, opts, torch.device(device), graphs)(
        batch, SMALL, torch.Generator(device).manual_seed(0)
    )
    for opt in opts.values():
        for group in opt.param_groups:
            assert group["fused"] is None or group["fused"] is False
            assert group["capturable"] is False
            assert isinstance(group["lr"], float)
        assert not hasattr(opt, "found_inf")
    other = copy.deepcopy(base)
    eager_opts = ppo.make_optimizers(other, SMALL)
    for name, opt in opts.items():
        eager_opts[name].load_state_dict(opt.state_dict())
    ppo.update(other, eager_opts, batch, SMALL, torch.Generator(device).manual_seed(1))


@pytest.mark.parametrize(
    "device",
    [
        pytest.param("cpu", id="graph-standin-cpu"),
        pytest.param("cuda", id="graph-cuda", marks=pytest.mark.skipif(not CUDA, reason="no CUDA")),
    ],
)
def test_graph_is_captured_again_when_adam_state_is_replaced(make_batch, device):
    """A checkpoint loaded into the optimisers (resume, rollback) replaces the tensors a
    graph reads: the next update captures anew and matches eager from the loaded state."""
    base, batch = _pair(make_batch, device)
    policy = copy.deepcopy(base)
    opts = ppo.make_optimizers(policy, SMALL)
    fast = FastUpdate(policy, opts, torch.device(device), graphs=True)
    fast(batch, SMALL, torch.Generator(device).manual_seed(0))
    saved_policy = copy.deepcopy(policy.state_dict())
    saved_opts = {k: copy.deepcopy(o.state_dict()) for k, o in opts.items()}
    fast(batch, SMALL, torch.Generator(device).manual_seed(1))

    policy.load_state_dict(saved_policy)
    for name, opt in opts.items():
        opt.load_state_dict(copy.deepcopy(saved_opts[name]))  # Adam keeps the step tensors
    stats = fast(batch, SMALL, torch.Generator(device).manual_seed(1))
    assert fast.captures == 2

    eager_policy = copy.deepcopy(base)
    eager_policy.load_state_dict(saved_policy)
    eager_opts = ppo.make_optimizers(eager_policy, SMALL)
    for name, opt in eager_opts.items():
        opt.load_state_dict(copy.deepcopy(saved_opts[name]))  # Adam keeps the step tensors
    generator = torch.Generator(device).manual_seed(1)
    eager = ppo.update(eager_policy, eager_opts, batch, SMALL, generator)
    _assert_close_stats(stats, eager)
    _assert_close_weights(policy, eager_policy)


# ---------------------------------------------------------------------------- host syncs


def _host_reads(make_batch, path: str, minibatches: int) -> int:
    cfg = PPOConfig(epochs=2, minibatches=minibatches)
    base, batch = _pair(make_batch, "cpu")
    opts = ppo.make_optimizers(base, cfg)
    generator = torch.Generator().manual_seed(0)
    fast = FastUpdate(base, opts, torch.device("cpu"), graphs=False)
    with CountHostReads() as reads:
        if path == "eager":
            ppo.update(base, opts, batch, cfg, generator)
        else:
            fast(batch, cfg, generator)
    return reads.count


def test_fused_update_reads_the_device_a_fixed_number_of_times(make_batch):
    """Eager asks the host at least once per minibatch (the finite check; on the CPU its
    for-loop Adam reads every step count too); fused a fixed few times per update (the
    ValueNorm guard and the statistics), however many minibatches there are. Counted by
    op on the CPU: the same ops are the host syncs on CUDA."""
    eager = [_host_reads(make_batch, "eager", m) for m in (2, 8)]
    fused = [_host_reads(make_batch, "fused", m) for m in (2, 8)]
    assert eager[1] - eager[0] >= 2 * (8 - 2)  # at least one per extra minibatch step
    assert fused[0] == fused[1] <= 3, fused


@pytest.mark.parametrize(
    ("mirror", "guards"),
    [(False, False), (True, False), (False, True)],
    ids=["plain", "mirror", "guards"],
)
def test_the_captured_step_reads_nothing_on_the_host(make_batch, mirror, guards):
    """What `cuda_graph` captures, run on the CPU: no op in it may read a device value
    (capture would fail on CUDA); also with ppo.target_kl and the extractor's clip."""
    cfg = SMALL.model_copy(update={"mirror": mirror})
    if guards:
        cfg = cfg.model_copy(update={"target_kl": 0.01, "feature_extractor_max_grad_norm": 1.0})
    base, batch = _pair(make_batch, "cpu")
    opts = ppo.make_optimizers(base, cfg)
    fast = FastUpdate(base, opts, torch.device("cpu"), graphs=False)
    advantages, targets = ppo.advantages_and_targets(base, batch, cfg)
    flat = ppo.update_data(batch, advantages, targets).reshape(-1)
    with fast._fused_optimizers(), CountHostReads() as reads:
        fast._step(flat[torch.arange(12)], cfg, fast.entropy_coef)
    assert reads.count == 0
    assert int(fast.applied) == 1


# ---------------------------------------------------------------------------- choosing


def resolve(requested: str, device: torch.device, **why: str) -> str:
    return update_path(requested, device, **why).value


def test_auto_is_eager_on_cpu_and_graphs_on_cuda():
    assert resolve("auto", torch.device("cpu")) == "eager"
    assert resolve("auto", torch.device("cuda")) == "cuda_graph"
    assert resolve("auto", torch.device("cuda"), why_not="anything") == "eager"
    assert resolve("fused", torch.device("cpu")) == "fused"
    assert resolve("eager", torch.device("cuda")) == "eager"


def test_a_fast_path_that_cannot_run_is_a_config_error():
    with pytest.raises(ConfigError, match="needs a CUDA device"):
        resolve("cuda_graph", torch.device("cpu"))
    with pytest.raises(ConfigError, match="does not support env-group"):
        resolve("fused", torch.device("cpu"), why_not="env-group minibatches")


def test_learner_resolves_its_path_once_from_config_and_what_it_is_built_with():
    cfg = Config.model_validate({"ppo": {"update_path": "fused"}})
    learner = Learner.build(cfg, NavRLPolicy(), "cpu")
    assert learner.update_path == "fused"
    assert isinstance(learner.fast, FastUpdate) and not learner.fast.graphs

    with pytest.raises(ConfigError, match=r"pipeline\.compress_rollouts"):
        Learner.build(cfg, NavRLPolicy(), "cpu", minibatches=ppo.env_minibatches)

    learner = Learner.build(Config(), NavRLPolicy(), "cpu")
    assert learner.update_path == "eager" and learner.fast is None

    # run.device "auto": the config cannot tell; the learner refuses on its CPU.
    with pytest.raises(ConfigError, match=r"ppo\.compile"):
        Learner.build(Config.model_validate({"ppo": {"compile": True}}), NavRLPolicy(), "cpu")


def test_a_learner_with_an_extra_loss_term_runs_fused_but_never_in_a_graph():
    """The BC term of "ppo+bc" reads a batch the host hands it each minibatch, which a CUDA
    graph's replay would not see: the graph path is refused when the learner is built,
    the fused one is not (and `auto` on CUDA runs fused then, by the same rule)."""
    term = lambda policy, mb: {}  # noqa: E731
    cfg = Config.model_validate({"ppo": {"update_path": "cuda_graph"}})
    with pytest.raises(ConfigError, match="extra loss term"):
        Learner.build(cfg, NavRLPolicy(), "cpu", aux_loss=term)
    fused = Config.model_validate({"ppo": {"update_path": "fused"}})
    learner = Learner.build(fused, NavRLPolicy(), "cpu", aux_loss=term)
    assert learner.update_path == "fused" and learner.fast is not None
    assert learner.fast.aux_loss is term
    assert update_path("auto", "cuda", why_not_graph="x").value == "fused"
    assert update_path("auto", "cpu", why_not_graph="x").value == "eager"


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"pipeline": {"compress_rollouts": True}}, "pipeline.compress_rollouts"),
        ({"run": {"device": "cpu"}, "ppo": {"update_path": "cuda_graph"}}, "needs a CUDA"),
        ({"ppo": {"update_path": "eager", "compile": True}}, "ppo.compile"),
        ({"run": {"device": "cpu"}, "ppo": {"update_path": "auto", "compile": True}}, "eager"),
    ],
)
def test_config_refuses_fast_paths_that_cannot_run(settings, message):
    data = {"ppo": {"update_path": "fused"}}
    for section, values in settings.items():
        data[section] = {**data.get(section, {}), **values}
    with pytest.raises(ValueError, match=message):
        Config.model_validate(data)


def _failing_capture(warmup, prepare, step, device, *, warmup_runs, generators):
    warmup()  # as a real capture fails after its warm-up (that is where CUDA complains)
    raise RuntimeError("operation not permitted when stream is capturing")


def test_a_failed_capture_falls_back_to_fused_under_auto(make_batch, monkeypatch):
    monkeypatch.setattr(fast_update, "capture_graph", _failing_capture)
    base, batch = _pair(make_batch, "cpu")
    eager_policy, fast_policy = copy.deepcopy(base), copy.deepcopy(base)
    eager_stats, _ = _eager(eager_policy, batch, SMALL, seed=3)
    opts = ppo.make_optimizers(fast_policy, SMALL)
    fast = FastUpdate(fast_policy, opts, torch.device("cpu"), graphs=True, fallback=True)
    stats = fast(batch, SMALL, torch.Generator().manual_seed(3))
    assert not fast.graphs and fast.requested == "cuda_graph"
    assert fast.capture_error == "RuntimeError: operation not permitted when stream is capturing"
    _assert_close_stats(stats, eager_stats)  # the warm-up's skipped step changed nothing
    _assert_close_weights(fast_policy, eager_policy)
    fast(batch, SMALL, torch.Generator().manual_seed(4))  # and no second try


def test_a_failed_capture_raises_when_cuda_graph_was_asked_for(make_batch, monkeypatch):
    monkeypatch.setattr(fast_update, "capture_graph", _failing_capture)
    base, batch = _pair(make_batch, "cpu")
    fast = FastUpdate(base, ppo.make_optimizers(base, SMALL), torch.device("cpu"), graphs=True)
    with pytest.raises(RuntimeError, match="capturing"):
        fast(batch, SMALL, torch.Generator().manual_seed(3))


@pytest.mark.parametrize(
    ("path", "compile"),
    [
        pytest.param("eager", False, id="eager"),
        pytest.param("fused", False, id="fused"),
        pytest.param("fused", True, id="fused-compiled"),
        pytest.param("cuda_graph", False, id="graph-standin-cpu"),
    ],
)
def test_an_extra_loss_term_is_trained_and_reported_on_every_path(make_batch, path, compile):
    """A loss term added in one place (the update's `aux_loss`) is, on every path, in the
    loss its gradients come from and in the statistics, by name after PPO's own; the fast
    paths give what the eager one gives, within their rounding."""

    def pull(policy: NavRLPolicy, mb) -> dict[str, torch.Tensor]:
        """The alpha head's bias pulled towards 0, scaled by the minibatch's |advantage|."""
        scale = 10.0 * mb.get("advantage").abs().mean()
        return {"pull": scale * policy.beta_head.alpha_layer.bias.square().sum()}

    base, batch = _pair(make_batch, "cpu")
    cfg = PPOConfig()

    def update(on: str, term) -> tuple[NavRLPolicy, dict[str, float]]:
        policy = copy.deepcopy(base)
        opts = ppo.make_optimizers(policy, cfg)
        generator = torch.Generator().manual_seed(0)
        if on == "eager":
            return policy, ppo.update(policy, opts, batch, cfg, generator, aux_loss=term)
        graphs = on == "cuda_graph"
        step = FastUpdate(policy, opts, torch.device("cpu"), graphs, compile=compile,
                          aux_loss=term)  # fmt: skip
        return policy, step(batch, cfg, generator)

    plain, plain_stats = update(path, None)
    pulled, stats = update(path, pull)
    assert list(stats)[:4] == [*ppo.LOSS_TERMS, "pull"] and "pull" not in plain_stats
    assert stats["minibatch_updates"] == cfg.epochs * cfg.minibatches
    assert 0 < stats["pull"] < math.inf
    bias = (p.beta_head.alpha_layer.bias.norm() for p in (pulled, plain))
    assert next(bias) < next(bias)  # its gradient moved the weights it reads
    reference, eager_stats = update("eager", pull)
    _assert_close_stats(stats, eager_stats)
    assert stats["pull"] == pytest.approx(eager_stats["pull"], rel=1e-4)
    _assert_close_weights(pulled, reference)
