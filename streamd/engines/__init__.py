"""Inference engines behind one interface; backends are imported lazily by name (see ``create_engine``).

``create_engine`` chooses, loads and checks a backend; with ``engine.type: auto`` a backend that fails (to
import, build, load, or pass ``streamd.checks.verify``'s start-up check) is logged once and the next one in
``backend_order`` is tried.
"""

from streamd.engines.base import Engine, EngineError
from streamd.engines.options import EngineOptions, Machine
from streamd.engines.registry import backend_order, create_engine, next_backend

__all__ = [
    "Engine",
    "EngineError",
    "EngineOptions",
    "Machine",
    "backend_order",
    "create_engine",
    "next_backend",
]
