"""Whole-detection checks above the engines: ``model`` (does the model fit the config), ``verify`` (an engine
equals ONNX Runtime at start-up), ``compare`` (output and detection tolerances), ``access`` (stream files and
sink paths as the running user can use them)."""
