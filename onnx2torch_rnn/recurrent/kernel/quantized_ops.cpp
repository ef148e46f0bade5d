// onnxruntime's int8 building blocks on the CPU, for eager inference: the modules call these ops only where the
// kernel is loaded (modules/quantized.py), and their Python implementations there are the reference (same numbers,
// bit for bit) and run everywhere else (other devices, torch.compile, torch.export, no kernel).
//
//   mlas_tanh(Tensor x) -> Tensor, mlas_logistic(Tensor x) -> Tensor      float32, MLAS's approximations
//   dynamic_quantize_linear(Tensor x) -> (Tensor y, Tensor scale, Tensor zero_point)   ONNX DynamicQuantizeLinear
//   matmul_integer(Tensor a, Tensor b, Tensor? a_zero_point, Tensor? b_zero_point) -> Tensor
//       the exact int32 product (a - a_zero_point) @ (b - b_zero_point): a [..., K] (zero point scalar or per row of
//       its last matrix), b [K, N] (scalar or per column), uint8 or int8 each
//   int8_matrix_pack(Tensor b) -> (Tensor panels, Tensor column_sums)
//       b [K, N] (uint8 or int8, contiguous) in the int8 layout dynamic_quantized_matmul reads (int8 panels of this
//       build's vector width, or column by column for few columns), once per weight (the caller keeps it)
//   dynamic_quantized_matmul(Tensor x, Tensor panels, Tensor column_sums, Tensor offsets, Tensor scale, Tensor? bias)
//       -> Tensor
//       quantize_dynamic's chain DynamicQuantizeLinear -> MatMulInteger by constant b -> Cast -> Mul(x_scale *
//       b_scale) [-> Add bias] in one call: float32 x [..., K] (contiguous) quantized to uint8 over its range, the
//       exact int32 product with b (packed; offsets [N] int32: 128 for uint8 b, minus b's zero point), then
//       float32(acc) * (x_scale * scale[j]) [+ bias[j]], each step rounded (scale [1] or [N], bias [N] float32)

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <optional>
#include <vector>

#include "int8.h"  // last: from there on, no float operation is contracted

namespace onnx2torch_rnn {
namespace {

using namespace int8;

constexpr int64_t kGrain = 1 << 15;  // elements per task of the element-wise ops

template <F (*f)(F)>
at::Tensor elementwise(const at::Tensor& x) {
  TORCH_CHECK_VALUE(x.scalar_type() == at::kFloat, "MLAS's activations take float32, got ", x.scalar_type());
  const at::Tensor in = x.contiguous();
  at::Tensor out = at::empty_like(in);
  const float* src = in.data_ptr<float>();
  float* dst = out.data_ptr<float>();
  at::parallel_for(0, in.numel(), kGrain, [&](int64_t begin, int64_t end) {
    int64_t j = begin;
    for (; j + L <= end; j += L) store(dst + j, f(load(src + j)));
    if (j < end) store(dst + j, f(load(src + j, static_cast<int>(end - j))), static_cast<int>(end - j));
  });
  return out;
}

at::Tensor mlas_tanh_cpu(const at::Tensor& x) { return elementwise<mlas_tanh>(x); }
at::Tensor mlas_logistic_cpu(const at::Tensor& x) { return elementwise<mlas_logistic>(x); }

std::tuple<at::Tensor, at::Tensor, at::Tensor> dynamic_quantize_linear_cpu(const at::Tensor& x) {
  const at::Tensor in = x.to(at::kFloat).contiguous();
  const float* v = in.data_ptr<float>();
  float low = 0, high = 0;
  widen(v, in.numel(), low, high);
  const Parameters p = parameters(low, high);
  at::Tensor y = at::empty(in.sizes(), in.options().dtype(at::kByte));
  uint8_t* q = y.data_ptr<uint8_t>();
  at::parallel_for(0, in.numel(), kGrain, [&](int64_t begin, int64_t end) {
    quantize(v + begin, end - begin, p, q + begin);
  });
  return {y, at::scalar_tensor(p.scale, in.options()),
          at::scalar_tensor(p.zero_point, in.options().dtype(at::kByte))};
}

// b [K, N] as panels, block b holding columns b·G·L .. (b + 1)·G·L - 1.
Panels matrix_pack(const at::Tensor& b, int64_t blocks) {
  const int64_t columns = b.size(1);
  return pack(b, blocks, [columns](int64_t block, int g, int l) {
    const int64_t column = (block * G + g) * L + l;
    return column < columns ? column : int64_t{-1};
  });
}

// b [K, N] column by column (for few columns, where panels of 64 would be mostly zeros): data [N][K], column sums.
Panels column_pack(const at::Tensor& b) {
  const at::Tensor m = b.contiguous();
  const uint8_t* w = static_cast<const uint8_t*>(m.data_ptr());
  const int64_t K = b.size(0), N = b.size(1);
  Panels p;
  p.K = K;
  p.shift = b.scalar_type() == at::kByte ? 128 : 0;
  p.data.resize(N * K);
  p.column_sums.assign(N, 0);
  for (int64_t k = 0; k < K; ++k) {
    for (int64_t j = 0; j < N; ++j) {
      const int8_t value = static_cast<int8_t>(p.shift ? w[k * N + j] ^ 0x80 : w[k * N + j]);
      p.data[j * K + k] = value;
      p.column_sums[j] += value;
    }
  }
  return p;
}

PanelCache::Entry cached_panels(const at::Tensor& b) {
  const bool columns = by_column(b.size(1));
  return panel_cache().get(b, /*kind=*/columns ? 2 : 0, [&] {
    return std::vector<Panels>{columns ? column_pack(b) : matrix_pack(b, panel_blocks(b.size(1)))};
  });
}

// A zero point as int32 values: none (0), one, or one per index.
std::vector<int32_t> zero_points(const std::optional<at::Tensor>& zero_point, int64_t count, const char* what) {
  if (!zero_point) return std::vector<int32_t>(1, 0);
  const at::Tensor z = zero_point->to(at::kInt).contiguous().view({-1});
  TORCH_CHECK_VALUE(z.numel() == 1 || z.numel() == count, "matmul_integer: ", what, " zero point of ", z.numel(),
                    " values, expected 1 or ", count);
  return std::vector<int32_t>(z.data_ptr<int32_t>(), z.data_ptr<int32_t>() + z.numel());
}

at::Tensor matmul_integer_cpu(const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& a_zero_point,
                              const std::optional<at::Tensor>& b_zero_point) {
  for (const at::Tensor* t : {&a, &b})
    TORCH_CHECK_VALUE(t->scalar_type() == at::kByte || t->scalar_type() == at::kChar,
                      "matmul_integer: uint8 or int8 operands expected, got ", t->scalar_type());
  TORCH_CHECK_VALUE(a.dim() >= 1 && b.dim() == 2 && a.size(-1) == b.size(0),
                    "matmul_integer: a [..., K] and b [K, N] expected, got ", a.sizes(), " and ", b.sizes());
  const int64_t K = b.size(0), N = b.size(1), M = c10::multiply_integers(a.sizes().begin(), a.sizes().end() - 1);
  const int64_t matrix_rows = a.dim() >= 2 ? a.size(-2) : 1;
  const std::vector<int32_t> za = zero_points(a_zero_point, matrix_rows, "a's");
  const std::vector<int32_t> zb = zero_points(b_zero_point, N, "b's");
  // a as uint8 (int8 shifted by 128, its zero point with it), each row padded to whole groups of four
  const int32_t a_shift = a.scalar_type() == at::kChar ? 128 : 0;
  const at::Tensor a2 = a.reshape({M, K}).contiguous();
  Quantized rows(M, K);
  for (int64_t i = 0; i < M; ++i) {
    const uint8_t* src = static_cast<const uint8_t*>(a2.data_ptr()) + i * K;
    uint8_t* dst = rows.q.data() + i * rows.lda;
    int32_t sum = 0;
    for (int64_t k = 0; k < K; ++k) {
      dst[k] = static_cast<uint8_t>(src[k] ^ (a_shift ? 0x80 : 0));
      sum += dst[k];
    }
    rows.sums[i] = sum;
  }
  const PanelCache::Entry panels = cached_panels(b);
  const Panels& w = (*panels)[0];
  std::vector<int32_t> offsets(panel_blocks(N) * G * L, 0);  // b - zero point = int8 panel value + offset
  for (int64_t j = 0; j < N; ++j) offsets[j] = w.shift - zb[zb.size() == 1 ? 0 : j];
  auto row_zero = [&](int64_t i) { return za[za.size() == 1 ? 0 : i % matrix_rows] + a_shift; };

  std::vector<int64_t> shape = a.sizes().vec();
  shape.back() = N;
  at::Tensor out = at::empty(shape, a.options().dtype(at::kInt));
  int32_t* y = out.data_ptr<int32_t>();
  products(rows, M, K, by_column(N), w.data.data(), w.column_sums.data(), N, offsets.data(), row_zero,
           [&](int64_t i, int64_t j0, I exact, int count) { store(y + i * N + j0, exact, count); });
  return out;
}

// The one place this file's new ops allocate their outputs.
at::Tensor allocate(at::IntArrayRef sizes, at::ScalarType dtype) {
  return at::empty(sizes, at::TensorOptions().dtype(dtype));
}

std::tuple<at::Tensor, at::Tensor> int8_matrix_pack_cpu(const at::Tensor& b) {
  TORCH_CHECK_VALUE(b.dim() == 2 && (b.scalar_type() == at::kByte || b.scalar_type() == at::kChar) &&
                        b.is_contiguous(), "int8_matrix_pack: a contiguous uint8 or int8 matrix expected");
  const Panels p = by_column(b.size(1)) ? column_pack(b) : matrix_pack(b, panel_blocks(b.size(1)));
  at::Tensor data = allocate({static_cast<int64_t>(p.data.size())}, at::kChar);
  at::Tensor sums = allocate({static_cast<int64_t>(p.column_sums.size())}, at::kInt);
  std::memcpy(data.data_ptr(), p.data.data(), p.data.size());
  std::memcpy(sums.data_ptr(), p.column_sums.data(), sizeof(int32_t) * p.column_sums.size());
  return {data, sums};
}

// count values (1: one for every column) as a vector padded with zeros to `padded` values.
template <typename T>
std::vector<T> per_column(const T* values, int64_t count, int64_t N, int64_t padded) {
  std::vector<T> out(padded, T{0});
  for (int64_t j = 0; j < N; ++j) out[j] = values[count == 1 ? 0 : j];
  return out;
}

at::Tensor dynamic_quantized_matmul_cpu(const at::Tensor& x, const at::Tensor& panels, const at::Tensor& column_sums,
                                        const at::Tensor& offsets, const at::Tensor& scale,
                                        const std::optional<at::Tensor>& bias) {
  // dtypes, shapes and contiguity as the caller (modules/quantized.py) checked them; the layout's size re-checked
  const int64_t K = x.size(-1), N = offsets.numel();
  int64_t M = 1;
  for (int64_t d = 0; d + 1 < x.dim(); ++d) M *= x.size(d);
  const int64_t padded = panel_blocks(N) * G * L;
  TORCH_CHECK_VALUE(panels.numel() == packed_size(K, N) &&
                        column_sums.numel() == (by_column(N) ? N : padded),
                    "dynamic_quantized_matmul: panels not packed by int8_matrix_pack for this x");
  const float* v = x.data_ptr<float>();
  float low = 0, high = 0;
  widen(v, x.numel(), low, high);
  Quantized rows(M, K);
  static_cast<Parameters&>(rows) = parameters(low, high);
  for (int64_t i = 0; i < M; ++i) rows.sums[i] = quantize(v + i * K, K, rows, rows.q.data() + i * rows.lda);
  const std::vector<int32_t> offset = per_column(offsets.data_ptr<int32_t>(), N, N, padded);
  const std::vector<float> multiplier = per_column(scale.data_ptr<float>(), scale.numel(), N, padded);
  const std::vector<float> add = bias ? per_column(bias->data_ptr<float>(), N, N, padded) : std::vector<float>();
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = N;
  at::Tensor out = allocate(shape, at::kFloat);
  float* y = out.data_ptr<float>();
  const float x_scale = rows.scale;
  const int32_t zero = rows.zero_point;
  products(rows, M, K, by_column(N), static_cast<const int8_t*>(panels.data_ptr()), column_sums.data_ptr<int32_t>(), N,
           offset.data(), [zero](int64_t) { return zero; }, [&](int64_t i, int64_t j0, I exact, int count) {
             F value = __builtin_convertvector(exact, F) * (x_scale * load(multiplier.data() + j0));
             if (bias) value = value + load(add.data() + j0);
             store(y + i * N + j0, value, count);
           });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(onnx2torch_rnn, m) {
  m.def("mlas_tanh(Tensor x) -> Tensor");
  m.def("mlas_logistic(Tensor x) -> Tensor");
  m.def("dynamic_quantize_linear(Tensor x) -> (Tensor, Tensor, Tensor)");
  m.def("matmul_integer(Tensor a, Tensor b, Tensor? a_zero_point, Tensor? b_zero_point) -> Tensor");
  m.def("int8_matrix_pack(Tensor b) -> (Tensor, Tensor)");
  m.def("dynamic_quantized_matmul(Tensor x, Tensor panels, Tensor column_sums, Tensor offsets, Tensor scale, "
        "Tensor? bias) -> Tensor");
}

TORCH_LIBRARY_IMPL(onnx2torch_rnn, CPU, m) {
  m.impl("mlas_tanh", &mlas_tanh_cpu);
  m.impl("mlas_logistic", &mlas_logistic_cpu);
  m.impl("dynamic_quantize_linear", &dynamic_quantize_linear_cpu);
  m.impl("matmul_integer", &matmul_integer_cpu);
  m.impl("int8_matrix_pack", &int8_matrix_pack_cpu);
  m.impl("dynamic_quantized_matmul", &dynamic_quantized_matmul_cpu);
}

}  // namespace onnx2torch_rnn
