"""Validated configuration: TOML file < `NAVRL_` environment < dotted `KEY=VALUE` overrides.

- `sections.py`: one pydantic model per TOML table, and `Config`, the whole;
- `loader.py`: reading a config (file, environment, overrides) and writing one as TOML;
- `execution_plan.py`: the rules for how a run executes (update, collect and reset paths,
  compile, streams), and the plan they make of a config and a device.

Import from here: `from navrl_daemon.config import Config, load_config`.
"""

from navrl_daemon.config.execution_plan import (
    NOT_FAST,
    NOT_GRAPH,
    Choice,
    CollectPath,
    ExecutionPlan,
    UpdatePath,
)
from navrl_daemon.config.loader import (
    MOVED,
    load_config,
    moved_key,
    parse_override,
    set_dotted,
    to_toml,
    validate,
    with_moved_keys,
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
    NavigationConfig,
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
from navrl_daemon.errors import ConfigError

__all__ = [
    "MOVED",
    "NOT_FAST",
    "NOT_GRAPH",
    "ArchiveConfig",
    "CheckpointConfig",
    "Choice",
    "CollectPath",
    "Config",
    "ConfigError",
    "CurriculumStage",
    "DistributedConfig",
    "EnvConfig",
    "EvalConfig",
    "ExecutionPlan",
    "LogConfig",
    "MetricsConfig",
    "NavigationConfig",
    "OfflineConfig",
    "PPOConfig",
    "PipelineConfig",
    "PrefetchConfig",
    "PromotionRule",
    "RunConfig",
    "Section",
    "UpdatePath",
    "load_config",
    "moved_key",
    "parse_override",
    "resolve_device",
    "set_dotted",
    "state_dir_problem",
    "to_toml",
    "validate",
    "with_moved_keys",
]
