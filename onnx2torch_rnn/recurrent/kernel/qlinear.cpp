// onnxruntime's QLinear* arithmetic on 8-bit tensors on the CPU, for eager inference: one op per node instead of the
// 5-20 torch ops of their Python implementations in modules/quantized.py, which are the reference (same numbers, bit
// for bit) and run everywhere else (other devices, torch.compile, torch.export, no kernel). Python has checked the
// dtypes (uint8 or int8 data, float32 multipliers and tables, int32 accumulators), the shapes and the contiguity, and
// passes the scales and zero points as numbers.
//
//   requantize(Tensor acc, Tensor multiplier, Tensor? bias, int zero_point, ScalarType dtype, int inner) -> Tensor
//       MlasRequantizeOutput: saturate(round_half_even(float32(acc + bias[g % B]) * multiplier[g % M]) + zero_point)
//       for g = i / inner, B and M the lengths of bias and multiplier (per channel, per column or one value); the
//       int32 sum wraps
//   qlinear_add(Tensor a, Tensor b, Tensor terms) -> Tensor
//       MLAS's QLinearAdd: convert(fma(x, x_ratio, fma(y, y_ratio, offset))) on the raw values of the vector operand
//       x and the other one y (a and b, or b and a where only b varies along the innermost axis, as onnxruntime
//       hands them to MLAS), numpy broadcasting, any strides; terms float32 [x_ratio, y_ratio, offset] for x = a,
//       then for x = b (one tensor the module makes once: each boxed scalar costs a quarter microsecond)
//   qlinear_mul(Tensor a, Tensor b, Tensor terms) -> Tensor
//       MLAS's QLinearMul: convert(float32((a - a_zero) * (b - b_zero)) * ratio + c_zero), broadcast as qlinear_add;
//       terms float32 [a_zero, b_zero, ratio, c_zero]
//   qlinear_lookup(Tensor x, Tensor table) -> Tensor          table[x - lowest] (256 values of the output type)
//   qlinear_matmul(Tensor a, Tensor panels, Tensor column_sums, Tensor offsets, Tensor multiplier, Tensor? bias,
//                  Tensor numbers) -> Tensor
//       QLinearMatMul / QGemm by constant b in one call: the exact int32 product (a - a_zero) @ (b - b's zero point)
//       of 8-bit a [..., K] by b packed once by int8_matrix_pack (offsets [N] int32: 128 for uint8 b, minus b's zero
//       point per column), requantized as `requantize` with the int32 bias [N] and the multiplier [1] or [N];
//       numbers: int32 [a_zero, y_zero, 1 for an int8 output (else uint8)] [+ an axis: a of any rank flattened there
//       to [rows, K] first, as ONNX Flatten (fused before a QGemm); the output [rows, N]]
//   qlinear_matmul_add(Tensor a, Tensor panels, Tensor column_sums, Tensor offsets, Tensor multiplier, Tensor? bias,
//                      Tensor numbers, Tensor terms) -> Tensor
//       qlinear_matmul, then qlinear_add of each value and a constant's value for its column (one rounding each, as
//       the two ops): terms float32 [x_ratio, y_ratio, offset, the constant per column (N)]; numbers as
//       qlinear_matmul's plus 1 where the product is qlinear_add's x (else y)
//   qlinear_average_pool(Tensor x, Tensor numbers) -> Tensor
//       numbers: int64 [x_zero, y_zero, count_include_pad, bits of the float32 x_scale and y_scale, kernel, strides,
//       begins, out] (per spatial axis; one tensor the module keeps per input shape: numbers and lists are boxed at
//       every call of an op, a tensor is passed as it is).
//       x [N, C, 1-3 spatial]: each window's dequantized taps summed in row-major order in float32 (taps in the
//       padding skipped: they add +0), divided by its count, by y_scale, plus y_zero, rounded, saturated
//   qlinear_global_average_pool(Tensor x, Tensor numbers) -> Tensor
//       numbers: int64 [x_zero, y_zero, channels_last, bits of the float32 x_scale and y_scale];
//       float32(Σ (x - x_zero)) * (x_scale / (y_scale * size)), rounded, plus y_zero, saturated; [N, C, 1, ...]
//       ([N, 1, ..., C] channels last)
//   qlinear_concat(Tensor[] xs, Tensor tables, int axis) -> Tensor
//       QLinearConcat by constant scales and zero points in one call: input i requantized through row i of tables
//       [len(xs), 256] (table[x - lowest], an identity row for a copied input), the inputs concatenated along axis
//       (the same type and rank, the same sizes but along axis)
//   max_pool(Tensor x, Tensor numbers) -> Tensor
//       MaxPool without indices on uint8, int8 or float32 x [N, C, 1-3 spatial] (modules/nn.py: MaxPool): each
//       window's largest tap inside the input, from the type's lowest value (what onnxruntime reads in the padding);
//       a NaN tap stays the window's value (as torch's max pooling, the reference). numbers: int64 [kernel,
//       strides, begins, out, dilations] (per spatial axis; kept per input shape) [+ fill, 8-bit x: the value a
//       window reaching outside x starts from: a constant Pad before it, fused (modules/nn.py: MaxPool's padding)]
//   qlinear_softmax(Tensor x, Tensor table, Tensor numbers) -> Tensor
//       numbers: int64 [L, inner, y_zero, bits of the float32 inverse]; x [R, L, inner] (any shape of that many
//       values), each row its L values `inner` apart: v = table[(q + top - max(row)) & 0xFF] (top 255, or 127 for
//       int8), Σ v in order in float32, saturate(round_half_even(v * inverse / Σ) + y_zero)
//
// "convert" is MLAS's cvtps2dq and saturating packs: NaN and values past the int32 range give the lowest value.
// Float operations round one by one as in the Python reference (contraction off below), the fused ones explicit.

#define TORCH_STABLE_ONLY  // PyTorch's stable ABI (int8.h)
#include <torch/csrc/stable/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <type_traits>
#include <vector>

#include "int8.h"  // last: from there on, no float operation is contracted

namespace onnx2torch_rnn {
namespace {

using int8::sizes_of;
using torch::headeronly::ScalarType;
using torch::stable::Tensor;

constexpr int64_t kGrain = 1 << 15;  // elements per task

// Every output of this file is allocated here.
Tensor output(const std::vector<int64_t>& sizes, ScalarType dtype) { return int8::allocate(sizes, dtype); }

bool signed_bytes(const Tensor& t) {
  CHECK_VALUE(t.scalar_type() == ScalarType::Byte || t.scalar_type() == ScalarType::Char, "qlinear: uint8 or int8 expected, "
                    "got ", t.scalar_type());
  return t.scalar_type() == ScalarType::Char;
}

// Calls f with a value of the 8-bit type of `dtype` (for its type).
template <typename Fn>
void with_type(ScalarType dtype, Fn&& f) {
  if (dtype == ScalarType::Char) {
    f(int8_t{});
  } else {
    CHECK_VALUE(dtype == ScalarType::Byte, "qlinear: uint8 or int8 expected, got ", dtype);
    f(uint8_t{});
  }
}

// round half to even, saturated, NaN to the lowest value (a value already rounded may come in)
template <typename T>
T saturate(float value) {
  constexpr float low = std::numeric_limits<T>::min(), high = std::numeric_limits<T>::max();
  return static_cast<T>(std::isnan(value) ? low : std::min(std::max(value, low), high));
}

// MLAS's conversion: cvtps2dq (half to even; NaN and |v| >= 2^31 give INT32_MIN), then saturating packs.
template <typename T>
T convert(float value) {
  if (std::isnan(value) || std::fabs(value) >= 2147483648.0f) return std::numeric_limits<T>::min();
  return saturate<T>(std::nearbyint(value));
}

Tensor requantize_cpu(const Tensor& acc, const Tensor& multiplier, const std::optional<Tensor>& bias,
                          int64_t zero_point, ScalarType dtype, int64_t inner) {
  CHECK_VALUE(acc.scalar_type() == ScalarType::Int && acc.is_contiguous() && multiplier.scalar_type() == ScalarType::Float &&
                        multiplier.is_contiguous() && multiplier.numel() >= 1 && inner >= 1,
                    "requantize: contiguous int32 acc and float32 multiplier expected");
  CHECK_VALUE(!bias || (bias->scalar_type() == ScalarType::Int && bias->is_contiguous() && bias->numel() >= 1),
                    "requantize: a contiguous int32 bias expected");
  Tensor out = output(sizes_of(acc), dtype);
  const int32_t* a = acc.const_data_ptr<int32_t>();
  const float* m = multiplier.const_data_ptr<float>();
  const int32_t* b = bias ? bias->const_data_ptr<int32_t>() : nullptr;
  const int64_t m_count = multiplier.numel(), b_count = bias ? bias->numel() : 1;
  const float zero = static_cast<float>(zero_point);
  with_type(dtype, [&](auto type) {
    using T = decltype(type);
    T* y = static_cast<T*>(out.mutable_data_ptr());
    torch::stable::parallel_for(0, acc.numel(), kGrain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end;) {  // runs of `inner` values share their multiplier and bias
        const int64_t group = i / inner, run = std::min(end, (group + 1) * inner);
        const float scale = m[group % m_count];
        const uint32_t add = b ? static_cast<uint32_t>(b[group % b_count]) : 0u;  // wraps as an int32 sum does
        for (; i < run; ++i) {
          const float value = static_cast<float>(static_cast<int32_t>(static_cast<uint32_t>(a[i]) + add)) * scale;
          y[i] = saturate<T>(std::nearbyint(value) + zero);
        }
      }
    });
  });
  return out;
}

// The numpy broadcast of two operands: the output's shape and, per operand, its stride along each output axis (0
// where it repeats).
struct Broadcast {
  std::vector<int64_t> shape, strides[2];
  int64_t numel = 1;
};

Broadcast broadcast(const Tensor& x, const Tensor& y) {
  CHECK_VALUE(x.scalar_type() == y.scalar_type(), "qlinear: operands of one type expected");
  const int64_t rank = std::max(x.dim(), y.dim());
  Broadcast b;
  b.shape.assign(rank, 1);
  const Tensor* operands[2] = {&x, &y};
  for (const Tensor* t : operands) {
    for (int64_t d = 0; d < t->dim(); ++d) {
      int64_t& out = b.shape[rank - t->dim() + d];
      const int64_t size = t->size(d);
      CHECK_VALUE(size == out || size == 1 || out == 1, "qlinear: the operands do not broadcast");
      out = size == 1 ? out : size;
    }
  }
  for (int64_t s : b.shape) b.numel *= s;
  for (int k = 0; k < 2; ++k) {
    const Tensor& t = *operands[k];
    b.strides[k].assign(rank, 0);
    for (int64_t d = 0; d < t.dim(); ++d)
      if (t.size(d) != 1) b.strides[k][rank - t.dim() + d] = t.stride(d);
  }
  return b;
}

// Walks one operand's values over the output in row-major order from output element `start`: an odometer over the
// output's axes.
struct Walker {
  const std::vector<int64_t>& shape;
  const std::vector<int64_t>& strides;
  std::vector<int64_t> at;
  int64_t j = 0;

  Walker(const Broadcast& b, int k, int64_t start) : shape(b.shape), strides(b.strides[k]), at(b.shape.size(), 0) {
    for (size_t d = shape.size(); d-- > 0;) {
      at[d] = start % shape[d];
      start /= shape[d];
      j += at[d] * strides[d];
    }
  }

  int64_t index() const { return j; }
  void next() {
    for (size_t d = shape.size(); d-- > 0;) {
      j += strides[d];
      if (++at[d] < shape[d]) return;
      j -= strides[d] * shape[d];
      at[d] = 0;
    }
  }
};

// `convert` on a vector of values stored as T at y[0 .. count): clamped to T's range before rounding (the same
// integer as rounding first, the bounds being integers), so that the rounding is exact (int8.h's round_even).
template <typename T>
void store_converted(T* y, int8::F value, int count) {
  using int8::F;
  using int8::I;
  constexpr float low = std::numeric_limits<T>::min(), high = std::numeric_limits<T>::max();
  const I bad = (value != value) | (value >= 2147483648.0f) | (value <= -2147483648.0f);
  F clamped = value < low ? splat(low) : value;
  clamped = clamped > high ? splat(high) : clamped;
  const I q = bad ? splat(static_cast<int32_t>(low)) : __builtin_convertvector(int8::round_even(clamped), I);
  if (count == int8::L) {  // a loop of constant length: one vector narrowing
    for (int l = 0; l < int8::L; ++l) y[l] = static_cast<T>(q[l]);
  } else {
    for (int l = 0; l < count; ++l) y[l] = static_cast<T>(q[l]);
  }
}

// One operand's values for outputs i .. i + count of a broadcast, as floats: loaded where the operand is the
// whole output in its order (contiguous), one value repeated, else walked value by value through its strides.
template <typename T>
struct Operand {
  const T* data;
  Walker walker;
  bool whole, single;

  Operand(const Tensor& t, const Broadcast& b, int k, int64_t start)
      : data(static_cast<const T*>(t.const_data_ptr())), walker(b, k, start),
        whole(t.is_contiguous() && t.numel() == b.numel), single(t.numel() == 1) {}

  int8::F at(int64_t i, int count) {
    using int8::L;
    if (single) return splat(static_cast<float>(data[0]));
    int32_t values[L] = {};
    if (whole && count == L) {  // a loop of constant length: one vector widening
      for (int l = 0; l < L; ++l) values[l] = data[i + l];
    } else if (whole) {
      for (int l = 0; l < count; ++l) values[l] = data[i + l];
    } else {
      for (int l = 0; l < count; ++l, walker.next()) values[l] = data[walker.index()];
    }
    return __builtin_convertvector(load(values), int8::F);
  }
};

// f(x values, y values) -> float32 values for each vector of output elements of the broadcast; then convert.
template <typename Fn>
Tensor binary(const Tensor& x, const Tensor& y, Fn f) {
  using int8::L;
  const Broadcast shape = broadcast(x, y);
  Tensor out = output(shape.shape, x.scalar_type());
  with_type(x.scalar_type(), [&](auto type) {
    using T = decltype(type);
    T* c = static_cast<T*>(out.mutable_data_ptr());
    const int64_t n = shape.numel;
    if (n == 0) return;
    torch::stable::parallel_for(0, (n + L - 1) / L, kGrain / L, [&, c](int64_t begin, int64_t end) {
      Operand<T> u(x, shape, 0, begin * L), v(y, shape, 1, begin * L);
      for (int64_t k = begin; k < end; ++k) {
        const int64_t i = k * L;
        const int count = static_cast<int>(std::min<int64_t>(L, n - i));
        store_converted(c + i, f(u.at(i, count), v.at(i, count)), count);
      }
    });
  });
  return out;
}

// The terms tensor, checked: `count` float32 values.
const float* terms_of(const Tensor& terms, int64_t count, const char* op) {
  CHECK_VALUE(terms.scalar_type() == ScalarType::Float && terms.numel() == count && terms.is_contiguous(), op, ": ",
              count, " float32 terms expected");
  return terms.const_data_ptr<float>();
}

// The size of t's innermost axis (1 for a scalar).
int64_t innermost(const Tensor& t) { return t.dim() == 0 ? 1 : t.size(-1); }

Tensor qlinear_add_cpu(const Tensor& a, const Tensor& b, const Tensor& terms) {
  // onnxruntime hands MLAS the operand that varies along the innermost axis as x: b where only b does
  const bool swap = innermost(a) == 1 && innermost(b) > 1;
  const float* t = terms_of(terms, 6, "qlinear_add") + (swap ? 3 : 0);
  const int8::F rx = splat(t[0]), ry = splat(t[1]), f = splat(t[2]);
  return binary(swap ? b : a, swap ? a : b,
                [=](int8::F x, int8::F y) { return int8::fma(x, rx, int8::fma(y, ry, f)); });
}

Tensor qlinear_mul_cpu(const Tensor& a, const Tensor& b, const Tensor& terms) {
  const float* t = terms_of(terms, 4, "qlinear_mul");
  const float za = t[0], zb = t[1], r = t[2], zc = t[3];
  return binary(a, b, [=](int8::F u, int8::F v) { return (u - za) * (v - zb) * r + zc; });
}

Tensor qlinear_lookup_cpu(const Tensor& x, const Tensor& table) {
  const uint8_t flip = signed_bytes(x) ? 0x80 : 0;  // x - lowest as a byte
  signed_bytes(table);
  CHECK_VALUE(x.is_contiguous() && table.is_contiguous() && table.numel() == 256,
                    "qlinear_lookup: contiguous x and a table of 256 values expected");
  Tensor out = output(sizes_of(x), table.scalar_type());
  const uint8_t* q = static_cast<const uint8_t*>(x.const_data_ptr());
  const uint8_t* t = static_cast<const uint8_t*>(table.const_data_ptr());
  uint8_t* y = static_cast<uint8_t*>(out.mutable_data_ptr());
  // the pointers by value: a byte store may alias anything, so captured by reference they were reloaded per value
  torch::stable::parallel_for(0, x.numel(), kGrain, [q, t, y, flip](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) y[i] = t[q[i] ^ flip];
  });
  return out;
}

// The int64 numbers of an op's call: their count checked once, then read one by one.
struct Numbers {
  const int64_t* p;
  int64_t size;

  Numbers(const Tensor& t, const char* op) : p(nullptr), size(t.numel()) {
    CHECK_VALUE(t.scalar_type() == ScalarType::Long && t.is_contiguous(), op, ": contiguous int64 numbers expected");
    p = t.const_data_ptr<int64_t>();
  }
  void expect(int64_t count, const char* op) const {
    CHECK_VALUE(size == count, op, ": ", count, " numbers expected, got ", size);
  }
  // value `d` of the per-axis list at `first` for axis a of three (missing axes: `absent`)
  int64_t axis(int64_t first, int64_t rank, int a, int64_t absent) const {
    const int64_t d = a - (3 - rank);
    return d >= 0 ? p[first + d] : absent;
  }
  // the float32 whose bits are number i (a scale: exact, and no scalar argument to box)
  float real(int64_t i) const {
    const auto bits = static_cast<uint32_t>(p[i]);
    float value;
    std::memcpy(&value, &bits, sizeof(float));
    return value;
  }
};

// Calls f(begin, end) over [0, count): in parallel (torch's thread pool) where the work (`cost` per item) is worth
// it, else here (a parallel_for costs about a microsecond).
template <typename Fn>
void maybe_parallel(int64_t count, int64_t cost, Fn&& f) {
  const int64_t grain = std::max<int64_t>(1, kGrain / std::max<int64_t>(1, cost));
  if (count <= grain) {
    f(int64_t{0}, count);
  } else {
    torch::stable::parallel_for(0, count, grain, f);
  }
}

// totals[o] += float32(from[o · step] - zero) · scale for o < count (a function of its own: nothing aliases, and
// steps 1 and 2 are vectorised)
template <typename T>
void add_dequantized(float* __restrict totals, const T* __restrict from, int64_t step, int64_t count, int32_t zero,
                     float scale) {
  auto add = [&](auto stride) {
    for (int64_t o = 0; o < count; ++o)
      totals[o] += static_cast<float>(static_cast<int32_t>(from[o * stride]) - zero) * scale;
  };
  if (step == 1) {
    add(std::integral_constant<int64_t, 1>{});
  } else if (step == 2) {
    add(std::integral_constant<int64_t, 2>{});
  } else {
    add(step);
  }
}

// y = saturate(round_half_even(total / divisor / y_scale + y_zero)) for a plane's windows (a function of its own:
// nothing aliases, and the divisions are vectorised over the plane)
template <typename T>
void averaged(float* __restrict totals, const float* __restrict divisors, int64_t count, float ys, float zy,
              T* __restrict y) {
  for (int64_t i = 0; i < count; ++i) totals[i] = totals[i] / divisors[i] / ys + zy;
  for (int64_t i = 0; i < count; ++i) y[i] = saturate<T>(std::nearbyint(totals[i]));
}

Tensor qlinear_average_pool_cpu(const Tensor& x, const Tensor& numbers) {
  const Numbers n(numbers, "qlinear_average_pool");
  const int64_t rank = x.dim() - 2;
  CHECK_VALUE(rank >= 1 && rank <= 3 && x.is_contiguous(), "qlinear_average_pool: x [N, C, 1-3 spatial axes] "
              "expected");
  n.expect(5 + 4 * rank, "qlinear_average_pool");
  int8::Windows w;
  for (int a = 0; a < 3; ++a) {
    const int64_t d = a - (3 - rank);
    w.axes[a] = {d >= 0 ? x.size(2 + d) : 1, n.axis(5, rank, a, 1), n.axis(5 + rank, rank, a, 1),
                 n.axis(5 + 2 * rank, rank, a, 0), 1};
    w.out[a] = n.axis(5 + 3 * rank, rank, a, 1);
    CHECK_VALUE(w.out[a] >= 0 && w.axes[a].kernel >= 1 && w.axes[a].stride >= 1, "qlinear_average_pool: kernel, "
                "strides >= 1 and output sizes >= 0 expected");
  }
  const int32_t x_zero = static_cast<int32_t>(n.p[0]);
  const bool count_include_pad = n.p[2] != 0;
  const float xs = n.real(3), ys = n.real(4), zy = static_cast<float>(n.p[1]);
  std::vector<int64_t> shape{x.size(0), x.size(1)};
  for (int a = 3 - static_cast<int>(rank); a < 3; ++a) shape.push_back(w.out[a]);
  Tensor out = output(shape, x.scalar_type());
  const std::vector<int64_t> offsets = w.whole_taps();
  const int64_t plane = w.plane(), positions = w.positions(), step = w.axes[2].stride;
  const float whole = static_cast<float>(offsets.size());
  // each window's divisor, the same in every plane: the whole kernel, or (count_include_pad 0) its taps in the input
  std::vector<float> divisors;
  divisors.reserve(positions);
  w.each([&](int64_t, int64_t count) { divisors.insert(divisors.end(), count, whole); },
         [&](const int64_t* lo, const int64_t* hi, const int64_t*) {
           divisors.push_back(count_include_pad ? whole : static_cast<float>((hi[0] - lo[0]) * (hi[1] - lo[1]) *
                                                                              (hi[2] - lo[2])));
         });
  with_type(x.scalar_type(), [&](auto type) {
    using T = decltype(type);
    const T* q = static_cast<const T*>(x.const_data_ptr());
    T* y = static_cast<T*>(out.mutable_data_ptr());
    maybe_parallel(x.size(0) * x.size(1), positions * w.taps(), [&](int64_t begin, int64_t end) {
      std::vector<float> totals(positions);
      for (int64_t image = begin; image < end; ++image) {
        const T* src = q + image * plane;
        float* total = totals.data();
        // each tap dequantized, float32(q - x_zero) * x_scale; the taps summed in row-major order (those in the
        // padding skipped: they add +0)
        w.each([&](int64_t at, int64_t count) {
          std::fill_n(total, count, 0.0f);
          for (const int64_t tap : offsets) add_dequantized(total, src + at + tap, step, count, x_zero, xs);
          total += count;
        }, [&](const int64_t* lo, const int64_t* hi, const int64_t* start) {
          float sum = 0.0f;
          for (int64_t k0 = lo[0]; k0 < hi[0]; ++k0) {
            for (int64_t k1 = lo[1]; k1 < hi[1]; ++k1) {
              const T* row = src + ((start[0] + k0) * w.axes[1].size + start[1] + k1) * w.axes[2].size + start[2];
              for (int64_t k2 = lo[2]; k2 < hi[2]; ++k2)
                sum += static_cast<float>(static_cast<int32_t>(row[k2]) - x_zero) * xs;
            }
          }
          *total++ = sum;
        });
        averaged(totals.data(), divisors.data(), positions, ys, zy, y + image * positions);
      }
    });
  });
  return out;
}

Tensor max_pool_cpu(const Tensor& x, const Tensor& numbers) {
  const Numbers n(numbers, "max_pool");
  const int64_t rank = x.dim() - 2;
  CHECK_VALUE(rank >= 1 && rank <= 3 && x.is_contiguous(), "max_pool: contiguous x [N, C, 1-3 spatial axes] expected");
  CHECK_VALUE(n.size == 5 * rank || (n.size == 5 * rank + 1 && x.scalar_type() != ScalarType::Float),
              "max_pool: ", 5 * rank, " numbers expected (one more, the fill, for 8-bit x), got ", n.size);
  int64_t in[3];
  for (int a = 0; a < 3; ++a) in[a] = a >= 3 - rank ? x.size(2 + a - (3 - rank)) : 1;
  const int8::MaxPool pool(n.p, rank, in, n.size > 5 * rank ? n.p + 5 * rank : nullptr);
  std::vector<int64_t> shape{x.size(0), x.size(1)};
  for (int a = 3 - static_cast<int>(rank); a < 3; ++a) shape.push_back(pool.out[a]);
  Tensor y = output(shape, x.scalar_type());
  const int64_t plane = pool.plane(), positions = pool.positions();
  auto run = [&](auto type) {
    using T = decltype(type);
    const T* q = static_cast<const T*>(x.const_data_ptr());
    T* dst = static_cast<T*>(y.mutable_data_ptr());
    maybe_parallel(x.size(0) * x.size(1), positions * pool.taps(), [&](int64_t begin, int64_t end) {
      for (int64_t image = begin; image < end; ++image) pool(q + image * plane, dst + image * positions);
    });
  };
  if (x.scalar_type() == ScalarType::Float) {
    run(float{});
  } else {
    with_type(x.scalar_type(), run);
  }
  return y;
}

Tensor qlinear_global_average_pool_cpu(const Tensor& x, const Tensor& numbers) {
  const Numbers n(numbers, "qlinear_global_average_pool");
  n.expect(5, "qlinear_global_average_pool");
  CHECK_VALUE(x.dim() >= 3 && x.is_contiguous(), "qlinear_global_average_pool: contiguous x [N, C, spatial] "
                    "expected");
  const bool channels_last = n.p[2] != 0;
  const int64_t N = x.size(0), C = channels_last ? x.size(-1) : x.size(1), x_zero = n.p[0];
  const int64_t size = x.numel() / std::max<int64_t>(1, N * C);
  std::vector<int64_t> shape(x.dim(), 1);
  shape[0] = N;
  shape[channels_last ? x.dim() - 1 : 1] = C;
  Tensor out = output(shape, x.scalar_type());
  const float multiplier = n.real(3) / (n.real(4) * static_cast<float>(size));
  const float zy = static_cast<float>(n.p[1]);
  with_type(x.scalar_type(), [&](auto type) {
    using T = decltype(type);
    const T* q = static_cast<const T*>(x.const_data_ptr());
    T* y = static_cast<T*>(out.mutable_data_ptr());
    for (int64_t b = 0; b < N; ++b) {
      for (int64_t c = 0; c < C; ++c) {
        int64_t sum = 0;
        if (channels_last) {
          for (int64_t s = 0; s < size; ++s) sum += q[(b * size + s) * C + c];
        } else {
          for (int64_t s = 0; s < size; ++s) sum += q[(b * C + c) * size + s];
        }
        const float acc = static_cast<float>(sum - size * x_zero);  // exact integer, rounded once to float32
        y[b * C + c] = saturate<T>(std::nearbyint(acc * multiplier) + zy);
      }
    }
  });
  return out;
}

Tensor qlinear_softmax_cpu(const Tensor& x, const Tensor& table, const Tensor& numbers) {
  const Numbers n(numbers, "qlinear_softmax");
  n.expect(4, "qlinear_softmax");
  const int64_t L = n.p[0], inner = n.p[1];
  CHECK_VALUE(x.is_contiguous() && table.scalar_type() == ScalarType::Float && table.is_contiguous() &&
                  table.numel() == 256 && L >= 1 && inner >= 1 && x.numel() % (L * inner) == 0,
              "qlinear_softmax: contiguous x [R, L, inner] and a float32 table of 256 values expected");
  Tensor out = output(sizes_of(x), x.scalar_type());
  const int64_t R = x.numel() / (L * inner);
  const float* t = table.const_data_ptr<float>();
  const float inv = n.real(3), zy = static_cast<float>(n.p[2]);
  with_type(x.scalar_type(), [&](auto type) {
    using T = decltype(type);
    const int32_t top = std::numeric_limits<T>::max();
    const T* q = static_cast<const T*>(x.const_data_ptr());
    T* y = static_cast<T*>(out.mutable_data_ptr());
    std::vector<float> values(L);
    for (int64_t r = 0; r < R * inner; ++r) {  // row r: L values `inner` apart
      const int64_t first = (r / inner) * L * inner + r % inner;
      const T* row = q + first;
      int32_t high = std::numeric_limits<T>::min();
      for (int64_t k = 0; k < L; ++k) high = std::max<int32_t>(high, row[k * inner]);
      float total = 0.0f;
      for (int64_t k = 0; k < L; ++k) {
        values[k] = t[(static_cast<int32_t>(row[k * inner]) + top - high) & 0xFF];
        total = k == 0 ? values[k] : total + values[k];
      }
      for (int64_t k = 0; k < L; ++k)
        y[first + k * inner] = saturate<T>(std::nearbyint(values[k] * inv / total) + zy);
    }
  });
  return out;
}

// The folded product of qlinear_matmul: each output value requantized, then `then(value, column)` (a T); a as
// [..., K], or flattened at axis `flatten` to [rows, K] (an ONNX Flatten before it; -1: none).
template <typename Then>
Tensor folded_product(const Tensor& a, const Tensor& panels, const Tensor& column_sums, const Tensor& offsets,
                      const Tensor& multiplier, const std::optional<Tensor>& bias, const int32_t* z, Then then,
                      int64_t flatten = -1) {
  // dtypes, shapes and contiguity as the caller (modules/quantized.py: QLinearMatMul, QGemm) checked them
  CHECK_VALUE(flatten <= a.dim() && (flatten >= 0 || a.dim() >= 1), "qlinear_matmul: a of rank ", a.dim(),
              " flattened at ", flatten);
  const int64_t last = flatten < 0 ? a.dim() - 1 : flatten, N = offsets.numel(), m_count = multiplier.numel();
  int64_t M = 1, K = 1;
  for (int64_t d = 0; d < a.dim(); ++d) (d < last ? M : K) *= a.size(d);
  CHECK_VALUE(panels.numel() == int8::packed_size(K, N) &&
                        column_sums.numel() == (int8::by_column(N) ? N : int8::panel_blocks(N) * int8::G * int8::L),
                    "qlinear_matmul: panels not packed by int8_matrix_pack for this a");
  const uint8_t flip = signed_bytes(a) ? 0x80 : 0;  // int8 a as uint8: a + 128, its zero point with it
  const int32_t a_zero = z[0] + (flip ? 128 : 0);
  const float zero = static_cast<float>(z[1]);
  // a's rows as uint8, padded to whole groups of four, and their sums
  int8::Quantized rows(M, K);
  const uint8_t* src = static_cast<const uint8_t*>(a.const_data_ptr());
  for (int64_t i = 0; i < M; ++i) {
    uint8_t* dst = rows.q.data() + i * rows.lda;
    int32_t sum = 0;
    for (int64_t k = 0; k < K; ++k) sum += dst[k] = src[i * K + k] ^ flip;
    rows.sums[i] = sum;
  }
  std::vector<int32_t> offset(int8::panel_blocks(N) * int8::G * int8::L, 0);  // padded to whole blocks
  std::copy(offsets.const_data_ptr<int32_t>(), offsets.const_data_ptr<int32_t>() + N, offset.begin());
  const float* m = multiplier.const_data_ptr<float>();
  const int32_t* b = bias ? bias->const_data_ptr<int32_t>() : nullptr;
  std::vector<int64_t> shape = flatten < 0 ? sizes_of(a) : std::vector<int64_t>{M, K};
  shape.back() = N;
  const ScalarType dtype = z[2] ? ScalarType::Char : ScalarType::Byte;
  Tensor out = output(shape, dtype);
  with_type(dtype, [&](auto type) {
    using T = decltype(type);
    T* y = static_cast<T*>(out.mutable_data_ptr());
    int8::products(rows, M, K, int8::by_column(N), static_cast<const int8_t*>(panels.const_data_ptr()),
                   column_sums.const_data_ptr<int32_t>(), N, offset.data(), [a_zero](int64_t) { return a_zero; },
                   [&](int64_t i, int64_t j0, int8::I exact, int count) {
                     for (int l = 0; l < count; ++l) {
                       const int64_t j = j0 + l;
                       const uint32_t add = b ? static_cast<uint32_t>(b[j]) : 0u;  // wraps as an int32 sum does
                       const float value =
                           static_cast<float>(static_cast<int32_t>(static_cast<uint32_t>(exact[l]) + add)) *
                           m[m_count == 1 ? 0 : j];
                       y[i * N + j] = then(saturate<T>(std::nearbyint(value) + zero), j);
                     }
                   });
  });
  return out;
}

Tensor qlinear_matmul_cpu(const Tensor& a, const Tensor& panels, const Tensor& column_sums,
                              const Tensor& offsets, const Tensor& multiplier,
                              const std::optional<Tensor>& bias, const Tensor& numbers) {
  CHECK_VALUE(numbers.numel() == 3 || numbers.numel() == 4, "qlinear_matmul: 3 or 4 numbers expected");
  const int32_t* n = numbers.const_data_ptr<int32_t>();
  return folded_product(a, panels, column_sums, offsets, multiplier, bias, n, [](auto value, int64_t) { return value; },
                        numbers.numel() == 4 ? n[3] : -1);
}

Tensor qlinear_matmul_add_cpu(const Tensor& a, const Tensor& panels, const Tensor& column_sums,
                                  const Tensor& offsets, const Tensor& multiplier,
                                  const std::optional<Tensor>& bias, const Tensor& numbers, const Tensor& terms) {
  const int64_t N = offsets.numel();
  CHECK_VALUE(numbers.numel() == 4 && terms.scalar_type() == ScalarType::Float && terms.is_contiguous() &&
                  terms.numel() == 3 + N, "qlinear_matmul_add: 4 numbers and float32 terms [3 + N] expected");
  const float* t = terms.const_data_ptr<float>();
  const float rx = t[0], ry = t[1], f = t[2];
  const float* column = t + 3;
  if (numbers.const_data_ptr<int32_t>()[3])  // the product is qlinear_add's x
    return folded_product(a, panels, column_sums, offsets, multiplier, bias, numbers.const_data_ptr<int32_t>(),
                          [=](auto value, int64_t j) {
                            using T = decltype(value);
                            return convert<T>(std::fma(static_cast<float>(value), rx, std::fma(column[j], ry, f)));
                          });
  return folded_product(a, panels, column_sums, offsets, multiplier, bias, numbers.const_data_ptr<int32_t>(),
                        [=](auto value, int64_t j) {
                          using T = decltype(value);
                          return convert<T>(std::fma(column[j], rx, std::fma(static_cast<float>(value), ry, f)));
                        });
}

Tensor qlinear_concat_cpu(const std::vector<Tensor>& xs, const Tensor& tables, int64_t axis) {
  const int64_t count = static_cast<int64_t>(xs.size());
  CHECK_VALUE(count >= 1 && tables.is_contiguous() && tables.numel() == 256 * count,
              "qlinear_concat: inputs and a table of 256 values per input expected");
  const bool flip = signed_bytes(tables);  // x - lowest as a byte
  std::vector<int64_t> shape = sizes_of(xs[0]);
  const int64_t rank = static_cast<int64_t>(shape.size());
  axis = axis < 0 ? axis + rank : axis;
  CHECK_VALUE(rank >= 1 && axis >= 0 && axis < rank, "qlinear_concat: axis ", axis, " out of range");
  shape[axis] = 0;
  for (const Tensor& x : xs) {
    CHECK_VALUE(x.scalar_type() == tables.scalar_type() && x.dim() == rank,
                "qlinear_concat: inputs of the tables' type and one rank expected");
    for (int64_t d = 0; d < rank; ++d)
      CHECK_VALUE(d == axis || x.size(d) == shape[d], "qlinear_concat: the inputs' sizes differ off the axis");
    shape[axis] += x.size(axis);
  }
  Tensor out = output(shape, tables.scalar_type());
  int64_t outer = 1, inner = 1;  // blocks before the axis; values per unit of the axis
  for (int64_t d = 0; d < axis; ++d) outer *= shape[d];
  for (int64_t d = axis + 1; d < rank; ++d) inner *= shape[d];
  const uint8_t* t = static_cast<const uint8_t*>(tables.const_data_ptr());
  uint8_t* y = static_cast<uint8_t*>(out.mutable_data_ptr());
  const uint8_t mask = flip ? 0x80 : 0;
  const int64_t row = shape[axis] * inner;  // output values per outer block
  int64_t offset = 0;
  for (int64_t i = 0; i < count; ++i) {
    const int64_t chunk = xs[i].size(axis) * inner;
    const Tensor x = int8::dense(xs[i]);  // a strided view copied (rare: no dispatch otherwise)
    const uint8_t* q = static_cast<const uint8_t*>(x.const_data_ptr());
    const uint8_t* table = t + 256 * i;
    for (int64_t o = 0; o < outer; ++o) {
      uint8_t* dst = y + o * row + offset;
      const uint8_t* src = q + o * chunk;
      for (int64_t j = 0; j < chunk; ++j) dst[j] = table[src[j] ^ mask];
    }
    offset += chunk;
  }
  return out;
}

}  // namespace

STABLE_TORCH_LIBRARY_FRAGMENT(onnx2torch_rnn, m) {
  m.def("requantize(Tensor acc, Tensor multiplier, Tensor? bias, int zero_point, ScalarType dtype, int inner) -> "
        "Tensor");
  m.def("qlinear_add(Tensor x, Tensor y, Tensor terms) -> Tensor");
  m.def("qlinear_mul(Tensor a, Tensor b, Tensor terms) -> Tensor");
  m.def("qlinear_lookup(Tensor x, Tensor table) -> Tensor");
  m.def("qlinear_matmul(Tensor a, Tensor panels, Tensor column_sums, Tensor offsets, Tensor multiplier, "
        "Tensor? bias, Tensor numbers) -> Tensor");
  m.def("qlinear_matmul_add(Tensor a, Tensor panels, Tensor column_sums, Tensor offsets, Tensor multiplier, "
        "Tensor? bias, Tensor numbers, Tensor terms) -> Tensor");
  m.def("qlinear_average_pool(Tensor x, Tensor numbers) -> Tensor");
  m.def("qlinear_global_average_pool(Tensor x, Tensor numbers) -> Tensor");
  m.def("max_pool(Tensor x, Tensor numbers) -> Tensor");
  m.def("qlinear_softmax(Tensor x, Tensor table, Tensor numbers) -> Tensor");
  m.def("qlinear_concat(Tensor[] xs, Tensor tables, int axis) -> Tensor");
}

STABLE_TORCH_LIBRARY_IMPL(onnx2torch_rnn, CPU, m) {
  m.impl("requantize", TORCH_BOX(&requantize_cpu));
  m.impl("qlinear_add", TORCH_BOX(&qlinear_add_cpu));
  m.impl("qlinear_mul", TORCH_BOX(&qlinear_mul_cpu));
  m.impl("qlinear_lookup", TORCH_BOX(&qlinear_lookup_cpu));
  m.impl("qlinear_matmul", TORCH_BOX(&qlinear_matmul_cpu));
  m.impl("qlinear_matmul_add", TORCH_BOX(&qlinear_matmul_add_cpu));
  m.impl("qlinear_average_pool", TORCH_BOX(&qlinear_average_pool_cpu));
  m.impl("qlinear_global_average_pool", TORCH_BOX(&qlinear_global_average_pool_cpu));
  m.impl("max_pool", TORCH_BOX(&max_pool_cpu));
  m.impl("qlinear_softmax", TORCH_BOX(&qlinear_softmax_cpu));
  m.impl("qlinear_concat", TORCH_BOX(&qlinear_concat_cpu));
}

}  // namespace onnx2torch_rnn
