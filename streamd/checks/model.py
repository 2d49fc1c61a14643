"""Does the model file fit the config? ``streamd check`` (and ``run``, before anything starts) opens the ONNX
graph — no engine is built, nothing runs — and compares its input, batch and output with the ``model:`` and
``engine:`` sections, so a mismatch is a config problem (exit 78, key path and line) and not a crash later.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from streamd.config import Config
from streamd.config._fields import Problems

VIDEO_SUFFIXES = {".mp4", ".mkv", ".mov", ".avi", ".ts", ".m4v", ".webm", ".h264", ".h265", ".hevc", ".flv"}


@dataclass
class ModelReport:
    """What the check found: ``problems`` (config lines, as ConfigError shows them), ``notes`` (facts worth a
    line that need no change) and ``summary`` (the model's input and output, for the OK line)."""

    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    summary: str = ""


def check_model(config: Config) -> ModelReport:
    """Open ``config.model.path`` as ONNX and check it against the config (see module docstring)."""
    problems = Problems(config.source, Path("."), config.lines)
    report = ModelReport()
    graph = _open(config.model.path, problems)
    if graph is not None:
        _compare(graph, config, problems, report)
    report.problems = problems.messages()
    return report


def _open(path: Path, problems: Problems) -> Any | None:
    if path.suffix.lower() in VIDEO_SUFFIXES:
        problems.add(
            "model.path",
            f"{path.name!r} is a video file, not a model; model.path takes an ONNX file "
            "(the videos go under streams[].url)",
        )
        return None
    import onnx

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # protobuf DecodeError, OSError, ...
        problems.add("model.path", f"cannot read {path.name!r} as an ONNX model: {_first_line(exc)}")
        return None
    if not model.graph.node or not model.opset_import:
        problems.add(
            "model.path", f"{path.name!r} is not an ONNX model (no graph in it); export the model to ONNX"
        )
        return None
    return model


def _compare(model: Any, config: Config, problems: Problems, report: ModelReport) -> None:
    from streamd.engines.base import EngineError
    from streamd.engines.onnx_tools import fix_input_size

    m, e = config.model, config.engine
    name = m.path.name
    try:
        size = (int(m.input_size[0]), int(m.input_size[1]))
        pinned, io, _ = fix_input_size(model, name, size, log_level=logging.DEBUG)  # a note says it
    except EngineError as exc:
        problems.add("model.path", str(exc).removeprefix("model.path: "))
        return
    c, h, w = io.chw
    declared = _declared_input(model, io)
    if len(io.outputs) == 1:  # a dynamic H/W at model.input_size: N is known then
        outputs = f"output {_text(_output_dims(pinned, io.output_shape))}"
    else:
        outputs = "outputs " + ", ".join(f"{n} {_text(d)}" for n, d in io.outputs)
    report.summary = f"model {name}: input {_text(declared)}, {outputs}"
    if c != 3:
        problems.add("model.path", f"{name} takes {c} input channels; streamd feeds 3 (RGB or BGR)")
    if io.dynamic_hw:
        _dynamic_size(config, io, declared, problems, report)
    if (w, h) != tuple(m.input_size):
        problems.add(
            "model.input_size",
            f"model.input_size is {list(m.input_size)} (width, height) but {name} takes {w}×{h} "
            f"(input {_text(io.input_shape)}); set model.input_size: [{w}, {h}]",
        )
    if io.batch is not None and io.batch > 1:
        top = -(-e.max_batch // io.batch) * io.batch
        report.notes.append(
            f"{name} fixes its batch at {io.batch}: the engine runs {io.batch} rows per call, a smaller "
            f"batch padded (batches of up to {top}; a dynamic-batch export wastes nothing)"
        )
    elif io.batch == 1 and e.max_batch > 1:
        report.notes.append(
            f"{name} fixes its batch at 1: unless it proves batch-dynamic when the engine loads, batches "
            f"of up to engine.max_batch {e.max_batch} run image by image (a dynamic-batch export is faster)"
        )
    _head(config, pinned, io, problems, report)


def _head(config: Config, pinned: Any, io: Any, problems: Problems, report: ModelReport) -> None:
    """Which head (layout) the outputs have: a note naming it and its evidence, or the problem."""
    from streamd.engines.base import EngineError
    from streamd.engines.onnx_outputs import per_image_shapes
    from streamd.stages.postprocess.head import HeadSettings, pack_parts
    from streamd.stages.postprocess.resolve import resolve_head, unsupported_model

    m = config.model
    name = m.path.name
    out = _output_dims(pinned, io.output_shape)  # a dynamic H/W at model.input_size: N is known then
    if len(io.outputs) == 1 and all(isinstance(d, int) and d > 0 for d in out[1:]):
        shapes = [(io.output_name, tuple(int(d) for d in out[1:]), out)]
    elif len(io.outputs) == 1 and not _can_run(pinned):
        if refused := unsupported_model([(io.output_name, out)], len(m.class_names)):
            problems.add("model.path", refused.removeprefix("model.path: "))
        else:
            report.notes.append(
                f"{name}: output shape {list(out)} is only known when run; layout checked then"
            )
        return
    else:  # several outputs, or dims only a run tells (e.g. RT-DETR's top-K): ONNX Runtime at batch 1
        try:
            shapes = per_image_shapes(pinned)
        except EngineError as exc:
            problems.add("model.path", str(exc).removeprefix("model.path: "))
            return
        except Exception as exc:  # e.g. external weights not loaded here: the engine resolves it at start
            report.notes.append(f"{name}: output shapes are only known when run ({_first_line(exc)})")
            return
    parts = pack_parts([(n, shape) for n, shape, _ in shapes])
    parts = tuple(replace(p, dims=dims) for p, (_, _, dims) in zip(parts, shapes, strict=True))
    try:
        head = resolve_head(HeadSettings.from_model(m), parts)
    except ValueError as exc:
        text = str(exc)
        key = text.split(":", 1)[0] if text.startswith("model.") else "model.layout"
        problems.add(key.split(" ")[0], text.removeprefix(f"{key}: "))
        return
    report.notes.append(_layout_note(config, head.layout, head.note))


def _can_run(model: Any) -> bool:
    """The model's weights are all in the file (``check`` loads no external data): ONNX Runtime can run it."""
    return not any(t.data_location == 1 for t in model.graph.initializer)  # 1: TensorProto.EXTERNAL


def _layout_note(config: Config, layout: str, note: str) -> str:
    """The head's note with where a set layout came from, plus ``model.classes``."""
    from streamd.config.model import defaults_from_metadata

    m = config.model
    if m.layout != "auto" and "model.layout" not in config.lines:
        source = "the model's metadata" if "layout" in defaults_from_metadata(m.path) else "the default"
        note = note.replace(f"model.layout {layout}:", f"model.layout {layout} (from {source}):", 1)
    if m.classes is not None:
        note += f"; model.classes keeps {len(m.classes)} of them"
    return note


def _declared_input(model: Any, io: Any) -> tuple[int | str, ...]:
    """The input shape as the file declares it (``io.input_shape`` has a dynamic H/W resolved)."""
    from streamd.engines.onnx_tools import _dims

    return next((_dims(i) for i in model.graph.input if i.name == io.input_name), io.input_shape)


def _dynamic_size(
    config: Config, io: Any, declared: tuple[int | str, ...], problems: Problems, report: ModelReport
) -> None:
    """A dynamic input H/W runs at ``model.input_size``: a note when the config (or the model's metadata)
    states it, a problem when it would be the built-in default (nothing says the model runs at that size)."""
    from streamd.config.model import defaults_from_metadata

    m = config.model
    axes = ", ".join(io.dynamic_hw)
    verb = "are" if len(io.dynamic_hw) > 1 else "is"
    if "model.input_size" in config.lines:
        source = "model.input_size"
    elif "input_size" in defaults_from_metadata(m.path):
        source = "model.input_size (from the model's metadata)"
    else:
        problems.add(
            "model.input_size",
            f"{m.path.name}'s input {axes} {verb} dynamic (input {_text(declared)}) and model.input_size is "
            f"not set (nor in the model's metadata), so it would run at the default {list(m.input_size)}; "
            "set model.input_size: [width, height], the size the model was exported or trained at "
            "(e.g. [640, 640])",
        )
        return
    report.notes.append(
        f"model input {axes} {verb} dynamic (input {_text(declared)}); it runs at {source} "
        f"{list(m.input_size)} on every engine"
    )


def _output_dims(model: Any, declared: tuple[int | str, ...]) -> tuple[int | str, ...]:
    """The output shape, from shape inference where the graph leaves dimensions symbolic."""
    if all(isinstance(d, int) and d > 0 for d in declared[1:]):
        return declared
    import onnx

    from streamd.engines.onnx_tools import _dims

    try:
        inferred = onnx.shape_inference.infer_shapes(model, data_prop=True).graph.output[0]
    except Exception:  # inference is best effort; the engine reports the real shape when it runs
        return declared
    dims = _dims(inferred)
    return dims if len(dims) == len(declared) else declared


def _text(dims: tuple[int | str, ...]) -> str:
    return "[" + ", ".join(str(d) for d in dims) + "]"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:200]
