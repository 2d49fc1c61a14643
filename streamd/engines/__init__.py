"""Inference engines behind one interface; backends are imported lazily by name (see ``create_engine``)."""

from streamd.engines.base import Engine, EngineError, create_engine

__all__ = ["Engine", "EngineError", "create_engine"]
