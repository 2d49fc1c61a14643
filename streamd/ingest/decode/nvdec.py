"""NVDEC decoder (PyNvVideoCodec 2.2): Annex-B packets -> NV12 pictures in device memory. Twin of ``cpu.py``.

Design
- Our context and stream: the device's primary context (shared with the engine and the preprocess kernels)
  and a stream of our own; the PyNvVideoCodec decoder is created on them with ``usedevicememory=True``.
  Packets come from our demuxer (timeouts, reconnects) as ``PacketData`` (address and size of the Annex-B
  buffer, pts); PyNvVideoCodec's own demuxer is never used (it cannot time out).
- Surface lifetime: PyNvVideoCodec recycles its output buffers within a few ``Decode()`` calls, so every
  picture is copied, device to device on the decoder's stream, into a buffer of our :class:`SurfacePool` as
  soon as ``Decode()`` returns, and an event (``ready``) is recorded after the copy. What goes downstream is
  an :class:`Nv12Lease` over the pooled buffer, valid until the consumer releases it. Ordering is by events,
  never by host synchronisation: the consumer's stream waits on ``ready`` before reading; ``release(stream)``
  records ``consumed`` on the consumer's stream and the decoder's stream waits on it before the buffer is
  written again. A surface dropped unread (the stream queue drops frames when the pipeline is behind) goes
  back to the pool through a finalizer.
- Deferred copies (``defer_copy=True``, streams with ``detect_fps``): a picture comes out as a
  :class:`DeferredCopy` over PyNvVideoCodec's buffer instead, copied into the pool by ``take()`` only when
  the frame goes on to the detector; a frame ``detect_fps`` skips (two in three at 10 of 30 fps) costs no
  copy, no pooled buffer and no event. PyNvVideoCodec's buffer is only read before the decoder's next call:
  that call (``decode``, ``flush``, a recreation) first copies every picture still undecided (e.g. one the
  stream's timeline holds back), so a later ``take()`` returns that copy.
- No pixel crosses PCIe: NVDEC writes device memory, the copy is device to device, consumers read by pointer.
  (:func:`download_nv12` is a debugging/test helper that does copy to the host.)
- Resolution changes: PyNvVideoCodec 2.2.4 keeps its first output size when a new SPS changes the picture
  size mid-stream (seen on the H200: 320x240 -> 640x360 still reported 320x240). So the decoder watches the
  SPS at the head of each packet (a vectorised scan of its first bytes, not per pixel): when the SPS bytes
  change, the old decoder is flushed (its pictures are returned) and a new one decodes from this packet,
  which carries the new parameter sets. Decode failures (:attr:`RECREATE_AFTER` in a row) also recreate it,
  with twice the size headroom.
- Low delay (``low_delay=True``, live streams): when the SPS says the stream never reorders (no B-frames;
  :mod:`.sps`), the decoder runs with ``DisplayDecodeLatencyType.LOW`` and every packet is
  marked ``ENDOFPICTURE``, so each picture leaves the ``Decode()`` call of its own packet; a stream with
  B-frames keeps NATIVE (the least delay its reordering allows). Files read as fast as possible keep NATIVE.
- Reuse: :meth:`NvdecDecoder.flush` (end of a file pass or a live session) sends ENDOFSTREAM, so every
  picture is delivered, and the same PyNvVideoCodec decoder then goes on with the next pass or session
  (parameter sets sent again in front); :meth:`NvdecDecoder.restart` tells the stream's decoder slot
  (``streamd.ingest.decoder_slot``) whether the next pass/session has the same format. Destroying a
  decoder holds the GIL inside PyNvVideoCodec (its destructor runs under pybind11), which would stall every
  other stream at each loop pass; so a decoder is only replaced when the SPS changes, and the replaced one is
  destroyed on a background thread (:func:`streamd.ingest.decode.base.close_later`). Creating one, and its
  session at the first ``Decode()``, was not seen holding it (24 streams starting in one worker, ≈ 55 ms
  apart: the start-up profile in bench/RESULTS.md, fourteenth session).
- A full GPU: NVDEC holds a limited number of decoders at once (how many: bench/RESULTS.md, measured with
  ``tools/nvdec_sessions.py``). PyNvVideoCodec creates the session at the first SPS,
  inside ``Decode()``; when ``cuvidCreateDecoder`` fails there with error 2 (out of memory), that is
  :class:`DecoderFull` (not a corrupt packet; no recreation with a larger size; the pictures decoded before
  go with it): the stream gives the decoder up and tries again later with backoff.
- Codecs: H.264 and HEVC, 8-bit 4:2:0. Hopper's NVDEC has no AV1 (``PyNvVCExceptionUnsupported``): AV1 and
  other codecs use the CPU decoder.

Only this module (and ``streamd/gpu``, ``streamd/engines``) imports CUDA or PyNvVideoCodec, lazily.
"""

from __future__ import annotations

import importlib
from dataclasses import replace
from typing import Any

import numpy as np

from streamd.gpu.decoder_io import DecoderGpu
from streamd.ingest.decode.base import DecodedPicture, DecodeError, DecoderFull, close_later, same_format
from streamd.ingest.decode.pool import Nv12Lease, SurfacePool
from streamd.ingest.decode.sps import colour_signal, reorder_depth
from streamd.ingest.sources.base import Packet, VideoInfo
from streamd.stages.preprocess.colour import signalled

NVDEC_CODECS = {"h264": "H264", "hevc": "HEVC"}
SPS_SCAN_BYTES = 1024  # parameter sets open an access unit (after an AUD / VPS), well inside this
START_CODE = b"\x00\x00\x01"  # (a 4-byte start code's extra zero ends the NAL unit before it: stripped)


def find_sps(view: np.ndarray, codec: str) -> bytes | None:
    """The SPS NAL unit (payload bytes, trailing zeros stripped) at the head of an Annex-B packet, if any.

    Runs on every packet a stream thread decodes, holding the GIL: ``bytes.find`` visits only the start
    codes (a few per packet), ≈ 5x quicker than array compares over the head (bench/bench_nal_scan.py)."""
    head = view[:SPS_SCAN_BYTES].tobytes()
    last = len(head) - 4  # a start code with its NAL header byte after it
    want = 7 if codec == "h264" else 33
    pos = head.find(START_CODE)
    while 0 <= pos <= last:
        i = pos + 3
        nal_type = head[i] & 0x1F if codec == "h264" else (head[i] >> 1) & 0x3F
        pos = head.find(START_CODE, i)
        if nal_type == want:
            return head[i : pos if 0 <= pos <= last else len(head)].rstrip(b"\0")
    return None


def with_colour(info: VideoInfo, sps: bytes | None) -> VideoInfo:
    """``info`` with the colour matrix and range its SPS signals, where it does (the OpenCV source cannot
    tell; the CPU decoder reads the same from FFmpeg's frames): what the kernel converts the pictures with."""
    if sps is None:
        return info
    matrix, full = signalled(*colour_signal(sps, info.codec), info.color_matrix, info.full_range)
    if (matrix, full) == (info.color_matrix, info.full_range):
        return info
    return replace(info, color_matrix=matrix, full_range=full)


RECREATE_AFTER = 3  # Decode() failures in a row before the decoder is recreated
NO_PTS = -(1 << 62)  # the timestamp NVDEC carries for a packet without pts (its picture gets pts None)


def nvdec_available(device: int = 0) -> tuple[bool, str]:
    """Whether PyNvVideoCodec and a CUDA device are usable here, and if not, why."""
    try:
        importlib.import_module("PyNvVideoCodec")
    except Exception as exc:
        return False, f"PyNvVideoCodec not importable: {type(exc).__name__}: {exc}"
    from streamd.gpu.cuda import gpu_available

    return gpu_available(device)


class _Retired:
    """A replaced PyNvVideoCodec decoder on its way to the background closer (dropped there)."""

    def __init__(self, dec: Any) -> None:
        self._dec = dec

    def close(self) -> None:
        self._dec = None


class NvdecDecoder:
    """PyNvVideoCodec decoder fed by our demuxer; yields :class:`Nv12Lease` pictures (see module docstring).

    ``pool_size``: most pooled buffers alive at once (pictures not yet released downstream, plus one being
    written). ``acquire_timeout_s``: how long to wait for a buffer when all are held before dropping the
    picture (counted in :attr:`dropped`). ``max_width/max_height``: the decoder is created for at least this
    size (or the stream's, if larger), so a stream that changes size within it is reconfigured in place.
    ``low_delay``: live stream; use the zero-delay mode when the stream has no B-frames (module docstring).
    ``defer_copy``: pictures come as :class:`DeferredCopy` (``DecodedPicture.deferred``), copied only when
    taken (module docstring).
    """

    name = "nvdec"

    def __init__(
        self,
        info: VideoInfo,
        *,
        device: int = 0,
        pool_size: int = 32,
        acquire_timeout_s: float = 1.0,
        max_width: int = 1920,
        max_height: int = 1088,
        low_delay: bool = False,
        defer_copy: bool = False,
        gpu: Any = None,
        nvc: Any = None,
    ) -> None:
        if info.codec not in NVDEC_CODECS:
            raise DecodeError(
                f"NVDEC decodes H.264 and HEVC here, not {info.codec!r} (Hopper's NVDEC has no AV1); "
                "use the CPU decoder for this stream"
            )
        if not info.annexb:
            raise DecodeError("NVDEC needs Annex-B packets: open the source with annexb=True")
        try:
            self._nvc = nvc if nvc is not None else importlib.import_module("PyNvVideoCodec")
            self._gpu = gpu if gpu is not None else DecoderGpu(device)
        except Exception as exc:  # ImportError, OSError (driver libraries), CUDAError
            raise DecodeError(f"NVDEC is not available here: {type(exc).__name__}: {exc}") from None
        self.info = info
        head = np.frombuffer(info.extradata, np.uint8) if info.extradata else None
        self._colour_info = with_colour(info, None if head is None else find_sps(head, info.codec))
        self.device = device
        self.pool = SurfacePool(self._gpu, pool_size)
        self._acquire_timeout_s = acquire_timeout_s
        self._max = (max(max_width, info.width), max(max_height, info.height))
        self._layout: dict[tuple[int, int], tuple[int, int]] = {}  # (w, h) -> (source pitch, chroma offset)
        self._wait_on = True  # DecodedFrame.WaitOnCUStream usable
        self.source_memory = "unknown"  # where PyNvVideoCodec's output lives (device, checked at first frame)
        self.skipped = 0  # NVDEC reports no per-picture corruption through PyNvVideoCodec
        self.dropped = 0  # pictures dropped because every pooled buffer was held downstream
        self.recreated = 0
        self.sequence_changes = 0  # new SPS mid-stream: decoder recreated (see the module docstring)
        self._sps: bytes | None = None
        self._errors_in_row = 0
        self._dec: Any = None
        self._closed = False
        self.low_delay = low_delay
        self.defer_copy = defer_copy
        self._undecided: list[DeferredCopy] = []  # deferred pictures of the last call, not taken or released
        self.latency = "native"  # native | low: the display delay mode of the current decoder
        self.created = 0  # PyNvVideoCodec decoders created (1 + recreations)
        self._create(info.extradata)

    # -- decoder lifecycle -------------------------------------------------------------------------------
    def _latency_for(self, head: Any) -> str:
        """``low`` when low delay was asked for and the SPS in ``head`` (bytes or an Annex-B array) says the
        stream never reorders; else ``native``."""
        if not self.low_delay or head is None or not len(head):
            return "native"
        view = np.frombuffer(head, np.uint8) if isinstance(head, bytes) else head
        sps = find_sps(view, self.info.codec)
        return "low" if sps is not None and reorder_depth(sps, self.info.codec) == 0 else "native"

    def _create(self, head: Any = None) -> None:
        nvc = self._nvc
        self.latency = self._latency_for(head)
        options: dict[str, Any] = {}
        kinds = getattr(nvc, "DisplayDecodeLatencyType", None)
        if kinds is not None:
            options["latency"] = kinds.LOW if self.latency == "low" else kinds.NATIVE
        try:
            self._dec = nvc.CreateDecoder(
                gpuid=self.device,
                codec=getattr(nvc.cudaVideoCodec, NVDEC_CODECS[self.info.codec]),
                cudacontext=self._gpu.context_handle,
                cudastream=self._gpu.stream_handle,
                usedevicememory=True,
                maxwidth=self._max[0],
                maxheight=self._max[1],
                **options,
            )
        except Exception as exc:
            raise DecodeError(f"cannot create the NVDEC decoder for {self.info.codec}: {exc}") from None
        self.created += 1
        self._send_extradata = bool(self.info.extradata)
        self._flushed = False

    def _recreate(self, *, grow: bool, head: Any = None) -> None:
        """A fresh decoder (a new sequence, or after failures: then with twice the size headroom, in case
        the stream grew past it). It starts decoding at the next key frame. The old one is destroyed on the
        background closer thread (PyNvVideoCodec holds the GIL while it tears a decoder down)."""
        self._settle()  # the old decoder's buffers go with it
        old, self._dec = self._dec, None
        if old is not None:
            close_later(_Retired(old))
        if grow:
            self._max = (min(8192, 2 * self._max[0]), min(8192, 2 * self._max[1]))
            self.recreated += 1
        self._layout.clear()
        self._create(head if head is not None else self.info.extradata)

    def restart(self, info: VideoInfo) -> bool:
        """Go on with a new pass/session of the stream after :meth:`flush`: True (decoder kept) when ``info``
        has this decoder's format; False: the caller needs a new decoder."""
        if self._closed or not same_format(self.info, info):
            return False
        self.info = info
        self._colour_info = with_colour(info, self._sps)
        return True

    # -- decoding ----------------------------------------------------------------------------------------
    def decode(self, packet: Packet) -> list[DecodedPicture]:
        view = packet.view()
        before: list[DecodedPicture] = []
        sps = find_sps(view, self.info.codec)
        if sps is not None:
            if self._sps is not None and sps != self._sps:
                if not self._flushed:
                    before = self.flush()  # the old sequence's pictures; a new decoder takes this packet
                self.sequence_changes += 1
                self._recreate(grow=False, head=view)
            self._sps = sps
            self._colour_info = with_colour(self.info, sps)
        if self._flushed:  # after a flush (end of a pass/session): the same decoder goes on
            self._flushed = False
            self._send_extradata = bool(self.info.extradata)
        if self._send_extradata:  # parameter sets first (RTSP sends them out of band, in the SDP)
            view = np.concatenate((np.frombuffer(self.info.extradata, np.uint8), view))
            self._send_extradata = False
        pd = self._nvc.PacketData()
        pd.bsl_data = int(view.ctypes.data)
        pd.bsl = int(view.size)
        pd.pts = NO_PTS if packet.pts is None else int(packet.pts)
        if self.latency == "low":  # one whole picture per packet: decode and display it now
            pd.decode_flag = self._nvc.VideoPacketFlag.ENDOFPICTURE
        try:
            return before + self._run(pd)  # `view` stays referenced until Decode() has parsed it
        except DecoderFull as exc:  # the old sequence's pictures still go out
            exc.pictures = before + exc.pictures
            raise

    def flush(self) -> list[DecodedPicture]:
        """Every picture still in the decoder (ENDOFSTREAM) at the end of a stream, a file pass or a live
        session; the next ``decode`` goes on with the same decoder, parameter sets first."""
        if self._flushed or self._dec is None:
            return []
        pd = self._nvc.PacketData()
        pd.bsl_data = 0
        pd.bsl = 0
        pd.decode_flag = self._nvc.VideoPacketFlag.ENDOFSTREAM
        out = self._run(pd)
        self._flushed = True
        return out

    def _run(self, pd: Any) -> list[DecodedPicture]:
        self._settle()  # Decode() may reuse the buffers of the pictures it gave last time
        try:
            frames = self._dec.Decode(pd)
        except Exception as exc:
            if "cuvidCreateDecoder" in str(exc) and "returned error 2" in str(exc):
                # PyNvVideoCodec creates the NVDEC session at the first SPS, inside Decode(): the GPU has no
                # room for another one. Growing the size (below) would only ask for more.
                detail = " ".join(str(exc).split())[:200]
                raise DecoderFull(
                    f"NVDEC has no room for another decoder on GPU {self.device} ({detail})"
                ) from None
            self._errors_in_row += 1
            if self._errors_in_row >= RECREATE_AFTER:
                self._errors_in_row = 0
                self._recreate(grow=True)
            raise DecodeError(f"NVDEC could not decode a packet ({type(exc).__name__}: {exc})") from None
        self._errors_in_row = 0
        if self.defer_copy:
            return [self._defer(frame) for frame in frames]
        return [pic for pic in map(self._take, frames) if pic is not None]

    def _defer(self, frame: Any) -> DecodedPicture:
        width, height = self._size(frame)
        deferred = DeferredCopy(self, frame, width, height)
        self._undecided.append(deferred)
        return DecodedPicture(self._pts(frame), width, height, deferred=deferred)

    def _settle(self) -> None:
        """Copy the pictures of the last call nobody has taken or released yet, while their buffers hold."""
        undecided, self._undecided = self._undecided, []
        for deferred in undecided:
            deferred.keep()

    def _take(self, frame: Any) -> DecodedPicture | None:
        """Copy one PyNvVideoCodec frame into a pooled buffer before PyNvVideoCodec recycles it."""
        width, height = self._size(frame)
        surface = self._copy(frame, width, height)
        return None if surface is None else DecodedPicture(self._pts(frame), width, height, surface=surface)

    def _copy(self, frame: Any, width: int, height: int) -> Nv12Lease | None:
        """The frame in a pooled buffer (None: every buffer held downstream; counted in ``dropped``)."""
        src_pitch, chroma_off = self._plane_layout(frame, width, height)
        slot = self.pool.acquire(width, height, src_pitch, self._acquire_timeout_s)
        if slot is None:
            self.dropped += 1
            return None
        if self._wait_on:  # order our stream after PyNvVideoCodec's post-processing of this frame
            try:
                frame.WaitOnCUStream(self._gpu.stream_handle)
            except Exception:
                self._wait_on = False
        luma = int(frame.GetPtrToPlane(0))
        gpu = self._gpu
        if chroma_off == src_pitch * height:  # Y then UV in one block, as in our buffer: one copy
            gpu.copy_linear(slot.ptr, luma, src_pitch * height * 3 // 2)
        else:
            gpu.copy_plane(slot.ptr, slot.pitch, luma, src_pitch, width, height)
            uv = slot.ptr + slot.pitch * height
            gpu.copy_plane(uv, slot.pitch, luma + chroma_off, src_pitch, width, height // 2)
        gpu.record(slot.ready)
        return Nv12Lease(slot, self.pool, gpu, self._colour_info, self.device)

    def _size(self, frame: Any) -> tuple[int, int]:
        """(width, height) of this picture: its NV12 ``shape`` is (H * 3 / 2, W). Per frame, because one
        ``Decode()`` can return pictures from both sides of a size change; else the decoder's current size."""
        try:
            rows, width = frame.shape[:2]
            return int(width), int(rows) * 2 // 3
        except Exception:
            try:
                return int(self._dec.GetWidth()), int(self._dec.GetHeight())
            except Exception:
                return self.info.width, self.info.height

    def _plane_layout(self, frame: Any, width: int, height: int) -> tuple[int, int]:
        """(pitch, chroma offset from the Y plane) of PyNvVideoCodec's NV12 output, learnt once per size.

        From the frame's CUDA array interface when it is readable; else the documented layout (pitch =
        width, UV right after Y).
        """
        key = (width, height)
        layout = self._layout.get(key)
        if layout is None:
            layout = (width, width * height)
            self.source_memory = self._gpu.memory_type(int(frame.GetPtrToPlane(0)))
            try:
                views = frame.cuda()
                luma = int(views[0].__cuda_array_interface__["data"][0])
                cai = views[1].__cuda_array_interface__
                strides = cai.get("strides") or ()
                pitch = int(strides[0]) if strides else width
                if pitch >= width:
                    layout = (pitch, int(cai["data"][0]) - luma)
            except Exception:
                pass
            self._layout[key] = layout
        return layout

    def _pts(self, frame: Any) -> float | None:
        if not self.info.time_base:
            return None
        get = getattr(frame, "getPTS", None)
        raw = get() if get is not None else getattr(frame, "timestamp", None)
        return None if raw is None or int(raw) == NO_PTS else float(raw) * self.info.time_base

    def close(self) -> None:
        """Release the decoder, the free pooled buffers, the stream and the context (safe to call twice).

        Surfaces still held downstream stay valid; their buffers are freed when they are released, and our
        retain of the context is dropped only after that, so no handle of ours outlives its context.
        """
        if self._closed:
            return
        self._closed = True
        for deferred in self._undecided:  # nothing reads them once the decoder is gone
            deferred.release()
        self._undecided = []
        self._dec = None  # PyNvVideoCodec's decoder goes first (its surfaces, its use of our stream)
        self._gpu.close_stream()
        self.pool.close(on_empty=self._gpu.release_context)


class DeferredCopy:
    """A picture still in PyNvVideoCodec's buffer (``NvdecDecoder(defer_copy=True)``): ``take()`` copies it
    into a pooled buffer (the frame goes on), ``release()`` lets it go uncopied (``detect_fps`` skipped it).
    Only the stream's decode thread calls either; if neither came, the decoder copies it before its next
    call (``keep``)."""

    __slots__ = ("_dec", "_frame", "_lease", "height", "width")

    def __init__(self, dec: NvdecDecoder, frame: Any, width: int, height: int) -> None:
        self._dec: NvdecDecoder | None = dec
        self._frame = frame
        self._lease: Nv12Lease | None = None
        self.width, self.height = width, height

    def keep(self) -> None:
        """Copy now if undecided (the decoder's buffer is about to be reused)."""
        if self._dec is not None:
            self._lease = self._dec._copy(self._frame, self.width, self.height)
            self._dec = self._frame = None

    def take(self) -> Nv12Lease | None:
        """The pooled copy (made now unless kept already); None when no buffer was free (counted dropped)."""
        self.keep()
        lease, self._lease = self._lease, None
        return lease

    def release(self) -> None:
        """Not wanted: no copy (or the kept copy goes back to its pool)."""
        self._dec = self._frame = None
        if self._lease is not None:
            self._lease.release()
            self._lease = None


def download_nv12(surface: Nv12Lease) -> np.ndarray:
    """Debug/test helper: the surface's NV12 pixels on the host, shape (H * 3 // 2, W) uint8.

    This is the one place that moves pixels over PCIe; the decode path never calls it.
    """
    from streamd.gpu import cuda

    drv = cuda.driver()
    out = np.empty((surface.height * 3 // 2, surface.width), np.uint8)
    surface.ready.synchronize()
    planes = (
        (0, surface.luma_ptr, surface.height),
        (surface.height, surface.chroma_ptr, surface.height // 2),
    )
    for dst_row, src, rows in planes:
        m = drv.CUDA_MEMCPY2D()
        m.srcMemoryType = drv.CUmemorytype.CU_MEMORYTYPE_DEVICE
        m.srcDevice, m.srcPitch = src, surface.pitch
        m.dstMemoryType = drv.CUmemorytype.CU_MEMORYTYPE_HOST
        m.dstHost, m.dstPitch = out[dst_row:].ctypes.data, surface.width
        m.WidthInBytes, m.Height = surface.width, rows
        cuda.check(drv.cuMemcpy2D(m), "cuMemcpy2D")
    return out
