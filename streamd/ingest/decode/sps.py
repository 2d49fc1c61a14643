"""How many pictures a stream may reorder (H.264 and HEVC) and its colour signal (H.264), from its SPS.

The NVDEC decoder may use its zero-display-delay mode only for streams that never reorder (no B-frames:
decode order = display order); this module reads that from the SPS, the way the standards state it:

- HEVC: ``sps_max_num_reorder_pics`` of the highest sub-layer (always present).
- H.264: 0 for the Baseline profile (no B slices), for ``pic_order_cnt_type`` 2 (output order = decode
  order) and for intra-only streams (no reference frames); else the VUI's ``max_num_reorder_frames`` when the
  encoder wrote bitstream restrictions (x264 and most camera encoders do); else unknown (None).

:func:`colour_signal` reads the H.264 VUI's colour signal (matrix coefficients, full-range flag) for the
decoders' YUV -> RGB conversion (``stages.preprocess.colour``): the OpenCV source cannot report it.

Pure Python over a few dozen bytes, once per decoder; no GPU needed (tests run on the CPU).
"""

from __future__ import annotations

_H264_HIGH_PROFILES = {100, 110, 122, 244, 44, 83, 86, 118, 128, 138, 139, 134, 135}


class _Bits:
    """MSB-first bit reader over an RBSP (emulation-prevention bytes removed)."""

    def __init__(self, data: bytes) -> None:
        self._value = int.from_bytes(data, "big")
        self._size = len(data) * 8
        self.pos = 0

    def u(self, n: int) -> int:
        if n == 0:
            return 0
        if self.pos + n > self._size:
            raise ValueError("SPS ends early")
        self.pos += n
        return (self._value >> (self._size - self.pos)) & ((1 << n) - 1)

    def ue(self) -> int:
        zeros = 0
        while self.u(1) == 0:
            zeros += 1
            if zeros > 31:
                raise ValueError("bad exp-Golomb code")
        return (1 << zeros) - 1 + self.u(zeros)

    def se(self) -> int:
        k = self.ue()
        return (k + 1) // 2 if k % 2 else -(k // 2)


def rbsp(nal: bytes) -> bytes:
    """The NAL unit's payload with emulation-prevention bytes (``00 00 03``) removed."""
    out = bytearray()
    zeros = 0
    for b in nal:
        if zeros >= 2 and b == 3:
            zeros = 0
            continue
        out.append(b)
        zeros = zeros + 1 if b == 0 else 0
    return bytes(out)


def reorder_depth(sps_nal: bytes, codec: str) -> int | None:
    """Pictures that may precede another in decode order and follow it in display order (0: none, no
    B-frames), from an SPS NAL unit (header included, as :func:`.nvdec.find_sps` returns it);
    None when the SPS does not say or cannot be parsed."""
    try:
        if codec == "h264":
            return _h264(_Bits(rbsp(sps_nal[1:])))
        if codec == "hevc":
            return _hevc(_Bits(rbsp(sps_nal[2:])))
    except ValueError:
        return None
    return None


def _skip_scaling_list(r: _Bits, size: int) -> None:
    last = nxt = 8
    for _ in range(size):
        if nxt:
            nxt = (last + r.se() + 256) % 256
        last = nxt or last


def _skip_hrd(r: _Bits) -> None:
    count = r.ue() + 1
    r.u(8)  # bit_rate_scale, cpb_size_scale
    for _ in range(count):
        r.ue()
        r.ue()
        r.u(1)
    r.u(20)  # four 5-bit lengths / delays


def colour_signal(sps_nal: bytes, codec: str) -> tuple[int | None, int | None]:
    """(matrix_coefficients, range) an H.264 SPS's VUI signals: ISO/IEC 23091-2 MatrixCoefficients (None: not
    written) and FFmpeg's AVColorRange (1 limited, 2 full; None: not written). HEVC and unparsable SPSs give
    (None, None): the source's values stand (``stages.preprocess.colour.signalled``)."""
    if codec != "h264":
        return None, None
    try:
        r = _Bits(rbsp(sps_nal[1:]))
        if not _h264_to_vui(r)[3]:
            return None, None
        if r.u(1) and r.u(8) == 255:  # aspect_ratio_info
            r.u(32)
        if r.u(1):  # overscan_info_present_flag
            r.u(1)
        if not r.u(1):  # video_signal_type_present_flag
            return None, None
        r.u(3)  # video_format
        full = r.u(1)
        matrix = None
        if r.u(1):  # colour_description_present_flag
            r.u(16)  # colour_primaries, transfer_characteristics
            matrix = r.u(8)
        return matrix, 2 if full else 1
    except ValueError:
        return None, None


def _h264(r: _Bits) -> int | None:
    _, poc_type, ref_frames, vui = _h264_to_vui(r)
    if poc_type < 0 or ref_frames == 0:
        return 0  # Baseline (no B slices), output order = decode order, or intra only
    if not vui:
        return None
    if r.u(1) and r.u(8) == 255:  # aspect_ratio_info
        r.u(32)
    if r.u(1):  # overscan_info_present_flag
        r.u(1)
    if r.u(1):  # video_signal_type_present_flag
        r.u(4)
        if r.u(1):
            r.u(24)
    if r.u(1):  # chroma_loc_info_present_flag
        r.ue()
        r.ue()
    if r.u(1):  # timing_info_present_flag
        r.u(32)
        r.u(32)
        r.u(1)
    nal_hrd = r.u(1)
    if nal_hrd:
        _skip_hrd(r)
    vcl_hrd = r.u(1)
    if vcl_hrd:
        _skip_hrd(r)
    if nal_hrd or vcl_hrd:
        r.u(1)
    r.u(1)  # pic_struct_present_flag
    if not r.u(1):  # bitstream_restriction_flag
        return None
    r.u(1)
    for _ in range(4):
        r.ue()
    return r.ue()  # max_num_reorder_frames


def _h264_to_vui(r: _Bits) -> tuple[int, int, int, int]:
    """Reads an H.264 SPS up to its VUI: (profile, poc type, ref frames, vui present); poc type -1 for the
    Baseline profile and ``pic_order_cnt_type`` 2 (no reordering), where the rest is not read."""
    profile = r.u(8)
    r.u(16)  # constraint flags, level
    r.ue()  # seq_parameter_set_id
    if profile in _H264_HIGH_PROFILES:
        chroma = r.ue()
        if chroma == 3:
            r.u(1)
        r.ue()
        r.ue()
        r.u(1)
        if r.u(1):  # seq_scaling_matrix_present_flag
            for i in range(12 if chroma == 3 else 8):
                if r.u(1):
                    _skip_scaling_list(r, 16 if i < 6 else 64)
    r.ue()  # log2_max_frame_num_minus4
    poc_type = r.ue()
    if poc_type == 0:
        r.ue()
    elif poc_type == 1:
        r.u(1)
        r.se()
        r.se()
        for _ in range(r.ue()):
            r.se()
    ref_frames = r.ue()
    r.u(1)  # gaps_in_frame_num_value_allowed_flag
    r.ue()
    r.ue()
    if not r.u(1):  # frame_mbs_only_flag
        r.u(1)
    r.u(1)  # direct_8x8_inference_flag
    if r.u(1):  # frame_cropping_flag
        for _ in range(4):
            r.ue()
    vui = r.u(1)  # vui_parameters_present_flag
    return profile, -1 if profile == 66 or poc_type == 2 else poc_type, ref_frames, vui


def _hevc(r: _Bits) -> int | None:
    r.u(4)  # sps_video_parameter_set_id
    sub_layers = r.u(3)  # sps_max_sub_layers_minus1
    r.u(1)
    r.u(88)  # general profile space/tier/idc, compatibility and constraint flags
    r.u(8)  # general_level_idc
    present = [(r.u(1), r.u(1)) for _ in range(sub_layers)]
    if sub_layers:
        r.u(2 * (8 - sub_layers))
    for profile_present, level_present in present:
        r.u(88 if profile_present else 0)
        r.u(8 if level_present else 0)
    r.ue()  # sps_seq_parameter_set_id
    if r.ue() == 3:  # chroma_format_idc
        r.u(1)
    r.ue()
    r.ue()
    if r.u(1):  # conformance_window_flag
        for _ in range(4):
            r.ue()
    r.ue()
    r.ue()
    r.ue()  # log2_max_pic_order_cnt_lsb_minus4
    ordering_for_all = r.u(1)
    reorder = 0
    for _ in range(0 if ordering_for_all else sub_layers, sub_layers + 1):
        r.ue()
        reorder = r.ue()
        r.ue()
    return reorder
