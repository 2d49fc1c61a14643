"""streamd's config: a YAML file checked into frozen dataclasses, one module per section.

``load_config(path)`` reads and checks a file (None = the bundled demo); ``parse_config(data, base_dir)``
checks data already loaded. Both collect every problem and raise one ``ConfigError`` whose lines say
``file:line: key.path: expected ..., got ...; how to fix``. Programs exit with ``EX_CONFIG`` (78) on it.
The key reference is docs/config.md.
"""

from __future__ import annotations

from streamd.config.coco import COCO_NAMES
from streamd.config.engine import EngineConfig
from streamd.config.errors import EX_CONFIG, ConfigError
from streamd.config.loader import BUNDLED_DEMO, Config, load_config, parse_config
from streamd.config.metrics import MetricsConfig
from streamd.config.model import DEFAULT_MODEL, ModelConfig
from streamd.config.pipeline import PipelineConfig
from streamd.config.sinks import JsonlSinkConfig, SinkConfig, StdoutSinkConfig
from streamd.config.streams import StreamConfig, redact_url

__all__ = [
    "BUNDLED_DEMO",
    "COCO_NAMES",
    "DEFAULT_MODEL",
    "EX_CONFIG",
    "Config",
    "ConfigError",
    "EngineConfig",
    "JsonlSinkConfig",
    "MetricsConfig",
    "ModelConfig",
    "PipelineConfig",
    "SinkConfig",
    "StdoutSinkConfig",
    "StreamConfig",
    "load_config",
    "parse_config",
    "redact_url",
]
