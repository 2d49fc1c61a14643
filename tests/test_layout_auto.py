"""`model.layout: auto` names the layout it chose and why; an ambiguous output, or a model this version cannot
run (segmentation, pose, oriented boxes, several outputs), is a config error (exit 78) naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from streamd.checks.model import check_model
from streamd.config import load_config
from streamd.engines.onnx_tools import model_io
from streamd.stages.postprocess.resolve import resolve_layout
from tests.conftest import CLIP, ROOT, run_streamd
from tests.engines.tiny_models import make_outputs_model

REFUSED = {
    "square-84": (
        {"output0": [1, 84, 84]},
        "",
        "model.layout: auto cannot tell the layout of output output0",
    ),
    "square-6": ({"output0": [1, 6, 6]}, "", "set model.layout to yolov8 or yolov5 or end2end"),
    "fits-two": ({"output0": [1, 84, 6]}, "", "set model.layout to yolov8 or end2end"),
    "seg": (
        {"output0": [1, 116, 64], "output1": [1, 32, 8, 8]},
        "",
        "model.path: a segmentation model (Ultralytics -seg: outputs output0 [1, 116, 64], output1 "
        "[1, 32, 8, 8]",
    ),
    "seg-one-output": (
        {"output0": [1, 116, 64]},
        "",
        "model.path: output output0 [1, 116, 64] looks like a seg",
    ),
    "pose": (
        {"output0": [1, 56, 64]},
        "  class_names: [person]\n",
        "model.path: output output0 [1, 56, 64] looks like a pose model (56 = 4 box + 1 class score + 17",
    ),
    "obb": (
        {"output0": [1, 85, 64]},
        "  layout: yolov8\n",
        "looks like an oriented-box model (85 = 4 box + 80",
    ),
    "multi": (
        {"boxes": [1, 10, 4], "scores": [1, 10]},
        "",
        "model.outputs: auto cannot tell which of the outputs boxes [1, 10, 4], scores [1, 10] holds what; "
        "set model.outputs {boxes: NAME, scores: NAME, classes: NAME, count: NAME}",
    ),
}


def write(tmp_path: Path, model: Path, extra: str = "", input_size: int = 32) -> Path:
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(
        f"streams:\n  - id: cam\n    url: {CLIP}\nmodel:\n  path: {model}\n"
        f"  input_size: [{input_size}, {input_size}]\n{extra}sinks:\n  - type: stdout\n"
    )
    return cfg


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_ambiguous_or_unsupported_model_is_refused(tmp_path: Path, case: str) -> None:
    outputs, extra, expected = REFUSED[case]
    cfg = write(tmp_path, make_outputs_model(tmp_path / f"{case}.onnx", outputs), extra)
    proc = run_streamd("check", str(cfg))
    assert proc.returncode == 78, proc.stderr
    assert expected in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_model_io_lists_every_output_of_a_multi_output_model(tmp_path: Path) -> None:
    import onnx

    model = onnx.load(str(make_outputs_model(tmp_path / "m.onnx", {"boxes": [1, 10, 4], "scores": [1, 10]})))
    io = model_io(model, "m.onnx", (32, 32))
    assert io.outputs == (("boxes", (1, 10, 4)), ("scores", (1, 10)))


@pytest.mark.parametrize(
    ("shape", "extra", "note"),
    [
        (
            [1, 84, 64],
            "",
            "model.layout auto chose yolov8: output output0 [1, 84, 64], 84 = 4 box + 80 class",
        ),
        ([1, 64, 85], "", "model.layout auto chose yolov5: output output0 [1, 64, 85], 85 = 4 box + 1 obj"),
        ([1, 100, 6], "", "model.layout auto chose end2end: output output0 [1, 100, 6], up to 100 boxes"),
        (
            [1, 7, 64],
            "  class_names: [a, b, c]\n  classes: [b]\n",
            "3 class names (model.class_names); model",
        ),
    ],
)
def test_unambiguous_model_gets_a_note_naming_the_layout(
    tmp_path: Path, shape: list[int], extra: str, note: str
) -> None:
    cfg = write(tmp_path, make_outputs_model(tmp_path / "m.onnx", {"output0": shape}), extra)
    report = check_model(load_config(cfg))
    assert report.problems == []
    said = [n for n in report.notes if n.startswith("model.layout")]
    assert len(said) == 1 and note in said[0], report.notes


def test_bundled_demo_check_notes_its_layout() -> None:
    proc = run_streamd("check", str(ROOT / "configs" / "demo.yaml"))
    assert proc.returncode == 0, proc.stderr
    assert (
        "note: model.layout yolov8: output output0 [batch, 84, 3549], 84 = 4 box + 80 class scores over 3549 "
        "candidates; 80 class names (model.class_names)" in proc.stderr
    ), proc.stderr


@pytest.mark.parametrize(
    ("model", "size", "layout"),
    [("nanodet-coco.onnx", 416, "yolov8"), ("centernet-mbv3-coco.onnx", 512, "end2end")],
)
def test_bundled_models_resolve_as_before(tmp_path: Path, model: str, size: int, layout: str) -> None:
    """Under auto and from their metadata both bundled models keep their layout."""
    path = ROOT / "models" / model
    auto = check_model(load_config(write(tmp_path, path, "  layout: auto\n", size)))
    assert auto.problems == [] and f"model.layout auto chose {layout}: " in "\n".join(auto.notes)
    meta = check_model(load_config(write(tmp_path, path, "", size)))
    assert meta.problems == [] and f"model.layout {layout} (from the model's metadata): " in "\n".join(
        meta.notes
    )


def test_resolve_layout_rules() -> None:
    assert resolve_layout("auto", (1, 84, 3549), 80) == "yolov8"
    assert resolve_layout("yolov8", (1, 84, 84), 80) == "yolov8"  # a layout set is never second-guessed
    assert resolve_layout("end2end", (1, 6, 6), 80) == "end2end"
    with pytest.raises(ValueError, match=r"^model\.path: .*pose model \(56 = 4 box \+ 1 class score \+ 17"):
        resolve_layout("yolov8", (1, 56, 8400), 1)
    with pytest.raises(ValueError, match="fits no known layout"):
        resolve_layout("auto", (1, 10, 10), 80)
