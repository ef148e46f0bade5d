// ONNX ConvInteger on the CPU for eager inference (modules/quantized.py calls it where the kernel is loaded; its
// Python implementation there is the reference and runs everywhere else):
//
//   conv_integer(Tensor x, Tensor panels, Tensor column_sums, Tensor offsets, Tensor? x_zero_point,
//                int[] weight_shape, int[] strides, int[] pads, int[] dilations, int group) -> Tensor
//       the exact int32 convolution of x - x_zero_point [N, C, *spatial] (1 to 3 spatial axes) by
//       w - w_zero_point [M, C / group, *kernel] packed by conv_weight_pack (offsets [M] int32: 128 for uint8
//       weights, minus their zero point, per output channel; the caller keeps them): x uint8 or int8, its zero
//       point one value; pads = begins then ends per spatial axis (padding is x's zero point, i.e. zero after the
//       shift). Integer sums are exact in any order (onnxruntime's int32 accumulator, wrapping alike).
//   conv_weight_pack(Tensor w, int group) -> (Tensor panels, Tensor column_sums)
//       contiguous uint8 or int8 weights [M, C / group, *kernel] as each group's matrix [taps, M / group] in int8
//       panels (int8.h), once per weight (the caller keeps them)
//   dynamic_quantized_conv(Tensor x, Tensor panels, Tensor column_sums, Tensor offsets, Tensor scale, Tensor? bias,
//                          Tensor numbers) -> Tensor
//       quantize_dynamic's chain DynamicQuantizeLinear -> ConvInteger by constant weights -> Cast -> Mul(x_scale *
//       w_scale) [-> Add bias] [-> Relu] in one call: float32 x (contiguous) quantized to uint8 over its range,
//       convolved by the packed weights (offsets [M] int32: 128 for uint8 weights, minus their zero point), then
//       float32(acc) * (x_scale * scale[m]) [+ bias[m]] per output channel m, each step rounded (scale [1] or [M],
//       bias [M] float32), then 0 in place of a negative value with Relu (NaN kept, as torch.relu). numbers: int64
//       [1 for Relu, group, kernel, strides, pads (begins, ends), dilations] (per spatial axis; kept per input shape)
//       [+ a MaxPool's numbers: the output max-pooled as qlinear.cpp's max_pool pools it]
//   qlinear_conv(Tensor x, Tensor panels, Tensor column_sums, Tensor offsets, Tensor multiplier, Tensor? bias,
//                Tensor numbers, Tensor? table) -> Tensor
//       QLinearConv: conv_integer's exact sums (weights packed alike) plus the int32 bias [M] (wrapping), requantized
//       as MlasRequantizeOutput per output channel (multiplier [1] or [M] float32) to uint8 or int8. numbers: int64
//       [x_zero, y_zero, 1 for an int8 output (else uint8), group, kernel, strides, pads (begins, ends), dilations]
//       (per spatial axis; one tensor the module keeps per input shape: lists are boxed at every call, a tensor is
//       passed as it is) [+ a MaxPool's numbers, as dynamic_quantized_conv's]; table: 256 values of the output type
//       or None: each output y becomes table[y - lowest] (a QLinearLeakyRelu / QLinearSigmoid after it, fused).
//       A float32 x (contiguous) is quantized first as quantize_linear quantizes it (the QuantizeLinear before the
//       convolution, fused): numbers then [x_zero, y_zero, int8 output, bits of its float32 scale, its zero point,
//       1 for int8 (else uint8), group, ...]
//
// im2col and an integer product: a tile of output positions gathers its inputs (uint8; int8 shifted by 128) from
// x padded with its zero point, as rows of taps, times each group's weight panels with the zero points as row and
// column sums (int8.h: products; AVX-512 VNNI where built for it). PyTorch's stable ABI (int8.h): raw pointers.

#define TORCH_STABLE_ONLY
#include <torch/csrc/stable/library.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <tuple>
#include <vector>

#include "int8.h"  // dynamic quantization (last: from there on, no float operation is contracted)

namespace onnx2torch_rnn {
namespace {

using namespace int8;

constexpr int64_t kTile = 256;  // output positions per task: rows of one product

struct Geometry {  // three spatial axes (missing ones of size 1); padded: in + pads before and after
  int64_t in[3], out[3], kernel[3], stride[3], pad[3], dilation[3], padded[3];
};

// 8-bit values as int32 (uint8 or int8 storage).
int32_t value_at(const void* data, bool is_signed, int64_t i) {
  return is_signed ? static_cast<const int8_t*>(data)[i] : static_cast<const uint8_t*>(data)[i];
}

// The geometry of x [N, C, *spatial] convolved by w [M, C / group, *kernel], checked.
Geometry geometry(const Tensor& x, const std::vector<int64_t>& w, const std::vector<int64_t>& strides,
                  const std::vector<int64_t>& pads, const std::vector<int64_t>& dilations, int64_t group) {
  const int64_t rank = x.dim() - 2;
  CHECK_VALUE(rank >= 1 && rank <= 3 && static_cast<int64_t>(w.size()) == x.dim() && group >= 1 &&
                  x.size(1) % group == 0 && w[0] % group == 0 && w[1] * group == x.size(1),
              "conv_integer: x [N, C, 1-3 spatial axes] and w [M, C / group, kernel] expected, with group ", group);
  CHECK_VALUE(static_cast<int64_t>(strides.size()) == rank && static_cast<int64_t>(dilations.size()) == rank &&
                        static_cast<int64_t>(pads.size()) == 2 * rank,
              "conv_integer: strides, dilations and pads (begins, ends) per spatial axis expected");
  Geometry s;
  for (int a = 0; a < 3; ++a) {
    const int64_t d = a - (3 - rank);  // the spatial axis this one is, or negative (size 1)
    s.in[a] = d >= 0 ? x.size(2 + d) : 1;
    s.kernel[a] = d >= 0 ? w[2 + d] : 1;
    s.stride[a] = d >= 0 ? strides[d] : 1;
    s.dilation[a] = d >= 0 ? dilations[d] : 1;
    s.pad[a] = d >= 0 ? pads[d] : 0;
    const int64_t span = (s.kernel[a] - 1) * s.dilation[a] + 1;
    const int64_t padded = s.in[a] + s.pad[a] + (d >= 0 ? pads[rank + d] : 0);
    CHECK_VALUE(s.stride[a] >= 1 && s.dilation[a] >= 1 && padded >= span && s.pad[a] >= 0 &&
                    padded >= s.in[a] + s.pad[a],
                "conv_integer: non-negative pads and a kernel that fits the padded input expected");
    s.out[a] = (padded - span) / s.stride[a] + 1;
    s.padded[a] = padded;
  }
  return s;
}

// The output shape [N, M, *out].
std::vector<int64_t> output_shape(const Tensor& x, int64_t M, const Geometry& s) {
  const int64_t rank = x.dim() - 2;
  std::vector<int64_t> shape{x.size(0), M};
  for (int64_t d = 0; d < rank; ++d) shape.push_back(s.out[3 - rank + d]);
  return shape;
}

// x as uint8 (int8 shifted by 128) [N·C][padded planes], the padding filled with `pad` (x's zero point, shifted:
// zero after the subtraction).
std::vector<uint8_t> padded_input(const void* x, bool x_signed, uint8_t pad, const Geometry& s, int64_t planes) {
  const int64_t P1 = s.padded[1], P2 = s.padded[2], plane = s.padded[0] * P1 * P2;
  std::vector<uint8_t> xp(planes * plane, pad);
  for (int64_t r = 0; r < planes; ++r) {
    for (int64_t i0 = 0; i0 < s.in[0]; ++i0) {
      for (int64_t i1 = 0; i1 < s.in[1]; ++i1) {
        const int64_t src = ((r * s.in[0] + i0) * s.in[1] + i1) * s.in[2];
        uint8_t* dst = xp.data() + r * plane + ((i0 + s.pad[0]) * P1 + i1 + s.pad[1]) * P2 + s.pad[2];
        for (int64_t i2 = 0; i2 < s.in[2]; ++i2)
          dst[i2] = static_cast<uint8_t>(value_at(x, x_signed, src + i2) + (x_signed ? 128 : 0));
      }
    }
  }
  return xp;
}

// Each group's weights [M / group, taps] as the matrix [taps, M / group] in int8 panels (int8.h).
std::vector<Panels> weight_panels(const uint8_t* w, bool w_unsigned, int64_t M, int64_t group, int64_t taps) {
  const int64_t group_out = M / group;
  std::vector<Panels> out;
  for (int64_t g = 0; g < group; ++g) {
    const uint8_t* wg = w + g * group_out * taps;
    out.push_back(pack_values(taps, panel_blocks(group_out), w_unsigned,
                              [wg, taps](int64_t k, int64_t j) { return wg[j * taps + k]; },
                              [group_out](int64_t b, int g2, int l) {
                                const int64_t j = (b * G + g2) * L + l;
                                return j < group_out ? j : int64_t{-1};
                              }));
  }
  return out;
}

// The weights as the convolution reads them: per group, panels' data and column sums, and offsets (the weights'
// shift minus their zero point per output channel, padded to whole blocks).
struct Weights {
  std::vector<const int8_t*> data;
  std::vector<const int32_t*> sums;
  std::vector<int32_t> offsets;  // [group][panel_blocks(M / group) · G · L]
};

// Calls emit(n, m0, p, exact, count) with the exact int32 sums of output channels m0 .. m0 + count - 1 (count <= L)
// of image n at output position p: im2col rows of a tile of output positions (uint8, x's zero point `x_zero` in its
// padding) times each group's weight panels (int8.h: products), in parallel over images, groups and tiles.
template <typename Emit>
void convolve(const void* x, bool x_signed, int32_t x_zero, const Weights& w, const Geometry& s, int64_t N,
              int64_t C, int64_t M, int64_t group, Emit emit) {
  const int64_t channels = C / group, group_out = M / group, padded = panel_blocks(group_out) * G * L;
  const int64_t taps = channels * s.kernel[0] * s.kernel[1] * s.kernel[2];
  const int64_t P1 = s.padded[1], P2 = s.padded[2], plane = s.padded[0] * P1 * P2;
  const int64_t positions = s.out[0] * s.out[1] * s.out[2];
  const int32_t zero = x_zero + (x_signed ? 128 : 0);
  const std::vector<uint8_t> xp = padded_input(x, x_signed, static_cast<uint8_t>(zero), s, N * C);
  std::vector<int64_t> offsets;  // of each tap from its output position's origin in the padded input
  for (int64_t c = 0; c < channels; ++c)
    for (int64_t k0 = 0; k0 < s.kernel[0]; ++k0)
      for (int64_t k1 = 0; k1 < s.kernel[1]; ++k1)
        for (int64_t k2 = 0; k2 < s.kernel[2]; ++k2)
          offsets.push_back(c * plane + (k0 * s.dilation[0] * P1 + k1 * s.dilation[1]) * P2 + k2 * s.dilation[2]);
  const int64_t tiles = (positions + kTile - 1) / kTile, tasks = N * group * tiles;
  const int64_t grain = std::max<int64_t>(1, (1 << 18) / std::max<int64_t>(1, kTile * taps * group_out));
  torch::stable::parallel_for(0, tasks, grain, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      const int64_t tile = task % tiles, g = task / tiles % group, n = task / (tiles * group);
      const int64_t p0 = tile * kTile, rows = std::min(positions, p0 + kTile) - p0;
      Quantized a(rows, taps);
      const int64_t* const tap = offsets.data();  // locals: the byte stores below could alias what [&] reaches
      const int64_t count = taps;
      const uint8_t* image = xp.data() + (n * C + g * channels) * plane;
      int64_t o2 = p0 % s.out[2], o1 = p0 / s.out[2] % s.out[1], o0 = p0 / (s.out[2] * s.out[1]);
      for (int64_t i = 0; i < rows; ++i, ++o2) {  // position p0 + i is (o0, o1, o2): counted, not divided
        if (o2 == s.out[2]) o2 = 0, ++o1;
        if (o1 == s.out[1]) o1 = 0, ++o0;
        const uint8_t* origin = image + (o0 * s.stride[0] * P1 + o1 * s.stride[1]) * P2 + o2 * s.stride[2];
        uint8_t* row = a.q.data() + i * a.lda;
        int32_t sum = 0;
        for (int64_t t = 0; t < count; ++t) sum += row[t] = origin[tap[t]];
        a.sums[i] = sum;
      }
      products(a, rows, taps, false, w.data[g], w.sums[g], group_out, w.offsets.data() + g * padded,
               [zero](int64_t) { return zero; },
               [&](int64_t i, int64_t j0, I exact, int count) { emit(n, g * group_out + j0, p0 + i, exact, count); });
    }
  });
}

// Offsets per output channel [M] as [group][panel_blocks(M / group) · G · L], zeros in the padding.
std::vector<int32_t> grouped(const int32_t* offsets, int64_t M, int64_t group) {
  const int64_t group_out = M / group, padded = panel_blocks(group_out) * G * L;
  std::vector<int32_t> out(group * padded, 0);
  for (int64_t m = 0; m < M; ++m) out[m / group_out * padded + m % group_out] = offsets[m];
  return out;
}

// The packed weights (conv_weight_pack's) as the convolution reads them, their size checked.
Weights packed_weights(const Tensor& panels, const Tensor& column_sums, const Tensor& offsets, int64_t M,
                       int64_t group, int64_t taps, const char* op) {
  const int64_t group_out = M / group;
  const int64_t size = panel_blocks(group_out) * (taps + 3) / 4 * G * L * 4, count = panel_blocks(group_out) * G * L;
  CHECK_VALUE(panels.scalar_type() == ScalarType::Char && panels.is_contiguous() &&
                  column_sums.scalar_type() == ScalarType::Int && column_sums.is_contiguous() &&
                  offsets.scalar_type() == ScalarType::Int && offsets.is_contiguous() &&
                  panels.numel() == group * size && column_sums.numel() == group * count && offsets.numel() == M,
              op, ": weights not packed by conv_weight_pack for this shape");
  Weights weights{{}, {}, grouped(offsets.const_data_ptr<int32_t>(), M, group)};
  for (int64_t g = 0; g < group; ++g) {
    weights.data.push_back(panels.const_data_ptr<int8_t>() + g * size);
    weights.sums.push_back(column_sums.const_data_ptr<int32_t>() + g * count);
  }
  return weights;
}

int64_t taps_of(const Geometry& s, int64_t C, int64_t group) {
  return C / group * s.kernel[0] * s.kernel[1] * s.kernel[2];
}

Tensor conv_integer_cpu(const Tensor& x, const Tensor& panels, const Tensor& column_sums, const Tensor& offsets,
                        const std::optional<Tensor>& x_zero_point, const std::vector<int64_t>& weight_shape,
                        const std::vector<int64_t>& strides, const std::vector<int64_t>& pads,
                        const std::vector<int64_t>& dilations, int64_t group) {
  CHECK_VALUE(x.scalar_type() == ScalarType::Byte || x.scalar_type() == ScalarType::Char,
              "conv_integer: uint8 or int8 x expected, got ", x.scalar_type());
  const Geometry s = geometry(x, weight_shape, strides, pads, dilations, group);
  const int64_t N = x.size(0), C = x.size(1), M = weight_shape[0];
  const Weights weights = packed_weights(panels, column_sums, offsets, M, group, taps_of(s, C, group), "conv_integer");
  const std::vector<int32_t> zx = zero_points(x_zero_point, 1, "conv_integer: x's");
  const Tensor xc = dense(x);
  const int64_t positions = s.out[0] * s.out[1] * s.out[2];
  Tensor out = allocate(output_shape(x, M, s), ScalarType::Int);
  int32_t* y = out.mutable_data_ptr<int32_t>();
  convolve(xc.const_data_ptr(), x.scalar_type() == ScalarType::Char, zx[0], weights, s, N, C, M, group,
           [&](int64_t n, int64_t m0, int64_t p, I acc, int count) {
             for (int l = 0; l < count; ++l) y[(n * M + m0 + l) * positions + p] = acc[l];
           });
  return out;
}

std::tuple<Tensor, Tensor> conv_weight_pack_cpu(const Tensor& w, int64_t group) {
  CHECK_VALUE(w.dim() >= 3 && (w.scalar_type() == ScalarType::Byte || w.scalar_type() == ScalarType::Char) &&
                  w.is_contiguous() && group >= 1 && w.size(0) % group == 0,
              "conv_weight_pack: contiguous uint8 or int8 weights [M, C / group, kernel] expected");
  const int64_t M = w.size(0), taps = w.numel() / std::max<int64_t>(1, M);
  const std::vector<Panels> panels = weight_panels(static_cast<const uint8_t*>(w.const_data_ptr()),
                                                   w.scalar_type() == ScalarType::Byte, M, group, taps);
  const int64_t size = panels[0].data.size(), count = panels[0].column_sums.size();
  Tensor data = allocate({group * size}, ScalarType::Char), sums = allocate({group * count}, ScalarType::Int);
  for (int64_t g = 0; g < group; ++g) {
    if (size) std::memcpy(data.mutable_data_ptr<int8_t>() + g * size, panels[g].data.data(), size);
    std::memcpy(sums.mutable_data_ptr<int32_t>() + g * count, panels[g].column_sums.data(), sizeof(int32_t) * count);
  }
  return {data, sums};
}

// numbers[first + d] for d in [0, count)
std::vector<int64_t> slice(const int64_t* numbers, int64_t first, int64_t count) {
  return std::vector<int64_t>(numbers + first, numbers + first + count);
}

// The geometry of x [N, C, 1-3 spatial axes] convolved into M channels as `numbers` gives it from `first` on: [group,
// kernel, strides, pads (begins, ends), dilations] per spatial axis (one int64 tensor the caller keeps per input
// shape: lists are boxed at every call, a tensor is passed as it is), then optionally a MaxPool's numbers for the
// convolution's output ([kernel, strides, begins, out, dilations] per spatial axis: `pool` points to them, else null);
// the group too.
Geometry numbered_geometry(const Tensor& x, const Tensor& numbers, int64_t first, int64_t M, int64_t& group,
                           const int64_t*& pool, const char* op) {
  const int64_t rank = x.dim() - 2, count = first + 1 + 5 * rank;
  CHECK_VALUE(rank >= 1 && rank <= 3 && numbers.scalar_type() == ScalarType::Long && numbers.is_contiguous() &&
                  (numbers.numel() == count || numbers.numel() == count + 5 * rank),
              op, ": x [N, C, 1-3 spatial axes] and ", count, " int64 numbers (", count + 5 * rank,
              " with a MaxPool) expected");
  const int64_t* n = numbers.const_data_ptr<int64_t>() + first;
  group = n[0];
  pool = numbers.numel() == count ? nullptr : n + 1 + 5 * rank;
  std::vector<int64_t> weight_shape{M, x.size(1) / std::max<int64_t>(group, 1)};
  for (int64_t d = 0; d < rank; ++d) weight_shape.push_back(n[1 + d]);
  return geometry(x, weight_shape, slice(n, 1 + rank, rank), slice(n, 1 + 2 * rank, 2 * rank),
                  slice(n, 1 + 4 * rank, rank), group);
}

// The op's output of type T: what convolve(y) writes to y [N, M, *s.out], or that max-pooled as `pool` says (MaxPool's
// numbers, or null for none; the convolution then goes to a buffer first).
template <typename T, typename Convolve>
Tensor convolved(const Tensor& x, int64_t M, const Geometry& s, const int64_t* pool, ScalarType dtype,
                 Convolve convolve) {
  if (!pool) {
    Tensor out = allocate(output_shape(x, M, s), dtype);
    convolve(static_cast<T*>(out.mutable_data_ptr()));
    return out;
  }
  const int64_t rank = x.dim() - 2, planes = x.size(0) * M;
  const MaxPool pooling(pool, rank, s.out);
  std::vector<T> full(planes * pooling.plane());
  convolve(full.data());
  std::vector<int64_t> shape{x.size(0), M};
  for (int64_t a = 3 - rank; a < 3; ++a) shape.push_back(pooling.out[a]);
  Tensor out = allocate(shape, dtype);
  T* y = static_cast<T*>(out.mutable_data_ptr());
  for (int64_t plane = 0; plane < planes; ++plane)
    pooling(full.data() + plane * pooling.plane(), y + plane * pooling.positions());
  return out;
}

Tensor dynamic_quantized_conv_cpu(const Tensor& x, const Tensor& panels, const Tensor& column_sums,
                                  const Tensor& offsets, const Tensor& scale, const std::optional<Tensor>& bias,
                                  const Tensor& numbers) {
  // dtypes and contiguity as the caller (modules/quantized.py) checked them; the layout's size re-checked
  CHECK_VALUE(x.scalar_type() == ScalarType::Float && x.is_contiguous(),
              "dynamic_quantized_conv: contiguous float32 x expected");
  const int64_t N = x.size(0), C = x.size(1), M = offsets.numel();
  CHECK_VALUE((scale.numel() == 1 || scale.numel() == M) && (!bias || bias->numel() == M),
              "dynamic_quantized_conv: a scale (one or per output channel) and a bias per output channel expected");
  int64_t group = 1;
  const int64_t* pool = nullptr;
  const Geometry s = numbered_geometry(x, numbers, 1, M, group, pool, "dynamic_quantized_conv");
  const bool relu = numbers.const_data_ptr<int64_t>()[0] != 0;
  const Weights weights =
      packed_weights(panels, column_sums, offsets, M, group, taps_of(s, C, group), "dynamic_quantized_conv");
  const float* v = x.const_data_ptr<float>();
  float low = 0, high = 0;
  widen(v, x.numel(), low, high);
  const Parameters p = parameters(low, high);
  std::vector<uint8_t> q(x.numel());
  quantize(v, x.numel(), p, q.data());
  std::vector<float> factor(M);  // x_scale * w_scale per output channel, rounded
  const float* w_scale = scale.const_data_ptr<float>();
  for (int64_t m = 0; m < M; ++m) factor[m] = p.scale * w_scale[scale.numel() == 1 ? 0 : m];
  const float* add = bias ? bias->const_data_ptr<float>() : nullptr;

  const int64_t positions = s.out[0] * s.out[1] * s.out[2];
  return convolved<float>(x, M, s, pool, ScalarType::Float, [&](float* y) {
    convolve(q.data(), false, p.zero_point, weights, s, N, C, M, group,
             [&](int64_t n, int64_t m0, int64_t position, I acc, int count) {
               for (int l = 0; l < count; ++l) {
                 const int64_t m = m0 + l;
                 float value = static_cast<float>(acc[l]) * factor[m];
                 value = add ? value + add[m] : value;
                 y[(n * M + m) * positions + position] = relu && value < 0.0f ? 0.0f : value;
               }
             });
  });
}


// MLAS's requantization of the exact sums of channels m0 .. m0 + count - 1 (one position) into y (channel stride
// `stride`): float32(acc + bias) * multiplier, clamped to [lowest - zero, highest - zero] (NaN: the lowest),
// rounded half to even, plus the zero point (modules/quantized.py: requantize).
template <typename T>
struct Requantize {
  std::vector<int32_t> bias;      // per channel, zeros past M (or none)
  std::vector<float> multiplier;  // per channel, padded to whole vectors
  float low, high, zero;
  const T* table = nullptr;  // the output looked up: table[y - lowest] (or none)

  Requantize(const Tensor& m, const std::optional<Tensor>& b, int64_t M, int64_t zero_point,
             const std::optional<Tensor>& lookup)
      : bias(M + L, 0), multiplier(M + L, 0.0f), low(static_cast<float>(std::numeric_limits<T>::min() - zero_point)),
        high(static_cast<float>(std::numeric_limits<T>::max() - zero_point)), zero(static_cast<float>(zero_point)) {
    if (lookup) table = static_cast<const T*>(lookup->const_data_ptr());
    const float* mp = m.const_data_ptr<float>();
    for (int64_t j = 0; j < M; ++j) {
      multiplier[j] = mp[m.numel() == 1 ? 0 : j];
      if (b) bias[j] = b->const_data_ptr<int32_t>()[j];
    }
  }
  void operator()(I acc, int64_t m0, int count, T* y, int64_t stride) const {
    // the int32 sum wraps as onnxruntime's does
    acc = (I)((V<uint32_t>)acc + (V<uint32_t>)load(bias.data() + m0));
    F v = __builtin_convertvector(acc, F) * load(multiplier.data() + m0);
    v = !(v >= low) ? splat(low) : v;
    v = v > high ? splat(high) : v;
    const I q = __builtin_convertvector(round_even(v) + zero, I);
    if (table) {
      for (int l = 0; l < count; ++l) y[(m0 + l) * stride] = table[q[l] - std::numeric_limits<T>::min()];
    } else {
      for (int l = 0; l < count; ++l) y[(m0 + l) * stride] = static_cast<T>(q[l]);
    }
  }
};

Tensor qlinear_conv_cpu(const Tensor& x, const Tensor& panels, const Tensor& column_sums, const Tensor& offsets,
                        const Tensor& multiplier, const std::optional<Tensor>& bias, const Tensor& numbers,
                        const std::optional<Tensor>& table) {
  // dtypes and contiguity as the caller (modules/quantized.py: QLinearConv) checked them; the layout's size re-checked
  const int64_t M = offsets.numel();
  CHECK_VALUE((multiplier.numel() == 1 || multiplier.numel() == M) && (!bias || bias->numel() == M),
              "qlinear_conv: a multiplier (one or per output channel) and a bias per output channel expected");
  CHECK_VALUE(!table || (table->numel() == 256 && table->is_contiguous() &&
                         table->scalar_type() == (numbers.const_data_ptr<int64_t>()[2] ? ScalarType::Char
                                                                                       : ScalarType::Byte)),
              "qlinear_conv: a table of 256 values of the output type expected");
  int64_t group = 1;
  const int64_t* pool = nullptr;
  // after x_zero, y_zero, int8 [, a float x's quantization: scale bits, zero point, 1 for int8]
  const bool quantizing = x.scalar_type() == ScalarType::Float;
  const Geometry s = numbered_geometry(x, numbers, quantizing ? 6 : 3, M, group, pool, "qlinear_conv");
  const int64_t* n = numbers.const_data_ptr<int64_t>();
  const int64_t N = x.size(0), C = x.size(1), positions = s.out[0] * s.out[1] * s.out[2];
  const Weights weights = packed_weights(panels, column_sums, offsets, M, group, taps_of(s, C, group), "qlinear_conv");
  const ScalarType dtype = n[2] ? ScalarType::Char : ScalarType::Byte;
  const void* data = x.const_data_ptr();
  bool x_signed = x.scalar_type() == ScalarType::Char;
  std::vector<uint8_t> quantized;  // a float x quantized (QuantizeLinear before the convolution, fused)
  if (quantizing) {
    CHECK_VALUE(x.is_contiguous() && (n[5] == 0 || n[5] == 1), "qlinear_conv: contiguous float32 x to quantize to "
                "uint8 or int8 expected");
    const auto bits = static_cast<uint32_t>(n[3]);
    float scale;
    std::memcpy(&scale, &bits, sizeof(float));
    quantized.resize(x.numel());
    x_signed = n[5] == 1;
    if (x_signed) {
      quantize(x.const_data_ptr<float>(), x.numel(), scale, static_cast<int32_t>(n[4]),
               reinterpret_cast<int8_t*>(quantized.data()));
    } else {
      quantize(x.const_data_ptr<float>(), x.numel(), scale, static_cast<int32_t>(n[4]), quantized.data());
    }
    data = quantized.data();
  }
  auto run = [&](auto type) {
    using T = decltype(type);
    const Requantize<T> requantize(multiplier, bias, M, n[1], table);
    return convolved<T>(x, M, s, pool, dtype, [&](T* y) {
      convolve(data, x_signed, static_cast<int32_t>(n[0]), weights, s, N, C,
               M, group, [&](int64_t image, int64_t m0, int64_t p, I acc, int count) {
                 requantize(acc, m0, count, y + image * M * positions + p, positions);
               });
    });
  };
  return dtype == ScalarType::Char ? run(int8_t{}) : run(uint8_t{});
}

}  // namespace

STABLE_TORCH_LIBRARY_FRAGMENT(onnx2torch_rnn, m) {
  m.def("conv_integer(Tensor x, Tensor panels, Tensor column_sums, Tensor offsets, Tensor? x_zero_point, "
        "int[] weight_shape, int[] strides, int[] pads, int[] dilations, int group) -> Tensor");
  m.def("conv_weight_pack(Tensor w, int group) -> (Tensor, Tensor)");
  m.def("dynamic_quantized_conv(Tensor x, Tensor panels, Tensor column_sums, Tensor offsets, Tensor scale, "
        "Tensor? bias, Tensor numbers) -> Tensor");
  m.def("qlinear_conv(Tensor x, Tensor panels, Tensor column_sums, Tensor offsets, Tensor multiplier, Tensor? bias, "
        "Tensor numbers, Tensor? table) -> Tensor");
}

STABLE_TORCH_LIBRARY_IMPL(onnx2torch_rnn, CPU, m) {
  m.impl("conv_integer", TORCH_BOX(&conv_integer_cpu));
  m.impl("conv_weight_pack", TORCH_BOX(&conv_weight_pack_cpu));
  m.impl("dynamic_quantized_conv", TORCH_BOX(&dynamic_quantized_conv_cpu));
  m.impl("qlinear_conv", TORCH_BOX(&qlinear_conv_cpu));
}

}  // namespace onnx2torch_rnn
