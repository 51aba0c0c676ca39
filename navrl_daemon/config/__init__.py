"""Validated configuration: TOML file < `NAVRL_` environment < dotted `KEY=VALUE` overrides.

- `sections.py`: one pydantic model per TOML table, and `Config`, the whole;
- `loader.py`: reading a config (file, environment, overrides) and writing one as TOML;
- `update_path.py`: the one rule for which PPO update path a run can take.

Import from here: `from navrl_daemon.config import Config, load_config`.
"""

from navrl_daemon.config.loader import (
    load_config,
    parse_override,
    set_dotted,
    to_toml,
    validate,
)
from navrl_daemon.config.sections import (
    ArchiveConfig,
    CheckpointConfig,
    Config,
    CurriculumStage,
    DistributedConfig,
    EnvConfig,
    EvalConfig,
    LogConfig,
    MetricsConfig,
    OfflineConfig,
    PipelineConfig,
    PPOConfig,
    PrefetchConfig,
    PromotionRule,
    RunConfig,
    Section,
    resolve_device,
    state_dir_problem,
)
from navrl_daemon.config.update_path import (
    NOT_FAST,
    NOT_GRAPH,
    UpdatePath,
    check_compile,
    resolve_update_path,
)
from navrl_daemon.errors import ConfigError

__all__ = [
    "NOT_FAST",
    "NOT_GRAPH",
    "ArchiveConfig",
    "CheckpointConfig",
    "Config",
    "ConfigError",
    "CurriculumStage",
    "DistributedConfig",
    "EnvConfig",
    "EvalConfig",
    "LogConfig",
    "MetricsConfig",
    "OfflineConfig",
    "PPOConfig",
    "PipelineConfig",
    "PrefetchConfig",
    "PromotionRule",
    "RunConfig",
    "Section",
    "UpdatePath",
    "check_compile",
    "load_config",
    "parse_override",
    "resolve_device",
    "resolve_update_path",
    "set_dotted",
    "state_dir_problem",
    "to_toml",
    "validate",
]
