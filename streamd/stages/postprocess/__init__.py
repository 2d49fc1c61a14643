"""Postprocess: ``cpu`` (output layouts, the spec and the numpy NMS twin), ``cuda`` (decode + NMS kernel)."""
