"""Engine + stages for a config: what a worker (or the shared engine process) runs its batches through."""

from __future__ import annotations

import logging

from streamd.config import Config
from streamd.exitcodes import EX_CONFIG, StartupError
from streamd.stages.contract import Stages
from streamd.stages.cpu import CpuStages
from streamd.stages.postprocess.cpu import ClassThresholds, PostprocessSpec
from streamd.stages.postprocess.head import HeadSettings
from streamd.stages.postprocess.resolve import resolve_head
from streamd.stages.preprocess.cpu import PreprocessSpec

log = logging.getLogger(__name__)


def build_stages(config: Config, device: int | None = None, *, warm_batch: int | None = None) -> Stages:
    """Engine + the stage implementation that fits it (CUDA stages for a GPU engine, CPU twins otherwise).
    ``warm_batch``: the largest batch warmed at start-up (default: the pipeline's batch).

    Raises StartupError: EX_CONFIG when the model does not fit the config, EX_UNAVAILABLE when the engine or
    the GPU cannot be brought up."""
    from streamd.checks.verify import VerifyPlan, create_engine  # engines load heavy libraries: on use only
    from streamd.engines import EngineError, EngineOptions
    from streamd.engines.base import parts_of

    m, e = config.model, config.engine
    device = e.device if device is None else device
    try:
        options = EngineOptions.from_config(e, device=device)
        engine = create_engine(e.type, m.path, options, verify=VerifyPlan.from_config(config))
    except EngineError as exc:  # a StartupError already: 78 if the config does not fit, 69 if unavailable
        raise StartupError(str(exc), exc.code) from exc
    try:
        c, h, w = engine.input_shape
        if (w, h) != tuple(m.input_size) or c != 3:
            raise StartupError(
                f"model.input_size is {list(m.input_size)} (width, height) but the model takes "
                f"[{c}, {h}, {w}] (C, H, W); set model.input_size: [{w}, {h}]",
                EX_CONFIG,
            )
        try:
            head = resolve_head(HeadSettings.from_model(m), parts_of(engine))
        except ValueError as exc:
            raise StartupError(str(exc), EX_CONFIG) from exc
        log.info("%s", head.note)
        pre = PreprocessSpec(w, h, m.channel_order, m.mean, m.std, m.resize, m.pad_value)
        post = PostprocessSpec(
            head.layout,
            len(m.class_names),
            m.score_threshold,
            m.iou_threshold,
            m.max_detections,
            m.top_k,
            thresholds=ClassThresholds.from_config(config),
            head=head,
        )
        if engine.on_device:  # GPU engine: the three-stream CUDA stages (imported only here)
            from streamd.stages.cuda import GpuStages

            warm = config.pipeline.batch_size if warm_batch is None else warm_batch
            return GpuStages(engine, pre, post, device=device, warm_batch=warm, batch_step=e.batch_step)
        return CpuStages(engine, pre, post)
    except BaseException:
        engine.close()
        raise
