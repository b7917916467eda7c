"""Config schemas (plain dataclasses) and the Hydra boundary (`compose`)."""

from fp8bench.config.schema import (
    BackendConfig,
    Config,
    ConfigError,
    FormatConfig,
    MeasureConfig,
    ModelConfig,
    ScalingConfig,
    StoreConfig,
    WorkloadConfig,
)

__all__ = ["BackendConfig", "Config", "ConfigError", "FormatConfig", "MeasureConfig", "ModelConfig",
           "ScalingConfig", "StoreConfig", "WorkloadConfig"]
