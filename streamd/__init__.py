"""streamd: many live video streams -> decode -> object detection -> JSON lines."""

__version__ = "0.1.0"
