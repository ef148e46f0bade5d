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
//   contracted into a fused multiply-add (int8.h), and MLAS's own fused multiply-adds (its sigmoid and tanh) are
//   explicit.
// - The weights are packed once per weight version, for each block of L hidden units (one vector register: 16 with
//   AVX-512, 8 with AVX2) every gate's columns, four rows per int32 lane: one pass over a block yields all four
//   gates, and the gate equations run on the accumulators at once.

#include <ATen/ATen.h>
#include <torch/library.h>

#include <cfloat>
#include <optional>
#include <vector>

#include "config.h"
#include "int8.h"  // last: from there on, no float operation is contracted

namespace onnx2torch_rnn {
namespace {

using namespace int8;

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
  int32_t w_offset, r_offset;      // weight - zero point = int8 panel value + offset
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
          const int32_t row_term = w_offset * (x.sums[n0 + m] - za * static_cast<int32_t>(input));
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
    Quantized s(batch, hidden);
    const bool zero_ended = c->outputs[0] && lens;  // rows that have ended feed zeros when Y is computed
    for (int64_t step = 0; step < longest; ++step) {
      auto ended = [&](int64_t n) { return zero_ended && step > 0 && length(n) < step; };
      float low = 0, high = 0;
      for (int64_t n = 0; n < batch; ++n) {
        if (!ended(n)) widen(h + n * hpad, hidden, low, high);
      }
      static_cast<Parameters&>(s) = parameters(low, high);
      for (int64_t n = 0; n < batch; ++n) {
        uint8_t* q = s.q.data() + n * s.lda;
        if (ended(n)) {
          std::memset(q, s.zero_point, hidden);
          s.sums[n] = s.zero_point * static_cast<int32_t>(hidden);
        } else {
          s.sums[n] = quantize(h + n * hpad, hidden, s, q);
        }
      }
      for (int64_t b = 0; b < blocks; ++b) {
        const int8_t* panel = R->data.data() + b * R->K4 * G * L * 4;
        tiles(s.q.data(), s.lda, batch, panel, R->K4, [&](int64_t n0, auto& acc) {
          for (int m = 0; m < static_cast<int>(sizeof(acc) / sizeof(acc[0])); ++m) {
            const int64_t n = n0 + m, len = length(n);
            if (step >= len) continue;
            const int64_t t = c->reversed(d) ? len - 1 - step : step;
            const int32_t row_term = r_offset * (s.sums[n] - s.zero_point * static_cast<int32_t>(hidden));
            gates(n, b, acc[m], xproj + (t * batch + n) * G * hpad, row_term, s, t);
          }
        });
      }
    }
  }
};

// ---- the op ---------------------------------------------------------------------------------------------------------

// t as float32 values in memory order, converted only when it is not already (an op call costs microseconds).
at::Tensor floats(const at::Tensor& t) {
  return t.scalar_type() == at::kFloat && t.is_contiguous() ? t : t.to(at::kFloat).contiguous();
}

// count values from p (count 1: one value for every gate) as [G][hpad], zeros in the padding; with q, p[i] + q[i].
std::vector<float> padded(const float* p, int64_t count, int64_t hidden, int64_t hpad, const float* q = nullptr) {
  std::vector<float> out(G * hpad, 0.0f);
  for (int64_t g = 0; g < G && (count == 1 || g * hidden < count); ++g) {
    for (int64_t j = 0; j < hidden; ++j) {
      const int64_t i = count == 1 ? 0 : g * hidden + j;
      out[g * hpad + j] = q ? p[i] + q[i] : p[i];  // Wb + Rb in float32
    }
  }
  return out;
}

// W or R [D, K, 4H] as panels per direction, block b holding units b·L .. b·L + L - 1 of every gate.
PanelCache::Entry lstm_panels(const at::Tensor& M, int64_t hidden, int64_t blocks) {
  return panel_cache().get(M, /*kind=*/1, [&] {
    std::vector<Panels> out;
    for (int64_t d = 0; d < M.size(0); ++d) {
      out.push_back(pack(M[d], blocks, [hidden](int64_t b, int g, int l) {
        const int64_t j = b * L + l;
        return j < hidden ? g * hidden + j : int64_t{-1};
      }));
    }
    return out;
  });
}

// Like onnxruntime, the first zero point of each direction's.
std::vector<int32_t> first_zero_points(const at::Tensor& zero_point, int64_t directions) {
  const at::Tensor z = zero_point.scalar_type() == at::kChar || zero_point.scalar_type() == at::kByte
                           ? zero_point.contiguous() : zero_point.to(at::kInt).contiguous();
  const int64_t per = z.numel() / directions;
  std::vector<int32_t> out(directions);
  for (int64_t d = 0; d < directions; ++d) {
    switch (z.scalar_type()) {
      case at::kChar: out[d] = z.data_ptr<int8_t>()[d * per]; break;
      case at::kByte: out[d] = z.data_ptr<uint8_t>()[d * per]; break;
      default: out[d] = z.data_ptr<int32_t>()[d * per]; break;
    }
  }
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

  const at::Tensor x = floats(X);
  const auto options = x.options();
  // X quantized once: its range over the steps up to the longest row
  Quantized xq(steps * batch, input);
  {
    float low = 0, high = 0;
    widen(x.data_ptr<float>(), longest * batch * input, low, high);
    static_cast<Parameters&>(xq) = parameters(low, high);
    for (int64_t r = 0; r < steps * batch; ++r)
      xq.sums[r] = quantize(x.data_ptr<float>() + r * input, input, xq, xq.q.data() + r * xq.lda);
  }

  const PanelCache::Entry w_panels = lstm_panels(W, hidden, blocks), r_panels = lstm_panels(R, hidden, blocks);
  const std::vector<int32_t> w_zero = first_zero_points(W_zero_point, D), r_zero = first_zero_points(R_zero_point, D);
  const at::Tensor w_scales = floats(W_scale), r_scales = floats(R_scale);
  const int64_t w_per = w_scales.numel() / D, r_per = r_scales.numel() / D;
  const at::Tensor biases = B ? floats(*B) : at::Tensor(), peephole_weights = P ? floats(*P) : at::Tensor();

  at::Tensor y;  // zeros past each row's length: only the steps that run are written
  if (c.outputs[0]) {
    y = at::empty({steps, D, batch, hidden}, options);
    if (lp) y.zero_();
  }
  std::vector<float> xproj(steps * batch * G * hpad), h(D * batch * hpad, 0.0f), cell(D * batch * hpad, 0.0f);
  for (int k = 0; k < 2; ++k) {
    const std::optional<at::Tensor>& given = k ? initial_c : initial_h;
    if (!given) continue;
    const at::Tensor s = floats(*given);
    for (int64_t r = 0; r < D * batch; ++r)
      std::memcpy((k ? cell : h).data() + r * hpad, s.data_ptr<float>() + r * hidden, sizeof(float) * hidden);
  }
  for (int64_t d = 0; d < D; ++d) {
    const std::vector<float> w_scale = padded(w_scales.data_ptr<float>() + d * w_per, w_per, hidden, hpad);
    const std::vector<float> r_scale = padded(r_scales.data_ptr<float>() + d * r_per, r_per, hidden, hpad);
    std::vector<float> bias, peepholes;
    if (B) {
      const float* wb = biases.data_ptr<float>() + d * 8 * hidden;
      bias = padded(wb, 4 * hidden, hidden, hpad, wb + 4 * hidden);
    }
    if (P) peepholes = padded(peephole_weights.data_ptr<float>() + d * 3 * hidden, 3 * hidden, hidden, hpad);
    const Panels &w = (*w_panels)[d], &r = (*r_panels)[d];
    Direction run{&c, static_cast<int>(d), steps, batch, hidden, hpad, blocks, &w, &r, w.shift - w_zero[d],
                r.shift - r_zero[d],
                w_scale.data(), r_scale.data(), B ? bias.data() : nullptr, P ? peepholes.data() : nullptr, lp,
                xproj.data(), h.data() + d * batch * hpad, cell.data() + d * batch * hpad,
                c.outputs[0] ? y.data_ptr<float>() + d * batch * hidden : nullptr,
                c.has_clip ? static_cast<float>(c.clip) : FLT_MAX};
    run.project(xq, steps * batch, input);
    run.recur(longest);
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
