// ONNX QuantizeLinear and DequantizeLinear per tensor on the CPU, for eager inference: one op each instead of the
// six or so torch ops of their Python implementations in modules/quantized.py (``quantize``, ``dequantize``), which
// are the reference (same numbers, bit for bit) and run everywhere else. The scale and zero point come as one int64
// tensor of numbers that Python makes once per module (one boxed argument: each more costs a quarter microsecond).
//
//   quantize_linear(Tensor x, Tensor numbers) -> Tensor
//       float32 x; numbers [bits of the float32 scale, zero point, output type: 0 uint8, 1 int8, 2 uint16, 3 int16]:
//       saturate(round_half_even(x / scale) + zero_point), the division in float32 (MlasQuantizeLinear: x / scale
//       clamped to the type's range less the zero point, rounded, plus the zero point; the same values); NaN
//       becomes the lowest value
//   dequantize_linear(Tensor q, Tensor numbers) -> Tensor
//       numbers [bits of the float32 scale, zero point]: float32(int32(q) - zero_point) * scale in float32, q of 8,
//       16 or 32 bits (the int32 difference wraps)
//   quantize_dequantize_linear(Tensor x, Tensor numbers) -> Tensor
//       a QuantizeLinear read only by a DequantizeLinear, in one pass: numbers [quantize_linear's three,
//       dequantize_linear's two], float32 out (the same numbers as the two ops)
//   quantize_concat_dequantize(Tensor[] xs, Tensor numbers, Tensor tables, int axis) -> Tensor
//       QuantizeLinear of each float32 x (numbers: quantize_linear's three per input, 8-bit types), QLinearConcat
//       and DequantizeLinear in one pass: row i of tables (float32 [len(xs), 256]) holds what the last two give
//       input i's integers (lowest first); the inputs concatenated along axis (one rank, the same sizes but along
//       axis)
//
// Strided inputs (a transposed or broadcast view) are read through their strides; outputs are contiguous. Built
// against PyTorch's stable ABI (int8.h): raw pointers, no tensor op by name.

#define TORCH_STABLE_ONLY
#include <torch/csrc/stable/library.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "int8.h"

namespace onnx2torch_rnn {
namespace {

using int8::allocate;
using int8::quantize;  // of float32 values to any 8- or 16-bit type (int8.h)
using torch::headeronly::ScalarType;
using torch::stable::Tensor;

constexpr int64_t kGrain = 1 << 15;  // elements per task

struct Numbers {
  float scale;
  int32_t zero;
  int64_t type;
};

// The numbers tensor, checked: `count` int64 values.
const int64_t* numbers_of(const Tensor& numbers, int64_t count, const char* op) {
  CHECK_VALUE(numbers.scalar_type() == ScalarType::Long && numbers.numel() == count && numbers.is_contiguous(), op,
              ": ", count, " int64 numbers expected");
  return numbers.const_data_ptr<int64_t>();
}

// A scale and zero point (and, `typed`, the quantized type) from n[0 ..).
Numbers numbers_at(const int64_t* n, bool typed) {
  const auto bits = static_cast<uint32_t>(n[0]);
  Numbers out{0.0f, static_cast<int32_t>(n[1]), typed ? n[2] : 0};
  std::memcpy(&out.scale, &bits, sizeof(float));
  return out;
}

// t's values in the order of a contiguous tensor of its sizes: its own data where it is contiguous, else gathered
// through its strides into `buffer` (a transposed or broadcast view: cheaper than a copy through the dispatcher).
template <typename T>
const T* dense_values(const Tensor& t, std::vector<T>& buffer) {
  const T* base = static_cast<const T*>(t.const_data_ptr());
  if (t.is_contiguous()) return base;
  const auto sizes = t.sizes();
  const auto strides = t.strides();
  const int64_t rank = t.dim(), n = t.numel(), inner = sizes[rank - 1], step = strides[rank - 1];
  buffer.resize(n);
  std::vector<int64_t> index(rank, 0);
  int64_t offset = 0;
  for (int64_t i = 0; i < n; i += inner) {
    for (int64_t k = 0; k < inner; ++k) buffer[i + k] = base[offset + k * step];
    for (int64_t d = rank - 2; d >= 0; --d) {  // the next row: an odometer over the outer axes
      offset += strides[d];
      if (++index[d] < sizes[d]) break;
      offset -= strides[d] * sizes[d];
      index[d] = 0;
    }
  }
  return buffer.data();
}

// The quantized values dequantized: float32(q - zero) * scale, q - zero exact in int32 (both of T's range).
template <typename T>
void quantize_dequantize(const float* x, int64_t n, const Numbers& q, const Numbers& dq, float* y) {
  quantize<T>(x, n, q.scale, q.zero, [&](int64_t j, const int8::I& u, int64_t count) {
    const int8::F v = __builtin_convertvector(u - dq.zero, int8::F) * dq.scale;
    std::memcpy(y + j, &v, sizeof(float) * count);
  });
}

Tensor quantize_linear_cpu(const Tensor& x, const Tensor& numbers) {
  CHECK_VALUE(x.scalar_type() == ScalarType::Float, "quantize_linear: float32 x expected, got ", x.scalar_type());
  const Numbers p = numbers_at(numbers_of(numbers, 3, "quantize_linear"), true);
  std::vector<float> buffer;
  const float* src = dense_values(x, buffer);
  const int64_t n = x.numel();
  Tensor out;
  auto run = [&](auto type, ScalarType dtype) {
    using T = decltype(type);
    out = allocate(int8::sizes_of(x), dtype);
    quantize(src, n, p.scale, p.zero, static_cast<T*>(out.mutable_data_ptr()));
  };
  switch (p.type) {
    case 0: run(uint8_t{}, ScalarType::Byte); break;
    case 1: run(int8_t{}, ScalarType::Char); break;
    case 2: run(uint16_t{}, ScalarType::UInt16); break;
    case 3: run(int16_t{}, ScalarType::Short); break;
    default: CHECK_VALUE(false, "quantize_linear: output type 0 to 3 expected, got ", p.type);
  }
  return out;
}

template <typename T>
void dequantize(const T* q, int64_t n, int32_t zero, float scale, float* y) {
  torch::stable::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const auto shifted = static_cast<int32_t>(static_cast<uint32_t>(static_cast<int32_t>(q[i])) -
                                                static_cast<uint32_t>(zero));
      y[i] = static_cast<float>(shifted) * scale;
    }
  });
}

template <typename T>
void dequantize_any(const Tensor& q, const Numbers& p, float* y) {
  std::vector<T> buffer;
  dequantize(dense_values(q, buffer), q.numel(), p.zero, p.scale, y);
}

Tensor dequantize_linear_cpu(const Tensor& q, const Tensor& numbers) {
  const Numbers p = numbers_at(numbers_of(numbers, 2, "dequantize_linear"), false);
  const ScalarType type = q.scalar_type();
  CHECK_VALUE(type == ScalarType::Byte || type == ScalarType::Char || type == ScalarType::UInt16 ||
                  type == ScalarType::Short || type == ScalarType::Int,
              "dequantize_linear: 8-, 16- or 32-bit integers expected, got ", type);
  Tensor out = allocate(int8::sizes_of(q), ScalarType::Float);
  float* y = out.mutable_data_ptr<float>();
  switch (type) {
    case ScalarType::Byte: dequantize_any<uint8_t>(q, p, y); break;
    case ScalarType::Char: dequantize_any<int8_t>(q, p, y); break;
    case ScalarType::UInt16: dequantize_any<uint16_t>(q, p, y); break;
    case ScalarType::Short: dequantize_any<int16_t>(q, p, y); break;
    default: dequantize_any<int32_t>(q, p, y); break;
  }
  return out;
}

Tensor quantize_dequantize_linear_cpu(const Tensor& x, const Tensor& numbers) {
  CHECK_VALUE(x.scalar_type() == ScalarType::Float, "quantize_dequantize_linear: float32 x expected, got ",
              x.scalar_type());
  const int64_t* n = numbers_of(numbers, 5, "quantize_dequantize_linear");
  const Numbers q = numbers_at(n, true), dq = numbers_at(n + 3, false);
  std::vector<float> buffer;
  const float* src = dense_values(x, buffer);
  Tensor out = allocate(int8::sizes_of(x), ScalarType::Float);
  float* y = out.mutable_data_ptr<float>();
  switch (q.type) {
    case 0: quantize_dequantize<uint8_t>(src, x.numel(), q, dq, y); break;
    case 1: quantize_dequantize<int8_t>(src, x.numel(), q, dq, y); break;
    case 2: quantize_dequantize<uint16_t>(src, x.numel(), q, dq, y); break;
    case 3: quantize_dequantize<int16_t>(src, x.numel(), q, dq, y); break;
    default: CHECK_VALUE(false, "quantize_dequantize_linear: type 0 to 3 expected, got ", q.type);
  }
  return out;
}

Tensor quantize_concat_dequantize_cpu(const std::vector<Tensor>& xs, const Tensor& numbers, const Tensor& tables,
                                      int64_t axis) {
  const int64_t count = static_cast<int64_t>(xs.size());
  CHECK_VALUE(count >= 1 && tables.scalar_type() == ScalarType::Float && tables.is_contiguous() &&
                  tables.numel() == 256 * count, "quantize_concat_dequantize: float32 tables [inputs, 256] expected");
  const int64_t* n = numbers_of(numbers, 3 * count, "quantize_concat_dequantize");
  std::vector<int64_t> shape = int8::sizes_of(xs[0]);
  const int64_t rank = static_cast<int64_t>(shape.size());
  axis = axis < 0 ? axis + rank : axis;
  CHECK_VALUE(rank >= 1 && axis >= 0 && axis < rank, "quantize_concat_dequantize: axis ", axis, " out of range");
  shape[axis] = 0;
  for (const Tensor& x : xs) {
    CHECK_VALUE(x.scalar_type() == ScalarType::Float && x.dim() == rank,
                "quantize_concat_dequantize: float32 inputs of one rank expected");
    for (int64_t d = 0; d < rank; ++d)
      CHECK_VALUE(d == axis || x.size(d) == shape[d], "quantize_concat_dequantize: the inputs' sizes differ off "
                  "the axis");
    shape[axis] += x.size(axis);
  }
  Tensor out = allocate(shape, ScalarType::Float);
  int64_t inner = 1;  // values per unit of the axis
  for (int64_t d = axis + 1; d < rank; ++d) inner *= shape[d];
  const int64_t row = shape[axis] * inner;  // output values per outer block
  float* y = out.mutable_data_ptr<float>();
  int64_t offset = 0;
  for (int64_t i = 0; i < count; ++i) {
    const Numbers p = numbers_at(n + 3 * i, true);
    const int64_t chunk = xs[i].size(axis) * inner;
    const float* table = tables.const_data_ptr<float>() + 256 * i;
    std::vector<float> buffer;
    const float* src = dense_values(xs[i], buffer);
    auto run = [&](auto type) {
      using T = decltype(type);
      const int32_t lowest = std::numeric_limits<T>::min();
      quantize<T>(src, xs[i].numel(), p.scale, p.zero,
                  [&](int64_t j, const int8::I& u, int64_t values) {
                    for (int64_t l = 0; l < values; ++l) {
                      const int64_t k = j + l;  // x's index: block k / chunk, k % chunk within it
                      y[(k / chunk) * row + offset + k % chunk] = table[u[l] - lowest];
                    }
                  });
    };
    if (p.type == 0) {
      run(uint8_t{});
    } else {
      CHECK_VALUE(p.type == 1, "quantize_concat_dequantize: 8-bit types expected, got ", p.type);
      run(int8_t{});
    }
    offset += chunk;
  }
  return out;
}

}  // namespace

STABLE_TORCH_LIBRARY_FRAGMENT(onnx2torch_rnn, m) {
  m.def("quantize_linear(Tensor x, Tensor numbers) -> Tensor");
  m.def("dequantize_linear(Tensor q, Tensor numbers) -> Tensor");
  m.def("quantize_dequantize_linear(Tensor x, Tensor numbers) -> Tensor");
  m.def("quantize_concat_dequantize(Tensor[] xs, Tensor numbers, Tensor tables, int axis) -> Tensor");
}

STABLE_TORCH_LIBRARY_IMPL(onnx2torch_rnn, CPU, m) {
  m.impl("quantize_linear", TORCH_BOX(&quantize_linear_cpu));
  m.impl("dequantize_linear", TORCH_BOX(&dequantize_linear_cpu));
  m.impl("quantize_dequantize_linear", TORCH_BOX(&quantize_dequantize_linear_cpu));
  m.impl("quantize_concat_dequantize", TORCH_BOX(&quantize_concat_dequantize_cpu));
}

}  // namespace onnx2torch_rnn
