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
// Raw pointers and few ATen calls (the stable-ABI port).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>

namespace onnx2torch_rnn {
namespace {

constexpr int64_t kGrain = 1 << 15;  // elements per task

// One value of a zero point of any integer type (0 when absent), read without a dispatch.
int32_t zero_point_value(const std::optional<at::Tensor>& zero_point) {
  if (!zero_point) return 0;
  TORCH_CHECK_VALUE(zero_point->numel() == 1, "quantize_linear: one zero point expected, got ", zero_point->numel());
  const void* p = zero_point->data_ptr();
  switch (zero_point->scalar_type()) {
    case at::kByte: return *static_cast<const uint8_t*>(p);
    case at::kChar: return *static_cast<const int8_t*>(p);
    case at::kUInt16: return *static_cast<const uint16_t*>(p);
    case at::kShort: return *static_cast<const int16_t*>(p);
    case at::kInt: return *static_cast<const int32_t*>(p);
    default: TORCH_CHECK_VALUE(false, "quantize_linear: an integer zero point expected, got ", zero_point->scalar_type());
  }
}

float scale_value(const at::Tensor& scale) {
  TORCH_CHECK_VALUE(scale.numel() == 1 && scale.scalar_type() == at::kFloat, "quantize_linear: one float32 scale "
                    "expected, got ", scale.numel(), " of ", scale.scalar_type());
  return *scale.data_ptr<float>();
}

template <typename T>
void quantize(const float* x, int64_t n, float scale, float zero, T* y) {
  constexpr float low = std::numeric_limits<T>::min(), high = std::numeric_limits<T>::max();
  at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float v = std::nearbyint(x[i] / scale) + zero;  // the default rounding mode: half to even
      y[i] = static_cast<T>(std::isnan(v) ? low : std::min(std::max(v, low), high));
    }
  });
}

at::Tensor quantize_linear_cpu(const at::Tensor& x, const at::Tensor& scale, const std::optional<at::Tensor>& zero_point,
                               at::ScalarType dtype) {
  TORCH_CHECK_VALUE(x.scalar_type() == at::kFloat, "quantize_linear: float32 x expected, got ", x.scalar_type());
  const at::Tensor in = x.contiguous();
  at::Tensor out = at::empty(in.sizes(), in.options().dtype(dtype));
  const float s = scale_value(scale), zero = static_cast<float>(zero_point_value(zero_point));
  const float* src = in.data_ptr<float>();
  const int64_t n = in.numel();
  switch (dtype) {
    case at::kByte: quantize(src, n, s, zero, static_cast<uint8_t*>(out.data_ptr())); break;
    case at::kChar: quantize(src, n, s, zero, static_cast<int8_t*>(out.data_ptr())); break;
    case at::kUInt16: quantize(src, n, s, zero, static_cast<uint16_t*>(out.data_ptr())); break;
    case at::kShort: quantize(src, n, s, zero, static_cast<int16_t*>(out.data_ptr())); break;
    default: TORCH_CHECK_VALUE(false, "quantize_linear: uint8, int8, uint16 or int16 output expected, got ", dtype);
  }
  return out;
}

template <typename T>
void dequantize(const T* q, int64_t n, int32_t zero, float scale, float* y) {
  at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const auto shifted = static_cast<int32_t>(static_cast<uint32_t>(static_cast<int32_t>(q[i])) -
                                                static_cast<uint32_t>(zero));
      y[i] = static_cast<float>(shifted) * scale;
    }
  });
}

at::Tensor dequantize_linear_cpu(const at::Tensor& q, const at::Tensor& scale,
                                 const std::optional<at::Tensor>& zero_point) {
  const at::Tensor in = q.contiguous();
  at::Tensor out = at::empty(in.sizes(), in.options().dtype(at::kFloat));
  const float s = scale_value(scale);
  const int32_t zero = zero_point_value(zero_point);
  float* y = out.data_ptr<float>();
  const int64_t n = in.numel();
  switch (in.scalar_type()) {
    case at::kByte: dequantize(static_cast<const uint8_t*>(in.data_ptr()), n, zero, s, y); break;
    case at::kChar: dequantize(static_cast<const int8_t*>(in.data_ptr()), n, zero, s, y); break;
    case at::kUInt16: dequantize(static_cast<const uint16_t*>(in.data_ptr()), n, zero, s, y); break;
    case at::kShort: dequantize(static_cast<const int16_t*>(in.data_ptr()), n, zero, s, y); break;
    case at::kInt: dequantize(static_cast<const int32_t*>(in.data_ptr()), n, zero, s, y); break;
    default: TORCH_CHECK_VALUE(false, "dequantize_linear: 8-, 16- or 32-bit integers expected, got ", in.scalar_type());
  }
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(onnx2torch_rnn, m) {
  m.def("quantize_linear(Tensor x, Tensor scale, Tensor? zero_point, ScalarType dtype) -> Tensor");
  m.def("dequantize_linear(Tensor q, Tensor scale, Tensor? zero_point) -> Tensor");
}

TORCH_LIBRARY_IMPL(onnx2torch_rnn, CPU, m) {
  m.impl("quantize_linear", &quantize_linear_cpu);
  m.impl("dequantize_linear", &dequantize_linear_cpu);
}

}  // namespace onnx2torch_rnn
