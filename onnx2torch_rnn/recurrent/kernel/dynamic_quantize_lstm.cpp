// com.microsoft DynamicQuantizeLSTM on the CPU in one call: the CPU implementation of the
// onnx2torch_rnn::dynamic_quantize_lstm op. Its Python implementation (modules/quantized.py: IntegerProducts,
// quantized_lstm_step) is this kernel's reference and fallback, and says which float operations onnxruntime does in
// which order; the numbers here are the same, bit for bit.
//
// - Integer products: the float operand quantized to uint8 on the fly (X once over the steps up to the longest row,
//   the state once per step and direction), times the weights as int8 (uint8 weights shifted by 128), exact in
//   int32 in any order; the zero points enter as row and column sums. With AVX-512 VNNI in the build's target,
//   vpdpbusd (uint8 x int8, four products per int32 lane); elsewhere the same sums on plain int32 vectors.
// - The float work around them in onnxruntime's order, each operation rounded to float32: no multiply and add is
//   contracted into a fused multiply-add in this file (the pragma below), and MLAS's own fused multiply-adds (its
//   sigmoid and tanh) are explicit.
// - The weights are packed once per weight version, for each block of 16 hidden units every gate's columns, four
//   rows per int32 lane: one pass over a block yields all four gates, and the gate equations run on the
//   accumulators at once.

#include <ATen/ATen.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/library.h>
#if defined(__AVX512VNNI__) && defined(__AVX512F__)
#include <immintrin.h>
#define ONNX2TORCH_RNN_VNNI 1
#endif

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "config.h"
#include "vec.h"

// Every float operation below rounds on its own, as onnxruntime's code (built without FMA contraction) does.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

namespace onnx2torch_rnn {
namespace {

constexpr int L = 16;  // hidden units per block: int32/float lanes of a 64-byte vector
constexpr int G = 4;   // gates, in ONNX order i o f c
constexpr int kRows = 4;  // rows per register tile
using F = V<float>;
using I = V<int32_t>;

// ---- the weights ----------------------------------------------------------------------------------------------------

// One direction's weights M [K, 4H] (ONNX's W[d] or R[d]) as int8 panels: [blocks][K4][G][L][4], for block b the
// columns g·H + b·L + l of every gate g, rows 4·k4 .. 4·k4 + 3 in the four bytes of lane l (zeros past K and H).
struct Panels {
  std::vector<int8_t> data;
  std::vector<int32_t> column_sums;  // [blocks][G][L]: Σ_k of the int8 values
  int32_t offset = 0;                // w - zero point = int8 value + offset
  int64_t K = 0, K4 = 0;
};

Panels pack(const at::Tensor& M, int64_t hidden, int64_t blocks, int32_t zero_point) {
  const bool unsigned_weights = M.scalar_type() == at::kByte;
  const at::Tensor m = M.contiguous();
  const uint8_t* w = static_cast<const uint8_t*>(m.data_ptr());
  Panels p;
  p.K = M.size(0);
  p.K4 = (p.K + 3) / 4;
  p.offset = (unsigned_weights ? 128 : 0) - zero_point;
  p.data.assign(blocks * p.K4 * G * L * 4, 0);
  p.column_sums.assign(blocks * G * L, 0);
  const int64_t columns = G * hidden;
  for (int64_t k = 0; k < p.K; ++k) {
    for (int g = 0; g < G; ++g) {
      for (int64_t j = 0; j < hidden; ++j) {
        const uint8_t raw = w[k * columns + g * hidden + j];
        const int8_t value = static_cast<int8_t>(unsigned_weights ? raw ^ 0x80 : raw);  // uint8: minus 128
        const int64_t b = j / L, l = j % L;
        p.data[(((b * p.K4 + k / 4) * G + g) * L + l) * 4 + k % 4] = value;
        p.column_sums[(b * G + g) * L + l] += value;
      }
    }
  }
  return p;
}

// Packed weights per weight tensor, zero points and version: a weight modified in place bumps its version counter;
// a new tensor has a new identity (held weakly: a freed tensor's address may be reused). Inference tensors have no
// version counter: they are packed at every call.
class PanelCache {
 public:
  using Entry = std::shared_ptr<const std::vector<Panels>>;  // per direction

  Entry get(const at::Tensor& M, int64_t hidden, int64_t blocks, const std::vector<int32_t>& zero_points) {
    const bool cacheable = !M.is_inference();
    if (cacheable) {
      std::lock_guard<std::mutex> lock(mutex_);
      for (auto it = entries_.begin(); it != entries_.end(); ++it) {
        const Key& k = it->first;
        if (k.version == M._version() && k.data == M.data_ptr() && k.zero_points == zero_points &&
            k.tensor.lock().get() == M.unsafeGetTensorImpl()) {
          entries_.splice(entries_.begin(), entries_, it);
          return it->second;
        }
      }
    }
    auto packed = std::make_shared<std::vector<Panels>>();
    for (int64_t d = 0; d < M.size(0); ++d) packed->push_back(pack(M[d], hidden, blocks, zero_points[d]));
    if (cacheable) {
      std::lock_guard<std::mutex> lock(mutex_);
      Key key{c10::weak_intrusive_ptr<c10::TensorImpl>(M.getIntrusivePtr()), M._version(), M.data_ptr(), zero_points};
      entries_.emplace_front(std::move(key), packed);
      if (entries_.size() > kCapacity) entries_.pop_back();
    }
    return packed;
  }

 private:
  struct Key {
    c10::weak_intrusive_ptr<c10::TensorImpl> tensor;
    int64_t version;
    const void* data;
    std::vector<int32_t> zero_points;
  };
  static constexpr size_t kCapacity = 64;
  std::mutex mutex_;
  std::list<std::pair<Key, Entry>> entries_;
};

PanelCache& panel_cache() {
  static PanelCache cache;
  return cache;
}

// ---- integer products -----------------------------------------------------------------------------------------------

// acc[m][g] = Σ_k a[m, k] · panel[k, g, :] (exact int32) for MR rows of uint8 a (row stride lda, zeros past K up to
// 4·K4) and one block's panel, with U independent partial sums over k to keep enough products in flight.
template <int MR>
__attribute__((noinline)) void dot(const uint8_t* a, int64_t lda, const int8_t* panel, int64_t K4, I (&acc)[MR][G]) {
  constexpr int U = MR >= 3 ? 1 : MR == 2 ? 2 : 3;
  int64_t k = 0;
#ifdef ONNX2TORCH_RNN_VNNI
  __m512i part[U][MR][G];
  for (int u = 0; u < U; ++u)
    for (int m = 0; m < MR; ++m)
      for (int g = 0; g < G; ++g) part[u][m][g] = _mm512_setzero_si512();
  auto step = [&](int u, int64_t at) {
    __m512i w[G];
    for (int g = 0; g < G; ++g) w[g] = _mm512_loadu_si512(panel + (at * G + g) * L * 4);
    for (int m = 0; m < MR; ++m) {
      int32_t four;
      std::memcpy(&four, a + m * lda + at * 4, 4);
      const __m512i x = _mm512_set1_epi32(four);
      for (int g = 0; g < G; ++g) part[u][m][g] = _mm512_dpbusd_epi32(part[u][m][g], x, w[g]);
    }
  };
  for (; k + U <= K4; k += U) {
#pragma GCC unroll 4
    for (int u = 0; u < U; ++u) step(u, k + u);
  }
  for (; k < K4; ++k) step(0, k);
  for (int m = 0; m < MR; ++m) {
    for (int g = 0; g < G; ++g) {
      __m512i sum = part[0][m][g];
      for (int u = 1; u < U; ++u) sum = _mm512_add_epi32(sum, part[u][m][g]);
      acc[m][g] = (I)sum;
    }
  }
#else
  // The four int8 values of each lane, sign-extended by shifts, times the four uint8 values of the row.
  I part[U][MR][G] = {};
  auto step = [&](int u, int64_t at) {
    for (int g = 0; g < G; ++g) {
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
    for (int g = 0; g < G; ++g) {
      acc[m][g] = part[0][m][g];
      for (int u = 1; u < U; ++u) acc[m][g] += part[u][m][g];
    }
  }
#endif
}

// Calls f(n0, acc) for each tile of up to kRows of `rows` rows of a, after the tile's products with one block.
template <typename Fn>
void tiles(const uint8_t* a, int64_t lda, int64_t rows, const int8_t* panel, int64_t K4, Fn&& f) {
  int64_t n = 0;
  for (; n + kRows <= rows; n += kRows) {
    I acc[kRows][G];
    dot<kRows>(a + n * lda, lda, panel, K4, acc);
    f(n, acc);
  }
  switch (rows - n) {
    case 1: { I acc[1][G]; dot<1>(a + n * lda, lda, panel, K4, acc); f(n, acc); break; }
    case 2: { I acc[2][G]; dot<2>(a + n * lda, lda, panel, K4, acc); f(n, acc); break; }
    case 3: { I acc[3][G]; dot<3>(a + n * lda, lda, panel, K4, acc); f(n, acc); break; }
    default: break;
  }
}

// ---- dynamic quantization -------------------------------------------------------------------------------------------

// round half to even of a float32 integer-or-not in [-2^22, 2^22]
inline F round_even(F x) {
  const float magic = 12582912.0f;  // 1.5 · 2^23
  return (x + magic) - magic;
}

struct Quantized {  // uint8 rows with what the products need
  float scale = 1;
  int32_t zero_point = 0;
  std::vector<uint8_t> q;      // [rows][lda], zeros past the row's values
  std::vector<int32_t> sums;   // per row, Σ q
  int64_t lda = 0;
};

// The range [min(v, 0), max(v, 0)] of `count` rows of `size` floats (stride ld), skipping rows for which zero(n):
// onnxruntime's dynamic quantization parameters (modules/quantized.py: dynamic_parameters), in float32.
template <typename Zero>
void parameters(const float* v, int64_t ld, int64_t count, int64_t size, Zero zero, Quantized& out) {
  float low = 0, high = 0;
  for (int64_t n = 0; n < count; ++n) {
    if (zero(n)) continue;
    const float* row = v + n * ld;
    for (int64_t j = 0; j < size; ++j) {
      low = std::min(low, row[j]);
      high = std::max(high, row[j]);
    }
  }
  out.scale = high == low ? 1.0f : (high - low) / 255.0f;
  const float zero_point = 0.0f - low / out.scale;
  out.zero_point = static_cast<int32_t>(std::nearbyint(std::min(std::max(zero_point, 0.0f), 255.0f)));
}

// Rows of v quantized with out's parameters: round_half_even(v / scale) + zero point, saturated, NaN as 0 (rows for
// which zero(n) as zeros before quantization).
template <typename Zero>
void quantize(const float* v, int64_t ld, int64_t rows, int64_t size, Zero zero, Quantized& out) {
  const float zp = static_cast<float>(out.zero_point), low = -zp, high = 255.0f - zp;
  for (int64_t n = 0; n < rows; ++n) {
    uint8_t* q = out.q.data() + n * out.lda;
    int32_t sum = 0;
    if (zero(n)) {
      std::memset(q, out.zero_point, size);
      sum = out.zero_point * static_cast<int32_t>(size);
    } else {
      const float* row = v + n * ld;
      for (int64_t j = 0; j < size; j += L) {
        const int len = static_cast<int>(std::min<int64_t>(L, size - j));
        F x = load(row + j, len) / out.scale;
        x = !(x >= low) ? splat(low) : x;  // NaN: the lowest value
        x = x > high ? splat(high) : x;
        const I u = __builtin_convertvector(round_even(x) + zp, I);
        for (int l = 0; l < len; ++l) {
          q[j + l] = static_cast<uint8_t>(u[l]);
          sum += u[l];
        }
      }
    }
    out.sums[n] = sum;
  }
}

// ---- the gates ------------------------------------------------------------------------------------------------------

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

template <typename Fn>
inline F lanes(F x, Fn f) {
  for (int l = 0; l < L; ++l) x[l] = f(x[l]);
  return x;
}

// The activations as the Python implementation computes them in float32 (recurrent/cells.py: ACTIVATIONS; MLAS's
// for Sigmoid and Tanh), each operation rounded.
inline F activate(const Activation& f, F x) {
  const float a = static_cast<float>(f.alpha), b = static_cast<float>(f.beta);
  switch (f.kind) {
    case Kind::Sigmoid: return mlas_logistic(x);
    case Kind::Tanh: return mlas_tanh(x);
    case Kind::Relu: return x < 0 ? splat(0.0f) : x;
    case Kind::Affine: return a * x + b;
    case Kind::LeakyRelu: return x > 0 ? x : x * a;
    case Kind::ThresholdedRelu: return x <= a ? splat(0.0f) : x;
    case Kind::ScaledTanh: return a * lanes(b * x, [](float v) { return std::tanh(v); });
    case Kind::HardSigmoid: {
      const F y = a * x + b;
      return y > 1.0f ? splat(1.0f) : y < 0.0f ? splat(0.0f) : y;
    }
    case Kind::Elu: return lanes(x, [a](float v) { return v > 0 ? v : a * std::expm1(v); });
    case Kind::Softsign: return x / (1.0f + (x < 0 ? -x : x));
    case Kind::Softplus: return lanes(x, [](float v) { return std::log(std::exp(v) + 1.0f); });
  }
  return x;
}

// ---- one direction's recurrence -------------------------------------------------------------------------------------

struct Direction {
  const Config* c;
  int d;
  int64_t steps, batch, hidden, hpad, blocks;
  const Panels *W, *R;
  const float *w_scale, *r_scale;  // [G][hpad] per column (a per-direction scale repeated)
  const float* bias;               // [G][hpad] Wb + Rb, or nullptr
  const float* peepholes;          // [3][hpad] (i, o, f), or nullptr
  const int64_t* lens;             // nullptr: every row runs every step
  float* xproj;                    // [T·N][G][hpad]
  float *h, *cell;                 // [N][hpad]
  float* y;                        // Y + this direction's offset, or nullptr
  float limit;                     // clip, else FLT_MAX

  int64_t length(int64_t n) const { return lens ? lens[n] : steps; }

  // X·Wᵀ for every row of the quantized X, scaled: float32(acc) · float32(x_scale · w_scale).
  void project(const Quantized& x, int64_t rows, int64_t input) {
    const int32_t za = x.zero_point;
    for (int64_t b = 0; b < blocks; ++b) {
      const int8_t* panel = W->data.data() + b * W->K4 * G * L * 4;
      const int32_t* sums = W->column_sums.data() + b * G * L;
      tiles(x.q.data(), x.lda, rows, panel, W->K4, [&](int64_t n0, auto& acc) {
        for (int m = 0; m < static_cast<int>(sizeof(acc) / sizeof(acc[0])); ++m) {
          const int32_t row_term = W->offset * (x.sums[n0 + m] - za * static_cast<int32_t>(input));
          float* out = xproj + (n0 + m) * G * hpad + b * L;
          for (int g = 0; g < G; ++g) {
            const I exact = acc[m][g] + row_term - za * load(sums + g * L);
            const F multiplier = x.scale * load(w_scale + g * hpad + b * L);
            store(out + g * hpad, __builtin_convertvector(exact, F) * multiplier);
          }
        }
      });
    }
  }

  // The gates of row n, units b·L ..: pre-activations x + the state's product, then onnxruntime's gate order.
  void gates(int64_t n, int64_t b, const I (&acc)[G], const float* x, int32_t row_term, const Quantized& s,
             int64_t t) {
    const int64_t j = b * L;
    const int32_t za = s.zero_point;
    const int32_t* sums = R->column_sums.data() + b * G * L;
    F pre[G];
    for (int g = 0; g < G; ++g) {
      const I exact = acc[g] + row_term - za * load(sums + g * L);
      const F multiplier = s.scale * load(r_scale + g * hpad + j);
      pre[g] = load(x + g * hpad + j) + __builtin_convertvector(exact, F) * multiplier;
    }
    float* cp = cell + n * hpad + j;
    const F c_prev = load(cp);
    auto gate = [&](int g, const F* state, int p) {
      F v = pre[g];
      if (peepholes && state) v = v + *state * load(peepholes + p * hpad + j);
      if (bias) v = v + load(bias + g * hpad + j);
      return clamp(v, -limit, limit);
    };
    const Activation &fa = c->activation(d, 0), &ga = c->activation(d, 1), &ha = c->activation(d, 2);
    const F i = activate(fa, gate(0, &c_prev, 0));
    const F f = c->input_forget ? 1.0f - i : activate(fa, gate(2, &c_prev, 2));
    const F g = activate(ga, gate(3, nullptr, 0));
    const F c_new = c_prev * f + i * g;
    const F o = activate(fa, gate(1, &c_new, 1));
    const F h_new = activate(ha, c_new) * o;
    store(cp, c_new);
    store(h + n * hpad + j, h_new);
    if (y) store(y + (t * c->directions * batch + n) * hidden + j, h_new,
                 static_cast<int>(std::min<int64_t>(L, hidden - j)));
  }

  void recur(int64_t longest) {
    Quantized s;
    s.lda = R->K4 * 4;
    s.q.assign(batch * s.lda, 0);
    s.sums.assign(batch, 0);
    const bool zero_ended = c->outputs[0] && lens;  // rows that have ended feed zeros when Y is computed
    for (int64_t step = 0; step < longest; ++step) {
      auto ended = [&](int64_t n) { return zero_ended && step > 0 && length(n) < step; };
      parameters(h, hpad, batch, hidden, ended, s);
      quantize(h, hpad, batch, hidden, ended, s);
      for (int64_t b = 0; b < blocks; ++b) {
        const int8_t* panel = R->data.data() + b * R->K4 * G * L * 4;
        tiles(s.q.data(), s.lda, batch, panel, R->K4, [&](int64_t n0, auto& acc) {
          for (int m = 0; m < static_cast<int>(sizeof(acc) / sizeof(acc[0])); ++m) {
            const int64_t n = n0 + m, len = length(n);
            if (step >= len) continue;
            const int64_t t = c->reversed(d) ? len - 1 - step : step;
            const int32_t row_term = R->offset * (s.sums[n] - s.zero_point * static_cast<int32_t>(hidden));
            gates(n, b, acc[m], xproj + (t * batch + n) * G * hpad, row_term, s, t);
          }
        });
      }
    }
  }
};

// ---- the op ---------------------------------------------------------------------------------------------------------

// v [G·H] (or one value) as [G][hpad] floats, zeros in the padding.
std::vector<float> padded(const at::Tensor& v, int64_t hidden, int64_t hpad) {
  const at::Tensor f = v.to(at::kFloat).contiguous().view({-1});
  std::vector<float> out(G * hpad, 0.0f);
  const float* p = f.data_ptr<float>();
  const bool single = f.numel() == 1;
  const int64_t gates = single ? G : f.numel() / hidden;
  for (int64_t g = 0; g < gates; ++g)
    for (int64_t j = 0; j < hidden; ++j) out[g * hpad + j] = single ? p[0] : p[g * hidden + j];
  return out;
}

std::vector<int32_t> first_zero_points(const at::Tensor& zero_point, int64_t directions) {
  const at::Tensor z = zero_point.to(at::kInt).reshape({directions, -1});
  std::vector<int32_t> out(directions);
  for (int64_t d = 0; d < directions; ++d) out[d] = z[d][0].item<int32_t>();
  return out;
}

void check(const char* name, const at::Tensor& t, const std::vector<int64_t>& shape) {
  TORCH_CHECK_VALUE(t.sizes().vec() == shape, "DynamicQuantizeLSTM: ", name, " must have shape ",
                    c10::IntArrayRef(shape), ", got ", t.sizes());
}

// Checks the inputs (their dtypes and shapes; sequence_lens's values) and returns sequence_lens as int64, undefined
// when every row runs every step.
at::Tensor checked(const Config& c, const at::Tensor& X, const at::Tensor& W, const at::Tensor& R,
                   const std::optional<at::Tensor>& B, const std::optional<at::Tensor>& sequence_lens,
                   const std::optional<at::Tensor>& initial_h, const std::optional<at::Tensor>& initial_c,
                   const std::optional<at::Tensor>& P, const at::Tensor& W_scale, const at::Tensor& R_scale) {
  TORCH_CHECK_VALUE(c.cell == CellType::LSTM && c.layout == 0 && c.mask_output < 0,
                    "DynamicQuantizeLSTM: an LSTM config of layout 0 without a mask expected");
  TORCH_CHECK_VALUE(X.scalar_type() != at::kDouble,
                    "DynamicQuantizeLSTM computes in float32 (as onnxruntime): X must not be float64");
  TORCH_CHECK_VALUE(X.dim() == 3 && W.dim() == 3 && R.dim() == 3, "DynamicQuantizeLSTM: X, W and R must be 3-D");
  for (const at::Tensor* w : {&W, &R})
    TORCH_CHECK_VALUE(w->scalar_type() == at::kChar || w->scalar_type() == at::kByte,
                      "DynamicQuantizeLSTM: W and R must be int8 or uint8");
  const int64_t steps = X.size(0), batch = X.size(1), input = X.size(2), D = c.directions, hidden = R.size(1);
  TORCH_CHECK_VALUE(c.hidden_size < 0 || c.hidden_size == hidden, "DynamicQuantizeLSTM: R must have shape [",
                    D, ", ", c.hidden_size, ", ", 4 * c.hidden_size, "], got ", R.sizes());
  check("W", W, {D, input, 4 * hidden});
  check("R", R, {D, hidden, 4 * hidden});
  if (B) check("B", *B, {D, 8 * hidden});
  if (P) check("P", *P, {D, 3 * hidden});
  if (initial_h) check("initial_h", *initial_h, {D, batch, hidden});
  if (initial_c) check("initial_c", *initial_c, {D, batch, hidden});
  for (const at::Tensor* s : {&W_scale, &R_scale})
    TORCH_CHECK_VALUE(s->numel() == D || s->numel() == D * 4 * hidden,
                      "DynamicQuantizeLSTM: a scale per direction, or per direction and column");
  if (!sequence_lens) return {};
  TORCH_CHECK_VALUE(sequence_lens->scalar_type() == at::kInt || sequence_lens->scalar_type() == at::kLong,
                    "sequence_lens must be int32 or int64");
  check("sequence_lens", *sequence_lens, {batch});
  at::Tensor lens = sequence_lens->to(at::kLong).contiguous();
  const int64_t* p = lens.data_ptr<int64_t>();
  for (int64_t n = 0; n < batch; ++n)
    TORCH_CHECK_VALUE(p[n] >= 0 && p[n] <= steps, "sequence_lens values must lie in [0, ", steps,
                      "] (the sequence length of X), got ", lens);
  return std::all_of(p, p + batch, [steps](int64_t v) { return v == steps; }) ? at::Tensor() : lens;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> dynamic_quantize_lstm_cpu(
    const at::Tensor& X, const at::Tensor& W, const at::Tensor& R, const std::optional<at::Tensor>& B,
    const std::optional<at::Tensor>& sequence_lens, const std::optional<at::Tensor>& initial_h,
    const std::optional<at::Tensor>& initial_c, const std::optional<at::Tensor>& P, const at::Tensor& W_scale,
    const at::Tensor& W_zero_point, const at::Tensor& R_scale, const at::Tensor& R_zero_point,
    c10::string_view config) {
  const Config& c = config_of(std::string_view(config.data(), config.size()));
  const at::Tensor lens = checked(c, X, W, R, B, sequence_lens, initial_h, initial_c, P, W_scale, R_scale);
  const int64_t steps = X.size(0), batch = X.size(1), input = X.size(2), D = c.directions;
  const int64_t hidden = R.size(1), hpad = (hidden + L - 1) / L * L, blocks = hpad / L;
  const int64_t* lp = lens.defined() ? lens.data_ptr<int64_t>() : nullptr;
  const int64_t longest = lp ? (batch ? *std::max_element(lp, lp + batch) : 0) : steps;

  const at::Tensor x = X.to(at::kFloat).contiguous();
  const auto options = x.options();
  // X quantized once: its range over the steps up to the longest row
  Quantized xq;
  xq.lda = (input + 3) / 4 * 4;
  xq.q.assign(steps * batch * xq.lda, 0);
  xq.sums.assign(steps * batch, 0);
  auto none = [](int64_t) { return false; };
  parameters(x.data_ptr<float>(), input, longest * batch, input, none, xq);
  quantize(x.data_ptr<float>(), input, steps * batch, input, none, xq);

  const PanelCache::Entry w_panels = panel_cache().get(W, hidden, blocks, first_zero_points(W_zero_point, D));
  const PanelCache::Entry r_panels = panel_cache().get(R, hidden, blocks, first_zero_points(R_zero_point, D));
  const at::Tensor w_scales = W_scale.reshape({D, -1}), r_scales = R_scale.reshape({D, -1});

  at::Tensor y;  // zeros past each row's length: only the steps that run are written
  if (c.outputs[0]) {
    y = at::empty({steps, D, batch, hidden}, options);
    if (lp) y.zero_();
  }
  std::vector<float> xproj(steps * batch * G * hpad), h(D * batch * hpad, 0.0f), cell(D * batch * hpad, 0.0f);
  for (int k = 0; k < 2; ++k) {
    const std::optional<at::Tensor>& given = k ? initial_c : initial_h;
    if (!given) continue;
    const at::Tensor s = given->to(at::kFloat).contiguous();
    for (int64_t r = 0; r < D * batch; ++r)
      std::memcpy((k ? cell : h).data() + r * hpad, s.data_ptr<float>() + r * hidden, sizeof(float) * hidden);
  }
  for (int64_t d = 0; d < D; ++d) {
    const std::vector<float> w_scale = padded(w_scales[d], hidden, hpad), r_scale = padded(r_scales[d], hidden, hpad);
    std::vector<float> bias, peepholes;
    if (B) {
      const at::Tensor halves = B->select(0, d).to(at::kFloat).view({2, -1});
      bias = padded(halves[0] + halves[1], hidden, hpad);  // Wb + Rb in float32
    }
    if (P) peepholes = padded(P->select(0, d), hidden, hpad);
    Direction r{&c, static_cast<int>(d), steps, batch, hidden, hpad, blocks, &(*w_panels)[d], &(*r_panels)[d],
                w_scale.data(), r_scale.data(), B ? bias.data() : nullptr, P ? peepholes.data() : nullptr, lp,
                xproj.data(), h.data() + d * batch * hpad, cell.data() + d * batch * hpad,
                c.outputs[0] ? y.data_ptr<float>() + d * batch * hidden : nullptr,
                c.has_clip ? static_cast<float>(c.clip) : FLT_MAX};
    r.project(xq, steps * batch, input);
    r.recur(longest);
  }

  // The final states: zero for a row of length 0 and for a sequence of length 0, initial states or not.
  at::Tensor states[2];
  for (int k = 0; k < 2; ++k) {
    if (!c.outputs[k + 1]) continue;
    states[k] = at::empty({D, batch, hidden}, options);
    float* out = states[k].data_ptr<float>();
    for (int64_t r = 0; r < D * batch; ++r) {
      const int64_t n = r % batch;
      if (steps == 0 || (lp && lp[n] == 0))
        std::fill(out + r * hidden, out + (r + 1) * hidden, 0.0f);
      else
        std::memcpy(out + r * hidden, (k ? cell : h).data() + r * hpad, sizeof(float) * hidden);
    }
  }
  auto output = [&](const at::Tensor& t) {
    return !t.defined() ? at::empty({0}, X.options()) : t.scalar_type() == X.scalar_type() ? t : t.to(X.scalar_type());
  };
  return {output(y), output(states[0]), output(states[1])};
}

}  // namespace

TORCH_LIBRARY_IMPL(onnx2torch_rnn, CPU, m) { m.impl("dynamic_quantize_lstm", &dynamic_quantize_lstm_cpu); }

}  // namespace onnx2torch_rnn
