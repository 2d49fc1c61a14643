"""Which ``Head`` a model has: from its outputs (names, per-image shapes) and the ``model:`` settings.

``auto`` picks from shapes and output names and says why (``Head.note``); a model whose outputs fit several
layouts, or whose outputs it cannot read, is refused with a ``ValueError`` whose message starts with the key
to set (``model.layout: ...``, ``model.outputs: ...``, ``model.path: ...``), which callers turn into a config
error (exit 78). A layout that is set is checked against the outputs, never second-guessed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from streamd.stages.postprocess.head import (
    ACTIVATIONS,
    BOX_FORMATS,
    LAYOUTS,
    SUPPORTED,
    TF_NAMES,
    TORCHVISION_NAMES,
    Head,
    HeadSettings,
    OutputPart,
    cells,
    shapes_text,
)

Dims = Sequence[int | str]
SINGLE = ("yolov8", "yolov5", "end2end", "detr", "yolox")  # the layouts one output can have, auto's order


def _text(dims: Dims) -> str:
    return "[" + ", ".join(str(d) for d in dims) + "]"


def _fits(a: int, b: int, s: HeadSettings) -> dict[str, bool]:
    c = s.num_classes
    grid = a == cells(s.strides, *s.input_size)
    return {
        "yolov8": a == 4 + c,
        "yolov5": b == 5 + c,
        "end2end": b == 6,
        "detr": b == 4 + c,
        "yolox": b == 5 + c and grid,
    }


def _implied(layout: str, a: int, b: int, s: HeadSettings) -> str:
    """What ``layout`` would read from an output [B, a, b], whatever the class names say."""
    return {
        "yolov8": f"yolov8 ({a - 4} classes, {b} candidates)",
        "yolov5": f"yolov5 ({b - 5} classes, {a} candidates, boxes already decoded)",
        "end2end": f"end2end (up to {a} boxes, NMS in the model)",
        "detr": f"detr ({b - 4} classes, {a} queries)",
        "yolox": f"yolox ({b - 5} classes, raw output decoded on the grid of strides "
        f"{'/'.join(map(str, s.strides))})",
    }[layout]


def unsupported_model(outputs: Sequence[tuple[str, Dims]], num_classes: int) -> str | None:
    """A ``model.path: ...`` message when the outputs show a model this version cannot run (segmentation,
    pose, oriented boxes); None otherwise."""
    listed = ", ".join(f"{name} {_text(dims)}" for name, dims in outputs)
    if len(outputs) > 1:
        protos = [(n, d) for n, d in outputs if len(d) == 4 and d[1] == 32]
        if protos and any(len(d) == 3 for _, d in outputs):
            return (
                f"model.path: a segmentation model (Ultralytics -seg: outputs {listed}; {protos[0][0]} holds "
                "32 prototype masks [B, 32, H/4, W/4]) is not supported: streamd runs detection models only; "
                f"export the detection model (e.g. yolov8s.pt, not yolov8s-seg.pt); {SUPPORTED}"
            )
        return None
    if not outputs or len(outputs[0][1]) != 3 or not isinstance(outputs[0][1][1], int):
        return None
    a, c = int(outputs[0][1][1]), num_classes
    if a == 4 + c + 32:
        kind = (
            f"a segmentation model ({a} = 4 box + {c} class scores + 32 mask coefficients, Ultralytics -seg)"
        )
    elif a > 5 and (a - 5) % 3 == 0 and (c == 1 or a == 56):
        kind = f"a pose model ({a} = 4 box + 1 class score + {(a - 5) // 3} keypoints × 3, Ultralytics -pose)"
    elif a == 5 + c:
        kind = f"an oriented-box model ({a} = 4 box + {c} class scores + 1 angle, Ultralytics -obb)"
    else:
        return None
    return (
        f"model.path: output {listed} looks like {kind}, which this version cannot run; "
        f"export the detection model (e.g. yolov8s.pt); {SUPPORTED}"
    )


def resolve_head(s: HeadSettings, parts: Sequence[OutputPart]) -> Head:
    """The head of a model with outputs ``parts`` (packed in graph order) under settings ``s``."""
    if s.layout not in (*LAYOUTS, "auto"):
        raise ValueError(
            f"model.layout: unknown layout {s.layout!r}; expected auto or one of {', '.join(LAYOUTS)}"
        )
    for key, value, allowed in (
        ("score_activation", s.score_activation, ACTIVATIONS),
        ("box_format", s.box_format, BOX_FORMATS),
        ("box_units", s.box_units, ("pixels", "normalized")),
    ):
        if value not in (*allowed, "auto"):
            raise ValueError(
                f"model.{key}: unknown value {value!r}; expected auto or one of {', '.join(allowed)}"
            )
    if not parts:
        raise ValueError("model.path: the model has no output")
    protos = unsupported_model([(p.name, (1, *p.shape)) for p in parts], s.num_classes)
    if len(parts) > 1 and protos:
        raise ValueError(protos)
    if s.outputs or s.layout == "outputs":
        return _mapped(s, parts)
    if len(parts) > 1:
        return _multi(s, parts)
    return _single(s, parts[0])


def _single(s: HeadSettings, part: OutputPart) -> Head:
    if len(part.shape) != 2:
        raise ValueError(
            f"model output: expected a 3-D tensor [B, ., .], got {_text(('B', *part.shape))}; {SUPPORTED}"
        )
    a, b = part.shape
    fits = _fits(a, b, s)
    options = [x for x in SINGLE if fits[x]]
    if s.layout == "auto":
        if len(options) > 1 or (options and a == b):
            shaped = {"yolov8": a > 4, "yolov5": b > 5, "end2end": b == 6, "detr": b > 4, "yolox": b > 5}
            named = options if len(options) > 1 else [x for x in SINGLE if shaped[x] and x != "yolox"]
            raise ValueError(
                f"model.layout: auto cannot tell the layout of {part.label} with "
                f"{s.num_classes} class names: it fits {' and '.join(_implied(x, a, b, s) for x in named)}; "
                f"set model.layout to {' or '.join(named)} (and model.class_names to the model's classes)"
            )
        if options:
            return _build(options[0], s, part, auto=True)
    elif s.layout in fits and (fits[s.layout] or (s.layout == "detr" and b in (5 + s.num_classes, 6))):
        return _build(s.layout, s, part, auto=False)
    refused = unsupported_model([(part.name, (1, a, b))], s.num_classes)
    if refused:
        raise ValueError(refused)
    c = s.num_classes
    if s.layout == "auto":
        raise ValueError(
            f"model output shape {_text((1, a, b))} fits no known layout for {c} classes: expected "
            f"[B, {4 + c}, N] (yolov8), [B, N, {5 + c}] (yolov5, yolox), [B, K, 6] (end2end) or "
            f"[B, N, {4 + c}] (detr); set model.layout or model.class_names to match the model"
        )
    if s.layout == "yolox" and b == 5 + c:
        grid = cells(s.strides, *s.input_size)
        raise ValueError(
            f"model.strides: the yolox output {part.name} has {a} candidates but strides "
            f"{list(s.strides)} at {s.input_size[0]}×{s.input_size[1]} make {grid} grid cells; set "
            "model.strides to the model's (YOLOX: [8, 16, 32]; with a P6 level [8, 16, 32, 64])"
        )
    raise ValueError(
        f"model.layout is {s.layout!r} but the model output shape {_text((1, a, b))} does not match it "
        f"with {c} class names (model.class_names)"
    )


def _build(layout: str, s: HeadSettings, part: OutputPart, auto: bool) -> Head:
    head = _build_head(layout, s, part, auto)
    return replace(head, note=f"{head.note}; {s.num_classes} class names (model.class_names)")


def _build_head(layout: str, s: HeadSettings, part: OutputPart, auto: bool) -> Head:
    a, b = part.shape
    o, c, row = part.offset, s.num_classes, part.offset + part.size
    head = "model.layout auto chose" if auto else "model.layout"
    out = part.label
    if layout == "yolov8":
        note = f"{head} yolov8: {out}, {a} = 4 box + {c} class scores over {b} candidates"
        return Head(
            "yolov8", c, b, row, (o, 1, b), scores=(o + 4 * b, 1, b), score_cols=c, note=note, legacy=True
        )
    if layout in ("yolov5", "yolox"):
        grid = tuple((st, -(-s.input_size[0] // st), -(-s.input_size[1] // st)) for st in s.strides)
        what = (
            "decoded boxes"
            if layout == "yolov5"
            else f"raw boxes decoded on the grid of strides {list(s.strides)}"
        )
        note = f"{head} {layout}: {out}, {b} = 4 box + 1 objectness + {c} class scores over {a} candidates "
        note += f"({what})"
        return Head(
            layout, c, a, row, (o, b, 1), scores=(o + 5, b, 1), score_cols=c, objectness=(o + 4, b),
            grid=grid if layout == "yolox" else (), note=note, legacy=layout == "yolov5",
        )  # fmt: skip
    if layout == "end2end":
        note = (
            f"{head} end2end: {out}, up to {a} boxes of (x1, y1, x2, y2, score, class id), NMS done in the "
        )
        note += "model"
        return Head(
            "end2end", c, a, row, (o, 6, 1), "xyxy", scores=(o + 4, 6, 1), classes=(o + 5, 6), nms=False,
            note=note, legacy=True,
        )  # fmt: skip
    if b == 6 and c != 2:  # [N, 6]: box, score, class id (Ultralytics 8.4 RT-DETR: its own top-300)
        act = _activation(s, "none")
        fmt, scale, units = _box(s, "cxcywh", "normalized")
        note = f"{head} detr: {out}, {a} rows of {fmt} box ({units}), score ({act}), class id; no NMS"
        return Head(
            "detr", c, a, row, (o, 6, 1), fmt, scale, scores=(o + 4, 6, 1), activation=act,
            classes=(o + 5, 6), nms=False, note=note,
        )  # fmt: skip
    # detr, one output [N, 4 + C] (Ultralytics RT-DETR: scores already sigmoid) or [N, 5 + C] (+ "no object")
    act = _activation(s, "none" if b == 4 + c else "softmax")
    fmt, scale, units = _box(s, "cxcywh", "normalized")
    note = f"{head} detr: {out}, {a} queries of {fmt} boxes ({units}) + {b - 4} class scores ({act}), no NMS"
    return Head(
        "detr", c, a, row, (o, b, 1), fmt, scale, scores=(o + 4, b, 1), score_cols=c, softmax_cols=b - 4,
        activation=act, nms=False, note=note,
    )  # fmt: skip


def _activation(s: HeadSettings, default: str) -> str:
    return default if s.score_activation == "auto" else s.score_activation


def _box(s: HeadSettings, fmt: str | None, units: str | None) -> tuple[str, tuple[float, float], str]:
    """(box format, scale, units) from the settings, else the defaults; None default: must be set."""
    fmt = fmt if s.box_format == "auto" else s.box_format
    units = units if s.box_units == "auto" else s.box_units
    missing = [k for k, v in (("model.box_format", fmt), ("model.box_units", units)) if v is None]
    if missing:
        raise ValueError(
            f"{missing[0]}: the boxes' format cannot be told from the outputs' names; set "
            f"{' and '.join(missing)} (box_format: xyxy, xywh, cxcywh or yxyx; box_units: pixels or "
            "normalized)"
        )
    assert fmt is not None and units is not None
    scale = (float(s.input_size[0]), float(s.input_size[1])) if units == "normalized" else (1.0, 1.0)
    return fmt, scale, units


def _multi(s: HeadSettings, parts: Sequence[OutputPart]) -> Head:
    """Several outputs, no ``model.outputs``: known exports by their names, else a config error."""
    names = {p.name.lower(): p.name for p in parts}
    if all(n in names for n in TF_NAMES.values()):
        mapping = {k: names[v] for k, v in TF_NAMES.items()}
        if "num_detections" in names:
            mapping["count"] = names["num_detections"]
        return _mapped(s, parts, mapping, "TF Object Detection API names")
    boxes = [p for p in parts if len(p.shape) == 2 and p.shape[1] == 4]
    others = [p for p in parts if p not in boxes and len(p.shape) == 2]
    if len(parts) == 2 and len(boxes) == 1 and len(others) == 1 and s.layout in ("auto", "detr"):
        score = others[0].name.lower()
        if s.layout == "detr" or "logit" in score or score == "labels":
            return _detr2(
                s, boxes[0], others[0], "the layout set" if s.layout == "detr" else "a logits output"
            )
        if {p.name for p in parts} == {"boxes", "scores"}:
            return _mapped(s, parts, {"boxes": "boxes", "scores": "scores"}, "torchvision's output names")
    listed = shapes_text(parts)
    raise ValueError(
        f"model.outputs: auto cannot tell which of the outputs {listed} holds what; set model.outputs "
        "{boxes: NAME, scores: NAME, classes: NAME, count: NAME} (classes, count: if the model has them) "
        "with "
        "model.box_format and model.box_units, or model.layout: detr for a boxes + logits pair"
    )


def _detr2(s: HeadSettings, boxes: OutputPart, logits: OutputPart, why: str) -> Head:
    c = s.num_classes
    n, k = logits.shape
    if boxes.shape[0] != n or k not in (c, c + 1):
        raise ValueError(
            f"model.layout: detr reads boxes [B, N, 4] and logits [B, N, {c}] ({c} classes, or {c + 1} with "
            f"a trailing 'no object'); got {boxes.name} {_text(('B', *boxes.shape))} and {logits.name} "
            f"{_text(('B', *logits.shape))}: set model.class_names to the model's classes"
        )
    act = _activation(s, "softmax" if k == c + 1 else "sigmoid")
    fmt, scale, units = _box(s, "cxcywh", "normalized")
    verb = "chose" if s.layout == "auto" else "is"
    note = (
        f"model.layout {verb} detr ({why}): {boxes.name} {_text(('B', n, 4))} {fmt} boxes ({units}), "
        f"{logits.name} {_text(('B', n, k))} class logits ({act}), no NMS"
    )
    row = max(p.offset + p.size for p in (boxes, logits))
    return Head(
        "detr", c, n, row, (boxes.offset, 4, 1), fmt, scale, scores=(logits.offset, k, 1), score_cols=c,
        softmax_cols=k, activation=act, nms=False, note=note,
    )  # fmt: skip


def _mapped(
    s: HeadSettings, parts: Sequence[OutputPart], mapping: dict[str, str] | None = None, why: str = ""
) -> Head:
    """``model.outputs`` (or a known export's names): boxes + scores (+ classes, count)."""
    mapping = dict(mapping or s.outputs)
    by_name = {p.name: p for p in parts}
    for key in ("boxes", "scores"):
        if key not in mapping:
            raise ValueError(
                f"model.outputs.{key}: required; name the output holding the {key} ({shapes_text(parts)})"
            )
    for key, name in mapping.items():
        if name not in by_name:
            raise ValueError(
                f"model.outputs.{key}: no output named {name!r}; the model's outputs: {shapes_text(parts)}"
            )
    box, score = by_name[mapping["boxes"]], by_name[mapping["scores"]]
    cls = by_name.get(mapping.get("classes", ""))
    count = by_name.get(mapping.get("count", ""))
    if box.shape[-1:] != (4,) or box.size % 4:
        raise ValueError(f"model.outputs.boxes: {box.name} {_text(('B', *box.shape))} is not [B, N, 4]")
    n, c = box.size // 4, s.num_classes
    dims = [d for d in score.shape if d != 1] or [1]  # [B, N, 1] reads as [B, N]
    if dims in ([n], [1]) and n == score.size:
        cols, strides = 1, (1, 1)
    elif len(dims) == 2 and dims[0] == n:  # [B, N, K]: candidate-major
        cols, strides = dims[1], (dims[1], 1)
    elif len(dims) == 2 and dims[1] == n:  # [B, K, N]: class-major (yolov8-like)
        cols, strides = dims[0], (1, n)
    else:
        cols, strides = 0, (0, 0)
    if cols not in (1, c, c + 1) or (cols == 1 and cls is None and c != 1):
        raise ValueError(
            f"model.outputs.scores: {score.name} {_text(('B', *score.shape))} does not hold one score per "
            f"box (with model.outputs.classes) or {c} class scores per box for the {n} boxes of {box.name}; "
            "check model.outputs and model.class_names"
        )
    if cls is not None and cols > 1:
        raise ValueError(
            f"model.outputs.classes: with a classes output ({cls.name}) the scores must be one per box; "
            f"{score.name} {_text(('B', *score.shape))} holds {cols}: drop model.outputs.classes (the best "
            "class is taken from the scores) or name the per-box score output"
        )
    if cls is not None and cls.size != n:
        raise ValueError(
            f"model.outputs.classes: {cls.name} {_text(('B', *cls.shape))} is not one class per box"
        )
    if count is not None and count.size != 1:
        raise ValueError(
            f"model.outputs.count: {count.name} {_text(('B', *count.shape))} is not one number per image"
        )
    # Known exports by their names, whether auto found them or the mapping names them.
    tf = mapping.get("boxes") == TF_NAMES["boxes"] and mapping.get("scores") == TF_NAMES["scores"]
    torchvision = (mapping.get("boxes"), mapping.get("scores")) == TORCHVISION_NAMES
    detr = s.layout == "detr"
    fmt, scale, units = _box(
        s,
        "yxyx" if tf else "xyxy" if torchvision else "cxcywh" if detr else None,
        "normalized" if tf or detr else "pixels" if torchvision else None,
    )
    offset = s.class_offset if s.class_offset is not None else (1 if tf else 0)
    if detr:  # DETR's logits: sigmoid, or softmax with a trailing "no object"; a set, no NMS
        act = _activation(s, "softmax" if cols == c + 1 else "sigmoid")
    else:
        act = _activation(s, "softmax" if cols == c + 1 and cols > 1 else "none")
    nms = cls is None and not detr
    layout = "detr" if detr else "outputs"
    said = f" ({why})" if why else ""
    note = (
        f"model.layout {'auto chose ' if why else ''}{layout}{said}: boxes {box.name} ({fmt}, {units}), "
        f"scores {score.name} ({cols} per box, {act})"
        + (f", classes {cls.name} (minus {offset})" if cls is not None else "")
        + (f", count {count.name}" if count is not None else "")
        + (", class-aware NMS" if nms else ", no NMS")
    )
    row = max(p.offset + p.size for p in parts)
    return Head(
        layout, c, n, row, (box.offset, 4, 1), fmt, scale, scores=(score.offset, *strides),
        score_cols=c if cls is None else 1, softmax_cols=cols if act == "softmax" else 0, activation=act,
        classes=(cls.offset, 1) if cls is not None else None, class_offset=offset,
        count=count.offset if count is not None else None, nms=nms, note=note,
    )  # fmt: skip


def resolve_layout(layout: str, shape: tuple[int, ...], num_classes: int, name: str = "output") -> str:
    """The layout name of a one-output model with output ``shape`` [B, a, b] (``resolve_head``'s rules)."""
    if len(shape) != 3:
        raise ValueError(
            f"model output: expected a 3-D tensor [B, ., .], got shape {list(shape)}; {SUPPORTED}"
        )
    return resolve_head(HeadSettings(layout, num_classes), [OutputPart(name, tuple(shape[1:]))]).layout
