"""The cluster's stream list: the config file's ``streams:`` (the same file on every node; a SIGHUP on every
node applies an edit) or, with ``cluster.streams_key``, an etcd key every node reads and follows.

The key holds YAML with a ``streams:`` list written as in the config file, checked against the running
config as a reload checks a file (``streamd check``'s messages, naming the key); an invalid list is refused
on every node, and the running list stays.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from streamd.analytics.tracker import missing_dependency
from streamd.cluster.etcd import Etcd
from streamd.config import Config, ConfigError, StreamConfig
from streamd.config._fields import Problems
from streamd.config._yaml import load_yaml
from streamd.config.streams import parse_streams

log = logging.getLogger("streamd.cluster")


def parse_stream_list(text: str, label: str, config: Config) -> tuple[StreamConfig, ...]:
    """The streams of the YAML ``text`` (``streams: [...]``), checked as the config file's would be against
    ``config`` (its model's classes, tracking and clips defaults); raises ConfigError."""
    data, marks, duplicates = load_yaml(text, label)
    source = config.source if config.source not in ("<bundled demo>", "<config>") else "."
    problems = Problems(label, Path(source).absolute().parent, marks)
    for key, message in duplicates:
        problems.add(key, message)
    if not isinstance(data, dict) or "streams" not in data:
        problems.add("", "expected YAML with a streams: list (as in the config file)")
        raise ConfigError(problems.messages())
    extra = sorted(str(k) for k in data if k != "streams")
    if extra:
        problems.add(
            extra[0], "only streams: belongs in the stream list key; other sections stay in the file"
        )
    streams = parse_streams(
        data["streams"], problems, problems.base_dir, config.model.class_names, config.tracking, config.clips
    )
    if problems.items:
        raise ConfigError(problems.messages())
    missing = missing_dependency(streams, config.tracking)  # tracking's lap, before a node places them
    if missing:
        raise ConfigError([f"{label}: {missing}"])
    return streams


class StreamList:
    """The list every node places. ``etcd`` is used only with ``cluster.streams_key``."""

    def __init__(self, etcd: Etcd, config: Config) -> None:
        self.etcd, self.config, self.key = etcd, config, config.cluster.streams_key
        self.streams: tuple[StreamConfig, ...] = config.streams
        self.revision = 0  # mod revision of the key last applied or refused
        self.refused: list[str] = []  # the problems of the key's current value, when refused

    @property
    def by_id(self) -> dict[str, StreamConfig]:
        return {s.id: s for s in self.streams}

    def refresh(self, first: bool = False) -> None:
        """Follow the etcd key (if any). Raises EtcdError; at start, a bad list raises ConfigError."""
        if not self.key:
            return
        entry = self.etcd.get(self.key)
        if entry is None:
            if first:
                raise ConfigError(
                    [
                        f"etcd key {self.key}: not found; put the stream list there first "
                        f'(etcdctl put {self.key} "$(cat streams.yaml)")'
                    ]
                )
            return
        if entry.mod_revision == self.revision:
            return
        self.revision = entry.mod_revision
        try:
            streams = parse_stream_list(entry.value, f"etcd key {self.key}", self.config)
        except ConfigError as exc:
            if first:
                raise
            self.refused = list(exc.problems)
            log.error(
                "cluster: stream list refused (%d problem(s)); the running list stays:", len(exc.problems)
            )
            for problem in exc.problems:
                log.error("  %s", problem)
            return
        self.refused = []
        if not first and streams != self.streams:
            log.info("cluster: stream list from %s changed: %d stream(s)", self.key, len(streams))
        self.streams = streams

    def reload(self, new: Config) -> None:
        """A reloaded config file: its streams are the list (unless the list lives in etcd)."""
        self.config = new
        if not self.key:
            self.streams = new.streams
            log.info("cluster: stream list from %s: %d stream(s)", new.source, len(new.streams))

    def status(self) -> dict[str, Any]:
        return {"source": f"etcd:{self.key}" if self.key else "config file", "refused": self.refused}
