"""``model:`` — the detector file, its input preprocessing and its output decoding."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from streamd.config._fields import (
    Invalid,
    Problems,
    describe,
    existing_file,
    opt,
    path_text,
    read_section,
    resolve_path,
    suggest,
)
from streamd.config.coco import COCO_NAMES
from streamd.config.onnx_meta import read_metadata_props
from streamd.resources import bundled_path

DEFAULT_MODEL = bundled_path("models", "nanodet-coco.onnx")
MAX_TOP_K = 4096  # the GPU NMS kernel's limit (kernels/postprocess.cu: 64 mask words of 64 candidates)


@dataclass(frozen=True)
class ModelConfig:
    """The detector and how frames are turned into its input and its output into detections."""

    path: Path = opt(  # noqa: RUF009 (opt() is a dataclasses.field)
        DEFAULT_MODEL,
        "the model file (ONNX); relative to the config file's folder; must exist. "
        "Default: the bundled models/nanodet-coco.onnx",
    )
    input_size: tuple[int, int] = opt(
        (416, 416),
        "network input [width, height] in pixels",
        ge=32,
        le=4096,
        multiple_of=32,
        shape="[width, height]",
    )
    channel_order: Literal["rgb", "bgr"] = opt("rgb", "channel order the network expects")
    mean: tuple[float, float, float] = opt(
        (0.0, 0.0, 0.0), "subtracted per channel (in channel_order) before dividing by std"
    )
    std: tuple[float, float, float] = opt(
        (255.0, 255.0, 255.0),
        "divisor per channel (in channel_order): input = (pixel - mean) / std",
        gt=0,
    )
    resize: Literal["letterbox", "stretch"] = opt(
        "letterbox", "letterbox = keep the aspect ratio and pad with pad_value; stretch = scale to input_size"
    )
    pad_value: int = opt(114, "grey level of the letterbox padding", ge=0, le=255)
    layout: Literal["auto", "yolov8", "yolov5", "end2end", "detr", "yolox", "outputs"] = opt(
        "auto",
        "how to read the outputs: yolov8 [B, 4+C, N], yolov5 [B, N, 5+C], end2end [B, K, 6] (NMS in the "
        "model), detr [B, N, 4+C] or boxes + logits (RT-DETR, RF-DETR, DETR), yolox [B, N, 5+C] raw (grid "
        "decode at model.strides), outputs (several outputs named in model.outputs: SSD, TF Object Detection "
        "API, torchvision); auto = pick from the outputs' shapes, names and the number of class names, noted "
        "by check and logged at start; a model that fits several layouts must set it",
    )
    outputs: tuple[tuple[str, str], ...] = opt(
        (),
        "several-output models: which output holds what, {boxes: NAME, scores: NAME, classes: NAME, count: "
        "NAME} (classes and count only if the model has them: then no NMS is run); stored as (role, name)",
    )
    strides: tuple[int, ...] = opt((8, 16, 32), "yolox: the grid strides, one per output level, in order")
    box_format: Literal["auto", "cxcywh", "xyxy", "xywh", "yxyx"] = opt(
        "auto",
        "detr/outputs: box coordinates (xywh = top-left corner + size; yxyx = TF's ymin, xmin, ymax, xmax); "
        "auto: cxcywh for detr, what a known export's names say for outputs",
    )
    box_units: Literal["auto", "pixels", "normalized"] = opt(
        "auto", "detr/outputs: boxes in input pixels or normalised to 0..1; auto: normalized for detr"
    )
    score_activation: Literal["auto", "none", "sigmoid", "softmax"] = opt(
        "auto",
        "detr/outputs: scores as given (none), or logits through sigmoid or softmax (a trailing 'no object' "
        "column counts in softmax); auto: sigmoid for a logits output, softmax with the extra column",
    )
    class_offset: int | None = opt(
        None, "outputs with a classes output: subtracted from each class id (auto: 1 for TF OD API names)"
    )
    class_names: tuple[str, ...] = opt(
        COCO_NAMES,
        "'coco' (the 80 COCO names), a list of names, or a text file with one name per line; "
        "class id = position in the list",
    )
    score_threshold: float = opt(0.25, "detections scoring below this are dropped", gt=0, lt=1)
    iou_threshold: float = opt(
        0.45, "NMS: a box overlapping a better one of its class by more is dropped", gt=0, le=1
    )
    max_detections: int = opt(100, "most detections kept per frame after NMS", ge=1, le=10000)
    top_k: int = opt(
        1000, "most candidates per frame kept (best scores first) before NMS", ge=1, le=MAX_TOP_K
    )
    classes: tuple[int, ...] | None = opt(
        None,
        "class names or ids to detect (list); the others are dropped before NMS. Default: every class. "
        "streams[].classes overrides it per stream",
    )
    class_thresholds: tuple[tuple[int, float], ...] = opt(
        (),
        "class name (or id) -> score threshold for that class, in place of score_threshold "
        "(each 0 < x < 1); stored as (class id, threshold) pairs",
    )

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def thresholds(self, classes: tuple[int, ...] | None = None) -> list[float]:
        """Score threshold per class id (``inf``: filtered out) for ``classes`` (None = model.classes)."""
        keep = self.classes if classes is None else classes
        row = [self.score_threshold] * self.num_classes
        for cid, thr in self.class_thresholds:
            row[cid] = thr
        if keep is not None:
            wanted = set(keep)
            row = [thr if cid in wanted else float("inf") for cid, thr in enumerate(row)]
        return row


def class_list(value: object, path: str) -> tuple[str | int, ...]:
    """A list of class names or ids, as written (resolved later by :func:`resolve_classes`)."""
    if isinstance(value, (str, int)) and not isinstance(value, bool):
        raise Invalid(f"expected a list of class names or ids, got {describe(value)}; write [{value}]", path)
    if not isinstance(value, list) or not value:
        raise Invalid(f"expected a list of class names or ids (at least one), got {describe(value)}", path)
    for index, item in enumerate(value):
        if isinstance(item, bool) or not isinstance(item, (str, int)) or (isinstance(item, str) and not item):
            raise Invalid(f"expected a class name or id, got {describe(item)}", f"{path}[{index}]")
    return tuple(value)


def resolve_class(item: str | int, names: tuple[str, ...], path: str) -> int:
    """A class name or id -> the class id, checked against model.class_names."""
    if isinstance(item, int):
        if not 0 <= item < len(names):
            raise Invalid(
                f"class id {item} is out of range: the model has {len(names)} classes "
                f"(ids 0-{len(names) - 1})",
                path,
            )
        return item
    name = item.strip()
    if name in names:
        return names.index(name)
    raise Invalid(f"unknown class name {name!r} (not in model.class_names){suggest(name, names)}", path)


def resolve_classes(items: tuple[str | int, ...], names: tuple[str, ...], path: str) -> tuple[int, ...]:
    """Class names or ids -> sorted unique class ids; raises Invalid at the first bad item."""
    return tuple(sorted({resolve_class(item, names, f"{path}[{i}]") for i, item in enumerate(items)}))


def _thresholds_mapping(value: object, path: str) -> dict:
    if not isinstance(value, dict) or not value:
        raise Invalid(
            "expected a mapping of class name -> score threshold (e.g. {person: 0.5}), "
            f"got {describe(value)}",
            path,
        )
    out = {}
    for key, thr in value.items():
        here = f"{path}.{key}"
        if isinstance(thr, bool) or not isinstance(thr, (int, float)) or not 0 < float(thr) < 1:
            raise Invalid(f"expected a score threshold, a number > 0 and < 1, got {describe(thr)}", here)
        out[key] = float(thr)
    return out


def _resolve_model_classes(given: dict, problems: Problems) -> None:
    """Turn the class names of ``classes`` and ``class_thresholds`` into ids (in ``given``)."""
    names = given.get("class_names", COCO_NAMES)
    if "classes" in given:
        try:
            given["classes"] = resolve_classes(given["classes"], names, "model.classes")
        except Invalid as exc:
            problems.add(exc.path, exc.message)
            del given["classes"]
    if "class_thresholds" in given:
        pairs: dict[int, float] = {}
        for key, thr in given.pop("class_thresholds").items():
            try:
                pairs[resolve_class(key, names, f"model.class_thresholds.{key}")] = thr
            except Invalid as exc:
                problems.add(exc.path, exc.message)
        given["class_thresholds"] = tuple(sorted(pairs.items()))


OUTPUT_ROLES = ("boxes", "scores", "classes", "count")


def _outputs_mapping(value: object, path: str) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, dict) or not value:
        raise Invalid(
            "expected a mapping of role -> output name, e.g. {boxes: detection_boxes, scores: "
            f"detection_scores}}, got {describe(value)}",
            path,
        )
    out = []
    for role, name in value.items():
        if role not in OUTPUT_ROLES:
            raise Invalid(
                f"unknown role {role!r}; expected {', '.join(OUTPUT_ROLES)}"
                + suggest(str(role), OUTPUT_ROLES),
                f"{path}.{role}",
            )
        if not isinstance(name, str) or not name.strip():
            raise Invalid(
                f"expected the name of one of the model's outputs, got {describe(name)}", f"{path}.{role}"
            )
        out.append((role, name.strip()))
    missing = [r for r in ("boxes", "scores") if r not in value]
    if missing:
        raise Invalid(
            f"{' and '.join(missing)} missing: name the outputs holding the boxes and the scores", path
        )
    return tuple(out)


def _strides(value: object, path: str) -> tuple[int, ...]:
    if (
        not isinstance(value, list)
        or not 1 <= len(value) <= 4
        or not all(
            isinstance(v, int) and not isinstance(v, bool) and v in (4, 8, 16, 32, 64, 128) for v in value
        )
        or value != sorted(set(value))
    ):
        raise Invalid(
            "expected 1 to 4 increasing strides from 4, 8, 16, 32, 64, 128 (YOLOX: [8, 16, 32]), "
            f"got {describe(value)}",
            path,
        )
    return tuple(value)


def _class_offset(value: object, path: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not -1 <= value <= 1000:
        raise Invalid(f"expected an integer between -1 and 1000 (TF OD API: 1), got {describe(value)}", path)
    return value


def check_class_names(value: object, path: str, base_dir: Path) -> tuple[str, ...]:
    if value == "coco":
        return COCO_NAMES
    if isinstance(value, list):
        if not value:
            raise Invalid("expected at least one class name, got an empty list", path)
        for index, name in enumerate(value):
            if not isinstance(name, str) or not name.strip():
                hint = f"; put it in quotes: '{name}'" if isinstance(name, (int, float)) else ""
                raise Invalid(f"expected a class name, got {describe(name)}{hint}", f"{path}[{index}]")
        return tuple(name.strip() for name in value)
    if isinstance(value, str) and value.strip():
        return _names_from_file(existing_file(value.strip(), path, base_dir, "class names file"), path)
    raise Invalid(
        f"expected 'coco', a list of names, or the path of a text file with one name per line, "
        f"got {describe(value)}",
        path,
    )


def _names_from_file(file: Path, path: str) -> tuple[str, ...]:
    try:
        lines = [line.strip() for line in file.read_text(encoding="utf-8").splitlines()]
    except (OSError, UnicodeDecodeError) as exc:
        raise Invalid(f"cannot read the class names file {str(file)!r}: {exc}", path) from None
    while lines and not lines[-1]:
        lines.pop()
    if not lines:
        raise Invalid(f"the class names file {str(file)!r} holds no names; write one name per line", path)
    if "" in lines:
        raise Invalid(
            f"line {lines.index('') + 1} of the class names file {str(file)!r} is empty; "
            "class ids count lines, so every line must hold a name",
            path,
        )
    return tuple(lines)


def model_path(value: object, path: str, base_dir: Path, must_exist: bool = True) -> Path:
    """``model.path`` resolved; ``must_exist`` False (``check --no-model``): a missing file is accepted."""
    raw = path_text(value, path, "the path of the model file")
    if not must_exist and not resolve_path(raw, base_dir).exists():
        return resolve_path(raw, base_dir)
    return existing_file(raw, path, base_dir, "model file")


def parse_model(raw: object, problems: Problems, base_dir: Path, model_file: bool = True) -> ModelConfig:
    """Check the ``model:`` section (absent or empty = all defaults). ``model_file`` False: the model file
    need not exist (the settings it states about itself are read only where it does)."""
    given = read_section(
        ModelConfig,
        {} if raw is None else raw,
        "model",
        problems,
        special={
            "path": lambda v, p: model_path(v, p, base_dir, model_file),
            "class_names": lambda v, p: check_class_names(v, p, base_dir),
            "classes": class_list,
            "class_thresholds": _thresholds_mapping,
            "outputs": _outputs_mapping,
            "strides": _strides,
            "class_offset": _class_offset,
        },
    )
    if given is None:
        return ModelConfig()
    if "path" not in given and model_file and problems.ok("model.path") and not DEFAULT_MODEL.is_file():
        problems.add(
            "model.path",
            f"not set, and the default model {str(DEFAULT_MODEL)!r} is missing; "
            "set model.path to an ONNX file (relative to the config file's folder)",
        )
    if problems.ok("model.path"):
        for key, value in defaults_from_metadata(given.get("path", DEFAULT_MODEL)).items():
            given.setdefault(key, value)
    _resolve_model_classes(given, problems)
    return ModelConfig(**given)


def defaults_from_metadata(model: Path) -> dict[str, object]:
    """Preprocessing and decoding settings the ONNX file states about itself (``metadata_props``).

    Keys read: ``channel_order``, ``mean``, ``std``, ``layout`` (or Ultralytics' ``head: RTDETRDecoder``:
    detr), ``input_size`` ([w, h] or Ultralytics'
    ``imgsz`` [h, w]) and ``names`` (a JSON list, or Ultralytics' ``{0: 'person', ...}``). They fill only what
    the config leaves out; a value that does not parse is ignored (the config's own default applies).
    """
    if model.suffix.lower() != ".onnx" or not model.is_file():
        return {}
    try:
        meta = read_metadata_props(model)
    except (OSError, ValueError):  # not readable as ONNX: the model check and the engine report it
        return {}
    found: dict[str, object] = {}
    if meta.get("channel_order") in ("rgb", "bgr"):
        found["channel_order"] = meta["channel_order"]
    if meta.get("layout") in ("yolov8", "yolov5", "end2end", "detr", "yolox"):
        found["layout"] = meta["layout"]
    elif meta.get("head") == "RTDETRDecoder":  # Ultralytics RT-DETR: its [B, 300, 6] rows are cx, cy, w, h
        found["layout"] = "detr"  # normalised (not end2end's x1, y1, x2, y2 pixels), score, class
    for key in ("mean", "std"):
        triple = _literal(meta.get(key))
        if not (isinstance(triple, list) and len(triple) == 3):
            continue
        values = [float(v) for v in triple if isinstance(v, (int, float))]
        if len(values) == 3 and (key == "mean" or min(values) > 0):
            found[key] = tuple(values)
    size = _literal(meta.get("input_size"))
    imgsz = _literal(meta.get("imgsz"))
    if size is None and isinstance(imgsz, list):
        size = imgsz[::-1]
    if isinstance(size, list) and len(size) == 2 and all(isinstance(v, int) and v % 32 == 0 for v in size):
        found["input_size"] = (size[0], size[1])
    names = _literal(meta.get("names"))
    if isinstance(names, dict) and sorted(names) == list(range(len(names))):
        names = [names[i] for i in range(len(names))]
    if isinstance(names, list) and names and all(isinstance(n, str) and n for n in names):
        found["class_names"] = tuple(names)
    return found


def _literal(text: str | None) -> object:
    if not text:
        return None
    try:
        return ast.literal_eval(text)  # JSON lists/numbers and Python dict literals alike
    except (ValueError, SyntaxError):
        return None
