"""The env contract and its conformance suite: both shipped backends pass, and every check
reports the fault planted for it by name (and only that check fails)."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDictBase
from torch import Tensor

from navrl_daemon.config import EnvConfig
from navrl_daemon.env import NavigationEnv, make_env
from navrl_daemon.env.backends import embedded, resolve
from navrl_daemon.env.conformance import CHECKS, run_conformance
from navrl_daemon.env.contract import check_specs
from navrl_daemon.errors import ConfigError
from tests.env import planted_faults

CFG = EnvConfig().replaced(
    num_envs=8,
    field_size=10.0,
    num_obstacles=4,
    num_dynamic_obstacles=8,
    max_episode_length=50,
    spawn="local",
)


def statuses(factory, cfg: EnvConfig = CFG) -> dict[str, tuple[str, str]]:
    report = run_conformance(factory, cfg, backend="test", device="cpu", seed=3)
    assert [r.name for r in report.results] == list(CHECKS)
    return {r.name: (r.status, r.detail) for r in report.results}


def failing(factory) -> set[str]:
    return {name for name, (status, _) in statuses(factory).items() if status == "fail"}


@pytest.mark.parametrize("backend", ["navigation", "navrl-2d"])
def test_shipped_backends_pass_every_check(backend: str) -> None:
    result = statuses(resolve(backend).load(), CFG.model_copy(update={"backend": backend}))
    assert all(status == "pass" for status, _ in result.values()), result


def test_embedded_passes_at_navrl_scale() -> None:
    # NavRL's defaults: 350 pillars, 80 dynamic obstacles (probes are still 4 envs).
    result = statuses(embedded, EnvConfig())
    assert all(status == "pass" for status, _ in result.values()), result


@pytest.mark.parametrize(("fault", "check"), sorted(planted_faults.FAULTS.items()))
def test_planted_fault_is_reported_by_its_name(fault: str, check: str) -> None:
    result = statuses(getattr(planted_faults, fault))
    assert {n for n, (s, _) in result.items() if s == "fail"} == {check}, result


# -------------------------------------------------------------- the other checks can fail too


class _IgnoresNumEnvs(NavigationEnv):
    def __init__(self, cfg: EnvConfig, **kwargs) -> None:
        kwargs["num_envs"] = 5
        super().__init__(cfg, **kwargs)


class _ResetsEveryEnv(NavigationEnv):
    """A partial reset (TorchRL's auto-reset) restarts all envs, not the done ones."""

    def _reset(self, tensordict: TensorDictBase | None = None, **kwargs) -> TensorDictBase:
        return super()._reset(None)


class _CountsTwice(NavigationEnv):
    def _output(
        self, dyn_obs: Tensor, terminated: Tensor, truncated: Tensor, stats: Tensor
    ) -> TensorDictBase:
        out = super()._output(dyn_obs, terminated, truncated, stats)
        out["stats", "episode_len"] = out["stats", "episode_len"] * 2
        return out


class _ForgetsOnLoad(NavigationEnv):
    def load_state_dict_env(self, state: dict[str, Tensor]) -> None:
        pass


class _NoState(NavigationEnv):
    state_dict_env = None  # type: ignore[assignment]


class _NanReward(NavigationEnv):
    def _reward(self, *args: Tensor | None) -> Tensor:
        return torch.full((self.num_envs,), float("nan"), device=self.device)


class _NoEvalLayout(NavigationEnv):
    def __init__(self, cfg: EnvConfig, **kwargs) -> None:
        if kwargs.get("layout") == "navrl":
            raise NotImplementedError("no eval layout")
        super().__init__(cfg, **kwargs)


class _HonestlyNondeterministic(planted_faults._Nondeterministic):
    deterministic = False


def factory(cls):
    return lambda cfg, **kwargs: cls(cfg, **kwargs)


@pytest.mark.parametrize(
    ("cls", "check"),
    [
        (_IgnoresNumEnvs, "batch"),
        (_ResetsEveryEnv, "auto_reset"),
        (_CountsTwice, "stats"),
        (_ForgetsOnLoad, "state"),
        (_NanReward, "step"),
        (_NoEvalLayout, "eval_layout"),
    ],
)
def test_each_check_can_fail(cls: type[NavigationEnv], check: str) -> None:
    assert check in failing(factory(cls))


def test_optional_parts_are_skipped_not_failed() -> None:
    no_state = statuses(factory(_NoState))
    assert no_state["state"][0] == "skip" and "restarts its episodes" in no_state["state"][1]
    declared = statuses(factory(_HonestlyNondeterministic))
    assert declared["determinism"] == ("skip", "the backend declares deterministic = False")
    assert all(s != "fail" for s, _ in declared.values())


def test_factory_errors_fail_build_and_skip_the_rest() -> None:
    def broken(cfg, **kwargs):
        raise RuntimeError("simulator did not start")

    result = statuses(broken)
    assert result["build"] == ("fail", "factory raised RuntimeError: simulator did not start")
    assert all(result[name][0] == "skip" for name in CHECKS[1:])
    not_an_env = statuses(lambda cfg, **kwargs: object())
    assert not_an_env["build"] == ("fail", "factory returned object, not a TorchRL EnvBase")


def test_config_errors_from_the_factory_propagate() -> None:
    def refuses(cfg, **kwargs):
        raise ConfigError("env.options: nope")

    with pytest.raises(ConfigError, match="nope"):
        run_conformance(refuses, CFG, backend="x", device="cpu", seed=0)


def test_check_specs_names_the_fault() -> None:
    assert check_specs(make_env(CFG), num_envs=8, device="cpu") == []
    env = planted_faults.wrong_dtype(CFG)
    (failure,) = check_specs(env, num_envs=8, device="cpu")
    assert failure.check == "dtypes" and "agents.observation.state" in failure.detail
    failures = check_specs(make_env(CFG), num_envs=6, device="cpu")
    assert failures[0].check == "batch" and failures[0].detail == "batch size (8,), expected (6,)"


def test_make_env_refuses_a_backend_whose_specs_break_the_contract() -> None:
    cfg = CFG.model_copy(update={"backend": "tests.env.planted_faults:missing_key"})
    with pytest.raises(ConfigError) as err:
        make_env(cfg)
    message = str(err.value)
    assert "tests.env.planted_faults:missing_key" in message
    assert "keys: agents.observation.direction missing from the observation spec" in message
