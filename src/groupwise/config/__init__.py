"""The run configuration: one typed schema (pydantic v2, unknown keys forbidden), loaded from YAML with dotted
command-line overrides, with every cross-field rule checked at load and all violations reported together.

Entry points: ``load_config(path, overrides)`` and ``config_from_dict(data, overrides)`` report every problem
(types, ranges, unknown keys, cross-field rules) in one :class:`ConfigError`. ``RunConfig(...)`` built in
Python also runs the cross-field rules (raising ``ConfigError``), but a type error there is pydantic's own
``ValidationError``. Must not import torch (the CLI and the simulator load configs without it).
"""

from groupwise.config.algorithm import (
    DynamicSamplingSection,
    GrpoSection,
    LossSection,
    OptimizerSection,
    OverlongSection,
    RewardScalingSection,
)
from groupwise.config.async_schema import (
    AsyncSection,
    CustomSamplerConfig,
    InOrderSamplerConfig,
    ReadyFirstSamplerConfig,
    RolloutFailureSection,
    SamplerConfig,
    WeightFifoSamplerConfig,
    WindowedSamplerConfig,
    required_buffer_capacity,
    sampler_config,
)
from groupwise.config.dataset_schema import DatasetColumns, DatasetSection
from groupwise.config.generation_schema import GenerationSection
from groupwise.config.issues import ConfigError, ConfigIssue
from groupwise.config.learner_schema import LearnerSection
from groupwise.config.load import config_from_dict, load_config
from groupwise.config.model_schema import ModelSection, TinyModelSection
from groupwise.config.runtime_schema import RaySection, RuntimeSection, SimSection
from groupwise.config.schema import RunConfig
from groupwise.config.sections import (
    AdditionSection,
    CheckpointSection,
    CountdownSection,
    DataSection,
    EvalSection,
    JsonlSection,
    LoggingSection,
    RewardSection,
    RunSection,
    SftSection,
)
from groupwise.config.yaml_input import parse_yaml

__all__ = [
    "AdditionSection",
    "AsyncSection",
    "CheckpointSection",
    "ConfigError",
    "ConfigIssue",
    "CountdownSection",
    "CustomSamplerConfig",
    "DataSection",
    "DatasetColumns",
    "DatasetSection",
    "DynamicSamplingSection",
    "EvalSection",
    "GenerationSection",
    "GrpoSection",
    "InOrderSamplerConfig",
    "JsonlSection",
    "LoggingSection",
    "LossSection",
    "ModelSection",
    "OptimizerSection",
    "OverlongSection",
    "LearnerSection",
    "RaySection",
    "ReadyFirstSamplerConfig",
    "RewardScalingSection",
    "RewardSection",
    "RolloutFailureSection",
    "RunConfig",
    "RunSection",
    "RuntimeSection",
    "SamplerConfig",
    "SftSection",
    "SimSection",
    "TinyModelSection",
    "WeightFifoSamplerConfig",
    "WindowedSamplerConfig",
    "config_from_dict",
    "load_config",
    "parse_yaml",
    "required_buffer_capacity",
    "sampler_config",
]
