"""Heads (detr, yolox, several outputs): what ``auto`` picks, the decode against an independent per-candidate
reference (plain Python, float64), and what the postprocessor keeps (NMS or not, counts, class offsets)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from streamd.stages.postprocess.cpu import CpuPostprocessor, PostprocessSpec
from streamd.stages.postprocess.head import Head, HeadSettings, pack_parts
from streamd.stages.postprocess.read import decode_rows
from streamd.stages.postprocess.resolve import resolve_head
from tests.heads_data import FAMILIES, H, W

EXPECTED = {  # family -> (layout, nms, activation, box format)
    "detr-one-output": ("detr", False, "none", "cxcywh"),
    "detr-sigmoid": ("detr", False, "sigmoid", "cxcywh"),
    "detr-softmax": ("detr", False, "softmax", "cxcywh"),
    "yolox": ("yolox", True, "none", "cxcywh"),
    "tf-od-api": ("outputs", False, "none", "yxyx"),
    "torchvision-ssd": ("outputs", True, "none", "xyxy"),
    "mapped-xywh": ("outputs", True, "none", "xywh"),
}


def head_of(family: str) -> Head:
    f = FAMILIES[family]
    return resolve_head(f.settings, f.parts())


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_auto_picks_the_family(family: str) -> None:
    head = head_of(family)
    assert (head.layout, head.nms, head.activation, head.box_format) == EXPECTED[family]
    assert head.note.startswith("model.layout"), head.note


def reference(family: str, rows: np.ndarray) -> list[list[tuple[tuple[float, ...], float, int, bool]]]:
    """Per image, per candidate: (x1, y1, x2, y2), score, class, valid — written from each family's export
    conventions, not from the head descriptor."""
    f = FAMILIES[family]
    out = []
    for row in rows.astype(np.float64):
        parts = {p.name: row[p.offset : p.offset + p.size].reshape(p.shape) for p in f.parts()}
        image = []
        if family.startswith("detr"):
            boxes = parts["output0"][:, :4] if family == "detr-one-output" else parts["pred_boxes"]
            scores = parts["output0"][:, 4:] if family == "detr-one-output" else parts["pred_logits"]
            for q in range(len(boxes)):
                cx, cy, w, h = boxes[q] * [W, H, W, H]
                s = scores[q]
                if family == "detr-sigmoid":
                    probs = [1 / (1 + math.exp(-v)) for v in s]
                elif family == "detr-softmax":
                    e = [math.exp(v - max(s)) for v in s]
                    probs = [v / sum(e) for v in e][:-1]
                else:
                    probs = list(s)
                c = int(np.argmax(probs))
                image.append(((cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2), probs[c], c, True))
        elif family == "yolox":
            raw, k = parts["output"], 0
            for stride in (8, 16, 32):
                gw, gh = math.ceil(W / stride), math.ceil(H / stride)
                for gy in range(gh):
                    for gx in range(gw):
                        r = raw[k]
                        cx, cy = (r[0] + gx) * stride, (r[1] + gy) * stride
                        w, h = math.exp(r[2]) * stride, math.exp(r[3]) * stride
                        c = int(np.argmax(r[5:]))
                        image.append(
                            ((cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2), r[4] * r[5 + c], c, True)
                        )
                        k += 1
        elif family == "tf-od-api":
            count = int(parts["num_detections"])
            for i, (y1, x1, y2, x2) in enumerate(parts["detection_boxes"]):
                box = (x1 * W, y1 * H, x2 * W, y2 * H)
                cls = int(parts["detection_classes"][i]) - 1
                image.append((box, parts["detection_scores"][i], cls, i < count))
        else:
            boxes = parts["boxes"] if family == "torchvision-ssd" else parts["bbox"]
            for i, b in enumerate(boxes):
                box = tuple(b) if family == "torchvision-ssd" else (b[0], b[1], b[0] + b[2], b[1] + b[3])
                c = int(np.argmax(parts["scores"][i]))
                image.append((box, parts["scores"][i][c], c, True))
        out.append(image)
    return out


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_decode_matches_an_independent_reference(family: str) -> None:
    rows = FAMILIES[family].rows(np.random.default_rng(5), 2)
    xyxy, score, cls, valid = decode_rows(head_of(family), rows)
    for b, image in enumerate(reference(family, rows)):
        assert len(image) == xyxy.shape[1]
        want_box = np.array([c[0] for c in image])
        np.testing.assert_allclose(xyxy[b], want_box, rtol=1e-5, atol=1e-3)
        np.testing.assert_allclose(score[b], [c[1] for c in image], rtol=1e-5, atol=1e-6)
        assert (cls[b] == [c[2] for c in image]).all()
        assert (valid[b] == [c[3] for c in image]).all()


def test_tf_count_and_offset_reach_the_detections() -> None:
    family = FAMILIES["tf-od-api"]
    rows = family.rows(np.random.default_rng(9), 3)
    head = head_of("tf-od-api")
    spec = PostprocessSpec(head.layout, 80, 0.3, 0.5, 100, 1000, head=head)
    for b, det in enumerate(CpuPostprocessor(spec)(rows)):
        image = reference("tf-od-api", rows[b : b + 1])[0]
        want = [c for c in image if c[3] and c[1] > 0.3]  # no NMS: the model did it
        assert len(det) == len(want)
        assert sorted(det.class_id.tolist()) == sorted(c[2] for c in want)


def test_nms_runs_only_where_the_model_did_not() -> None:
    """Two identical overlapping boxes: kept both by detr (set prediction), one by the SSD-style mapping."""
    parts = pack_parts([("boxes", (2, 4)), ("scores", (2, 2))])
    rows = np.array([[10, 10, 100, 100, 10, 10, 100, 100, 0.9, 0.1, 0.8, 0.1]], np.float32)
    ssd = resolve_head(HeadSettings(num_classes=2, box_units="pixels"), parts)
    detr = resolve_head(HeadSettings("detr", 2, box_units="pixels", score_activation="none"), parts)
    keep = [
        len(CpuPostprocessor(PostprocessSpec(h.layout, 2, 0.5, 0.5, 10, 100, head=h))(rows)[0])
        for h in (ssd, detr)
    ]
    assert keep == [1, 2]


@pytest.mark.parametrize(
    ("outputs", "settings", "message"),
    [
        (
            (("a", (10, 4)), ("b", (10, 80))),
            HeadSettings(),
            "model.outputs: auto cannot tell which of the outputs a",
        ),
        ((("output", (8400, 85)),), HeadSettings(), "set model.layout to yolov5 or yolox"),
        (
            (("output", (8400, 85)),),
            HeadSettings("yolox", input_size=(320, 320)),
            "model.strides: the yolox output",
        ),
        (
            (("o", (10, 4)), ("s", (10, 80))),
            HeadSettings(outputs={"boxes": "o", "scores": "x"}),
            "no output named 'x'",
        ),
        (
            (("o", (10, 4)), ("s", (10, 80))),
            HeadSettings(outputs={"boxes": "o", "scores": "s"}),
            "model.box_format",
        ),
        (
            (("o", (10, 4)), ("s", (10, 7))),
            HeadSettings(outputs={"boxes": "o", "scores": "s"}),
            "model.outputs.scores",
        ),
        ((("pred_boxes", (10, 4)), ("pred_logits", (10, 5))), HeadSettings(), "set model.class_names"),
    ],
)
def test_what_cannot_be_read_names_the_key(outputs: tuple, settings: HeadSettings, message: str) -> None:
    with pytest.raises(ValueError, match=r"^model") as exc:
        resolve_head(settings, pack_parts(outputs))
    assert message in str(exc.value)


def test_a_set_layout_is_not_second_guessed() -> None:
    parts = pack_parts([("output", (8400, 85))])
    assert resolve_head(HeadSettings("yolov5"), parts).layout == "yolov5"
    assert resolve_head(HeadSettings("yolox"), parts).grid == ((8, 80, 80), (16, 40, 40), (32, 20, 20))
    assert resolve_head(HeadSettings(), pack_parts([("output", (25200, 85))])).layout == "yolov5"


def test_fp16_rows_decode_as_float32() -> None:
    family = FAMILIES["yolox"]
    rows = family.rows(np.random.default_rng(1), 1)
    half = rows.astype(np.float16)
    got = decode_rows(head_of("yolox"), half)
    want = decode_rows(head_of("yolox"), half.astype(np.float32))
    for g, w in zip(got, want, strict=True):
        assert np.array_equal(g, w)
    assert replace(head_of("yolox"), note="x") == head_of("yolox")  # the note is not part of the identity


def test_class_major_scores_are_read_by_class() -> None:
    """scores [B, C, N] next to boxes [B, N, 4] (review finding): read with strides (1, N), not as [N, C]."""
    rng = np.random.default_rng(2)
    boxes = rng.uniform(0, 100, (1, 6, 4)).astype(np.float32)
    scores = rng.uniform(0, 1, (1, 3, 6)).astype(np.float32)
    parts = pack_parts([("boxes", (6, 4)), ("scores", (3, 6))])
    head = resolve_head(HeadSettings(num_classes=3, box_format="xyxy", box_units="pixels",
                                     outputs={"boxes": "boxes", "scores": "scores"}), parts)  # fmt: skip
    rows = np.concatenate([boxes.reshape(1, -1), scores.reshape(1, -1)], axis=1)
    _, score, cls, _ = decode_rows(head, rows)
    assert (cls[0] == scores[0].argmax(axis=0)).all() and np.allclose(score[0], scores[0].max(axis=0))


def test_a_classes_output_beside_per_class_scores_is_refused() -> None:
    parts = pack_parts([("boxes", (5, 4)), ("scores", (5, 3)), ("labels", (5,))])
    settings = HeadSettings(num_classes=3, box_format="xyxy", box_units="pixels",
                            outputs={"boxes": "boxes", "scores": "scores", "classes": "labels"})  # fmt: skip
    with pytest.raises(ValueError, match=r"^model.outputs.classes: with a classes output"):
        resolve_head(settings, parts)


def test_named_tf_outputs_keep_the_tf_conventions() -> None:
    """model.outputs naming TF's outputs gives what auto gives: yxyx, normalised, label - 1."""
    f = FAMILIES["tf-od-api"]
    mapping = {"boxes": "detection_boxes", "scores": "detection_scores", "classes": "detection_classes",
               "count": "num_detections"}  # fmt: skip
    named = resolve_head(HeadSettings(input_size=(W, H), outputs=mapping), f.parts())
    auto = resolve_head(f.settings, f.parts())
    assert named == auto and (named.class_offset, named.box_format) == (1, "yxyx")


def test_detr_with_named_outputs_keeps_detr_defaults() -> None:
    f = FAMILIES["detr-sigmoid"]
    mapping = {"boxes": "pred_boxes", "scores": "pred_logits"}
    named = resolve_head(HeadSettings("detr", input_size=(W, H), outputs=mapping), f.parts())
    assert (named.activation, named.nms, named.box_format, named.box_scale) == (
        "sigmoid",
        False,
        "cxcywh",
        (W, H),
    )
