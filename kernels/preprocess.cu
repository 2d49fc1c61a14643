// Batched preprocess: device frames (NV12 or packed 8-bit BGR/RGB) -> letterboxed/stretched, normalised
// NCHW float32/float16 model input, written straight into the engine's input tensor.
//
// One launch per batch: grid (ceil(W / 64), ceil(H / 8), B), block (32, 8). Each thread computes two
// horizontally adjacent output pixels and writes each channel as one pair (half2 / float2; scalar stores when
// W is odd), so a warp writes 64 consecutive pixels of one row of each plane. Source tap positions depend only
// on the column or the row, so each block computes them once into shared memory. Per-frame parameters come
// from a small device array (FrameParams, mirrored by FRAME_DTYPE in streamd/stages/preprocess/cuda.py);
// batch-wide ones are kernel arguments.
//
// Conventions (the CPU twin, streamd/stages/preprocess/cpu.py + colour.py, follows the same ones):
// - output pixel (x, y) inside the resized area [x0, x0 + rw) x [y0, y0 + rh) samples the source at
//   ((x - x0) + 0.5) * src_w / rw - 0.5 (half-pixel centres, OpenCV INTER_LINEAR), coordinate computed in
//   double like OpenCV, clamped to the border, bilinear: horizontal pass first, then vertical; pixels
//   outside it are pad_value;
// - NV12 -> RGB in float with the matrix (BT.601/BT.709) and range (limited/full) the stream signals, chroma
//   taken from the 2x2 block the luma pixel belongs to (nearest-neighbour upsampling: the stream's chroma
//   siting is not interpolated, on either path), each source tap clamped to [0, 255] before interpolation
//   (no rounding to 8 bits; computed in units of 255). The CPU decoder converts its pictures the same way
//   (colour.py), so both paths feed the network the same pixels;
// - then (value - mean) / std per channel, computed as value * scale - shift in the output channel order.

#ifndef STREAMD_EMU
#include <cuda_fp16.h>
#endif

namespace streamd_pre {

enum SourceFormat : int { kNV12 = 0, kBGR = 1, kRGB = 2 };

// Keep in sync with FRAME_DTYPE (streamd/stages/preprocess/cuda.py): 8-byte fields first, 96 bytes.
struct FrameParams {
    unsigned long long src0;  // NV12: Y plane; packed: first pixel of the first row
    unsigned long long src1;  // NV12: interleaved UV plane; packed: unused
    double sx, sy;            // source pixels per output pixel: src_w / rw, src_h / rh
    int pitch0, pitch1;       // bytes per row of src0 / src1
    int src_w, src_h;
    int format;               // SourceFormat
    int uv16;                 // 1 when src1 and pitch1 are even: read a UV pair with one 16-bit load
    int x0, y0;               // top-left of the resized image in the output (letterbox padding)
    int rw, rh;               // resized size
    // YUV -> RGB in units of 255 (so the clamp is a saturate): l = Y * y_mul + y_add;
    // R = sat(l + r_v V'), G = sat(l + g_u U' + g_v V'), B = sat(l + b_u U'), U' = U - 128, V' = V - 128
    // (range scaling and the 1 / 255 folded into the coefficients).
    float y_mul, y_add, r_v, g_u, g_v, b_u;
};

struct Normalise {
    float scale[3];     // 1 / std, output channel order (packed sources: values 0..255)
    float scale255[3];  // 255 / std (NV12 sources: values 0..1)
    float shift[3];     // mean / std
    float pad[3];       // pad_value * scale - shift
};

struct Rgb {
    float r, g, b;
};

constexpr int kTileW = 64;  // output pixels per block: 32 x 8 threads, two horizontal pixels each
constexpr int kTileH = 8;

// Exact byte -> float without a conversion instruction (those issue at a quarter rate or less):
// the float with bits 0x4B000000 | b is 2^23 + b.
__device__ __forceinline__ float u8f(unsigned int b) { return __int_as_float(0x4B000000 | b) - 8388608.0f; }
// b - 128, exactly, in one subtraction.
__device__ __forceinline__ float u8f_centred(unsigned int b) {
    return __int_as_float(0x4B000000 | b) - 8388736.0f;
}

// One NV12 source pixel as RGB in [0, 1] (chroma of its 2x2 block; saturated, i.e. clamped to [0, 255]).
__device__ __forceinline__ Rgb tap_nv12(const FrameParams& p, const unsigned char* yrow,
                                        const unsigned char* uvrow, int x) {
    const float luma = u8f(__ldg(yrow + x));
    const unsigned char* c = uvrow + (x & ~1);
    float u, v;
    if (p.uv16) {
        const unsigned int uv = __ldg(reinterpret_cast<const unsigned short*>(c));
        u = u8f_centred(uv & 0xffu);
        v = u8f_centred(uv >> 8);
    } else {
        u = u8f_centred(__ldg(c));
        v = u8f_centred(__ldg(c + 1));
    }
    const float l = fmaf(luma, p.y_mul, p.y_add);
    return {__saturatef(fmaf(p.r_v, v, l)), __saturatef(fmaf(p.g_v, v, fmaf(p.g_u, u, l))),
            __saturatef(fmaf(p.b_u, u, l))};
}

__device__ __forceinline__ Rgb tap_packed(const FrameParams& p, const unsigned char* row, int x) {
    const unsigned char* q = row + 3 * x;
    const float c0 = u8f(__ldg(q)), c1 = u8f(__ldg(q + 1)), c2 = u8f(__ldg(q + 2));
    return p.format == kBGR ? Rgb{c2, c1, c0} : Rgb{c0, c1, c2};
}

// OpenCV INTER_LINEAR source coordinate for destination index d: first tap i0, second tap i1, weight a of i1.
__device__ __forceinline__ void source_taps(int d, double scale, int size, int& i0, int& i1, float& a) {
    const float f = static_cast<float>((d + 0.5) * scale - 0.5);
    int i = static_cast<int>(floorf(f));
    a = f - static_cast<float>(i);
    if (i < 0) {
        i = 0;
        a = 0.0f;
    }
    if (i >= size - 1) {
        i = size - 1;
        a = 0.0f;
    }
    i0 = i;
    i1 = min(i + 1, size - 1);
}

__device__ __forceinline__ float lerp2(float p0, float p1, float w0, float w1) { return p0 * w0 + p1 * w1; }

struct Taps {  // the source rows of one output row
    const unsigned char* a0;  // NV12: Y row y0 / packed: row y0
    const unsigned char* a1;  // row y1
    const unsigned char* b0;  // NV12: UV row of y0
    const unsigned char* b1;  // NV12: UV row of y1
    float ay;
};

struct Out3 {
    float c0, c1, c2;
};

// Bilinear sample (horizontal pass, then vertical), then normalisation in output channel order
// (NV12 taps are in units of 255, packed ones in 8-bit units).
template <bool NV12>
__device__ __forceinline__ Out3 sample(const FrameParams& p, const Taps& t, int xa, int xb, float ax,
                                      int out_rgb, const Normalise& norm) {
    Rgb p00, p01, p10, p11;
    if (NV12) {
        p00 = tap_nv12(p, t.a0, t.b0, xa);
        p01 = tap_nv12(p, t.a0, t.b0, xb);
        p10 = tap_nv12(p, t.a1, t.b1, xa);
        p11 = tap_nv12(p, t.a1, t.b1, xb);
    } else {
        p00 = tap_packed(p, t.a0, xa);
        p01 = tap_packed(p, t.a0, xb);
        p10 = tap_packed(p, t.a1, xa);
        p11 = tap_packed(p, t.a1, xb);
    }
    const float wx0 = 1.0f - ax, wy0 = 1.0f - t.ay;
    const float r = lerp2(lerp2(p00.r, p01.r, wx0, ax), lerp2(p10.r, p11.r, wx0, ax), wy0, t.ay);
    const float g = lerp2(lerp2(p00.g, p01.g, wx0, ax), lerp2(p10.g, p11.g, wx0, ax), wy0, t.ay);
    const float b = lerp2(lerp2(p00.b, p01.b, wx0, ax), lerp2(p10.b, p11.b, wx0, ax), wy0, t.ay);
    const float c0 = out_rgb ? r : b;
    const float c2 = out_rgb ? b : r;
    const float* scale = NV12 ? norm.scale255 : norm.scale;
    return {c0 * scale[0] - norm.shift[0], g * scale[1] - norm.shift[1], c2 * scale[2] - norm.shift[2]};
}

__device__ __forceinline__ void store1(float* p, float v) { *p = v; }
__device__ __forceinline__ void store1(__half* p, float v) { *p = __float2half_rn(v); }
__device__ __forceinline__ void store2(float* p, float a, float b) { *reinterpret_cast<float2*>(p) = make_float2(a, b); }
__device__ __forceinline__ void store2(__half* p, float a, float b) {
    *reinterpret_cast<__half2*>(p) = __floats2half2_rn(a, b);
}

template <typename T>
__device__ __forceinline__ void preprocess(const FrameParams* __restrict__ frames, T* __restrict__ out,
                                           int out_w, int out_h, int out_rgb, const Normalise& norm) {
    __shared__ int s_x0[kTileW], s_x1[kTileW], s_y0[kTileH], s_y1[kTileH];
    __shared__ float s_ax[kTileW], s_ay[kTileH];
    const FrameParams& p = frames[blockIdx.z];
    const int tile_x = blockIdx.x * kTileW, tile_y = blockIdx.y * kTileH;
    const int t = threadIdx.y * blockDim.x + threadIdx.x;
    if (t < kTileW) {
        const int lx = tile_x + t - p.x0;
        if (lx >= 0 && lx < p.rw) source_taps(lx, p.sx, p.src_w, s_x0[t], s_x1[t], s_ax[t]);
    } else if (t < kTileW + kTileH) {
        const int r = t - kTileW, ly = tile_y + r - p.y0;
        if (ly >= 0 && ly < p.rh) source_taps(ly, p.sy, p.src_h, s_y0[r], s_y1[r], s_ay[r]);
    }
    __syncthreads();

    const int y = tile_y + threadIdx.y;
    const int col = 2 * threadIdx.x;
    const int x = tile_x + col;
    if (y >= out_h || x >= out_w) return;
    const bool second = x + 1 < out_w;
    Out3 va = {norm.pad[0], norm.pad[1], norm.pad[2]};
    Out3 vb = va;
    const int ly = y - p.y0;
    if (ly >= 0 && ly < p.rh) {
        const int y0 = s_y0[threadIdx.y], y1 = s_y1[threadIdx.y];
        const unsigned char* src0 = reinterpret_cast<const unsigned char*>(p.src0);
        const unsigned char* src1 = reinterpret_cast<const unsigned char*>(p.src1);
        Taps taps;
        taps.a0 = src0 + static_cast<long long>(y0) * p.pitch0;
        taps.a1 = src0 + static_cast<long long>(y1) * p.pitch0;
        taps.b0 = src1 + static_cast<long long>(y0 >> 1) * p.pitch1;
        taps.b1 = src1 + static_cast<long long>(y1 >> 1) * p.pitch1;
        taps.ay = s_ay[threadIdx.y];
        const int lx = x - p.x0;
        const bool in_a = lx >= 0 && lx < p.rw;
        const bool in_b = second && lx + 1 >= 0 && lx + 1 < p.rw;
        if (p.format == kNV12) {
            if (in_a) va = sample<true>(p, taps, s_x0[col], s_x1[col], s_ax[col], out_rgb, norm);
            if (in_b) vb = sample<true>(p, taps, s_x0[col + 1], s_x1[col + 1], s_ax[col + 1], out_rgb, norm);
        } else {
            if (in_a) va = sample<false>(p, taps, s_x0[col], s_x1[col], s_ax[col], out_rgb, norm);
            if (in_b) vb = sample<false>(p, taps, s_x0[col + 1], s_x1[col + 1], s_ax[col + 1], out_rgb, norm);
        }
    }
    const size_t plane = static_cast<size_t>(out_w) * out_h;
    T* o = out + blockIdx.z * 3 * plane + static_cast<size_t>(y) * out_w + x;
    if (second && (out_w & 1) == 0) {  // x even and every row/plane starts at an even index: aligned pairs
        store2(o, va.c0, vb.c0);
        store2(o + plane, va.c1, vb.c1);
        store2(o + 2 * plane, va.c2, vb.c2);
    } else {
        store1(o, va.c0);
        store1(o + plane, va.c1);
        store1(o + 2 * plane, va.c2);
        if (second) {
            store1(o + 1, vb.c0);
            store1(o + 1 + plane, vb.c1);
            store1(o + 1 + 2 * plane, vb.c2);
        }
    }
}

}  // namespace streamd_pre

// out: [B, 3, out_h, out_w] float32; frames: [B] FrameParams in device memory.
extern "C" __global__ void __launch_bounds__(256)
    preprocess_f32(const streamd_pre::FrameParams* __restrict__ frames, float* __restrict__ out, int out_w,
                   int out_h, int out_rgb, streamd_pre::Normalise norm) {
    streamd_pre::preprocess<float>(frames, out, out_w, out_h, out_rgb, norm);
}

// out: [B, 3, out_h, out_w] float16 (round to nearest even).
extern "C" __global__ void __launch_bounds__(256)
    preprocess_f16(const streamd_pre::FrameParams* __restrict__ frames, __half* __restrict__ out, int out_w,
                   int out_h, int out_rgb, streamd_pre::Normalise norm) {
    streamd_pre::preprocess<__half>(frames, out, out_w, out_h, out_rgb, norm);
}
