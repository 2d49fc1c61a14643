"""``streamd build-engine [CONFIG]``: build the TensorRT engine a config needs, ahead of time, with progress.

A first build takes minutes; doing it here (once per model, precision, GPU and TensorRT version) lets the
daemon start in seconds from the cache. The command reads ``model.path`` and the ``engine:`` section; flags
override them. Ctrl-C cancels the build cleanly (TensorRT is asked to stop at its next progress step). Under
systemd (``ExecStartPre=streamd build-engine ...``) it extends the start-up timeout while the build makes
progress.

Exit codes: 0 built or found in the cache, 1 build failed, 69 TensorRT (or CUDA) is not available here.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

from streamd.engines.base import PRECISIONS, EngineError

EX_UNAVAILABLE = 69


def add_build_engine_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``build-engine`` sub-command to an ``argparse`` sub-parser collection."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "build-engine",
        help="build and cache the TensorRT engine for a config (shows TensorRT's build progress)",
        description=__doc__.splitlines()[0] if __doc__ else None,
    )
    p.add_argument("config", nargs="?", help="YAML config file (default: the bundled demo config)")
    p.add_argument("--model", type=Path, help="ONNX model (default: the config's model.path)")
    p.add_argument(
        "--precision", choices=[x for x in PRECISIONS if x != "bf16"], help="overrides engine.precision"
    )  # bf16 is the torch engine's only (TensorRT builds fp32, fp16 or int8 plans)
    p.add_argument("--max-batch", type=int, help="overrides engine.max_batch (the profile's max)")
    p.add_argument("--opt-batch", type=int, help="batch TensorRT tunes for (default: max batch)")
    p.add_argument("--workspace-mb", type=int, help="builder workspace limit in MiB (default 4096)")
    p.add_argument("--device", type=int, help="overrides engine.device")
    p.add_argument(
        "--cache-dir", type=Path, help="overrides engine.cache_dir (plans go to CACHE_DIR/engines)"
    )
    p.add_argument("--force", action="store_true", help="rebuild even when a matching engine is cached")
    return p


def run_build_engine(args: argparse.Namespace, config: Any) -> int:
    """Build (or find) the engine; print where it is. ``config`` is the loaded ``streamd.config.Config``."""
    engine_cfg, model_cfg = getattr(config, "engine", None), getattr(config, "model", None)
    model = args.model or getattr(model_cfg, "path", None)
    if model is None:
        print("streamd build-engine: no model: give --model or a config with model.path", file=sys.stderr)
        return 1
    precision = args.precision or getattr(engine_cfg, "precision", "fp16")
    if precision == "bf16":
        print(
            "streamd build-engine: engine.precision bf16 is the torch engine's; TensorRT plans are fp32, "
            "fp16 or int8 (give --precision)",
            file=sys.stderr,
        )
        return 78
    max_batch = args.max_batch or getattr(engine_cfg, "max_batch", 8)
    device = args.device if args.device is not None else getattr(engine_cfg, "device", 0)
    cache_dir = args.cache_dir or getattr(engine_cfg, "cache_dir", None)
    kind = getattr(engine_cfg, "type", "auto")
    if kind not in ("auto", "tensorrt"):
        note = f"engine.type is {kind!r}; the daemon will not use this engine"
        print(f"streamd build-engine: note: {note}", file=sys.stderr)

    from streamd.engines.options import EngineOptions
    from streamd.engines.progress import BuildProgress
    from streamd.engines.tensorrt import TensorRTEngine, load_tensorrt

    try:
        load_tensorrt()
    except EngineError as exc:
        print(f"streamd build-engine: {exc}", file=sys.stderr)
        return EX_UNAVAILABLE
    cancel = threading.Event()

    def on_sigint(_signum: int, _frame: FrameType | None) -> None:
        cancel.set()  # TensorRT stops at its next progress callback

    previous = (
        signal.signal(signal.SIGINT, on_sigint)
        if threading.current_thread() is threading.main_thread()
        else None
    )
    progress = BuildProgress(sys.stderr, cancel)
    try:
        options = EngineOptions(
            max_batch=max_batch,
            precision=precision,
            device=device,
            cache_dir=cache_dir,
            cuda_graphs=False,
            opt_batch=args.opt_batch,
            workspace_mb=args.workspace_mb,
            rebuild=args.force,
            progress=progress,
            cancel=cancel,
            # a model with dynamic H/W is built at the config's size, as `streamd run` builds it
            input_size=_input_size(model_cfg),
        )
        engine = TensorRTEngine(Path(model), options)
    except EngineError as exc:
        if cancel.is_set():
            print("streamd build-engine: cancelled", file=sys.stderr)
        else:
            print(f"streamd build-engine: {exc}", file=sys.stderr)
        return EX_UNAVAILABLE if "cuda-python" in str(exc) else 1
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
    from streamd.checks.verify import VerificationError, VerifyPlan, verify_engine

    try:  # the start-up equivalence check, cached beside the plan: the daemon's start then skips it
        try:
            check = VerifyPlan.from_config(config)
        except AttributeError:  # a partial config (tests, tools)
            check = VerifyPlan()
        verdict = verify_engine(engine, Path(model), precision=precision, plan=check, cache_dir=cache_dir)
    except VerificationError as exc:
        print(f"streamd build-engine: {exc}", file=sys.stderr)
        engine.close()
        return 1
    plan = engine.plan
    key = plan.key.fields
    print(plan.path)
    print(
        f"  {'built' if plan.built else 'found in cache'}: TensorRT {key['tensorrt']}, {key['gpu']} "
        f"(sm {key['compute_capability']}), {plan.prepared.precision_recipe}, batch {engine.min_batch}.."
        f"{engine.max_batch}, input {engine.input_name} {list(engine.input_shape)} {engine.input_dtype}, "
        f"output {engine.output_name} {list(engine.output_shape[1:])} {engine.output_dtype}",
        file=sys.stderr,
    )
    if verdict is not None:
        print(
            f"  verified against ONNX Runtime CPU: {verdict.matched:.1%} of detections matched, "
            f"{'cached verdict' if verdict.cached else f'check took {verdict.cost_ms:.0f} ms'}",
            file=sys.stderr,
        )
    engine.close()
    return 0


def _input_size(model_cfg: Any) -> tuple[int, int] | None:
    """The config's model.input_size (width, height), if the config has one (tools pass partial configs)."""
    size = getattr(model_cfg, "input_size", None)
    return (int(size[0]), int(size[1])) if size is not None else None
