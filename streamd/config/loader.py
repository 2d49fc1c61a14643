"""The whole config: ``Config``, ``load_config`` (file -> Config) and ``parse_config`` (data -> Config)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from streamd.config._fields import (
    Invalid,
    Problems,
    check_keys,
    coerce,
    describe,
    opt,
    required,
)
from streamd.config._yaml import load_yaml
from streamd.config.clips import ClipsConfig, parse_clips
from streamd.config.cluster import ClusterConfig, parse_cluster
from streamd.config.engine import EngineConfig, parse_engine
from streamd.config.errors import ConfigError
from streamd.config.metrics import MetricsConfig, parse_metrics
from streamd.config.model import ModelConfig, parse_model
from streamd.config.pipeline import PipelineConfig, parse_pipeline
from streamd.config.sinks import DEFAULT_SINKS, JsonlSinkConfig, SinkConfig, parse_sinks
from streamd.config.streams import StreamConfig, parse_streams
from streamd.config.tracking import TrackingConfig, parse_tracking
from streamd.resources import bundled_path

BUNDLED_DEMO = bundled_path("configs", "demo.yaml")
LogLevel = Literal["debug", "info", "warning", "error"]


@dataclass(frozen=True)
class Config:
    """A checked streamd config. Paths in it are absolute."""

    streams: tuple[StreamConfig, ...] = required("the input streams; at least one")
    model: ModelConfig = field(default_factory=ModelConfig, metadata={"doc": "the detector"})
    engine: EngineConfig = field(default_factory=EngineConfig, metadata={"doc": "the inference backend"})
    pipeline: PipelineConfig = field(default_factory=PipelineConfig, metadata={"doc": "batching and queues"})
    sinks: tuple[SinkConfig, ...] = opt(DEFAULT_SINKS, "where results go; default: one stdout sink")
    metrics: MetricsConfig = field(default_factory=MetricsConfig, metadata={"doc": "the metrics endpoint"})
    tracking: TrackingConfig = field(
        default_factory=TrackingConfig, metadata={"doc": "object tracking (streams[].tracking overrides it)"}
    )
    clips: ClipsConfig = field(
        default_factory=ClipsConfig, metadata={"doc": "event clips (streams[].clips overrides it)"}
    )
    cluster: ClusterConfig = field(
        default_factory=ClusterConfig, metadata={"doc": "streams placed across nodes (off by default)"}
    )
    log_level: Literal["debug", "info", "warning", "error"] = opt(
        "info", "least severe log level written to stderr"
    )
    source: str = opt("<config>", "the config file this came from, or '<bundled demo>' (not a config key)")
    lines: Mapping[str, int] = field(
        default_factory=dict,
        compare=False,
        repr=False,
        metadata={"doc": "key path -> line in the file, for checks made after loading (not a config key)"},
    )

    @property
    def stream_ids(self) -> tuple[str, ...]:
        return tuple(s.id for s in self.streams)


TOP_KEYS = (
    "streams",
    "model",
    "engine",
    "pipeline",
    "sinks",
    "metrics",
    "tracking",
    "clips",
    "cluster",
    "log_level",
)


_SECTION_OF = {
    f.name: section
    for section, cls in (
        ("tracking", TrackingConfig),
        ("each sink in sinks", JsonlSinkConfig),
        ("engine", EngineConfig),
        ("metrics", MetricsConfig),
        ("model", ModelConfig),
        ("pipeline", PipelineConfig),
        ("each stream in streams", StreamConfig),
    )
    for f in dataclasses.fields(cls)
    if f.init
}  # a section's key written at the top level: say which section it belongs under (later sections win ties)


def _is_extension_key(key: str) -> bool:
    """Top-level keys starting with ``x-`` are ignored: a place for YAML anchors (``x-camera: &camera``)."""
    return key.startswith("x-")


def load_config(path: str | os.PathLike[str] | None = None, *, model_file: bool = True) -> Config:
    """Read and check a YAML config file; None = the bundled demo (configs/demo.yaml).

    Raises ConfigError with every problem found (file not readable, YAML syntax, schema, files missing).
    ``model_file`` False: ``model.path`` need not exist (``streamd check --no-model``).
    """
    file = BUNDLED_DEMO if path is None else Path(os.fspath(path))
    label = str(file) if path is None else os.fspath(path)
    try:
        text = file.read_bytes().decode("utf-8-sig")
    except FileNotFoundError:
        raise ConfigError([f"{label}: config file not found (looked at {file.absolute()})"]) from None
    except IsADirectoryError:
        raise ConfigError([f"{label}: is a folder; give the path of a YAML config file"]) from None
    except OSError as exc:
        raise ConfigError([f"{label}: cannot read the config file: {exc.strerror or exc}"]) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(
            [f"{label}: not UTF-8 text (bad byte at offset {exc.start}); save it as UTF-8"]
        ) from None
    data, marks, duplicates = load_yaml(text, label)
    problems = Problems(label, file.absolute().parent, marks)
    for key, message in duplicates:
        problems.add(key, message)
    config = _parse(data, problems, model_file)
    return dataclasses.replace(config, source="<bundled demo>" if path is None else label)


def parse_config(
    data: object, base_dir: Path, source: str = "<config>", marks: dict[str, int] | None = None
) -> Config:
    """Check already-loaded config data. Relative paths are taken from ``base_dir``; ``source`` prefixes every
    problem; ``marks`` maps key paths (``streams[0].url``) to 1-based lines for the messages."""
    return _parse(data, Problems(source, Path(base_dir).absolute(), marks or {}))


def _parse(data: object, problems: Problems, model_file: bool = True) -> Config:
    if data is None:
        problems.add("", "the config is empty; it needs at least a streams: list (see configs/demo.yaml)")
        raise ConfigError(problems.messages())
    if not isinstance(data, dict):
        problems.add(
            "", f"the top level must be a mapping of keys (streams:, model:, ...), got {describe(data)}"
        )
        raise ConfigError(problems.messages())
    check_keys(data, TOP_KEYS, "", problems, ignore=_is_extension_key, homes=_SECTION_OF)
    base_dir = problems.base_dir
    model = parse_model(data.get("model"), problems, base_dir, model_file)
    tracking = parse_tracking(data.get("tracking"), problems)
    if "streams" in data:  # after model and tracking: streams name classes and override tracking keys
        clips = parse_clips(data.get("clips"), problems, base_dir, model.class_names)
        streams = parse_streams(data["streams"], problems, base_dir, model.class_names, tracking, clips)
    else:
        streams, clips = (), parse_clips(data.get("clips"), problems, base_dir, model.class_names)
    cluster = parse_cluster(data.get("cluster"), problems)
    if "streams" not in data and not (cluster.enabled and cluster.streams_key):  # else etcd holds them
        problems.add(
            "streams", "required key missing; add a streams: list with at least one {id:, url:} item"
        )
    engine = parse_engine(data.get("engine"), problems, base_dir)
    pipeline = parse_pipeline(data.get("pipeline"), problems)
    raw_pipeline = data.get("pipeline")
    if not (isinstance(raw_pipeline, dict) and "ring_slots" in raw_pipeline) and engine.lanes > 1:
        # the default ring (3 slots) rounded up to whole rounds of the lanes: slot k runs on lane k % lanes
        slots = -(-pipeline.ring_slots // engine.lanes) * engine.lanes
        pipeline = dataclasses.replace(pipeline, ring_slots=slots)
    verify_batch_fits_engine(pipeline, engine, problems)
    sinks = parse_sinks(data["sinks"], problems, base_dir) if "sinks" in data else DEFAULT_SINKS
    metrics = parse_metrics(data.get("metrics"), problems)
    log_level: LogLevel = "info"
    if "log_level" in data:
        try:
            log_level = coerce(data["log_level"], LogLevel, {}, "log_level")
        except Invalid as exc:
            problems.add(exc.path, exc.message)
    if problems.items:
        raise ConfigError(problems.messages())
    return Config(
        streams=streams,
        model=model,
        engine=engine,
        pipeline=pipeline,
        sinks=sinks,
        metrics=metrics,
        tracking=tracking,
        clips=clips,
        cluster=cluster,
        log_level=log_level,
        source=problems.source,
        lines=dict(problems.marks),
    )


def verify_batch_fits_engine(pipeline: PipelineConfig, engine: EngineConfig, problems: Problems) -> None:
    if pipeline.batch_size > engine.max_batch and problems.ok("pipeline.batch_size", "engine.max_batch"):
        problems.add(
            "pipeline.batch_size",
            f"pipeline.batch_size {pipeline.batch_size} is larger than engine.max_batch {engine.max_batch}; "
            f"lower batch_size to at most {engine.max_batch} "
            f"or raise engine.max_batch to at least {pipeline.batch_size}",
        )
    slots, lanes = pipeline.ring_slots, engine.lanes
    if slots % lanes and problems.ok("pipeline.ring_slots", "engine.lanes"):  # slot k runs on lane k % lanes
        problems.add(
            "pipeline.ring_slots",
            f"pipeline.ring_slots {slots} is not a multiple of engine.lanes {lanes}: consecutive batches "
            f"would queue on the same lane; set ring_slots to {-(-slots // lanes) * lanes}",
        )
