// onnxruntime's int8 building blocks on the CPU, for eager inference: the modules call these ops only where the
// kernel is loaded (modules/quantized.py), and their Python implementations there are the reference (same numbers,
// bit for bit) and run everywhere else (other devices, torch.compile, torch.export, no kernel).
//
//   mlas_tanh(Tensor x) -> Tensor, mlas_logistic(Tensor x) -> Tensor      float32, MLAS's approximations
//   dynamic_quantize_linear(Tensor x) -> (Tensor y, Tensor scale, Tensor zero_point)   ONNX DynamicQuantizeLinear
//   matmul_integer(Tensor a, Tensor panels, Tensor column_sums, Tensor offsets, Tensor? a_zero_point) -> Tensor
//       the exact int32 product (a - a_zero_point) @ (b - b_zero_point): a [..., K] (uint8 or int8; zero point
//       scalar or per row of its last matrix), b [K, N] packed by int8_matrix_pack, offsets [N] int32 (128 for
//       uint8 b, minus b's zero point, per column); the caller keeps b's packing (modules/quantized.py)
//   int8_matrix_pack(Tensor b) -> (Tensor panels, Tensor column_sums)
//       b [K, N] (uint8 or int8, contiguous) in the int8 layout dynamic_quantized_matmul reads (int8 panels of this
//       build's vector width, or column by column for few columns), once per weight (the caller keeps it)
//   dynamic_quantized_matmul(Tensor x, Tensor panels, Tensor column_sums, Tensor offsets, Tensor scale, Tensor? bias)
//       -> Tensor
//       quantize_dynamic's chain DynamicQuantizeLinear -> MatMulInteger by constant b -> Cast -> Mul(x_scale *
//       b_scale) [-> Add bias] in one call: float32 x [..., K] (contiguous) quantized to uint8 over its range, the
//       exact int32 product with b (packed; offsets [N] int32: 128 for uint8 b, minus b's zero point), then
//       float32(acc) * (x_scale * scale[j]) [+ bias[j]], each step rounded (scale [1] or [N], bias [N] float32)
//   take(Tensor x, Tensor index) -> Tensor
//       torch.take without its dispatch: x's values (contiguous, any type) at the flat int64 indices `index`
//       (contiguous), shaped as index (a nearest Resize's gather of a small image: modules/nn.py)

#define TORCH_STABLE_ONLY  // PyTorch's stable ABI (int8.h)
#include <torch/csrc/stable/library.h>

#include <optional>
#include <vector>

#include "int8.h"  // last: from there on, no float operation is contracted

namespace onnx2torch_rnn {
namespace {

using namespace int8;

constexpr int64_t kGrain = 1 << 15;  // elements per task of the element-wise ops

template <F (*f)(F)>
Tensor elementwise(const Tensor& x) {
  CHECK_VALUE(x.scalar_type() == ScalarType::Float, "MLAS's activations take float32, got ", x.scalar_type());
  const Tensor in = dense(x);
  Tensor out = allocate(sizes_of(in), ScalarType::Float);
  const float* src = in.const_data_ptr<float>();
  float* dst = out.mutable_data_ptr<float>();
  torch::stable::parallel_for(0, in.numel(), kGrain, [&](int64_t begin, int64_t end) {
    int64_t j = begin;
    for (; j + L <= end; j += L) store(dst + j, f(load(src + j)));
    if (j < end) store(dst + j, f(load(src + j, static_cast<int>(end - j))), static_cast<int>(end - j));
  });
  return out;
}

Tensor mlas_tanh_cpu(const Tensor& x) { return elementwise<mlas_tanh>(x); }
Tensor mlas_logistic_cpu(const Tensor& x) { return elementwise<mlas_logistic>(x); }

std::tuple<Tensor, Tensor, Tensor> dynamic_quantize_linear_cpu(const Tensor& x) {
  const Tensor in = floats(x);
  const float* v = in.const_data_ptr<float>();
  float low = 0, high = 0;
  widen(v, in.numel(), low, high);
  const Parameters p = parameters(low, high);
  Tensor y = allocate(sizes_of(in), ScalarType::Byte);
  uint8_t* q = y.mutable_data_ptr<uint8_t>();
  torch::stable::parallel_for(0, in.numel(), kGrain, [&](int64_t begin, int64_t end) {
    quantize(v + begin, end - begin, p, q + begin);
  });
  Tensor scale = allocate({}, ScalarType::Float), zero_point = allocate({}, ScalarType::Byte);
  *scale.mutable_data_ptr<float>() = p.scale;
  *zero_point.mutable_data_ptr<uint8_t>() = static_cast<uint8_t>(p.zero_point);
  return {y, scale, zero_point};
}

// b [K, N] (contiguous) as panels, block b holding columns b·G·L .. (b + 1)·G·L - 1.
Panels matrix_pack(const Tensor& b, int64_t blocks) {
  const uint8_t* w = static_cast<const uint8_t*>(b.const_data_ptr());
  const int64_t columns = b.size(1);
  return pack_values(b.size(0), blocks, b.scalar_type() == ScalarType::Byte,
                     [w, columns](int64_t k, int64_t source) { return w[k * columns + source]; },
                     [columns](int64_t block, int g, int l) {
                       const int64_t column = (block * G + g) * L + l;
                       return column < columns ? column : int64_t{-1};
                     });
}

// b [K, N] (contiguous) column by column (for few columns, where panels of 64 would be mostly zeros): data [N][K],
// column sums.
Panels column_pack(const Tensor& b) {
  const uint8_t* w = static_cast<const uint8_t*>(b.const_data_ptr());
  const int64_t K = b.size(0), N = b.size(1);
  Panels p;
  p.K = K;
  p.shift = b.scalar_type() == ScalarType::Byte ? 128 : 0;
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

// count values (1: one for every column) as a vector padded with zeros to `padded` values.
template <typename T>
std::vector<T> per_column(const T* values, int64_t count, int64_t N, int64_t padded) {
  std::vector<T> out(padded, T{0});
  for (int64_t j = 0; j < N; ++j) out[j] = values[count == 1 ? 0 : j];
  return out;
}

// The layout's size re-checked (the caller packed b with int8_matrix_pack for K rows, N columns).
void check_packed(const Tensor& panels, const Tensor& column_sums, int64_t K, int64_t N, const char* op) {
  const int64_t padded = panel_blocks(N) * G * L;
  CHECK_VALUE(panels.scalar_type() == ScalarType::Char && panels.is_contiguous() &&
                  column_sums.scalar_type() == ScalarType::Int && column_sums.is_contiguous() &&
                  panels.numel() == packed_size(K, N) &&
                  column_sums.numel() == (by_column(N) ? N : padded),
              op, ": panels not packed by int8_matrix_pack for this x");
}

Tensor matmul_integer_cpu(const Tensor& a, const Tensor& panels, const Tensor& column_sums, const Tensor& offsets,
                          const std::optional<Tensor>& a_zero_point) {
  CHECK_VALUE(a.scalar_type() == ScalarType::Byte || a.scalar_type() == ScalarType::Char,
              "matmul_integer: uint8 or int8 a expected, got ", a.scalar_type());
  CHECK_VALUE(offsets.scalar_type() == ScalarType::Int && offsets.is_contiguous() && a.dim() >= 1,
              "matmul_integer: a [..., K] and int32 offsets [N] expected");
  const int64_t K = a.size(-1), N = offsets.numel();
  check_packed(panels, column_sums, K, N, "matmul_integer");
  int64_t M = 1;
  for (int64_t d = 0; d + 1 < a.dim(); ++d) M *= a.size(d);
  const int64_t matrix_rows = a.dim() >= 2 ? a.size(-2) : 1;
  const std::vector<int32_t> za = zero_points(a_zero_point, matrix_rows, "matmul_integer: a's");
  // a as uint8 (int8 shifted by 128, its zero point with it), each row padded to whole groups of four
  const int32_t a_shift = a.scalar_type() == ScalarType::Char ? 128 : 0;
  const Tensor a2 = dense(a);
  Quantized rows(M, K);
  for (int64_t i = 0; i < M; ++i) {
    const uint8_t* src = static_cast<const uint8_t*>(a2.const_data_ptr()) + i * K;
    uint8_t* dst = rows.q.data() + i * rows.lda;
    int32_t sum = 0;
    for (int64_t k = 0; k < K; ++k) {
      dst[k] = static_cast<uint8_t>(src[k] ^ (a_shift ? 0x80 : 0));
      sum += dst[k];
    }
    rows.sums[i] = sum;
  }
  const std::vector<int32_t> offset = per_column(offsets.const_data_ptr<int32_t>(), N, N, panel_blocks(N) * G * L);
  auto row_zero = [&](int64_t i) { return za[za.size() == 1 ? 0 : i % matrix_rows] + a_shift; };

  std::vector<int64_t> shape = sizes_of(a);
  shape.back() = N;
  Tensor out = allocate(shape, ScalarType::Int);
  int32_t* y = out.mutable_data_ptr<int32_t>();
  products(rows, M, K, by_column(N), panels.const_data_ptr<int8_t>(), column_sums.const_data_ptr<int32_t>(), N,
           offset.data(), row_zero, [&](int64_t i, int64_t j0, I exact, int count) { store(y + i * N + j0, exact, count); });
  return out;
}

std::tuple<Tensor, Tensor> int8_matrix_pack_cpu(const Tensor& b) {
  CHECK_VALUE(b.dim() == 2 && (b.scalar_type() == ScalarType::Byte || b.scalar_type() == ScalarType::Char) &&
                  b.is_contiguous(), "int8_matrix_pack: a contiguous uint8 or int8 matrix expected");
  const Panels p = by_column(b.size(1)) ? column_pack(b) : matrix_pack(b, panel_blocks(b.size(1)));
  Tensor data = allocate({static_cast<int64_t>(p.data.size())}, ScalarType::Char);
  Tensor sums = allocate({static_cast<int64_t>(p.column_sums.size())}, ScalarType::Int);
  if (!p.data.empty()) std::memcpy(data.mutable_data_ptr(), p.data.data(), p.data.size());
  if (!p.column_sums.empty())
    std::memcpy(sums.mutable_data_ptr(), p.column_sums.data(), sizeof(int32_t) * p.column_sums.size());
  return {data, sums};
}

Tensor dynamic_quantized_matmul_cpu(const Tensor& x, const Tensor& panels, const Tensor& column_sums,
                                    const Tensor& offsets, const Tensor& scale, const std::optional<Tensor>& bias) {
  // dtypes, shapes and contiguity as the caller (modules/quantized.py) checked them; the layout's size re-checked
  CHECK_VALUE(x.scalar_type() == ScalarType::Float && x.is_contiguous() && x.dim() >= 1,
              "dynamic_quantized_matmul: contiguous float32 x expected");
  const int64_t K = x.size(-1), N = offsets.numel();
  int64_t M = 1;
  for (int64_t d = 0; d + 1 < x.dim(); ++d) M *= x.size(d);
  const int64_t padded = panel_blocks(N) * G * L;
  check_packed(panels, column_sums, K, N, "dynamic_quantized_matmul");
  const float* v = x.const_data_ptr<float>();
  float low = 0, high = 0;
  widen(v, x.numel(), low, high);
  Quantized rows(M, K);
  static_cast<Parameters&>(rows) = parameters(low, high);
  for (int64_t i = 0; i < M; ++i) rows.sums[i] = quantize(v + i * K, K, rows, rows.q.data() + i * rows.lda);
  const std::vector<int32_t> offset = per_column(offsets.const_data_ptr<int32_t>(), N, N, padded);
  const std::vector<float> multiplier = per_column(scale.const_data_ptr<float>(), scale.numel(), N, padded);
  const std::vector<float> add = bias ? per_column(bias->const_data_ptr<float>(), N, N, padded) : std::vector<float>();
  std::vector<int64_t> shape = sizes_of(x);
  shape.back() = N;
  Tensor out = allocate(shape, ScalarType::Float);
  float* y = out.mutable_data_ptr<float>();
  const float x_scale = rows.scale;
  const int32_t zero = rows.zero_point;
  products(rows, M, K, by_column(N), panels.const_data_ptr<int8_t>(), column_sums.const_data_ptr<int32_t>(), N,
           offset.data(), [zero](int64_t) { return zero; }, [&](int64_t i, int64_t j0, I exact, int count) {
             F value = __builtin_convertvector(exact, F) * (x_scale * load(multiplier.data() + j0));
             if (bias) value = value + load(add.data() + j0);
             store(y + i * N + j0, value, count);
           });
  return out;
}

template <typename T>
void gather(const Tensor& x, const int64_t* index, int64_t n, Tensor& out) {
  const T* src = static_cast<const T*>(x.const_data_ptr());
  T* dst = static_cast<T*>(out.mutable_data_ptr());
  for (int64_t i = 0; i < n; ++i) dst[i] = src[index[i]];
}

Tensor take_cpu(const Tensor& x, const Tensor& index) {
  CHECK_VALUE(x.is_contiguous() && index.is_contiguous() && index.scalar_type() == ScalarType::Long,
              "take: contiguous x and int64 index expected");
  const int64_t n = index.numel(), size = x.numel();
  const int64_t* at = index.const_data_ptr<int64_t>();
  int64_t low = 0, high = 0;  // one check after a loop without branches
  for (int64_t i = 0; i < n; ++i) {
    low = std::min(low, at[i]);
    high = std::max(high, at[i]);
  }
  CHECK_VALUE(low >= 0 && (n == 0 || high < size), "take: an index out of range");
  Tensor out = allocate(sizes_of(index), x.scalar_type());
  switch (x.element_size()) {  // the values moved as they are, by their size
    case 1: gather<uint8_t>(x, at, n, out); break;
    case 2: gather<uint16_t>(x, at, n, out); break;
    case 4: gather<uint32_t>(x, at, n, out); break;
    case 8: gather<uint64_t>(x, at, n, out); break;
    default: CHECK_VALUE(false, "take: values of 1, 2, 4 or 8 bytes expected");
  }
  return out;
}

}  // namespace

STABLE_TORCH_LIBRARY_FRAGMENT(onnx2torch_rnn, m) {
  m.def("mlas_tanh(Tensor x) -> Tensor");
  m.def("mlas_logistic(Tensor x) -> Tensor");
  m.def("dynamic_quantize_linear(Tensor x) -> (Tensor, Tensor, Tensor)");
  m.def("matmul_integer(Tensor a, Tensor panels, Tensor column_sums, Tensor offsets, Tensor? a_zero_point) -> Tensor");
  m.def("int8_matrix_pack(Tensor b) -> (Tensor, Tensor)");
  m.def("dynamic_quantized_matmul(Tensor x, Tensor panels, Tensor column_sums, Tensor offsets, Tensor scale, "
        "Tensor? bias) -> Tensor");
  m.def("take(Tensor x, Tensor index) -> Tensor");
}

STABLE_TORCH_LIBRARY_IMPL(onnx2torch_rnn, CPU, m) {
  m.impl("mlas_tanh", TORCH_BOX(&mlas_tanh_cpu));
  m.impl("mlas_logistic", TORCH_BOX(&mlas_logistic_cpu));
  m.impl("dynamic_quantize_linear", TORCH_BOX(&dynamic_quantize_linear_cpu));
  m.impl("matmul_integer", TORCH_BOX(&matmul_integer_cpu));
  m.impl("int8_matrix_pack", TORCH_BOX(&int8_matrix_pack_cpu));
  m.impl("dynamic_quantized_matmul", TORCH_BOX(&dynamic_quantized_matmul_cpu));
  m.impl("take", TORCH_BOX(&take_cpu));
}

}  // namespace onnx2torch_rnn
