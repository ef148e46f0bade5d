// ONNX QuantizeLinear and DequantizeLinear per tensor on the CPU, for eager inference: one op each instead of the
// six or so torch ops of their Python implementations in modules/quantized.py (``quantize``, ``dequantize``), which
// are the reference (same numbers, bit for bit) and run everywhere else.
//
//   quantize_linear(Tensor x, Tensor scale, Tensor? zero_point, ScalarType dtype) -> Tensor
//       float32 x, one float32 scale and zero point: saturate(round_half_even(x / scale) + zero_point) to uint8,
//       int8, uint16 or int16, the division and the sum in float32; NaN becomes the lowest value
//   dequantize_linear(Tensor q, Tensor scale, Tensor? zero_point) -> Tensor
//       float32(int32(q) - int32(zero_point)) * scale in float32, q of 8, 16 or 32 bits (the int32 difference wraps)
//
// Built against PyTorch's stable ABI (int8.h): raw pointers, no tensor op by name.

#define TORCH_STABLE_ONLY
#include <torch/csrc/stable/library.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>

#include "int8.h"

namespace onnx2torch_rnn {
namespace {

using int8::allocate;
using int8::dense;
using int8::integer_at;
using torch::headeronly::ScalarType;
using torch::stable::Tensor;

constexpr int64_t kGrain = 1 << 15;  // elements per task

// One value of a zero point of any integer type (0 when absent), read without a dispatch.
int32_t zero_point_value(const std::optional<Tensor>& zero_point) {
  if (!zero_point) return 0;
  CHECK_VALUE(zero_point->numel() == 1, "quantize_linear: one zero point expected, got ", zero_point->numel());
  return integer_at(*zero_point, 0);
}

float scale_value(const Tensor& scale) {
  CHECK_VALUE(scale.numel() == 1 && scale.scalar_type() == ScalarType::Float, "quantize_linear: one float32 scale "
              "expected, got ", scale.numel(), " of ", scale.scalar_type());
  return *scale.const_data_ptr<float>();
}

template <typename T>
void quantize(const float* x, int64_t n, float scale, float zero, T* y) {
  constexpr float low = std::numeric_limits<T>::min(), high = std::numeric_limits<T>::max();
  torch::stable::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float v = std::nearbyint(x[i] / scale) + zero;  // the default rounding mode: half to even
      y[i] = static_cast<T>(std::isnan(v) ? low : std::min(std::max(v, low), high));
    }
  });
}

Tensor quantize_linear_cpu(const Tensor& x, const Tensor& scale, const std::optional<Tensor>& zero_point,
                           ScalarType dtype) {
  CHECK_VALUE(x.scalar_type() == ScalarType::Float, "quantize_linear: float32 x expected, got ", x.scalar_type());
  const Tensor in = dense(x);
  const float s = scale_value(scale), zero = static_cast<float>(zero_point_value(zero_point));
  const float* src = in.const_data_ptr<float>();
  const int64_t n = in.numel();
  Tensor out;
  auto run = [&](auto type) {
    using T = decltype(type);
    out = allocate(int8::sizes_of(in), dtype);
    quantize(src, n, s, zero, static_cast<T*>(out.mutable_data_ptr()));
  };
  switch (dtype) {
    case ScalarType::Byte: run(uint8_t{}); break;
    case ScalarType::Char: run(int8_t{}); break;
    case ScalarType::UInt16: run(uint16_t{}); break;
    case ScalarType::Short: run(int16_t{}); break;
    default: CHECK_VALUE(false, "quantize_linear: uint8, int8, uint16 or int16 output expected, got ", dtype);
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

Tensor dequantize_linear_cpu(const Tensor& q, const Tensor& scale, const std::optional<Tensor>& zero_point) {
  const Tensor in = dense(q);
  const float s = scale_value(scale);
  const int32_t zero = zero_point_value(zero_point);
  const int64_t n = in.numel();
  const void* src = in.const_data_ptr();
  const ScalarType type = in.scalar_type();
  CHECK_VALUE(type == ScalarType::Byte || type == ScalarType::Char || type == ScalarType::UInt16 ||
                  type == ScalarType::Short || type == ScalarType::Int,
              "dequantize_linear: 8-, 16- or 32-bit integers expected, got ", type);
  Tensor out = allocate(int8::sizes_of(in), ScalarType::Float);
  float* y = out.mutable_data_ptr<float>();
  switch (type) {
    case ScalarType::Byte: dequantize(static_cast<const uint8_t*>(src), n, zero, s, y); break;
    case ScalarType::Char: dequantize(static_cast<const int8_t*>(src), n, zero, s, y); break;
    case ScalarType::UInt16: dequantize(static_cast<const uint16_t*>(src), n, zero, s, y); break;
    case ScalarType::Short: dequantize(static_cast<const int16_t*>(src), n, zero, s, y); break;
    default: dequantize(static_cast<const int32_t*>(src), n, zero, s, y); break;
  }
  return out;
}

}  // namespace

STABLE_TORCH_LIBRARY_FRAGMENT(onnx2torch_rnn, m) {
  m.def("quantize_linear(Tensor x, Tensor scale, Tensor? zero_point, ScalarType dtype) -> Tensor");
  m.def("dequantize_linear(Tensor q, Tensor scale, Tensor? zero_point) -> Tensor");
}

STABLE_TORCH_LIBRARY_IMPL(onnx2torch_rnn, CPU, m) {
  m.impl("quantize_linear", TORCH_BOX(&quantize_linear_cpu));
  m.impl("dequantize_linear", TORCH_BOX(&dequantize_linear_cpu));
}

}  // namespace onnx2torch_rnn
