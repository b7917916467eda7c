"""Config schemas (plain dataclasses) and the Hydra boundary (`compose`)."""

from fp8bench.config.schema import (
    Config,
    ConfigError,
    FormatConfig,
    MeasureConfig,
    ModelConfig,
    ScalingConfig,
    StoreConfig,
    WorkloadConfig,
)

__all__ = ["Config", "ConfigError", "FormatConfig", "MeasureConfig", "ModelConfig", "ScalingConfig", "StoreConfig",
           "WorkloadConfig"]
