"""Preprocess: ``spec`` (what a model wants, where a frame lands), ``cpu`` (OpenCV), ``cuda`` (kernel)."""
