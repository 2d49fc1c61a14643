"""streamd.config: bad configs name the key path, the line and the fix; good configs load with defaults."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if importlib.util.find_spec("streamd") is None:  # running from a checkout without an install
    sys.path.insert(0, str(ROOT))

from streamd.config import (  # noqa: E402
    BUNDLED_DEMO,
    COCO_NAMES,
    EX_CONFIG,
    Config,
    ConfigError,
    EngineConfig,
    JsonlSinkConfig,
    MetricsConfig,
    ModelConfig,
    PipelineConfig,
    StdoutSinkConfig,
    StreamConfig,
    load_config,
    parse_config,
)

DEMO_FILES = [ROOT / "samples/vtest.mp4", ROOT / "samples/vtest-hevc.mp4", ROOT / "models/nanodet-coco.onnx"]
needs_demo_files = pytest.mark.skipif(
    not all(p.is_file() for p in DEMO_FILES), reason="samples/ or models/ files not produced yet"
)
needs_cli = pytest.mark.skipif(
    not (ROOT / "streamd/cli.py").is_file(), reason="streamd/cli.py not written yet"
)

# A valid config; every case below edits it. Paths are relative to the config file's folder (tmp_path).
GOOD = """\
streams:
  - id: cam1
    url: video.mp4
model:
  path: model.onnx
"""


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """A config folder holding placeholder media: video.mp4, model.onnx, names.txt and an out/ folder."""
    (tmp_path / "video.mp4").write_bytes(b"\0")
    (tmp_path / "model.onnx").write_bytes(b"\0")
    (tmp_path / "names.txt").write_text("cat\ndog\n\n")
    (tmp_path / "out").mkdir()
    return tmp_path


def write(folder: Path, text: str, name: str = "streamd.yaml") -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(text))
    return path


def problems_of(path: Path) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    return caught.value.problems


# (case id, YAML, key path, message fragments, how many problems in all).
# The line ending in "# <-" is the line the problem must point at.
BAD = [
    (
        "unknown-top-key",
        GOOD + "flavour: red  # <-\n",
        "flavour",
        ["unknown key", "valid keys here: streams"],
        1,
    ),
    ("section-key-at-top", GOOD + "batch_size: 4  # <-\n", "batch_size", ["belongs under pipeline:"], 1),
    (
        "unknown-nested-key",
        GOOD + "  iou_treshold: 0.3  # <-\n",
        "model.iou_treshold",
        ["unknown key; did you mean 'iou_threshold'?"],
        1,
    ),
    ("missing-streams", "model:  # <-\n  path: model.onnx\n", "streams", ["required key missing"], 1),
    ("empty-streams", "streams: []  # <-\nmodel:\n  path: model.onnx\n", "streams", ["the list is empty"], 1),
    (
        "streams-not-list",
        "streams:  # <-\n  id: a\nmodel:\n  path: model.onnx\n",
        "streams",
        ["expected a list of streams", "a mapping"],
        1,
    ),
    (
        "duplicate-yaml-key",
        GOOD + "  path: model.onnx  # <-\n",
        "model.path",
        ["key given twice (first on line 5)", "delete one"],
        1,
    ),
    (
        "duplicate-stream-id",
        GOOD.replace("model:", "  - id: cam1  # <-\n    url: video.mp4\nmodel:"),
        "streams[1].id",
        ["duplicate id 'cam1' (already used by streams[0])"],
        1,
    ),
    (
        "bad-id-chars",
        GOOD.replace("id: cam1", "id: cam 1  # <-"),
        "streams[0].id",
        ["got 'cam 1'", "A-Z a-z"],
        1,
    ),
    (
        "id-not-string",
        GOOD.replace("id: cam1", "id: 7  # <-"),
        "streams[0].id",
        ["got 7 (an integer)", "put it in quotes"],
        1,
    ),
    (
        "missing-url",
        "streams:\n  - id: cam1  # <-\nmodel:\n  path: model.onnx\n",
        "streams[0].url",
        ["required key missing", "rtsp://"],
        1,
    ),
    (
        "file-not-found",
        GOOD.replace("url: video.mp4", "url: nope.mp4  # <-"),
        "streams[0].url",
        ["video file not found: 'nope.mp4'", "relative to the config file's folder"],
        1,
    ),
    (
        "url-is-folder",
        GOOD.replace("url: video.mp4", "url: out  # <-"),
        "streams[0].url",
        ["is a folder, not a video file"],
        1,
    ),
    (
        "http-scheme",
        GOOD.replace("url: video.mp4", "url: http://cam/live  # <-"),
        "streams[0].url",
        ["unsupported URL scheme 'http://'", "rtsp://, rtsps://"],
        1,
    ),
    (
        "rtsp-no-host",
        GOOD.replace("url: video.mp4", "url: rtsp:///live  # <-"),
        "streams[0].url",
        ["has no host"],
        1,
    ),
    (
        "rtsp-bad-port",
        GOOD.replace("url: video.mp4", "url: rtsp://u:secret@cam:99999/x  # <-"),
        "streams[0].url",
        ["malformed rtsp URL 'rtsp://***@cam:99999/x'"],
        1,
    ),
    (
        "loop-on-rtsp",
        GOOD.replace("url: video.mp4", "url: rtsp://cam/live\n    loop: true  # <-"),
        "streams[0].loop",
        ["loop applies to video files only"],
        1,
    ),
    (
        "transport-on-file",
        GOOD.replace("url: video.mp4", "url: video.mp4\n    transport: udp  # <-"),
        "streams[0].transport",
        ["rtsp streams only"],
        1,
    ),
    (
        "string-for-int",
        GOOD.replace("url: video.mp4", "url: video.mp4\n    reconnect_attempts: '3'  # <-"),
        "streams[0].reconnect_attempts",
        ["expected an integer >= 0", "got the string '3'", "without quotes"],
        1,
    ),
    (
        "float-for-int",
        GOOD.replace("url: video.mp4", "url: video.mp4\n    reconnect_attempts: 3.0  # <-"),
        "streams[0].reconnect_attempts",
        ["got 3.0", "write 3"],
        1,
    ),
    (
        "unit-in-value",
        GOOD.replace("url: video.mp4", "url: video.mp4\n    open_timeout_s: 10s  # <-"),
        "streams[0].open_timeout_s",
        ["the unit is in the key name"],
        1,
    ),
    (
        "bool-yes",
        GOOD.replace("url: video.mp4", "url: video.mp4\n    loop: yes  # <-"),
        "streams[0].loop",
        ["expected true or false, got the string 'yes'"],
        1,
    ),
    (
        "bool-int",
        GOOD.replace("url: video.mp4", "url: video.mp4\n    realtime: 1  # <-"),
        "streams[0].realtime",
        ["expected true or false, got 1 (an integer)"],
        1,
    ),
    (
        "int-bool",
        GOOD + "engine:\n  max_batch: true  # <-\n",
        "engine.max_batch",
        ["expected an integer between 1 and 256, got true (a boolean)"],
        1,
    ),
    (
        "negative-timeout",
        GOOD.replace("url: video.mp4", "url: video.mp4\n    open_timeout_s: -1  # <-"),
        "streams[0].open_timeout_s",
        ["expected a number > 0, got -1"],
        1,
    ),
    (
        "empty-value",
        GOOD.replace("url: video.mp4", "url: video.mp4\n    stall_timeout_s:  # <-"),
        "streams[0].stall_timeout_s",
        ["got nothing", "delete the key to use the default (10.0)"],
        1,
    ),
    (
        "reconnect-max-below-initial",
        GOOD.replace(
            "url: video.mp4", "url: video.mp4\n    reconnect_initial_s: 2\n    reconnect_max_s: 1  # <-"
        ),
        "streams[0].reconnect_max_s",
        ["reconnect_max_s 1 is less than reconnect_initial_s 2"],
        1,
    ),
    (
        "input-size-not-multiple",
        GOOD + "  input_size: [416,\n    420]  # <-\n",
        "model.input_size[1]",
        ["a multiple of 32, got 420", "nearest valid: 416"],
        1,
    ),
    (
        "input-size-one-number",
        GOOD + "  input_size: 416  # <-\n",
        "model.input_size",
        ["a list [width, height] of 2 integers"],
        1,
    ),
    (
        "mean-wrong-length",
        GOOD + "  mean: [0, 0]  # <-\n",
        "model.mean",
        ["expected a list of 3 numbers, got a list of 2 items"],
        1,
    ),
    ("std-zero", GOOD + "  std: [1, 0, 1]  # <-\n", "model.std[1]", ["expected a number > 0, got 0.0"], 1),
    (
        "bad-resize",
        GOOD + "  resize: letterbx  # <-\n",
        "model.resize",
        ["one of 'letterbox', 'stretch'", "did you mean 'letterbox'?"],
        1,
    ),
    ("bad-layout", GOOD + "  layout: yolov9  # <-\n", "model.layout", ["one of 'auto', 'yolov8'"], 1),
    (
        "score-threshold-high",
        GOOD + "  score_threshold: 1.5  # <-\n",
        "model.score_threshold",
        ["expected a number > 0 and < 1, got 1.5"],
        1,
    ),
    (
        "not-finite",
        GOOD + "  iou_threshold: .nan  # <-\n",
        "model.iou_threshold",
        ["not a finite number"],
        1,
    ),
    (
        "model-missing",
        GOOD.replace("path: model.onnx", "path: missing.onnx  # <-"),
        "model.path",
        ["model file not found: 'missing.onnx'"],
        1,
    ),
    (
        "class-names-item",
        GOOD + "  class_names: [cat,\n    3]  # <-\n",
        "model.class_names[1]",
        ["expected a class name, got 3"],
        1,
    ),
    (
        "class-names-file-missing",
        GOOD + "  class_names: labels.txt  # <-\n",
        "model.class_names",
        ["class names file not found: 'labels.txt'"],
        1,
    ),
    (
        "model-not-mapping",
        GOOD.replace("model:", "model: [1]  # <-\nx-old:"),
        "model",
        ["expected a mapping"],
        1,
    ),
    (
        "batch-over-max-batch",
        GOOD + "engine:\n  max_batch: 8\npipeline:\n  batch_size: 16  # <-\n",
        "pipeline.batch_size",
        ["pipeline.batch_size 16 is larger than engine.max_batch 8"],
        1,
    ),
    (
        "ring-slots-not-a-multiple-of-lanes",
        GOOD + "engine:\n  lanes: 2\npipeline:\n  ring_slots: 3  # <-\n",
        "pipeline.ring_slots",
        ["pipeline.ring_slots 3 is not a multiple of engine.lanes 2", "set ring_slots to 4"],
        1,
    ),
    (
        "ring-slots-zero",
        GOOD + "pipeline:\n  ring_slots: 0  # <-\n",
        "pipeline.ring_slots",
        ["expected an integer between 1 and 16, got 0"],
        1,
    ),
    (
        "workers-zero",
        GOOD + "pipeline:\n  workers: 0  # <-\n",
        "pipeline.workers",
        ["expected 'auto' or an integer between 1 and 64, got 0"],
        1,
    ),
    (
        "workers-word",
        GOOD + "pipeline:\n  workers: many  # <-\n",
        "pipeline.workers",
        ["expected 'auto' or an integer between 1 and 64"],
        1,
    ),
    (
        "devices-not-list",
        GOOD + "pipeline:\n  devices: 0  # <-\n",
        "pipeline.devices",
        ["expected a list of CUDA device indices"],
        1,
    ),
    (
        "int8-onnxruntime",
        GOOD + "engine:\n  type: onnxruntime\n  precision: int8  # <-\n",
        "engine.precision",
        ["INT8 needs a Q/DQ", "TensorRT", "'onnxruntime'"],
        1,
    ),
    (
        "unknown-sink-type",
        GOOD + "sinks:\n  - type: kafka  # <-\n",
        "sinks[0].type",
        ["unknown sink type 'kafka'", "valid types: 'jsonl', 'stdout'"],
        1,
    ),
    ("sink-without-type", GOOD + "sinks:\n  - path: x  # <-\n", "sinks[0].type", ["required key missing"], 1),
    (
        "jsonl-missing-path",
        GOOD + "sinks:\n  - type: jsonl  # <-\n",
        "sinks[0].path",
        ["required key missing"],
        1,
    ),
    (
        "jsonl-folder-missing",
        GOOD + "sinks:\n  - type: jsonl\n    path: nowhere/out.jsonl  # <-\n",
        "sinks[0].path",
        ["folder not found", "nowhere"],
        1,
    ),
    (
        "jsonl-unknown-key",
        GOOD + "sinks:\n  - type: jsonl\n    path: out/r.jsonl\n    flush_evry: 5  # <-\n",
        "sinks[0].flush_evry",
        ["did you mean 'flush_every'?"],
        1,
    ),
    ("empty-sinks", GOOD + "sinks: []  # <-\n", "sinks", ["the list is empty"], 1),
    (
        "two-stdout-sinks",
        GOOD + "sinks:\n  - type: stdout\n  - type: stdout  # <-\n",
        "sinks[1].type",
        ["keep one stdout sink"],
        1,
    ),
    (
        "metrics-port",
        GOOD + "metrics:\n  port: 70000  # <-\n",
        "metrics.port",
        ["expected an integer between 1 and 65535, got 70000"],
        1,
    ),
    ("bad-log-level", GOOD + "log_level: INFO  # <-\n", "log_level", ["did you mean 'info'?"], 1),
]


@pytest.mark.parametrize(("text", "key", "fragments", "count"), [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_bad_config_names_key_line_and_fix(
    folder: Path, text: str, key: str, fragments: list[str], count: int
):
    path = write(folder, text)
    problems = problems_of(path)
    assert len(problems) == count, problems
    hits = [p for p in problems if f": {key}: " in p]
    assert len(hits) == 1, problems
    for fragment in fragments:
        assert fragment in hits[0]
    lines = [n for n, line in enumerate(text.splitlines(), 1) if "# <-" in line]
    where = f"{path}:{lines[0]}: " if lines else f"{path}: "
    assert hits[0].startswith(where), (where, hits[0])


def test_several_problems_all_reported_in_line_order(folder: Path):
    path = write(
        folder,
        """\
        streams:
          - id: cam 1
            url: http://x
          - id: b
            url: rtsp://cam/1
            loop: true
        model:
          path: model.onnx
          score_threshold: 2
        pipeline:
          ring_slots: 99
        metrics:
          port: 0
        bogus: 1
        """,
    )
    problems = problems_of(path)
    keys = ["streams[0].id", "streams[0].url", "streams[1].loop", "model.score_threshold"]
    keys += ["pipeline.ring_slots", "metrics.port", "bogus"]
    assert [next(k for k in keys if f": {k}: " in p) for p in problems] == keys
    error = ConfigError(problems)
    assert str(error) == "\n".join(problems)


def test_yaml_syntax_error_reports_line_and_column(folder: Path):
    path = write(folder, "streams:\n  - id: a\n    url: [video.mp4\nmodel: {}\n")
    (problem,) = problems_of(path)
    assert problem.startswith(f"{path}:4:")
    assert "invalid YAML" in problem


def test_tab_indentation_hint(folder: Path):
    path = write(folder, "streams:\n\t- id: a\n")
    (problem,) = problems_of(path)
    assert problem.startswith(f"{path}:2:1: invalid YAML") and "spaces, not tabs" in problem


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("", "the config is empty"),
        ("# only a comment\n", "the config is empty"),
        ("- streams\n- model\n", "the top level must be a mapping"),
        ("just words\n", "the top level must be a mapping"),
    ],
    ids=["empty", "comment-only", "list", "scalar"],
)
def test_top_level_must_be_a_mapping(folder: Path, text: str, fragment: str):
    (problem,) = problems_of(write(folder, text))
    assert fragment in problem


def test_missing_config_file(tmp_path: Path):
    (problem,) = problems_of(tmp_path / "nope.yaml")
    assert "config file not found" in problem


def test_parse_config_without_marks_has_no_line_numbers(folder: Path):
    with pytest.raises(ConfigError) as caught:
        parse_config({"streams": [{"id": "a", "url": "x.mp4"}], "model": {"path": "model.onnx"}}, folder)
    assert caught.value.problems == [
        f"<config>: streams[0].url: video file not found: 'x.mp4' (looked at {folder / 'x.mp4'}; "
        "paths are relative to the config file's folder)"
    ]


def test_defaults(folder: Path):
    config = load_config(write(folder, GOOD))
    assert isinstance(config, Config)
    (stream,) = config.streams
    assert stream == StreamConfig(id="cam1", url=str(folder / "video.mp4"))
    assert (stream.loop, stream.realtime, stream.transport) == (False, False, "tcp")
    assert (stream.open_timeout_s, stream.read_timeout_s, stream.stall_timeout_s) == (10.0, 5.0, 10.0)
    assert (stream.reconnect_initial_s, stream.reconnect_max_s, stream.reconnect_attempts) == (0.5, 30.0, 0)
    assert config.model == ModelConfig(path=folder / "model.onnx")
    model = config.model
    assert model.input_size == (416, 416) and model.channel_order == "rgb" and model.resize == "letterbox"
    assert model.mean == (0.0, 0.0, 0.0) and model.std == (255.0, 255.0, 255.0) and model.pad_value == 114
    assert model.layout == "auto" and model.class_names == COCO_NAMES and model.num_classes == 80
    assert (model.score_threshold, model.iou_threshold, model.max_detections, model.top_k) == (
        0.25,
        0.45,
        100,
        1000,
    )
    assert config.engine == EngineConfig()
    assert config.engine.type == "auto" and config.engine.precision == "fp16" and config.engine.max_batch == 8
    assert config.engine.cache_dir == Path.home() / ".cache" / "streamd"
    assert config.engine.cuda_graphs is True and config.engine.threads == 0 and config.engine.device == 0
    assert config.pipeline == PipelineConfig(batch_size=4, batch_timeout_ms=10.0, ring_slots=3, frame_queue=2)
    assert config.pipeline.decoder == "auto"
    assert config.sinks == (StdoutSinkConfig(),) and config.sinks[0].type == "stdout"
    assert config.metrics == MetricsConfig(enabled=False, host="127.0.0.1", port=9108)
    assert config.log_level == "info"
    assert config.source == str(folder / "streamd.yaml")


def test_config_is_frozen(folder: Path):
    config = load_config(write(folder, GOOD))
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.log_level = "debug"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.streams[0].loop = True  # type: ignore[misc]
    assert hash(config)


def test_paths_are_relative_to_the_config_folder(folder: Path):
    (folder / "sub").mkdir()
    path = write(
        folder,
        """\
        streams:
          - id: a
            url: ../video.mp4
          - id: b
            url: file://../video.mp4
        model:
          path: ../model.onnx
          class_names: ../names.txt
        engine:
          cache_dir: cache
        sinks:
          - type: jsonl
            path: ../out/results.jsonl
            flush_every: 10
        """,
        name="sub/streamd.yaml",
    )
    config = load_config(path)
    assert [s.path for s in config.streams] == [folder / "video.mp4"] * 2
    assert all(not s.is_live and Path(s.url).is_absolute() for s in config.streams)
    assert config.model.path == folder / "model.onnx"
    assert config.model.class_names == ("cat", "dog")
    assert config.engine.cache_dir == folder / "sub" / "cache"
    assert config.sinks == (JsonlSinkConfig(path=folder / "out" / "results.jsonl", flush_every=10),)


def test_values_and_yaml_1_2_scalars(folder: Path):
    text = GOOD.replace("url: video.mp4", "url: video.mp4\n    open_timeout_s: 3\n    read_timeout_s: 1e-1")
    text += "  class_names: [no, 'off', 'yes']\n  input_size: [640, 384]\nengine:\n  precision: fp32\n"
    config = load_config(write(folder, text))
    stream = config.streams[0]
    assert stream.open_timeout_s == 3.0 and isinstance(stream.open_timeout_s, float)
    assert stream.read_timeout_s == 0.1
    assert config.model.class_names == ("no", "off", "yes")  # YAML 1.1 would have read booleans
    assert config.model.input_size == (640, 384)


def test_rtsp_stream_and_credentials_are_redacted(folder: Path):
    text = GOOD.replace(
        "url: video.mp4",
        "url: rtsp://admin:s3cret@10.0.0.7:554/live?password=s3cret&channel=1\n    transport: udp",
    )
    (stream,) = load_config(write(folder, text)).streams
    assert stream.is_live and stream.path is None and stream.transport == "udp"
    assert stream.redacted_url == "rtsp://***@10.0.0.7:554/live?password=***&channel=1"
    assert "s3cret" not in repr(stream)
    assert StreamConfig(id="x", url="rtsps://cam.lan/s").redacted_url == "rtsps://cam.lan/s"


def test_extension_keys_and_merge_keys(folder: Path):
    text = """\
    x-camera: &camera
      transport: udp
      stall_timeout_s: 3
    streams:
      - <<: *camera
        id: a
        url: rtsp://cam-a/live
      - <<: *camera
        id: b
        url: rtsp://cam-b/live
        transport: tcp
    model:
      path: model.onnx
    """
    config = load_config(write(folder, text))
    assert [(s.transport, s.stall_timeout_s) for s in config.streams] == [("udp", 3.0), ("tcp", 3.0)]


def test_config_error_pickles():
    error = ConfigError(["a.yaml:1: streams: x", "a.yaml:2: model: y"])
    again = pickle.loads(pickle.dumps(error))
    assert again.problems == error.problems and str(again) == "a.yaml:1: streams: x\na.yaml:2: model: y"
    assert EX_CONFIG == 78


def test_coco_names():
    assert len(COCO_NAMES) == 80 == len(set(COCO_NAMES))
    assert COCO_NAMES[0] == "person" and COCO_NAMES[-1] == "toothbrush"


def test_docs_describe_every_key():
    docs = (ROOT / "docs/config.md").read_text()
    sections = [StreamConfig, ModelConfig, EngineConfig, PipelineConfig, JsonlSinkConfig, StdoutSinkConfig]
    sections += [MetricsConfig]
    for cls in sections:
        for f in dataclasses.fields(cls):
            assert f"`{f.name}`" in docs, f"docs/config.md does not describe {cls.__name__}.{f.name}"
            assert f.metadata.get("doc") or not f.init, f"{cls.__name__}.{f.name} has no doc"
    for key in ("streams", "sinks", "log_level", "x-"):
        assert f"`{key}" in docs


@needs_demo_files
def test_bundled_demo_loads():
    config = load_config()
    assert config.source == "<bundled demo>"
    (stream,) = config.streams
    assert stream.id == "demo" and stream.path.resolve() == ROOT / "samples/vtest.mp4"
    assert not stream.loop and not stream.realtime
    model = config.model
    assert model.path.resolve() == ROOT / "models/nanodet-coco.onnx" and model.channel_order == "bgr"
    assert model.mean == (103.53, 116.28, 123.675) and model.std == (57.375, 57.12, 58.395)
    assert (model.layout, model.resize, model.score_threshold, model.iou_threshold) == (
        "yolov8",
        "letterbox",
        0.35,
        0.5,
    )
    assert config.pipeline.batch_size == 4 and config.sinks == (StdoutSinkConfig(),)
    assert BUNDLED_DEMO.resolve() == ROOT / "configs/demo.yaml"


@needs_demo_files
@pytest.mark.parametrize("name", ["demo.yaml", "two-streams.yaml", "rtsp-cameras.yaml"])
def test_example_configs_load(name: str):
    config = load_config(ROOT / "configs" / name)
    assert config.streams


def run_check(path: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "streamd", "check", str(path)]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)


CLI_BAD = [c[0] for c in BAD]  # every malformed config, also through the real CLI: exit 78 + the key path


@needs_cli
@pytest.mark.parametrize("case", CLI_BAD)
def test_cli_check_bad_config_exits_78(folder: Path, case: str):
    _, text, key, fragments, _ = next(c for c in BAD if c[0] == case)
    result = run_check(write(folder, text))
    assert result.returncode == EX_CONFIG, result.stderr
    assert f": {key}: " in result.stderr and fragments[0] in result.stderr


@needs_cli
def test_cli_check_yaml_syntax_error_exits_78(folder: Path):
    result = run_check(write(folder, "streams:\n  - id: a\n    url: [video.mp4\n"))
    assert result.returncode == EX_CONFIG and "invalid YAML" in result.stderr


@needs_cli
@needs_demo_files
def test_cli_check_good_config_exits_0():
    result = run_check(ROOT / "configs/demo.yaml")
    assert result.returncode == 0, result.stderr


def test_model_metadata_fills_what_the_config_leaves_out(tmp_path: Path) -> None:
    """The bundled ONNX states its own preprocessing; an explicit config value still wins."""
    import onnx
    from onnx import TensorProto, helper

    from streamd.config.model import defaults_from_metadata

    bundled = defaults_from_metadata(Path(__file__).resolve().parent.parent / "models" / "nanodet-coco.onnx")
    if not bundled:
        pytest.skip("bundled model missing")
    assert bundled["channel_order"] == "bgr" and bundled["std"] == (57.375, 57.12, 58.395)
    # An Ultralytics-style export: names as a Python dict literal, imgsz as [h, w].
    graph = helper.make_graph(
        [helper.make_node("Identity", ["images"], ["output0"])],
        "g",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, 4, 4])],
        [helper.make_tensor_value_info("output0", TensorProto.FLOAT, [1, 3, 4, 4])],
    )
    model = helper.make_model(graph)
    helper.set_model_props(model, {"names": "{0: 'cat', 1: 'dog'}", "imgsz": "[384, 640]", "mean": "oops"})
    path = tmp_path / "u.onnx"
    onnx.save(model, str(path))
    clip = tmp_path / "c.mp4"
    clip.write_bytes(b"x")
    config = parse_config(
        {"streams": [{"id": "a", "url": "c.mp4"}], "model": {"path": "u.onnx", "std": [1, 1, 1]}}, tmp_path
    )
    m = config.model
    assert m.class_names == ("cat", "dog") and m.input_size == (640, 384)
    assert m.std == (1.0, 1.0, 1.0)  # given in the config: kept
    assert m.mean == (0.0, 0.0, 0.0)  # metadata unparsable: the documented default


def test_ring_slots_left_unset_follow_the_engines_lanes(folder: Path):
    """engine.lanes 2 without pipeline.ring_slots: the default ring (3) rounded up to 4, not a config error
    (bench_live --lanes 2 stopped at that error on the H200); set explicitly, it must be a multiple."""
    config = load_config(write(folder, GOOD + "engine:\n  lanes: 2\n"))
    assert config.pipeline.ring_slots == 4 and config.engine.lanes == 2
    config = load_config(write(folder, GOOD + "engine:\n  lanes: 3\npipeline:\n  batch_size: 8\n"))
    assert config.pipeline.ring_slots == 3
    assert load_config(write(folder, GOOD)).pipeline.ring_slots == 3
