"""torchvision SSDlite320-MobileNetV3: its own export, a batched two-output wrapper, a TF-OD-API-style model.

(a) `standard`: `torch.onnx.export(model, ([image],))` of the eval-mode detector (torchvision's tests):
    one [3,H,W] image in, `boxes` [N,4] / `scores` [N] / `labels` [N] out with N decided per image by score
    threshold + NMS. It has no batch axis, so streamd must refuse it with a clear message.
(b) `batched`: `BatchedSSD` below: the same modules without the per-image post-processing.
(c) `tfod-ssdlite`: `TFODStyle` below: (b) reduced to the TF Object Detection API's four-output contract.
"""

from __future__ import annotations

import time
from functools import partial
from pathlib import Path
from typing import Any

from .common import Built, calibrate_batchnorm, seed_everything

PACKAGES = ("torchvision", "torch", "onnx")
NUM_CLASSES = 91  # torchvision's COCO convention: column 0 is background, 1..90 the COCO category ids
TINY_WIDTH = 0.25
TOP_K = 100
SCORE_FLOOR = (
    0.1  # tfod: entries at or below this are padding, as TF's exporter pads after its score threshold
)
RGB_01 = "images: float32 [B,3,H,W], RGB, 0..1; the graph applies the model's own (x-0.5)/0.5 normalisation"


def _model(size: int, tiny: bool) -> Any:
    """The stock builder for the real size; for --tiny the same parts (MobileNetV3-Large extractor,
    SSDLiteHead, DefaultBoxGenerator, SSD) with a narrower backbone and input, because the stock builder
    forwards width_mult to SSD() as well and cannot take it."""
    import torch
    from torchvision.models import mobilenet_v3_large
    from torchvision.models.detection import _utils as det_utils
    from torchvision.models.detection import ssd, ssdlite
    from torchvision.models.detection.anchor_utils import DefaultBoxGenerator

    if not tiny:
        return ssdlite.ssdlite320_mobilenet_v3_large(weights=None, weights_backbone=None)
    norm = partial(torch.nn.BatchNorm2d, eps=0.001, momentum=0.03)
    body = mobilenet_v3_large(weights=None, norm_layer=norm, reduced_tail=True, width_mult=TINY_WIDTH)
    ssdlite._normal_init(body)
    features = body.features
    # C4 tap = the block before the last stage start, as _mobilenet_extractor picks it; width_mult on the
    # extractor narrows the four extra blocks too (the stock builder leaves them at 512/256/256/128)
    c4 = [i for i, block in enumerate(features) if getattr(block, "_is_cn", False)][-1]
    backbone = ssdlite.SSDLiteFeatureExtractorMobileNet(features, c4, norm, width_mult=TINY_WIDTH)
    anchors = DefaultBoxGenerator([[2, 3] for _ in range(6)], min_ratio=0.2, max_ratio=0.95)
    channels = det_utils.retrieve_out_channels(backbone, (size, size))
    head = ssdlite.SSDLiteHead(channels, anchors.num_anchors_per_location(), NUM_CLASSES, norm)
    return ssd.SSD(
        backbone,
        anchors,
        (size, size),
        NUM_CLASSES,
        head=head,
        image_mean=[0.5] * 3,
        image_std=[0.5] * 3,
        score_thresh=0.001,
        nms_thresh=0.55,
        detections_per_img=300,
        topk_candidates=300,
    )


def _calibrated(model: Any, size: int, gain: float) -> tuple[Any, Any]:
    """(model, BatchedSSD(model)) with BatchNorm statistics taken from real frames, then the logit gain."""
    from . import probe

    batched_cls, _ = _wrappers()
    batched = batched_cls(model, size).eval()
    calibrate_batchnorm(batched, probe.calibration_images(size, "rgb01"))
    _sharpen(model, gain)
    return model, batched


def _sharpen(model: Any, gain: float) -> Any:
    """Multiply the class-logit layers' weights by `gain`. SSDlite's init (normal, std 0.03) makes near-equal
    logits, so every softmax score sits at ~1/91 and nothing clears 0.05; a gain spreads them keeping the
    ranking each image's features give. 0 or 1 leaves the model as the package builds it."""
    import torch

    if gain and gain != 1:
        with torch.no_grad():
            for branch in model.head.classification_head.module_list:
                branch[-1].weight *= gain
    return model


def _wrappers() -> tuple[type, type]:
    import torch
    from torchvision.models.detection.image_list import ImageList
    from torchvision.ops import boxes as box_ops

    class BatchedSSD(torch.nn.Module):
        """images [B,3,S,S] RGB 0..1 -> boxes [B,A,4] x1,y1,x2,y2 input pixels, scores [B,A,C-1] softmax.

        Steps, all the model's own modules: normalise with model.transform's mean/std (its resize is skipped:
        the caller feeds S x S), model.backbone, model.head, model.box_coder.decode_single against the anchors
        model.anchor_generator makes for an S x S image (fixed for a fixed S, so computed once and stored),
        clip to the image like SSD.postprocess_detections, softmax over classes, drop column 0 (background).
        Left to the consumer: score threshold and per-class NMS (SSD does both in postprocess_detections).
        """

        def __init__(self, model: Any, size: int) -> None:
            super().__init__()
            self.model, self.size = model, size
            self.register_buffer("mean", torch.tensor(model.transform.image_mean).view(1, 3, 1, 1))
            self.register_buffer("std", torch.tensor(model.transform.image_std).view(1, 3, 1, 1))
            with torch.no_grad():
                probe = torch.zeros(1, 3, size, size)
                feats = list(model.backbone(probe).values())
                anchors = model.anchor_generator(ImageList(probe, [(size, size)]), feats)[0]
            self.register_buffer("anchors", anchors)

        def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            x = (images - self.mean) / self.std
            head = self.model.head(list(self.model.backbone(x).values()))
            count = self.anchors.shape[0]
            codes = head["bbox_regression"].reshape(-1, 4)
            anchors = self.anchors.unsqueeze(0).expand(images.shape[0], -1, -1).reshape(-1, 4)
            boxes = self.model.box_coder.decode_single(codes, anchors)
            boxes = box_ops.clip_boxes_to_image(boxes, (self.size, self.size)).reshape(
                images.shape[0], count, 4
            )
            scores = torch.softmax(head["cls_logits"], dim=-1)[..., 1:]
            return boxes, scores

    class TFODStyle(torch.nn.Module):
        """images [B,3,S,S] -> detection_boxes [B,100,4] ymin,xmin,ymax,xmax normalised, detection_scores
        [B,100], detection_classes [B,100] float 1-based, num_detections [B] float.

        From BatchedSSD: best class per anchor, top-100 anchors by that score (sorted, descending), boxes
        divided by S and reordered to y,x; entries with score <= SCORE_FLOOR are zeroed and not counted, the
        way TF's exporter pads after its score threshold. No NMS (a static-shape batched NMS is not available
        to the exporter): overlapping boxes stay, so the consumer's NMS still matters.
        """

        def __init__(self, batched: BatchedSSD) -> None:
            super().__init__()
            self.batched = batched

        def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, ...]:
            boxes, scores = self.batched(images)
            best, cls = scores.max(dim=-1)
            top, idx = best.topk(TOP_K, dim=1)
            picked = boxes.gather(1, idx.unsqueeze(-1).expand(-1, -1, 4)) / float(self.batched.size)
            yx = picked[..., [1, 0, 3, 2]]
            valid = (top > SCORE_FLOOR).to(top.dtype)
            classes = (cls.gather(1, idx) + 1).to(top.dtype) * valid
            return yx * valid.unsqueeze(-1), top * valid, classes, valid.sum(dim=1)

    return BatchedSSD, TFODStyle


def _extra(gain: float) -> dict[str, Any]:
    return {"bn_calibration": "BatchNorm statistics from vtest.mp4 frames 0,25,..,375", "score_gain": gain}


def _export(
    module: Any, example: Any, path: Path, names: list[str], dynamic: dict[str, Any], opset: int
) -> None:
    import torch

    torch.onnx.export(
        module,
        example,
        str(path),
        input_names=["images"],
        output_names=names,
        dynamic_axes=dynamic,
        opset_version=opset,
        dynamo=False,
    )


def build_ssdlite(size: int, tiny: bool, seed: int, out: Path, score_gain: float) -> list[Built]:
    import torch

    out.mkdir(parents=True, exist_ok=True)
    stem = f"ssdlite{'-tiny' if tiny else ''}-{size}"
    start = time.perf_counter()
    seed_everything(seed)
    model, wrapper = _calibrated(_model(size, tiny).eval(), size, score_gain)
    standard = out / f"{stem}-standard.onnx"
    image = torch.rand(3, size, size)
    _export(
        model,
        ([image],),
        standard,
        ["boxes", "scores", "labels"],
        {"images": {1: "height", 2: "width"}, "boxes": {0: "n"}, "scores": {0: "n"}, "labels": {0: "n"}},
        11,
    )
    t_standard = time.perf_counter() - start
    start = time.perf_counter()
    batched = out / f"{stem}-batched.onnx"
    _export(
        wrapper,
        (torch.rand(2, 3, size, size),),
        batched,
        ["boxes", "scores"],
        {"images": {0: "batch"}, "boxes": {0: "batch"}, "scores": {0: "batch"}},
        17,
    )
    return [
        Built(
            "ssdlite",
            "standard",
            standard,
            "torch.onnx.export(model.eval(), ([image],), opset_version=11, dynamo=False)",
            PACKAGES,
            "images: float32 [3,H,W] (one image, no batch axis), RGB 0..1, any size: the graph resizes to "
            f"{size} and normalises",
            "boxes [N,4] x1,y1,x2,y2 in the input image's pixels, scores [N] "
            "softmax, labels [N] int64 1..90; N per image after score 0.001 + NMS 0.55, at most 300",
            t_standard,
            _extra(score_gain),
        ),
        Built(
            "ssdlite",
            "batched",
            batched,
            "torch.onnx.export(BatchedSSD(model, size), images[B,3,S,S], "
            "opset_version=17, dynamo=False, dynamic batch)",
            PACKAGES,
            RGB_01,
            "boxes [B,A,4] x1,y1,x2,y2 in input pixels (clipped); scores [B,A,90] softmax, the background "
            "column dropped (column j = torchvision label j+1); no threshold, no NMS",
            time.perf_counter() - start,
            _extra(score_gain),
        ),
    ]


def build_tfod(size: int, tiny: bool, seed: int, out: Path, score_gain: float) -> list[Built]:
    import torch

    _, TFODStyle = _wrappers()
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    seed_everything(seed)
    _, wrapper = _calibrated(_model(size, tiny).eval(), size, score_gain)
    path = out / f"tfod-ssdlite{'-tiny' if tiny else ''}-{size}.onnx"
    names = ["detection_boxes", "detection_scores", "detection_classes", "num_detections"]
    _export(
        TFODStyle(wrapper).eval(),
        (torch.rand(2, 3, size, size),),
        path,
        names,
        {"images": {0: "batch"}, **{n: {0: "batch"} for n in names}},
        17,
    )
    return [
        Built(
            "tfod-ssdlite",
            "tfod",
            path,
            "torch.onnx.export(TFODStyle(BatchedSSD(model, size)), "
            "opset_version=17, dynamo=False, dynamic batch)",
            PACKAGES,
            RGB_01,
            "imitates the TF Object Detection API exported-model contract (not made with TensorFlow): "
            "detection_boxes [B,100,4] ymin,xmin,ymax,xmax normalised 0..1, detection_scores [B,100] "
            "descending, detection_classes [B,100] float 1-based (torchvision COCO ids), num_detections [B] "
            f"float = entries with score > {SCORE_FLOOR}, the rest zero-padded; top-100 by score, NO NMS",
            time.perf_counter() - start,
            {**_extra(score_gain), "score_floor": SCORE_FLOOR},
        ),
    ]
