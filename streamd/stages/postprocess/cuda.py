"""GPU postprocess (kernels/postprocess.cu): raw engine output -> compact detections, one small D2H copy.

``post(output, batch, stream, results)`` enqueues, on ``stream``: a memset of the candidate counters, the
decode kernel (threshold + append, many blocks per frame) and the NMS kernel (one block per frame), which
writes into a :class:`NmsResults` device buffer laid out as ``[counts int32 x max_batch | pad to 16 bytes |
det float32 [max_batch, max_det, 6]]``. ``results.download(host, stream, batch)`` is then one
``cuMemcpyDtoHAsync`` of the counts and the first ``batch`` frames' rows into a :class:`HostNmsResults`
(pinned), and ``host.detections(batch)`` turns them into ``Detections`` once the stream has passed it.
Same semantics as the CPU twin (``streamd.stages.postprocess.cpu``): detections in model-input pixels
(``host.source_detections`` maps the whole batch back to source pixels at once, for the pipeline).

Class filter / per-class thresholds (``spec.thresholds``): each call writes the batch's [B, C] threshold rows
(one per frame, by its stream; +inf for filtered classes) into the results' pinned staging table and copies
it to the device on the same stream before the decode kernel, which compares each candidate's best class
score with its row. Pass ``stream_ids`` then; without ``spec.thresholds`` no table is made, and while the
table is not ``active`` (every row the plain threshold) the kernel takes the scalar threshold.

Scratch memory is owned by the postprocessor and shared by its calls; each call waits (on the device) for the
previous call's kernels, so calls from different streams are safe.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

import numpy as np

from streamd.config.model import MAX_TOP_K  # the kernel's removed-mask: 64 words of 64 candidates
from streamd.gpu.cuda import (
    Context,
    DeviceBuffer,
    Event,
    PinnedBuffer,
    Stream,
    copy_dtoh,
    copy_htod,
    device_pointer,
)
from streamd.gpu.kernels import KernelLoader, PackedArgs
from streamd.stages.postprocess.cpu import PostprocessSpec
from streamd.stages.postprocess.head import Head
from streamd.types import Detections, Transform, to_source_padded

LAYOUT_IDS = {"yolov8": 0, "yolov5": 1, "end2end": 2}  # one output: the fixed decode_<layout> kernels
BOX_FORMAT_IDS = {"cxcywh": 0, "xyxy": 1, "xywh": 2, "yxyx": 3}
ACTIVATION_IDS = {"none": 0, "sigmoid": 1, "softmax": 2}
MAX_LEVELS = 4


class HeadParams(ctypes.Structure):
    """Mirror of ``struct HeadParams`` in kernels/postprocess.cu (``decode_generic``), from a ``Head``."""

    _fields_ = [
        *((name, ctypes.c_int) for name in ("n", "row", "num_classes", "score_cols")),
        *((name, ctypes.c_int) for name in ("box_off", "box_sa", "box_sk", "box_format")),
        ("scale", ctypes.c_float * 4),
        *((name, ctypes.c_int) for name in ("score_off", "score_sa", "score_sc", "softmax_cols")),
        *((name, ctypes.c_int) for name in ("activation", "obj_off", "obj_sa", "cls_off", "cls_sa")),
        *((name, ctypes.c_int) for name in ("class_offset", "count_off", "levels")),
        ("level_end", ctypes.c_int * MAX_LEVELS),
        ("grid_w", ctypes.c_int * MAX_LEVELS),
        ("stride", ctypes.c_float * MAX_LEVELS),
    ]

    @staticmethod
    def of(head: Head) -> HeadParams:
        if len(head.grid) > MAX_LEVELS:
            raise ValueError(f"GpuPostprocessor: at most {MAX_LEVELS} grid levels, got {len(head.grid)}")
        sx, sy = head.box_scale
        scale = (sy, sx, sy, sx) if head.box_format == "yxyx" else (sx, sy, sx, sy)
        obj = head.objectness or (-1, 0)
        cls = head.classes or (-1, 0)
        ends, total = [], 0
        for _, gw, gh in head.grid:
            total += gw * gh
            ends.append(total)
        pad = [0] * (MAX_LEVELS - len(head.grid))
        return HeadParams(
            head.candidates, head.row, head.num_classes, head.score_cols if head.classes is None else 1,
            *head.box, BOX_FORMAT_IDS[head.box_format], (ctypes.c_float * 4)(*scale),
            *head.scores, head.softmax_cols, ACTIVATION_IDS[head.activation], *obj, *cls, head.class_offset,
            -1 if head.count is None else head.count, len(head.grid),
            (ctypes.c_int * MAX_LEVELS)(*ends, *pad),
            (ctypes.c_int * MAX_LEVELS)(*(g[1] for g in head.grid), *pad),
            (ctypes.c_float * MAX_LEVELS)(*(float(g[0]) for g in head.grid), *pad),
        )  # fmt: skip


NMS_THREADS = 1024
DECODE_THREADS = 256


def _header_bytes(max_batch: int) -> int:
    return (4 * max_batch + 15) // 16 * 16


def nms_geometry(spec: PostprocessSpec, num_anchors: int, max_det: int) -> tuple[int, int, int, int]:
    """(kcap, sort_cap, words, dynamic shared bytes) of the NMS kernel for ``num_anchors`` candidates."""
    kcap = max(1, min(spec.top_k, num_anchors))
    sort_cap = 2
    while sort_cap < kcap:
        sort_cap *= 2
    words = (kcap + 63) // 64
    return kcap, sort_cap, words, sort_cap * 8 + kcap * 28 + max_det * 4


class NmsResults:
    """Device buffer of one batch's results (see the module docstring for the layout)."""

    def __init__(self, max_batch: int, max_det: int, num_classes: int = 0) -> None:
        """``num_classes`` > 0: also a [max_batch, C] float32 threshold table (device + pinned staging)."""
        self.max_batch, self.max_det = max_batch, max_det
        self.header = _header_bytes(max_batch)
        self.buffer = DeviceBuffer(self.header + max_batch * max_det * 6 * 4)
        self.counts_ptr = self.buffer.ptr
        self.det_ptr = self.buffer.ptr + self.header
        self.thresholds: DeviceBuffer | None = None
        self.thresholds_host: PinnedBuffer | None = None
        if num_classes > 0:
            self.thresholds = DeviceBuffer(max_batch * num_classes * 4)
            self.thresholds_host = PinnedBuffer(max_batch * num_classes * 4)

    def nbytes(self, batch: int) -> int:
        """Bytes that carry the counts and the first ``batch`` frames' rows."""
        return self.header + batch * self.max_det * 6 * 4

    def download(self, host: HostNmsResults, stream: Stream, batch: int) -> None:
        """One asynchronous D2H copy of everything ``host.detections(batch)`` needs."""
        if (host.max_batch, host.max_det) != (self.max_batch, self.max_det):
            raise ValueError(
                f"HostNmsResults ({host.max_batch}, {host.max_det}) does not match NmsResults "
                f"({self.max_batch}, {self.max_det})"
            )
        copy_dtoh(host.buffer.ptr, self.buffer.ptr, self.nbytes(batch), stream)

    def close(self) -> None:
        self.buffer.close()
        for owned in (self.thresholds, self.thresholds_host):
            if owned is not None:
                owned.close()


class HostNmsResults:
    """Pinned host mirror of :class:`NmsResults`: ``counts`` [max_batch] int32 and
    ``det`` [max_batch, max_det, 6] float32."""

    def __init__(self, max_batch: int, max_det: int) -> None:
        self.max_batch, self.max_det = max_batch, max_det
        header = _header_bytes(max_batch)
        self.buffer = PinnedBuffer(header + max_batch * max_det * 6 * 4)
        self.counts = self.buffer.array(np.int32, max_batch)
        self.det = self.buffer.array(np.float32, (max_batch, max_det, 6), offset=header)

    def detections(self, batch: int) -> list[Detections]:
        """Per-frame detections (copies), valid once the download has completed."""
        out = []
        for i in range(batch):
            rows = self.det[i, : int(self.counts[i])]
            out.append(Detections(rows[:, :4].copy(), rows[:, 4].copy(), rows[:, 5].astype(np.int32)))
        return out

    def source_detections(
        self, transforms: list[Transform], sizes: list[tuple[int, int]]
    ) -> list[Detections]:
        """Per-frame detections in source pixels (``to_source_padded``), as many frames as ``transforms``;
        valid once the download has completed."""
        return to_source_padded(self.det, self.counts, transforms, sizes)

    def close(self) -> None:
        self.counts = self.det = None  # type: ignore[assignment]
        self.buffer.close()


class GpuPostprocessor:
    """Decode + threshold + top-K + class-aware NMS of a batch of raw outputs, two launches per batch.

    ``num_anchors`` is N of ``[B, 4 + C, N]`` / ``[B, N, 5 + C]`` or K of ``[B, K, 6]``; ``dtype`` is the
    engine output's element type (``float32`` or ``float16``).
    """

    def __init__(
        self,
        spec: PostprocessSpec,
        ctx: Context,
        *,
        max_batch: int,
        num_anchors: int,
        dtype: str = "float32",
        loader: KernelLoader | None = None,
    ) -> None:
        head = spec.head
        self.generic = head is not None and not head.legacy
        if not self.generic and spec.layout not in LAYOUT_IDS:
            raise ValueError(
                f"GpuPostprocessor: layout must be one of {', '.join(LAYOUT_IDS)} or a head, "
                f"got {spec.layout!r}"
            )
        if self.generic:
            assert head is not None
            num_anchors = head.candidates
        if dtype not in ("float32", "float16"):
            raise ValueError(f"GpuPostprocessor: dtype must be float32 or float16, got {dtype!r}")
        if not 1 <= spec.top_k <= MAX_TOP_K:
            raise ValueError(f"GpuPostprocessor: top_k must be in 1..{MAX_TOP_K}, got {spec.top_k}")
        if spec.max_detections < 1 or max_batch < 1 or num_anchors < 1:
            raise ValueError(
                f"GpuPostprocessor: max_detections ({spec.max_detections}), max_batch ({max_batch}) and "
                f"num_anchors ({num_anchors}) must be >= 1"
            )
        if (self.generic or spec.layout != "end2end") and spec.num_classes < 1:
            raise ValueError(f"GpuPostprocessor: num_classes must be >= 1, got {spec.num_classes}")
        self.spec, self.ctx, self.max_batch, self.n, self.dtype = spec, ctx, max_batch, num_anchors, dtype
        self.max_det = spec.max_detections
        self._owns_loader = loader is None
        self.loader = loader or KernelLoader(ctx)
        suffix = "f16" if dtype == "float16" else "f32"
        kind = "generic" if self.generic else spec.layout
        self.decode = self.loader.kernel("postprocess", f"decode_{kind}_{suffix}")
        self._head = HeadParams.of(head) if self.generic and head is not None else None
        self.nms = self.loader.kernel("postprocess", "nms_select")
        self.kcap, self.sort_cap, words, self.shared = nms_geometry(spec, num_anchors, self.max_det)
        if self.shared > 48 * 1024:
            limit = ctx.attribute("max_shared_memory_per_block_optin")
            if self.shared > limit:
                raise ValueError(
                    f"GpuPostprocessor: top_k {spec.top_k} / max_detections {self.max_det} need "
                    f"{self.shared} bytes of shared memory per block, the device allows {limit}"
                )
            self.nms.set_max_dynamic_shared(self.shared)
        n = max_batch * num_anchors
        self._keys = DeviceBuffer(8 * n)
        self._boxes = DeviceBuffer(16 * n)
        self._classes = DeviceBuffer(4 * n)
        self._counts = DeviceBuffer(4 * max_batch)
        do_nms = head.nms if head is not None else spec.layout != "end2end"
        self._mask = DeviceBuffer(max_batch * words * self.kcap * 8 if do_nms else 8)
        self._consts = (
            ctypes.c_int(num_anchors),
            ctypes.c_int(spec.num_classes),
            ctypes.c_float(spec.score_threshold),
            ctypes.c_float(spec.iou_threshold),
            ctypes.c_int(int(do_nms)),
        )
        self._done: Event | None = None
        self._done_stream: Stream | None = None  # the owned stream _done was last recorded on
        self._packed: dict[tuple[int, int, int, int], tuple[PackedArgs, PackedArgs]] = {}

    def input_shape(self, batch: int) -> tuple[int, ...]:
        if self._head is not None:
            return (batch, self._head.row)
        c = self.spec.num_classes
        return {
            "yolov8": (batch, 4 + c, self.n),
            "yolov5": (batch, self.n, 5 + c),
            "end2end": (batch, self.n, 6),
        }[self.spec.layout]

    def new_results(self) -> NmsResults:
        table = self.spec.thresholds
        return NmsResults(self.max_batch, self.max_det, table.num_classes if table is not None else 0)

    def new_host_results(self) -> HostNmsResults:
        return HostNmsResults(self.max_batch, self.max_det)

    def __call__(
        self,
        output: object,
        batch: int,
        stream: Stream,
        results: NmsResults,
        stream_ids: Sequence[str] | None = None,
    ) -> NmsResults:
        """Enqueue postprocess of ``batch`` frames of raw output (device address) into ``results``.

        ``stream_ids``: each frame's stream, needed with ``spec.thresholds`` (class filter). The threshold
        rows are staged in the pinned table of ``results``: reuse it only after its previous call finished."""
        if not 1 <= batch <= self.max_batch:
            raise ValueError(f"GpuPostprocessor: batch {batch} outside 1..{self.max_batch}")
        if (results.max_batch, results.max_det) != (self.max_batch, self.max_det):
            raise ValueError("GpuPostprocessor: results buffer made for another postprocessor")
        if self._done is not None and stream is not self._done_stream:
            stream.wait(self._done)  # the scratch buffers are free once the previous call's kernels ran
        self._counts.fill_u32(0, stream, count=batch)
        thresholds_ptr = 0
        table = self.spec.thresholds
        if table is not None and table.active:
            if stream_ids is None or len(stream_ids) != batch:
                raise ValueError("GpuPostprocessor: class thresholds need the stream id of every frame")
            if results.thresholds is None or results.thresholds_host is None:
                raise ValueError("GpuPostprocessor: results buffer made without a threshold table")
            c = table.num_classes
            if c != self.spec.num_classes:
                raise ValueError(
                    f"GpuPostprocessor: threshold rows have {c} classes, spec {self.spec.num_classes}"
                )
            table.rows(stream_ids, out=results.thresholds_host.array(np.float32, (batch, c)))
            copy_htod(results.thresholds.ptr, results.thresholds_host.ptr, batch * c * 4, stream)
            thresholds_ptr = results.thresholds.ptr
        key = (device_pointer(output), thresholds_ptr, results.det_ptr, results.counts_ptr)
        packed = self._packed.get(key)
        if packed is None:
            if len(self._packed) > 64:  # a caller cycling through many buffers: never grow without bound
                self._packed.clear()
            packed = self._packed[key] = self._pack_args(*key)
        grid = ((self.n + DECODE_THREADS - 1) // DECODE_THREADS, batch, 1)
        self.decode.launch(stream, grid, (DECODE_THREADS, 1, 1), packed[0])
        self.nms.launch(stream, (batch, 1, 1), (NMS_THREADS, 1, 1), packed[1], shared=self.shared)
        self._done = self._done or Event()
        self._done.record(stream)
        # Later calls on this same stream are ordered after this one anyway. Only a stream we own counts: a
        # borrowed handle may be the per-thread default stream (another stream in each thread) or a value a
        # destroyed stream had; holding the object keeps its handle from being reused while we compare.
        self._done_stream = None if stream.borrowed else stream
        return results

    def _pack_args(
        self, output: int, thresholds: int, det: int, det_counts: int
    ) -> tuple[PackedArgs, PackedArgs]:
        """Both kernels' arguments for one (engine output, threshold table, results) buffer set."""
        n_anchors, num_classes, score_thr, iou_thr, do_nms = self._consts
        keys, boxes, classes, counts = (
            ctypes.c_uint64(self._keys.ptr),
            ctypes.c_uint64(self._boxes.ptr),
            ctypes.c_uint64(self._classes.ptr),
            ctypes.c_uint64(self._counts.ptr),
        )
        shape_args = (self._head,) if self._head is not None else (n_anchors, num_classes)
        decode = PackedArgs(
            (
                ctypes.c_uint64(output),
                *shape_args,
                score_thr,
                keys,
                boxes,
                classes,
                counts,
                ctypes.c_uint64(thresholds),
            )
        )
        nms = PackedArgs(
            (
                keys,
                boxes,
                classes,
                counts,
                n_anchors,
                ctypes.c_int(self.kcap),
                ctypes.c_int(self.sort_cap),
                ctypes.c_int(self.max_det),
                iou_thr,
                do_nms,
                ctypes.c_uint64(self._mask.ptr),
                ctypes.c_uint64(det),
                ctypes.c_uint64(det_counts),
            )
        )
        return decode, nms

    def close(self) -> None:
        if self._done is not None:
            self._done.synchronize()
            self._done.close()
        for buf in (self._keys, self._boxes, self._classes, self._counts, self._mask):
            buf.close()
        if self._owns_loader:
            self.loader.close()
