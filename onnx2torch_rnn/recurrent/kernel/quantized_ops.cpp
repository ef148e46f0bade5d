// onnxruntime's int8 building blocks on the CPU, for eager inference: the modules call these ops only where the
// kernel is loaded (modules/quantized.py), and their Python implementations there are the reference (same numbers,
// bit for bit) and run everywhere else (other devices, torch.compile, torch.export, no kernel).
//
//   mlas_tanh(Tensor x) -> Tensor, mlas_logistic(Tensor x) -> Tensor      float32, MLAS's approximations
//   dynamic_quantize_linear(Tensor x) -> (Tensor y, Tensor scale, Tensor zero_point)   ONNX DynamicQuantizeLinear
//   matmul_integer(Tensor a, Tensor b, Tensor? a_zero_point, Tensor? b_zero_point) -> Tensor
//       the exact int32 product (a - a_zero_point) @ (b - b_zero_point): a [..., K] (zero point scalar or per row of
//       its last matrix), b [K, N] (scalar or per column), uint8 or int8 each

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
PanelCache::Entry matrix_panels(const at::Tensor& b, int64_t blocks) {
  const int64_t columns = b.size(1);
  return panel_cache().get(b, /*kind=*/0, [&] {
    return std::vector<Panels>{pack(b, blocks, [columns](int64_t block, int g, int l) {
      const int64_t column = (block * G + g) * L + l;
      return column < columns ? column : int64_t{-1};
    })};
  });
}

// b [K, N] column by column (for few columns, where panels of 64 would be mostly zeros): data [N][K], column sums.
PanelCache::Entry column_panels(const at::Tensor& b) {
  return panel_cache().get(b, /*kind=*/2, [&] {
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
    return std::vector<Panels>{std::move(p)};
  });
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
  const int64_t blocks = (N + G * L - 1) / (G * L);
  const bool by_column = N < 32;
  const PanelCache::Entry panels = by_column ? column_panels(b) : matrix_panels(b, blocks);
  const Panels& w = (*panels)[0];
  std::vector<int32_t> offsets(blocks * G * L, 0);  // b - zero point = int8 panel value + offset, per column
  for (int64_t j = 0; j < N; ++j) offsets[j] = w.shift - zb[zb.size() == 1 ? 0 : j];
  auto row_zero = [&](int64_t i) { return za[za.size() == 1 ? 0 : i % matrix_rows] + a_shift; };

  std::vector<int64_t> shape = a.sizes().vec();
  shape.back() = N;
  at::Tensor out = at::empty(shape, a.options().dtype(at::kInt));
  int32_t* y = out.data_ptr<int32_t>();
  if (by_column) {
    for (int64_t i = 0; i < M; ++i) {
      const int32_t zero = row_zero(i), row = rows.sums[i] - zero * static_cast<int32_t>(K);
      for (int64_t j = 0; j < N; ++j) {
        const int32_t dot = dot_row(rows.q.data() + i * rows.lda, w.data.data() + j * K, K);
        y[i * N + j] = dot - zero * w.column_sums[j] + offsets[j] * row;
      }
    }
    return out;
  }
  for (int64_t block = 0; block < blocks; ++block) {
    const int8_t* panel = w.data.data() + block * w.K4 * G * L * 4;
    const int32_t* sums = w.column_sums.data() + block * G * L;
    tiles(rows.q.data(), rows.lda, M, panel, w.K4, [&](int64_t n0, auto& acc) {
      for (int m = 0; m < static_cast<int>(sizeof(acc) / sizeof(acc[0])); ++m) {
        const int64_t i = n0 + m;
        const int32_t zero = row_zero(i);
        const int32_t row = rows.sums[i] - zero * static_cast<int32_t>(K);
        for (int g = 0; g < G; ++g) {
          const int64_t column = (block * G + g) * L;
          if (column >= N) break;
          const I exact = acc[m][g] - zero * load(sums + g * L) + load(offsets.data() + column) * row;
          store(y + i * N + column, exact, static_cast<int>(std::min<int64_t>(L, N - column)));
        }
      }
    });
  }
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(onnx2torch_rnn, m) {
  m.def("mlas_tanh(Tensor x) -> Tensor");
  m.def("mlas_logistic(Tensor x) -> Tensor");
  m.def("dynamic_quantize_linear(Tensor x) -> (Tensor, Tensor, Tensor)");
  m.def("matmul_integer(Tensor a, Tensor b, Tensor? a_zero_point, Tensor? b_zero_point) -> Tensor");
}

TORCH_LIBRARY_IMPL(onnx2torch_rnn, CPU, m) {
  m.impl("mlas_tanh", &mlas_tanh_cpu);
  m.impl("mlas_logistic", &mlas_logistic_cpu);
  m.impl("dynamic_quantize_linear", &dynamic_quantize_linear_cpu);
  m.impl("matmul_integer", &matmul_integer_cpu);
}

}  // namespace onnx2torch_rnn
