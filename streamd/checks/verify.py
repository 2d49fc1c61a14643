"""Start-up equivalence check: an engine must compute what its ONNX model says, or it is refused.

Every engine other than ONNX Runtime on the CPU (torch on CUDA or on the CPU, TensorRT, ORT's CUDA EP) is
compared, when it is built, against ONNX Runtime on the CPU running the same ONNX file, on a few inputs that
look like real frames: two bundled vtest frames (``streamd/data/verify-vtest-*.jpg``) and variations of them
(mirrored and darker, zoomed), put through the model's own preprocessing (``VerifyPlan.preprocess``).

Two levels, with tolerances by precision (``TOLERANCES``):

1. per output tensor: max and mean absolute error, relative to the reference's scale ``max|ref|`` (both
   must stay within tolerance). ``end2end`` outputs are compared row to row after pairing each reference
   row with the engine's closest row (rows legitimately swap places when two scores tie within rounding),
   and their max is taken over the rows scoring above the threshold (a low-score row may enter or leave
   the top K);
2. detections, after the configured decode + NMS (``streamd.stages.postprocess.cpu``): every reference
   detection scoring above ``score_threshold + margin`` must have a detection of the same class at IoU ≥
   ``iou`` in the engine's output, and the other way round (no detection appears or vanishes).

A failure raises ``VerificationError`` (an ``EngineError``; ``auto`` falls back to the next engine) naming the
model, the output, the error and what to do. The verdict is cached next to the engine's cache entry (a
TensorRT plan's ``.verify.json``; for the other engines ``<cache_dir>/verify/``) under a key holding the model
hash, engine, precision, conversion recipe, library versions and the check itself, so a warm start reads it
instead of paying for the check again. ``engine.verification`` holds the result (``Verification.as_dict``)
for logs and ``/metrics``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from streamd.checks.compare import TOLERANCES, OutputError, compare
from streamd.checks.compare import Tolerance as Tolerance  # re-exported: tests and benches read them here
from streamd.checks.compare import match_detections as match_detections
from streamd.engines.base import EngineError, VerificationError, parts_of, run_padded
from streamd.engines.options import EngineOptions, Machine
from streamd.stages.postprocess.resolve import resolve_head

log = logging.getLogger(__name__)

VERIFY_VERSION = 5  # bump when inputs, metrics or tolerances change meaning (5: auto checks at fp32's bar)
DATA_DIR = Path(__file__).resolve().parent.parent / "data"
FRAMES = ("verify-vtest-200.jpg", "verify-vtest-600.jpg")


@dataclass(frozen=True)
class VerifyPlan:
    """How to make the check's inputs and read its outputs (from the config's ``model:`` section).

    ``preprocess``/``postprocess`` are ``streamd.pipeline`` specs; None = stretch to the input size, RGB
    /255, and a numbers-only check (no detection-level comparison)."""

    enabled: bool = True
    preprocess: Any = None  # PreprocessSpec | None
    postprocess: Any = None  # PostprocessSpec | None (layout resolved, or "auto")
    model_name: str = ""
    head: Any = None  # HeadSettings | None: read the engine's outputs as the pipeline will
    # engine.type auto promises the CPU path's detections: every precision it tries must match them at
    # FP32's bar (IoU and share); a precision named with a named engine.type gets that precision's bar
    detections_as_fp32: bool = False

    @staticmethod
    def from_config(config: Any) -> VerifyPlan:
        """From a loaded ``streamd.config.Config`` (``engine.verify`` and the ``model:`` section)."""
        from streamd.stages.postprocess.cpu import PostprocessSpec
        from streamd.stages.postprocess.head import HeadSettings
        from streamd.stages.preprocess.cpu import PreprocessSpec

        m = config.model
        w, h = m.input_size
        pre = PreprocessSpec(w, h, m.channel_order, m.mean, m.std, m.resize, m.pad_value)
        post = PostprocessSpec(
            m.layout, len(m.class_names), m.score_threshold, m.iou_threshold, m.max_detections, m.top_k
        )
        settings = HeadSettings.from_model(m)
        return VerifyPlan(
            bool(getattr(config.engine, "verify", True)),
            pre,
            post,
            Path(m.path).name,
            settings,
            detections_as_fp32=getattr(config.engine, "type", "auto") == "auto",
        )

    def tolerance(self, precision: str) -> Tolerance:
        """The check's tolerance at ``precision``: its output bounds, and (``detections_as_fp32``) FP32's
        detection bar."""
        tol = TOLERANCES.get(precision, TOLERANCES["fp32"])
        if self.detections_as_fp32:
            fp32 = TOLERANCES["fp32"]
            tol = dataclasses.replace(tol, iou=max(tol.iou, fp32.iou), match=max(tol.match, fp32.match))
        return tol

    def key(self) -> dict[str, Any]:
        def spec(s: Any) -> Any:
            return None if s is None else {k: getattr(s, k) for k in s.__slots__}

        head = None if self.head is None else asdict(self.head)
        return {
            "preprocess": spec(self.preprocess),
            "postprocess": spec(self.postprocess),
            "head": head,
            "detections_as_fp32": self.detections_as_fp32,
        }


@dataclass
class Verification:
    """The verdict. ``as_dict()`` is what the logs and ``/metrics`` report."""

    model: str
    engine: str
    precision: str
    passed: bool
    cost_ms: float  # what the check cost when it ran (the cached value on a warm start)
    cached: bool = False
    inputs: int = 0
    outputs: list[OutputError] = field(default_factory=list)
    reference_detections: int = 0
    engine_detections: int = 0
    matched: float = 1.0  # worst of the two directions
    worst_iou: float = 1.0  # lowest IoU among matched pairs
    reason: str = ""
    key: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_dict(d: dict[str, Any]) -> Verification:
        outputs = [OutputError(**o) for o in d.get("outputs", [])]
        return Verification(**{**d, "outputs": outputs})


# ------------------------------------------------------------------------------------------------------------
# Inputs


def frames() -> list[np.ndarray]:
    """The bundled frames and variations of them: as is, mirrored + darker, zoomed into the centre."""
    import cv2

    out: list[np.ndarray] = []
    for name in FRAMES:
        image = cv2.imread(str(DATA_DIR / name), cv2.IMREAD_COLOR)
        if image is None:
            raise EngineError(f"engine verification: bundled frame {DATA_DIR / name} is missing")
        out.append(image)
    a, b = out
    darker = np.clip(a[:, ::-1].astype(np.float32) * 0.7 + 10, 0, 255).astype(np.uint8)
    h, w = b.shape[:2]
    zoom = cv2.resize(b[h // 5 : h - h // 5, w // 5 : w - w // 5], (w, h), interpolation=cv2.INTER_LINEAR)
    return [a, b, darker, zoom]


def make_inputs(shape: tuple[int, int, int], preprocess: Any) -> np.ndarray:
    """The check's input batch [n, C, H, W] float32 for a model taking ``shape`` = (C, H, W)."""
    from streamd.stages.preprocess.cpu import CpuPreprocessor, PreprocessSpec

    c, h, w = shape
    spec = preprocess
    if spec is None or (spec.width, spec.height) != (w, h):
        spec = PreprocessSpec(w, h, "rgb", (0.0, 0.0, 0.0), (255.0, 255.0, 255.0), "stretch")
    pre = CpuPreprocessor(spec)
    images = frames()
    batch = np.empty((len(images), 3, h, w), np.float32)
    for i, image in enumerate(images):
        pre(image, batch[i])
    if c != 3:
        raise EngineError(f"engine verification: expected a 3-channel model input, got {c} channels")
    return batch


# ------------------------------------------------------------------------------------------------------------
# Comparison


def _reference_outputs(model_path: Path, batch: np.ndarray) -> tuple[str, np.ndarray]:
    """ONNX Runtime CPU on the original ONNX file, image by image (a model with a fixed batch N > 1 gets each
    image padded to N rows)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    try:
        session = ort.InferenceSession(str(model_path), opts, providers=["CPUExecutionProvider"])
    except Exception as exc:  # ORT raises several types for a bad model
        raise EngineError(f"engine verification: ONNX Runtime cannot load {model_path}: {exc}") from exc
    first = session.get_inputs()[0]
    outputs = [o.name for o in session.get_outputs()]
    name, out = first.name, outputs[0]
    fixed = first.shape[0] if isinstance(first.shape[0], int) and first.shape[0] > 1 else 1

    def run(rows: np.ndarray) -> np.ndarray:
        if len(outputs) == 1:
            return np.asarray(session.run([out], {name: rows})[0])
        # several outputs: packed per image in graph order, as the engines run them (onnx_outputs)
        got = session.run(outputs, {name: rows})
        return np.concatenate([np.asarray(y).reshape(len(rows), -1).astype(np.float32) for y in got], axis=1)

    return out, np.concatenate([run_padded(run, batch[i : i + 1], fixed) for i in range(len(batch))])


def _engine_outputs(engine: Any, batch: np.ndarray) -> np.ndarray:
    fixed = getattr(engine, "batch_fixed", None)
    if fixed:  # the backend's engine for a fixed-batch model takes exactly that many rows
        return np.asarray(run_padded(engine.infer, batch, int(fixed)), np.float32)
    step = max(1, int(engine.max_batch))
    parts = [np.asarray(engine.infer(batch[i : i + step]), np.float32) for i in range(0, len(batch), step)]
    return np.concatenate(parts)


def identity(engine: Any, model_path: Path, precision: str, plan: VerifyPlan) -> dict[str, Any]:
    """Everything the verdict depends on (the cache key's fields)."""
    import onnxruntime

    from streamd.engines.onnx_tools import file_sha256

    fields: dict[str, Any] = {
        "verify": VERIFY_VERSION,
        "model_sha256": file_sha256(model_path),
        "engine": engine.name,
        "precision": precision,
        "steps": list(getattr(engine, "steps", ())),
        "engine_id": getattr(engine, "cache_identity", None),
        "numerics": getattr(engine, "numerics", None),  # torch: TF32, cuDNN autotuning
        "plan_key": _plan_digest(engine),
        "onnxruntime": onnxruntime.__version__,
        "plan": plan.key(),
        "frames": [(DATA_DIR / f).stat().st_size for f in FRAMES],
    }
    if engine.name.startswith("torch"):
        import torch

        fields["torch"] = torch.__version__
        try:
            from importlib.metadata import version

            fields["onnx2torch"] = version("onnx2torch")
        except Exception:  # not installed as a distribution
            fields["onnx2torch"] = None
        device = getattr(engine, "device", None)
        if getattr(device, "type", "cpu") == "cuda":
            fields["gpu"] = torch.cuda.get_device_name(device)
    return fields


def _plan_digest(engine: Any) -> str | None:
    """The cache key digest of a TensorRT engine's plan (None for engines without a cached plan)."""
    key = getattr(getattr(engine, "plan", None), "key", None)
    try:
        return str(key.digest()) if key is not None else None
    except Exception:  # a plan object of another shape
        return None


def verdict_path(engine: Any, model_path: Path, cache_dir: Path | str | None, digest: str) -> Path:
    """Where the verdict lives: beside a TensorRT plan, else ``<cache_dir>/verify/``."""
    from streamd.engines.cache import default_cache_dir

    plan = getattr(engine, "plan", None)
    plan_path = getattr(plan, "path", None)
    if plan_path is not None:
        return Path(plan_path).with_name(Path(plan_path).name + ".verify.json")
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    return root / "verify" / f"{model_path.stem}.{engine.name}.{digest[:16]}.json"


def _advice(engine: Any, precision: str) -> str:
    other = "fp32" if precision != "fp32" else None
    parts = ["set engine.type: onnxruntime (the CPU reference)"]
    if other and engine.name.startswith(("torch", "tensorrt", "onnxruntime-cuda")):
        parts.append(f"try engine.precision: {other}")
    parts.append("or engine.verify: false to run it anyway, at your own risk")
    advice = "; ".join(parts)
    if engine.name.startswith("torch"):
        advice += " (to find the op: tools/locate_divergence.py, see docs/engines.md)"
    return advice


def run_check(engine: Any, model_path: Path, precision: str, plan: VerifyPlan) -> Verification:
    """Run the comparison (no cache)."""
    t0 = time.perf_counter()
    tol = plan.tolerance(precision)
    batch = make_inputs(tuple(engine.input_shape), plan.preprocess)
    out_name, reference = _reference_outputs(model_path, batch)
    output = _engine_outputs(engine, batch)
    parts = parts_of(engine)
    spec = plan.postprocess
    if spec is not None and plan.head is not None:
        try:
            head = resolve_head(plan.head, parts)
        except ValueError:
            head = None  # the pipeline refuses the model with the reason; here: numbers only
        spec = dataclasses.replace(spec, head=head, layout=head.layout) if head is not None else None
    errors, agreement = compare(
        reference,
        output,
        precision=precision,
        output_name=out_name,
        postprocess=spec,
        parts=parts,
        tolerance=tol,
    )
    cost = (time.perf_counter() - t0) * 1e3
    v = Verification(
        model=model_path.name,
        engine=engine.name,
        precision=precision,
        passed=True,
        cost_ms=round(cost, 1),
        inputs=len(batch),
        outputs=errors,
        reference_detections=agreement["ref"],
        engine_detections=agreement["got"],
        matched=round(float(agreement["matched"]), 4),
        worst_iou=round(float(agreement["worst_iou"]), 4),
    )
    reasons = []
    for e in errors:
        if not e.passed:
            allowed = f"mean ≤ {tol.mean_rel * e.scale:.3g}, max ≤ {tol.max_rel * e.scale:.3g}"
            reasons.append(
                f"output {e.name!r}: max abs error {e.max_abs:.4g}, mean {e.mean_abs:.4g} (reference scale "
                f"{e.scale:.4g}; {precision} allows {allowed})"
            )
    if float(agreement["matched"]) < tol.match:
        reasons.append(
            f"detections: {v.matched:.1%} matched at IoU ≥ {tol.iou} (reference {v.reference_detections}, "
            f"engine {v.engine_detections} above score threshold + {tol.margin}; {precision} needs "
            f"≥ {tol.match:.0%}{' under engine.type auto' if plan.detections_as_fp32 else ''})"
        )
    if reasons:
        v.passed = False
        v.reason = "; ".join(reasons)
    return v


def verify_engine(
    engine: Any,
    model_path: Path,
    *,
    precision: str,
    plan: VerifyPlan | None = None,
    cache_dir: Path | str | None = None,
) -> Verification | None:
    """The start-up check for ``engine`` (see module docstring). Returns None for ONNX Runtime CPU (the
    reference itself) or when ``plan.enabled`` is False; sets ``engine.verification``; raises
    ``VerificationError`` on a failed check (fresh or cached)."""
    plan = plan or VerifyPlan()
    model_path = Path(model_path)
    if engine.name == "onnxruntime-cpu":
        return None
    effective = "fp32" if engine.name.endswith("fp32") or engine.name.startswith("torch-cpu") else precision
    if not plan.enabled:
        log.warning(
            "engine verification: skipped for %s on %s (engine.verify: false): its output is not compared "
            "with ONNX Runtime CPU",
            model_path.name,
            engine.name,
        )
        _set(engine, None)
        return None
    from streamd.engines.cache import CacheKey, atomic_write

    key = CacheKey(identity(engine, model_path, effective, plan))
    digest = key.digest()
    path = verdict_path(engine, model_path, cache_dir, digest)
    verdict: Verification | None = None
    try:
        stored = json.loads(path.read_text())
        if stored.get("key") == digest:
            verdict = Verification.from_dict(stored["verdict"])
            verdict.cached = True
    except (OSError, ValueError, KeyError, TypeError):
        verdict = None
    if verdict is None:
        verdict = run_check(engine, model_path, effective, plan)
        verdict.key = digest
        try:
            body = {"key": digest, "fields": key.fields, "verdict": verdict.as_dict()}
            atomic_write(path, (json.dumps(body, indent=2, sort_keys=True, default=str) + "\n").encode())
        except OSError as exc:
            log.warning("engine verification: cannot cache the verdict at %s: %s", path, exc)
    _set(engine, verdict)
    worst = max(verdict.outputs, key=lambda e: e.mean_abs / max(e.scale, 1e-12), default=None)
    numbers = (
        f"max abs {worst.max_abs:.3g}, mean {worst.mean_abs:.3g} (scale {worst.scale:.3g}); " if worst else ""
    )
    summary = (
        f"{verdict.engine} {effective} vs onnxruntime-cpu on {verdict.inputs} frames: {numbers}"
        f"detections {verdict.reference_detections} ref / {verdict.engine_detections} engine, "
        f"{verdict.matched:.1%} matched (worst IoU {verdict.worst_iou:.3f})"
    )
    if verdict.cached:
        log.info(
            "engine verification: %s: %s — cached verdict (%s), check skipped (it cost %.0f ms)",
            model_path.name,
            summary,
            "pass" if verdict.passed else "FAIL",
            verdict.cost_ms,
        )
    elif verdict.passed:
        log.info("engine verification: %s: %s — pass, %.0f ms", model_path.name, summary, verdict.cost_ms)
    if not verdict.passed:
        raise VerificationError(
            f"engine verification failed: model {model_path.name} on {verdict.engine} ({effective}) does not "
            f"compute what ONNX Runtime CPU computes: {verdict.reason}. "
            f"What to do: {_advice(engine, effective)}"
        )
    return verdict


def _set(engine: Any, verdict: Verification | None) -> None:
    with contextlib.suppress(AttributeError):  # an engine with __slots__
        engine.verification = None if verdict is None else verdict.as_dict()


def check_created(
    engine: Any, model_path: Path, options: EngineOptions, plan: VerifyPlan | bool | None = True
) -> None:
    """The start-up check ``create_engine`` runs on each engine it builds (``EngineOptions.check``, with
    ``plan`` bound): verify it per ``plan`` (a ``VerifyPlan``; True = the default plan, False = skip); closes
    the engine before raising."""
    if plan is None or plan is True:
        plan = VerifyPlan()
    elif plan is False:
        plan = VerifyPlan(enabled=False)
    try:
        verify_engine(engine, model_path, precision=options.precision, plan=plan, cache_dir=options.cache_dir)
    except BaseException:
        engine.close()
        raise


def create_engine(
    requested: str,
    model_path: Path,
    options: EngineOptions | None = None,
    *,
    verify: VerifyPlan | bool | None = True,
    machine: Machine | None = None,
    **fields: Any,
) -> Any:
    """``streamd.engines.create_engine`` with the start-up check: each backend's engine is verified against
    ONNX Runtime (``verify``: a ``VerifyPlan``, True or None = the default plan, False = skip) before it is
    taken; ``engine.type: auto`` falls back past one that fails it. ``options`` or their ``fields`` as
    keywords, as ``streamd.engines.create_engine`` takes them; ``options.input_size`` left None is the
    plan's preprocessing size (``model.input_size``: where a model's input H/W are dynamic, it runs there)."""
    from streamd.engines.registry import create_engine as create

    if options is None:
        options = EngineOptions(**fields)
    elif fields:
        raise TypeError(f"create_engine: options given twice: {', '.join(fields)}")
    if verify is True or verify is None:
        verify = VerifyPlan()
    if isinstance(verify, VerifyPlan):  # auto holds every precision to FP32's detection bar (VerifyPlan)
        verify = dataclasses.replace(verify, detections_as_fp32=requested == "auto")
    check = functools.partial(check_created, plan=verify)
    pre = verify.preprocess if isinstance(verify, VerifyPlan) else None
    if options.input_size is None and pre is not None:  # a dynamic input H/W runs at model.input_size
        options = dataclasses.replace(options, input_size=(int(pre.width), int(pre.height)))
    return create(requested, model_path, dataclasses.replace(options, check=check), machine=machine)
