"""The ONNX metadata reader (no onnx import) agrees with onnx itself, and refuses what is not ONNX."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from streamd.config.model import defaults_from_metadata
from streamd.config.onnx_meta import read_metadata_props
from tests.conftest import MODEL


def _onnx_props(path: Path) -> dict[str, str]:
    return {p.key: p.value for p in onnx.load(str(path), load_external_data=False).metadata_props}


def _model_with_metadata(path: Path, props: dict[str, str]) -> Path:
    weights = numpy_helper.from_array(np.arange(300_000, dtype=np.float32).reshape(1000, 300), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1000])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 300])],
        [weights],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], doc_string="d" * 300)
    helper.set_model_props(model, props)
    model.metadata_props.append(onnx.StringStringEntryProto(key="layout", value="end2end"))  # later one wins
    onnx.save(model, path)
    return path


def test_reader_agrees_with_onnx(tmp_path: Path) -> None:
    props = {
        "names": "{0: 'person', 1: 'gabelstapler', 2: 'Fußgänger'}",
        "imgsz": "[480, 640]",
        "layout": "yolov8",
        "mean": "[0, 0, 0]",
        "empty": "",
    }
    path = _model_with_metadata(tmp_path / "m.onnx", props)
    assert read_metadata_props(path) == _onnx_props(path) == {**props, "layout": "end2end"}
    assert read_metadata_props(MODEL) == _onnx_props(MODEL)
    found = defaults_from_metadata(path)
    assert found["class_names"] == ("person", "gabelstapler", "Fußgänger")
    assert found["input_size"] == (640, 480) and found["layout"] == "end2end"


@pytest.mark.parametrize(
    "content",
    [b"", b"hello, this is not a model\n" * 10, MODEL.read_bytes()[:5000], bytes(range(256)) * 4],
    ids=["empty", "text", "truncated", "binary"],
)
def test_not_onnx_gives_no_defaults(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "m.onnx"
    path.write_bytes(content)
    if content:
        with pytest.raises(ValueError):
            read_metadata_props(path)
    assert defaults_from_metadata(path) == {}
