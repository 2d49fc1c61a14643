"""``streamd run``'s entry object. The daemon is a supervisor over worker processes (``streamd.supervisor``);
each worker runs the pipeline for its share of the streams (``streamd.worker``). ``Daemon`` is the name the
CLI, benches and embedders use."""

from __future__ import annotations

from streamd.supervisor import Supervisor as Daemon
from streamd.worker import build_stages, choose_decoder

__all__ = ["Daemon", "build_stages", "choose_decoder"]
