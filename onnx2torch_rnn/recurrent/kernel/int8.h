// Integer products and dynamic quantization on the CPU as onnxruntime computes them, shared by the kernel's int8 ops
// (dynamic_quantize_lstm.cpp, quantized_ops.cpp; their Python implementations in modules/quantized.py are the
// reference): uint8 operands times int8 panels (uint8 weights shifted by 128), exact in int32 in any order, with
// AVX-512 VNNI's vpdpbusd (uint8 x int8, four products per int32 lane) where the build targets it and the same sums
// on plain int32 vectors elsewhere; onnxruntime's dynamic quantization parameters; MLAS's tanh and logistic.
//
// Every float operation in this header and in the files that include it rounds on its own, as onnxruntime's code
// (built without FMA contraction) does: contraction is off from here to the end of the including file (pragma
// below), and MLAS's own fused multiply-adds are explicit.
#pragma once

// Built against PyTorch's stable ABI (torch/csrc/stable), as recurrent.cpp: the including file defines
// TORCH_STABLE_ONLY before any include.
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>
#if defined(__AVX512VNNI__) && defined(__AVX512F__)
#include <immintrin.h>
#define ONNX2TORCH_RNN_VNNI 1
#elif defined(__AVX512F__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "config.h"  // CHECK_VALUE
#include "empty.h"
#include "vec.h"

#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

namespace onnx2torch_rnn {
namespace int8 {

// ---- tensors across PyTorch's stable ABI ----------------------------------------------------------------------------
// No tensor op by name per call where it can be helped (each goes through the dispatcher's boxed path, a microsecond
// or more): inputs are read through their data pointers, outputs allocated here, packed weights cached in Python.

using torch::headeronly::ScalarType;
using torch::stable::Tensor;

// A new contiguous CPU tensor (empty.h).
inline Tensor allocate(const std::vector<int64_t>& sizes, ScalarType dtype) { return empty_cpu(sizes, dtype); }

inline std::vector<int64_t> sizes_of(const Tensor& t) {
  const auto sizes = t.sizes();
  return std::vector<int64_t>(sizes.begin(), sizes.end());
}

inline std::string shape_text(const std::vector<int64_t>& shape) {  // as Python prints a list: [2, 3]
  std::string text = "[";
  for (size_t k = 0; k < shape.size(); ++k) text += (k ? ", " : "") + std::to_string(shape[k]);
  return text + "]";
}

// t itself where it is contiguous (no dispatch), else a contiguous copy.
inline Tensor dense(const Tensor& t) { return t.is_contiguous() ? t : torch::stable::contiguous(t); }

// t as float32 values in memory order, converted only when it is not already.
inline Tensor floats(const Tensor& t) {
  return dense(t.scalar_type() == ScalarType::Float ? t : torch::stable::to(t, ScalarType::Float));
}

// Value i (in memory order) of a contiguous integer tensor, as int32.
inline int32_t integer_at(const Tensor& t, int64_t i) {
  const void* p = t.const_data_ptr();
  switch (t.scalar_type()) {
    case ScalarType::Byte: return static_cast<const uint8_t*>(p)[i];
    case ScalarType::Char: return static_cast<const int8_t*>(p)[i];
    case ScalarType::UInt16: return static_cast<const uint16_t*>(p)[i];
    case ScalarType::Short: return static_cast<const int16_t*>(p)[i];
    case ScalarType::Int: return static_cast<const int32_t*>(p)[i];
    case ScalarType::Long: return static_cast<int32_t>(static_cast<const int64_t*>(p)[i]);
    default: CHECK_VALUE(false, "an integer tensor expected");
  }
  return 0;
}

// A zero point's values as int32: none ({0}), one, or `count` (one per index).
inline std::vector<int32_t> zero_points(const std::optional<Tensor>& zero_point, int64_t count, const char* what) {
  if (!zero_point) return {0};
  const Tensor z = dense(*zero_point);
  CHECK_VALUE(z.numel() == 1 || z.numel() == count, what, " zero point of ", z.numel(), " values, expected 1 or ",
              count);
  std::vector<int32_t> out(z.numel());
  for (int64_t i = 0; i < z.numel(); ++i) out[i] = integer_at(z, i);
  return out;
}

constexpr int L = Vec<float>::lanes;  // int32/float lanes of one vector register: the columns of one panel vector
constexpr int G = 4;      // vectors per panel block (DynamicQuantizeLSTM: its four gates)
constexpr int kRows = 4;  // rows per register tile
using F = V<float>;
using I = V<int32_t>;

// ---- weights as int8 panels -----------------------------------------------------------------------------------------

// A matrix M [K, columns] (int8 or uint8) as int8 panels [blocks][K4][G][L][4]: lane l of vector g of block b holds
// column `column(b, g, l)` (zeros where that is negative), rows 4·k4 .. 4·k4 + 3 in its four bytes (zeros past K).
struct Panels {
  std::vector<int8_t> data;
  std::vector<int32_t> column_sums;  // [blocks][G][L]: Σ_k of the int8 values
  int32_t shift = 0;                 // M = int8 value + shift (uint8 is stored minus 128)
  int64_t K = 0, K4 = 0;
};

// value(k, source): the matrix's 8-bit value (its storage as uint8) at row k, column source.
template <typename Value, typename Column>
Panels pack_values(int64_t K, int64_t blocks, bool unsigned_values, Value value, Column column) {
  Panels p;
  p.K = K;
  p.K4 = (p.K + 3) / 4;
  p.shift = unsigned_values ? 128 : 0;
  p.data.assign(blocks * p.K4 * G * L * 4, 0);
  p.column_sums.assign(blocks * G * L, 0);
  for (int64_t b = 0; b < blocks; ++b) {
    for (int g = 0; g < G; ++g) {
      for (int l = 0; l < L; ++l) {
        const int64_t source = column(b, g, l);
        if (source < 0) continue;
        int32_t& sum = p.column_sums[(b * G + g) * L + l];
        for (int64_t k = 0; k < p.K; ++k) {
          const uint8_t raw = value(k, source);
          const int8_t v = static_cast<int8_t>(unsigned_values ? raw ^ 0x80 : raw);
          p.data[(((b * p.K4 + k / 4) * G + g) * L + l) * 4 + k % 4] = v;
          sum += v;
        }
      }
    }
  }
  return p;
}

// ---- integer products -----------------------------------------------------------------------------------------------

// acc[m][g] = Σ_k a[m, k] · panel[k, g, :] (exact int32) for MR rows of uint8 a (row stride lda, zeros past K up to
// 4·K4) and one block's panel, for its first GV vectors (the others left unset: a block of few columns uses one),
// with U independent partial sums over k to keep enough products in flight.
template <int MR, int GV = G>
__attribute__((noinline)) void dot(const uint8_t* a, int64_t lda, const int8_t* panel, int64_t K4, I (&acc)[MR][G]) {
  constexpr int U = MR >= 3 ? 1 : MR == 2 ? 2 : 3;
  int64_t k = 0;
#ifdef ONNX2TORCH_RNN_VNNI
  __m512i part[U][MR][G];
  for (int u = 0; u < U; ++u)
    for (int m = 0; m < MR; ++m)
      for (int g = 0; g < GV; ++g) part[u][m][g] = _mm512_setzero_si512();
  auto step = [&](int u, int64_t at) {
    __m512i w[GV];
    for (int g = 0; g < GV; ++g) w[g] = _mm512_loadu_si512(panel + (at * G + g) * L * 4);
    for (int m = 0; m < MR; ++m) {
      int32_t four;
      std::memcpy(&four, a + m * lda + at * 4, 4);
      const __m512i x = _mm512_set1_epi32(four);
      for (int g = 0; g < GV; ++g) part[u][m][g] = _mm512_dpbusd_epi32(part[u][m][g], x, w[g]);
    }
  };
  for (; k + U <= K4; k += U) {
#pragma GCC unroll 4
    for (int u = 0; u < U; ++u) step(u, k + u);
  }
  for (; k < K4; ++k) step(0, k);
  for (int m = 0; m < MR; ++m) {
    for (int g = 0; g < GV; ++g) {
      __m512i sum = part[0][m][g];
      for (int u = 1; u < U; ++u) sum = _mm512_add_epi32(sum, part[u][m][g]);
      acc[m][g] = (I)sum;
    }
  }
#else
  // The four int8 values of each lane, sign-extended by shifts, times the four uint8 values of the row.
  I part[U][MR][G] = {};
  auto step = [&](int u, int64_t at) {
    for (int g = 0; g < GV; ++g) {
      const I w = load(reinterpret_cast<const int32_t*>(panel + (at * G + g) * L * 4));
      const I w0 = (w << 24) >> 24, w1 = (w << 16) >> 24, w2 = (w << 8) >> 24, w3 = w >> 24;
      for (int m = 0; m < MR; ++m) {
        const uint8_t* x = a + m * lda + at * 4;
        part[u][m][g] += w0 * int32_t{x[0]} + w1 * int32_t{x[1]} + w2 * int32_t{x[2]} + w3 * int32_t{x[3]};
      }
    }
  };
  for (; k + U <= K4; k += U) {
    for (int u = 0; u < U; ++u) step(u, k + u);
  }
  for (; k < K4; ++k) step(0, k);
  for (int m = 0; m < MR; ++m) {
    for (int g = 0; g < GV; ++g) {
      acc[m][g] = part[0][m][g];
      for (int u = 1; u < U; ++u) acc[m][g] += part[u][m][g];
    }
  }
#endif
}

// Calls f(n0, acc) for each tile of up to kRows of `rows` rows of a, after the tile's products with one block (its
// first GV vectors).
template <int GV = G, typename Fn>
void tiles(const uint8_t* a, int64_t lda, int64_t rows, const int8_t* panel, int64_t K4, Fn&& f) {
  int64_t n = 0;
  for (; n + kRows <= rows; n += kRows) {
    I acc[kRows][G];
    dot<kRows, GV>(a + n * lda, lda, panel, K4, acc);
    f(n, acc);
  }
  switch (rows - n) {
    case 1: { I acc[1][G]; dot<1, GV>(a + n * lda, lda, panel, K4, acc); f(n, acc); break; }
    case 2: { I acc[2][G]; dot<2, GV>(a + n * lda, lda, panel, K4, acc); f(n, acc); break; }
    case 3: { I acc[3][G]; dot<3, GV>(a + n * lda, lda, panel, K4, acc); f(n, acc); break; }
    default: break;
  }
}

// ---- dynamic quantization -------------------------------------------------------------------------------------------

// round half to even of a float32 integer-or-not in [-2^22, 2^22]
inline F round_even(F x) {
  const float magic = 12582912.0f;  // 1.5 · 2^23
  return (x + magic) - magic;
}

// Widens [low, high] to the values v[0 .. size) (NaN ignored).
inline void widen(const float* v, int64_t size, float& low, float& high) {
  F lo = splat(low), hi = splat(high);
  int64_t j = 0;
  for (; j + L <= size; j += L) {
    const F x = load(v + j);
    lo = x < lo ? x : lo;
    hi = x > hi ? x : hi;
  }
  for (int l = 0; l < L; ++l) {
    low = std::min(low, lo[l]);
    high = std::max(high, hi[l]);
  }
  for (; j < size; ++j) {
    low = std::min(low, v[j]);
    high = std::max(high, v[j]);
  }
}

struct Parameters {  // of a uint8 dynamic quantization
  float scale = 1;
  int32_t zero_point = 0;
};

// onnxruntime's uint8 parameters for the range [low, high] (which holds 0): (high - low) / 255 (1 for an empty range)
// and round_half_even(clamp(-low / scale, 0, 255)), in float32 (modules/quantized.py: dynamic_parameters).
inline Parameters parameters(float low, float high) {
  Parameters p;
  p.scale = high == low ? 1.0f : (high - low) / 255.0f;
  const float zero_point = 0.0f - low / p.scale;  // NaN (from an infinite range): 0
  p.zero_point = static_cast<int32_t>(std::nearbyint(zero_point > 0.0f ? std::min(zero_point, 255.0f) : 0.0f));
  return p;
}

// q[j] = round_half_even(v[j] / scale) + zero point, saturated, NaN as 0 (MlasQuantizeLinear); returns Σ q.
inline int32_t quantize(const float* v, int64_t size, Parameters p, uint8_t* q) {
  const float zp = static_cast<float>(p.zero_point), low = -zp, high = 255.0f - zp;
  I sums = {};
  auto convert = [&](F x) {
    x = x / p.scale;
    x = !(x >= low) ? splat(low) : x;  // NaN: the lowest value
    x = x > high ? splat(high) : x;
    return __builtin_convertvector(round_even(x) + zp, I);
  };
  int64_t j = 0;
  for (; j + L <= size; j += L) {
    const I u = convert(load(v + j));
    sums += u;
    uint8_t bytes[L];  // the low bytes of the lanes
    for (int l = 0; l < L; ++l) bytes[l] = static_cast<uint8_t>(u[l]);
    std::memcpy(q + j, &bytes, L);
  }
  if (j < size) {  // the last values as one partial vector (a vector load past the end would read beyond v)
    const int n = static_cast<int>(size - j);
    const I u = convert(load(v + j, n));
    for (int l = 0; l < n; ++l) {
      sums[l] += u[l];
      q[j + l] = static_cast<uint8_t>(u[l]);
    }
  }
  int32_t sum = 0;
  for (int l = 0; l < L; ++l) sum += sums[l];
  return sum;
}

constexpr int64_t kQuantizeGrain = 1 << 15;  // elements per task

// x / scale clamped to [lowest - zero, highest - zero] (NaN to the lowest), rounded half to even (exact: the bounds
// are integers below 2^22), plus the zero point (MlasQuantizeLinear), for any 8- or 16-bit type T (quantize_linear.cpp's
// ops; conv_integer.cpp's qlinear_conv of float x). store(j, values, count) takes the values of x[j .. j + count)
// (count < L only at the end).
template <typename T, typename Store>
inline void quantize(const float* x, int64_t n, float scale, int32_t zero_point, Store store) {
  const float zero = static_cast<float>(zero_point);
  const float low = static_cast<float>(std::numeric_limits<T>::min()) - zero;
  const float high = static_cast<float>(std::numeric_limits<T>::max()) - zero;
  auto convert = [&](F v) {
    v = v / scale;
    v = !(v >= low) ? splat(low) : v;
    v = v > high ? splat(high) : v;
    return __builtin_convertvector(round_even(v) + zero, I);
  };
  torch::stable::parallel_for(0, (n + L - 1) / L, kQuantizeGrain / L, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const int64_t j = b * L, count = std::min<int64_t>(L, n - j);
      // the last values by a partial load (zeros after, not stored): a whole vector would read past x
      store(j, convert(count == L ? load(x + j) : load(x + j, static_cast<int>(count))), count);
    }
  });
}

// The quantized values as T.
template <typename T>
inline void quantize(const float* x, int64_t n, float scale, int32_t zero_point, T* y) {
  quantize<T>(x, n, scale, zero_point, [y](int64_t j, const I& u, int64_t count) {
    T values[L];
    for (int l = 0; l < L; ++l) values[l] = static_cast<T>(u[l]);
    std::memcpy(y + j, values, sizeof(T) * count);
  });
}

// uint8 rows (row stride lda, zeros past the values) with their parameters and row sums: what the products take.
struct Quantized : Parameters {
  std::vector<uint8_t> q;
  std::vector<int32_t> sums;
  int64_t lda = 0;

  Quantized(int64_t rows, int64_t size) : q(rows * ((size + 3) / 4 * 4), 0), sums(rows, 0), lda((size + 3) / 4 * 4) {}
};

// ---- products of quantized rows by packed weights ------------------------------------------------------------------

inline int64_t panel_blocks(int64_t N) { return (N + G * L - 1) / (G * L); }

// Whether int8_matrix_pack stores a matrix of N columns column by column (few columns: panels of G·L would be mostly
// zeros), and the values its packing of [K, N] holds either way.
inline bool by_column(int64_t N) { return N < 32; }
inline int64_t packed_size(int64_t K, int64_t N) {
  return by_column(N) ? N * K : panel_blocks(N) * G * L * ((K + 3) / 4) * 4;
}

// Σ_k a[k] · b[k] for uint8 a and int8 b, exact.
inline int32_t dot_row(const uint8_t* a, const int8_t* b, int64_t K) {
#if defined(ONNX2TORCH_RNN_VNNI) && defined(__AVX512BW__)
  __m512i acc = _mm512_setzero_si512();
  int64_t k = 0;
  for (; k + 64 <= K; k += 64) acc = _mm512_dpbusd_epi32(acc, _mm512_loadu_si512(a + k), _mm512_loadu_si512(b + k));
  if (k < K) {
    const __mmask64 mask = ~0ULL >> (64 - (K - k));
    acc = _mm512_dpbusd_epi32(acc, _mm512_maskz_loadu_epi8(mask, a + k), _mm512_maskz_loadu_epi8(mask, b + k));
  }
  return _mm512_reduce_add_epi32(acc);
#else
  int32_t sum = 0;
  for (int64_t k = 0; k < K; ++k) sum += int32_t{a[k]} * int32_t{b[k]};
  return sum;
#endif
}

// The exact products of M uint8 rows (row i's zero point row_zero(i)) with weights w [K, N] packed column by column
// (`columns`) or as panels (data and column sums; offsets[j] = w's shift - its zero point, padded to whole blocks):
// out(i, j0, exact, count) for each run of up to L columns j0 .. j0 + count - 1 of row i.
template <typename RowZero, typename Out>
void products(const Quantized& rows, int64_t M, int64_t K, bool columns, const int8_t* data,
              const int32_t* column_sums, int64_t N, const int32_t* offsets, RowZero row_zero, Out out) {
  if (columns) {
    for (int64_t i = 0; i < M; ++i) {
      const int32_t zero = row_zero(i), row = rows.sums[i] - zero * static_cast<int32_t>(K);
      for (int64_t j0 = 0; j0 < N; j0 += L) {
        const int count = static_cast<int>(std::min<int64_t>(L, N - j0));
        I exact = {};
        for (int l = 0; l < count; ++l) {
          const int64_t j = j0 + l;
          exact[l] = dot_row(rows.q.data() + i * rows.lda, data + j * K, K) - zero * column_sums[j] + offsets[j] * row;
        }
        out(i, j0, exact, count);
      }
    }
    return;
  }
  const int64_t K4 = (K + 3) / 4;
  for (int64_t block = 0; block < panel_blocks(N); ++block) {
    const int8_t* panel = data + block * K4 * G * L * 4;
    const int32_t* sums = column_sums + block * G * L;
    auto each = [&](int64_t n0, auto& acc) {
      for (int m = 0; m < static_cast<int>(sizeof(acc) / sizeof(acc[0])); ++m) {
        const int64_t i = n0 + m;
        const int32_t zero = row_zero(i), row = rows.sums[i] - zero * static_cast<int32_t>(K);
        for (int g = 0; g < G; ++g) {
          const int64_t column = (block * G + g) * L;
          if (column >= N) break;
          const I exact = acc[m][g] - zero * load(sums + g * L) + load(offsets + column) * row;
          out(i, column, exact, static_cast<int>(std::min<int64_t>(L, N - column)));
        }
      }
    };
    if (N - block * G * L <= L) {  // one vector of columns used (a convolution of few channels): its products only
      tiles<1>(rows.q.data(), rows.lda, M, panel, K4, each);
    } else {
      tiles(rows.q.data(), rows.lda, M, panel, K4, each);
    }
  }
}

// ---- pooling windows (qlinear.cpp's max_pool and qlinear_average_pool; conv_integer.cpp's convolutions with a MaxPool
// after them) -----------------------------------------------------------------------------------------------------

// The taps of output o along one axis: k in [lo, hi) reads o · stride - begin + k · dilation, inside [0, size).
struct AxisTaps {
  int64_t size = 1, kernel = 1, stride = 1, begin = 0, dilation = 1;

  int64_t start(int64_t o) const { return o * stride - begin; }
  void range(int64_t o, int64_t& lo, int64_t& hi) const {
    const int64_t at = start(o);
    lo = 0;
    while (lo < kernel && at + lo * dilation < 0) ++lo;
    hi = lo;
    while (hi < kernel && at + hi * dilation < size) ++hi;
  }
  // the outputs [first, last) of `out` whose taps all lie inside [0, size)
  void inside(int64_t out, int64_t& first, int64_t& last) const {
    const int64_t top = size - 1 - (kernel - 1) * dilation + begin;  // o · stride <= top
    first = std::min(out, begin <= 0 ? int64_t{0} : (begin + stride - 1) / stride);
    last = std::max(first, std::min(out, top < 0 ? int64_t{0} : top / stride + 1));
  }
};

// The windows of one plane of three spatial axes (missing ones of size 1), in row-major order of the outputs. A run
// of windows wholly inside the plane (most of them) along the last axis is whole(at, count): `count` windows, the
// first one's taps at at + offsets[t] (row-major order of the kernel; offsets: `whole_taps`), each next one's
// axes[2].stride further (callers loop over taps, then windows: loads independent across windows, vectorised for a
// stride of 1); a window reaching outside the plane is part(lo, hi, start): per axis the taps [lo, hi) inside the
// plane, read from start + k · dilation. The tap ranges are computed per row of outputs, not per output.
struct Windows {
  AxisTaps axes[3];
  int64_t out[3] = {1, 1, 1};

  int64_t positions() const { return out[0] * out[1] * out[2]; }
  int64_t plane() const { return axes[0].size * axes[1].size * axes[2].size; }
  int64_t taps() const { return axes[0].kernel * axes[1].kernel * axes[2].kernel; }
  std::vector<int64_t> whole_taps() const {
    std::vector<int64_t> offsets;
    offsets.reserve(taps());
    for (int64_t k0 = 0; k0 < axes[0].kernel; ++k0)
      for (int64_t k1 = 0; k1 < axes[1].kernel; ++k1)
        for (int64_t k2 = 0; k2 < axes[2].kernel; ++k2)
          offsets.push_back(((k0 * axes[0].dilation) * axes[1].size + k1 * axes[1].dilation) * axes[2].size +
                            k2 * axes[2].dilation);
    return offsets;
  }

  template <typename Whole, typename Part>
  void each(Whole whole, Part part) const {
    const AxisTaps &a0 = axes[0], &a1 = axes[1], &a2 = axes[2];
    int64_t first, last, lo[3], hi[3], start[3];
    a2.inside(out[2], first, last);
    for (int64_t o0 = 0; o0 < out[0]; ++o0) {
      a0.range(o0, lo[0], hi[0]);
      start[0] = a0.start(o0);
      for (int64_t o1 = 0; o1 < out[1]; ++o1) {
        a1.range(o1, lo[1], hi[1]);
        start[1] = a1.start(o1);
        const bool inner = hi[0] - lo[0] == a0.kernel && hi[1] - lo[1] == a1.kernel;
        const int64_t from = inner ? first : out[2], to = inner ? last : out[2];
        const int64_t row = (start[0] * a1.size + start[1]) * a2.size;  // meaningful where inner
        auto edge = [&](int64_t o2) {
          a2.range(o2, lo[2], hi[2]);
          start[2] = a2.start(o2);
          part(lo, hi, start);
        };
        for (int64_t o2 = 0; o2 < from; ++o2) edge(o2);
        if (from < to) whole(row + a2.start(from), to - from);
        for (int64_t o2 = to; o2 < out[2]; ++o2) edge(o2);
      }
    }
  }
};

// MaxPool without indices over planes of three spatial axes (missing ones of size 1): each window's largest tap inside
// the plane, from the type's lowest value (what onnxruntime reads in the padding), or from `fill` for a window that
// reaches outside the plane where one is given (a constant Pad before the pooling: its padding reads that value); a
// NaN tap stays the window's value (as torch's max pooling).
struct MaxPool : Windows {
  const int64_t* fill = nullptr;
  std::vector<int64_t> offsets;  // whole_taps()

  // numbers: [kernel, strides, begins, out, dilations] per spatial axis of `rank`; in: the plane's three sizes
  MaxPool(const int64_t* numbers, int64_t rank, const int64_t (&in)[3], const int64_t* fill_value = nullptr)
      : fill(fill_value) {
    for (int a = 0; a < 3; ++a) axes[a].size = in[a];
    for (int a = 3 - static_cast<int>(rank); a < 3; ++a) {
      const int64_t d = a - (3 - rank);
      axes[a] = {in[a], numbers[d], numbers[rank + d], numbers[2 * rank + d], numbers[4 * rank + d]};
      out[a] = numbers[3 * rank + d];
      CHECK_VALUE(out[a] >= 0 && axes[a].dilation >= 1 && axes[a].kernel >= 1 && axes[a].stride >= 1,
                  "max_pool: kernel, strides, dilations >= 1 and output sizes >= 0 expected");
    }
    offsets = whole_taps();
  }

  template <typename T>
  static T larger(T m, T v) {
    if constexpr (std::is_floating_point_v<T>) {
      return v > m || std::isnan(v) ? v : m;  // NaN: kept (nothing is larger than it)
    } else {
      return v > m ? v : m;
    }
  }

  template <typename T>
  void operator()(const T* src, T* to) const {  // one plane
    const T lowest = std::numeric_limits<T>::lowest();
    const int64_t step = axes[2].stride;
    each([&](int64_t at, int64_t count) {
      for (int64_t o = 0; o < count; ++o) to[o] = lowest;
      for (const int64_t tap : offsets) {
        const T* w = src + at + tap;
        if (step == 1) {
          for (int64_t o = 0; o < count; ++o) to[o] = larger(to[o], w[o]);
        } else {
          for (int64_t o = 0; o < count; ++o) to[o] = larger(to[o], w[o * step]);
        }
      }
      to += count;
    }, [&](const int64_t* lo, const int64_t* hi, const int64_t* start) {
      T m = fill ? static_cast<T>(*fill) : lowest;
      for (int64_t k0 = lo[0]; k0 < hi[0]; ++k0) {
        for (int64_t k1 = lo[1]; k1 < hi[1]; ++k1) {
          const T* row = src + ((start[0] + k0 * axes[0].dilation) * axes[1].size + start[1] + k1 * axes[1].dilation) *
                                   axes[2].size + start[2];
          for (int64_t k2 = lo[2]; k2 < hi[2]; ++k2) m = larger(m, row[k2 * axes[2].dilation]);
        }
      }
      *to++ = m;
    });
  }
};

// ---- MLAS's activations ---------------------------------------------------------------------------------------------

inline F fma(F a, F b, F c) {
#ifdef __AVX512F__
  return (F)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c);
#else
  for (int l = 0; l < L; ++l) a[l] = __builtin_fmaf(a[l], b[l], c[l]);
  return a;
#endif
}

inline F max_of(F a, F b) { return a < b ? b : a; }

// MLAS's rational approximations (modules/quantized.py: _rational): clamp, x² rounded, Horner's rule with one fused
// multiply-add per step, (x · p) / q.
template <size_t NP, size_t NQ>
inline F rational(F x, float bound, const float (&p)[NP], const float (&q)[NQ]) {
  x = clamp(x, -bound, bound);
  const F x2 = x * x;
  F pv = splat(p[0]), qv = splat(q[0]);
  for (size_t k = 1; k < NP; ++k) pv = fma(x2, pv, splat(p[k]));
  for (size_t k = 1; k < NQ; ++k) qv = fma(x2, qv, splat(q[k]));
  return (x * pv) / qv;
}

constexpr float kTanhP[] = {-2.76076847742355e-16f, 2.00018790482477e-13f, -8.60467152213735e-11f,
                            5.12229709037114e-08f, 1.48572235717979e-05f, 6.37261928875436e-04f,
                            4.89352455891786e-03f};
constexpr float kTanhQ[] = {1.19825839466702e-06f, 1.18534705686654e-04f, 2.26843463243900e-03f,
                            4.89352518554385e-03f};
constexpr float kLogisticP[] = {4.37031012579801e-11f, 1.15627324459942e-07f, 6.08574864600143e-05f,
                                8.51377133304701e-03f, 2.48287947061529e-01f};
constexpr float kLogisticQ[] = {6.10247389755681e-13f, 5.76102136993427e-09f, 6.29106785017040e-06f,
                                1.70198817374094e-03f, 1.16817656904453e-01f, 9.93151921023180e-01f};

inline F mlas_tanh(F x) { return rational(x, 9.0f, kTanhP, kTanhQ); }
inline F mlas_logistic(F x) { return max_of(rational(x, 18.0f, kLogisticP, kLogisticQ) + 0.5f, splat(0.0f)); }


}  // namespace int8
}  // namespace onnx2torch_rnn
