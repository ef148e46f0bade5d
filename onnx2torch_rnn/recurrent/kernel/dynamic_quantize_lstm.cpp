// com.microsoft DynamicQuantizeLSTM on the CPU in one call: two ops, which the CPU implementation of the
// onnx2torch_rnn::dynamic_quantize_lstm op (and the module's eager inference) call from Python
// (modules/quantized.py: native_dynamic_quantize_lstm):
//
//   dynamic_quantize_lstm_pack(Tensor W, Tensor R, Tensor? B, Tensor? P, Tensor W_scale, Tensor W_zero_point,
//                              Tensor R_scale, Tensor R_zero_point, str config) -> Tensor
//       the node's weights checked and packed into one byte tensor (Packed below: the config's number, the sizes, the
//       weights as int8 panels with their column sums, the scales, Wb + Rb and P padded to whole blocks), which
//       Python keeps per weight version
//   dynamic_quantize_lstm_packed(Tensor X, Tensor packed, Tensor? sequence_lens, Tensor? initial_h,
//                                Tensor? initial_c) -> (Tensor, Tensor, Tensor)
//       the node on them: Y, Y_h, Y_c (an empty tensor for an output the config does not ask for)
//
// Its Python implementation (modules/quantized.py: IntegerProducts,
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

#define TORCH_STABLE_ONLY  // PyTorch's stable ABI (int8.h)
#include <torch/csrc/stable/library.h>

#include <array>
#include <cfloat>
#include <optional>
#include <string_view>
#include <vector>

#include "config.h"
#include "stack.h"
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
// for Sigmoid and Tanh), each operation rounded. Inlined: a call passes its vectors through memory (a small node's
// steps spent a fifth of their time there).
__attribute__((always_inline)) inline F activate(const Activation& f, F x) {
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

// One direction's weights as panels (int8.h) inside the packed tensor.
struct PanelView {
  const int8_t* data;
  const int32_t* sums;  // column sums
  int64_t K4;
};

// ---- one direction's recurrence -------------------------------------------------------------------------------------

struct Direction {
  const Config* c;
  int d;
  int64_t steps, batch, hidden, hpad, blocks;
  PanelView W, R;
  int32_t w_offset, r_offset;      // weight - zero point = int8 panel value + offset
  const float *w_scale, *r_scale;  // [G][hpad] per column (a per-direction scale repeated)
  const float* bias;               // [G][hpad] Wb + Rb, or nullptr
  const float* peepholes;          // [3][hpad] (i, o, f), or nullptr
  const int64_t* lens;             // nullptr: every row runs every step
  float* xproj;                    // [T·N][G][hpad]
  float *h, *cell;                 // [N][hpad]
  float* y;                        // Y + this direction's offset, or nullptr
  int64_t y_step, y_row;           // where Y's element (t, n, 0) lies: y + t·y_step + n·y_row
  float limit;                     // clip, else FLT_MAX

  int64_t length(int64_t n) const { return lens ? lens[n] : steps; }

  // X·Wᵀ for every row of the quantized X, scaled: float32(acc) · float32(x_scale · w_scale).
  void project(const Quantized& x, int64_t rows, int64_t input) {
    const int32_t za = x.zero_point;
    for (int64_t b = 0; b < blocks; ++b) {
      const int8_t* panel = W.data + b * W.K4 * G * L * 4;
      const int32_t* sums = W.sums + b * G * L;
      tiles(x.q.data(), x.lda, rows, panel, W.K4, [&](int64_t n0, auto& acc) {
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
    const int32_t* sums = R.sums + b * G * L;
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
    if (y) store(y + t * y_step + n * y_row + j, h_new,
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
        const int8_t* panel = R.data + b * R.K4 * G * L * 4;
        tiles(s.q.data(), s.lda, batch, panel, R.K4, [&](int64_t n0, auto& acc) {
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

// ---- the packed weights ------------------------------------------------------------------------------------------

// The packed tensor: a header of int64 values, then per direction W's and R's panels and column sums, the scales per
// column, Wb + Rb and P as [G][hpad] float32 (zeros in the padding), each part at a multiple of 64 bytes.
struct Packed {
  enum { kMagic, kConfig, kDirections, kInput, kHidden, kBias, kPeepholes, kOffsets, kHeader = kOffsets + 4 };
  int64_t input, hidden, hpad, blocks, directions;
  bool bias, peepholes;
  size_t w_data, w_sums, r_data, r_sums, scales, per_direction;  // byte offsets within one direction's part

  static constexpr int64_t kMagicValue = 0x38744c53;  // "SLt8": a tensor packed by this kernel

  Packed(int64_t directions, int64_t input, int64_t hidden, bool bias, bool peepholes)
      : input(input), hidden(hidden), hpad((hidden + L - 1) / L * L), blocks(hpad / L), directions(directions),
        bias(bias), peepholes(peepholes) {
    size_t at = 0;
    auto part = [&at](size_t bytes) {
      const size_t start = at;
      at += (bytes + 63) / 64 * 64;
      return start;
    };
    w_data = part(blocks * ((input + 3) / 4) * G * L * 4);
    w_sums = part(blocks * G * L * sizeof(int32_t));
    r_data = part(blocks * ((hidden + 3) / 4) * G * L * 4);
    r_sums = part(blocks * G * L * sizeof(int32_t));
    scales = part((2 + bias + peepholes) * G * hpad * sizeof(float));
    per_direction = at;
  }
  static size_t header() { return (kHeader * sizeof(int64_t) + 63) / 64 * 64; }
  size_t size() const { return header() + directions * per_direction; }
};

// count values from p (count 1: one value for every gate) as [G][hpad] at out, zeros in the padding; with q, p[i] +
// q[i].
void padded(const float* p, int64_t count, int64_t hidden, int64_t hpad, float* out, const float* q = nullptr) {
  std::fill(out, out + G * hpad, 0.0f);
  for (int64_t g = 0; g < G && (count == 1 || g * hidden < count); ++g) {
    for (int64_t j = 0; j < hidden; ++j) {
      const int64_t i = count == 1 ? 0 : g * hidden + j;
      out[g * hpad + j] = q ? p[i] + q[i] : p[i];  // Wb + Rb in float32
    }
  }
}

// W or R [K, 4H] of one direction (contiguous) as panels at data / sums, block b holding units b·L .. b·L + L - 1
// of every gate.
void pack_lstm(const uint8_t* m, bool unsigned_values, int64_t K, int64_t hidden, int64_t blocks, int8_t* data,
               int32_t* sums) {
  const Panels p = pack_values(K, blocks, unsigned_values, [m, hidden](int64_t k, int64_t j) {
    return m[k * 4 * hidden + j];
  }, [hidden](int64_t b, int g, int l) {
    const int64_t j = b * L + l;
    return j < hidden ? g * hidden + j : int64_t{-1};
  });
  if (!p.data.empty()) std::memcpy(data, p.data.data(), p.data.size());
  std::memcpy(sums, p.column_sums.data(), p.column_sums.size() * sizeof(int32_t));
}

void check_shape(const char* name, const Tensor& t, const std::vector<int64_t>& shape) {
  const std::vector<int64_t> sizes = sizes_of(t);
  CHECK_VALUE(sizes == shape, "DynamicQuantizeLSTM: ", name, " must have shape ", shape_text(shape), ", got ",
              shape_text(sizes));
}

// The weights checked; (directions, input, hidden).
std::array<int64_t, 3> checked_weights(const Config& c, const Tensor& W, const Tensor& R, const std::optional<Tensor>& B,
                                       const std::optional<Tensor>& P, const Tensor& W_scale, const Tensor& R_scale) {
  CHECK_VALUE(c.cell == CellType::LSTM && c.layout == 0 && c.mask_output < 0,
              "DynamicQuantizeLSTM: an LSTM config of layout 0 without a mask expected");
  CHECK_VALUE(W.dim() == 3 && R.dim() == 3, "DynamicQuantizeLSTM: X, W and R must be 3-D");
  for (const Tensor* w : {&W, &R})
    CHECK_VALUE(w->scalar_type() == ScalarType::Char || w->scalar_type() == ScalarType::Byte,
                "DynamicQuantizeLSTM: W and R must be int8 or uint8");
  const int64_t D = c.directions, hidden = R.size(1), input = W.size(1);
  CHECK_VALUE(c.hidden_size < 0 || c.hidden_size == hidden, "DynamicQuantizeLSTM: R must have shape [", D, ", ",
              c.hidden_size, ", ", 4 * c.hidden_size, "], got ", shape_text(sizes_of(R)));
  check_shape("W", W, {D, input, 4 * hidden});
  check_shape("R", R, {D, hidden, 4 * hidden});
  if (B) check_shape("B", *B, {D, 8 * hidden});
  if (P) check_shape("P", *P, {D, 3 * hidden});
  for (const Tensor* s : {&W_scale, &R_scale})
    CHECK_VALUE(s->numel() == D || s->numel() == D * 4 * hidden,
                "DynamicQuantizeLSTM: a scale per direction, or per direction and column");
  return {D, input, hidden};
}

Tensor dynamic_quantize_lstm_pack_cpu(const Tensor& W, const Tensor& R, const std::optional<Tensor>& B,
                                      const std::optional<Tensor>& P, const Tensor& W_scale,
                                      const Tensor& W_zero_point, const Tensor& R_scale, const Tensor& R_zero_point,
                                      std::string_view config) {
  const int64_t number = NumberedConfigs::get().number(config);
  const Config& c = NumberedConfigs::get().at(number);
  const auto [D, input, hidden] = checked_weights(c, W, R, B, P, W_scale, R_scale);
  const Packed layout(D, input, hidden, B.has_value(), P.has_value());
  Tensor packed = allocate({static_cast<int64_t>(layout.size())}, ScalarType::Byte);
  uint8_t* base = packed.mutable_data_ptr<uint8_t>();
  std::memset(base, 0, layout.size());
  int64_t* header = reinterpret_cast<int64_t*>(base);
  header[Packed::kMagic] = Packed::kMagicValue;
  header[Packed::kConfig] = number;
  header[Packed::kDirections] = D;
  header[Packed::kInput] = input;
  header[Packed::kHidden] = hidden;
  header[Packed::kBias] = B.has_value();
  header[Packed::kPeepholes] = P.has_value();
  const Tensor w = dense(W), r = dense(R), w_zero = dense(W_zero_point), r_zero = dense(R_zero_point);
  const Tensor w_scales = floats(W_scale), r_scales = floats(R_scale);
  const Tensor biases = B ? floats(*B) : Tensor(), peephole_weights = P ? floats(*P) : Tensor();
  const int64_t w_per = w_scales.numel() / D, r_per = r_scales.numel() / D, hpad = layout.hpad;
  for (int64_t d = 0; d < D; ++d) {
    uint8_t* part = base + Packed::header() + d * layout.per_direction;
    const bool w_unsigned = W.scalar_type() == ScalarType::Byte, r_unsigned = R.scalar_type() == ScalarType::Byte;
    pack_lstm(static_cast<const uint8_t*>(w.const_data_ptr()) + d * input * 4 * hidden, w_unsigned, input, hidden,
              layout.blocks, reinterpret_cast<int8_t*>(part + layout.w_data),
              reinterpret_cast<int32_t*>(part + layout.w_sums));
    pack_lstm(static_cast<const uint8_t*>(r.const_data_ptr()) + d * hidden * 4 * hidden, r_unsigned, hidden, hidden,
              layout.blocks, reinterpret_cast<int8_t*>(part + layout.r_data),
              reinterpret_cast<int32_t*>(part + layout.r_sums));
    // weight - zero point = int8 panel value + offset; like onnxruntime, the first zero point of each direction's
    header[Packed::kOffsets + d] = (w_unsigned ? 128 : 0) - integer_at(w_zero, d * (w_zero.numel() / D));
    header[Packed::kOffsets + 2 + d] = (r_unsigned ? 128 : 0) - integer_at(r_zero, d * (r_zero.numel() / D));
    float* vectors = reinterpret_cast<float*>(part + layout.scales);
    padded(w_scales.const_data_ptr<float>() + d * w_per, w_per, hidden, hpad, vectors);
    padded(r_scales.const_data_ptr<float>() + d * r_per, r_per, hidden, hpad, vectors + G * hpad);
    if (B) {
      const float* wb = biases.const_data_ptr<float>() + d * 8 * hidden;
      padded(wb, 4 * hidden, hidden, hpad, vectors + 2 * G * hpad, wb + 4 * hidden);
    }
    if (P)
      padded(peephole_weights.const_data_ptr<float>() + d * 3 * hidden, 3 * hidden, hidden, hpad,
             vectors + (B ? 3 : 2) * G * hpad);
  }
  return packed;
}

// ---- the ops -------------------------------------------------------------------------------------------------------

// sequence_lens checked, as int64; empty when every row runs every step.
std::vector<int64_t> lengths(const std::optional<Tensor>& sequence_lens, int64_t steps, int64_t batch) {
  if (!sequence_lens) return {};
  CHECK_VALUE(sequence_lens->scalar_type() == ScalarType::Int || sequence_lens->scalar_type() == ScalarType::Long,
              "sequence_lens must be int32 or int64");
  check_shape("sequence_lens", *sequence_lens, {batch});
  const Tensor lens = dense(*sequence_lens);
  std::vector<int64_t> out(batch);
  for (int64_t n = 0; n < batch; ++n) {
    out[n] = lens.scalar_type() == ScalarType::Int ? lens.const_data_ptr<int32_t>()[n]
                                                   : lens.const_data_ptr<int64_t>()[n];
    CHECK_VALUE(out[n] >= 0 && out[n] <= steps, "sequence_lens values must lie in [0, ", steps,
                "] (the sequence length of X), got ", out[n]);
  }
  return std::all_of(out.begin(), out.end(), [steps](int64_t v) { return v == steps; }) ? std::vector<int64_t>()
                                                                                         : out;
}

// One node's packed weights (dynamic_quantize_lstm_pack's tensor, or a part of a stack's), checked.
struct Node {
  const int64_t* header;
  const Config& c;
  Packed layout;

  Node(const uint8_t* base, int64_t bytes)
      : header(reinterpret_cast<const int64_t*>(base)),
        c((check(base, bytes), NumberedConfigs::get().at(header[Packed::kConfig]))),
        layout(header[Packed::kDirections], header[Packed::kInput], header[Packed::kHidden], header[Packed::kBias],
               header[Packed::kPeepholes]) {
    CHECK_VALUE(bytes >= static_cast<int64_t>(layout.size()), "DynamicQuantizeLSTM: packed weights cut short");
  }
  static void check(const uint8_t* base, int64_t bytes) {
    CHECK_VALUE(bytes >= static_cast<int64_t>(Packed::header()) &&
                    reinterpret_cast<const int64_t*>(base)[Packed::kMagic] == Packed::kMagicValue,
                "DynamicQuantizeLSTM: weights not packed by dynamic_quantize_lstm_pack");
  }
  // X's size checked: [steps, batch, input] as the node reads it.
  void check_input(int64_t input) const {
    CHECK_VALUE(input == layout.input, "DynamicQuantizeLSTM: W must have shape ",
                shape_text({c.directions, input, 4 * layout.hidden}), ", got ",
                shape_text({c.directions, layout.input, 4 * layout.hidden}));
  }
  void check_states(const std::optional<Tensor>& initial_h, const std::optional<Tensor>& initial_c,
                    int64_t batch) const {
    if (initial_h) check_shape("initial_h", *initial_h, {c.directions, batch, layout.hidden});
    if (initial_c) check_shape("initial_c", *initial_c, {c.directions, batch, layout.hidden});
  }
};

// Where a node writes Y (its element (t, d, n, 0) at t·t + d·d + n·n) and the tensor that holds it.
struct Output {
  Tensor y;
  int64_t t, d, n;
};

// A node's Y as the op returns it: [T, D, N, H].
Output node_output(int64_t T, int64_t D, int64_t N, int64_t H) {
  return {allocate({T, D, N, H}, ScalarType::Float), D * N * H, N * H, H};
}

// The node on float32 rows x [steps·N][input] (row t·N + n), its inputs checked: Y written where `y` says (when the
// config asks for it; zeros past each row's length), the final states (h, c) returned as [D, N, H] float32 (an
// undefined tensor where the config does not ask for one).
std::array<Tensor, 2> run(const Node& node, const uint8_t* base, const float* x, int64_t steps, int64_t batch,
                          const int64_t* lp, const std::optional<Tensor>& initial_h,
                          const std::optional<Tensor>& initial_c, const Output& y) {
  const Config& c = node.c;
  const Packed& layout = node.layout;
  const int64_t input = layout.input, D = c.directions;
  const int64_t hidden = layout.hidden, hpad = layout.hpad, blocks = layout.blocks;
  const int64_t longest = lp ? (batch ? *std::max_element(lp, lp + batch) : 0) : steps;

  // X quantized once: its range over the steps up to the longest row
  Quantized xq(steps * batch, input);
  {
    float low = 0, high = 0;
    widen(x, longest * batch * input, low, high);
    static_cast<Parameters&>(xq) = parameters(low, high);
    for (int64_t r = 0; r < steps * batch; ++r)
      xq.sums[r] = quantize(x + r * input, input, xq, xq.q.data() + r * xq.lda);
  }
  float* y_data = c.outputs[0] ? y.y.mutable_data_ptr<float>() : nullptr;
  if (y_data && lp) std::fill_n(y_data, y.y.numel(), 0.0f);  // only the steps that run are written

  std::vector<float> xproj(steps * batch * G * hpad), h(D * batch * hpad, 0.0f), cell(D * batch * hpad, 0.0f);
  for (int k = 0; k < 2; ++k) {
    const std::optional<Tensor>& given = k ? initial_c : initial_h;
    if (!given) continue;
    const Tensor s = floats(*given);
    for (int64_t r = 0; r < D * batch; ++r)
      std::memcpy((k ? cell : h).data() + r * hpad, s.const_data_ptr<float>() + r * hidden, sizeof(float) * hidden);
  }
  for (int64_t d = 0; d < D; ++d) {
    const uint8_t* part = base + Packed::header() + d * layout.per_direction;
    const float* vectors = reinterpret_cast<const float*>(part + layout.scales);
    const PanelView w{reinterpret_cast<const int8_t*>(part + layout.w_data),
                      reinterpret_cast<const int32_t*>(part + layout.w_sums), (input + 3) / 4};
    const PanelView r{reinterpret_cast<const int8_t*>(part + layout.r_data),
                      reinterpret_cast<const int32_t*>(part + layout.r_sums), (hidden + 3) / 4};
    Direction run{&c, static_cast<int>(d), steps, batch, hidden, hpad, blocks, w, r,
                  static_cast<int32_t>(node.header[Packed::kOffsets + d]),
                  static_cast<int32_t>(node.header[Packed::kOffsets + 2 + d]), vectors, vectors + G * hpad,
                  layout.bias ? vectors + 2 * G * hpad : nullptr,
                  layout.peepholes ? vectors + (layout.bias ? 3 : 2) * G * hpad : nullptr, lp, xproj.data(),
                  h.data() + d * batch * hpad, cell.data() + d * batch * hpad,
                  y_data ? y_data + d * y.d : nullptr, y.t, y.n,
                  c.has_clip ? static_cast<float>(c.clip) : FLT_MAX};
    run.project(xq, steps * batch, input);
    run.recur(longest);
  }

  // The final states: zero for a row of length 0 and for a sequence of length 0, initial states or not.
  std::array<Tensor, 2> states;
  for (int k = 0; k < 2; ++k) {
    if (!c.outputs[k + 1]) continue;
    states[k] = allocate({D, batch, hidden}, ScalarType::Float);
    float* out = states[k].mutable_data_ptr<float>();
    for (int64_t r = 0; r < D * batch; ++r) {
      const int64_t n = r % batch;
      if (steps == 0 || (lp && lp[n] == 0))
        std::fill(out + r * hidden, out + (r + 1) * hidden, 0.0f);
      else
        std::memcpy(out + r * hidden, (k ? cell : h).data() + r * hpad, sizeof(float) * hidden);
    }
  }
  return states;
}

const uint8_t* packed_bytes(const Tensor& packed) {
  CHECK_VALUE(packed.scalar_type() == ScalarType::Byte && packed.is_contiguous(),
              "DynamicQuantizeLSTM: weights not packed by dynamic_quantize_lstm_pack");
  return static_cast<const uint8_t*>(packed.const_data_ptr());
}

std::tuple<Tensor, Tensor, Tensor> dynamic_quantize_lstm_packed_cpu(const Tensor& X, const Tensor& packed,
                                                                    const std::optional<Tensor>& sequence_lens,
                                                                    const std::optional<Tensor>& initial_h,
                                                                    const std::optional<Tensor>& initial_c) {
  const uint8_t* base = packed_bytes(packed);
  const Node node(base, packed.numel());
  CHECK_VALUE(X.scalar_type() != ScalarType::Double,
              "DynamicQuantizeLSTM computes in float32 (as onnxruntime): X must not be float64");
  CHECK_VALUE(X.dim() == 3, "DynamicQuantizeLSTM: X, W and R must be 3-D");
  const int64_t steps = X.size(0), batch = X.size(1);
  node.check_input(X.size(2));
  node.check_states(initial_h, initial_c, batch);
  const std::vector<int64_t> lens = lengths(sequence_lens, steps, batch);
  const Output y = node.c.outputs[0] ? node_output(steps, node.c.directions, batch, node.layout.hidden) : Output{};
  const Tensor x = floats(X);
  const auto [h, c] = run(node, base, x.const_data_ptr<float>(), steps, batch, lens.empty() ? nullptr : lens.data(),
                          initial_h, initial_c, y);
  const ScalarType dtype = X.scalar_type();
  auto output = [&](const Tensor& t) {
    return !t.defined() ? allocate({0}, dtype) : dtype == ScalarType::Float ? t : torch::stable::to(t, dtype);
  };
  return {output(y.y), output(h), output(c)};
}

// StackedRecurrent.forward (recurrent/module.py, which documents the arguments) of DynamicQuantizeLSTM layers in one
// call, as recurrent_stack (recurrent.cpp) runs float layers: at batch 1 the Python around each layer costs more than
// its work. `packed` holds every layer's packed weights (dynamic_quantize_lstm_pack's, each a multiple of 64 bytes)
// one after the other; `numbers` (int64, made once per stack in Python) the flags batch_first, batch_first_output,
// merge_output, last_states, then per layer where its weights start in `packed` and where its initial states lie
// (six values: stack.h, stack_states) in `states`, the stack's state inputs (empty: none). X float32 (each layer's Y
// is the next one's X in float32, as the layers' own calls give it). Returns y, h_n, c_n (None where the layers do
// not compute them: no tensor to make); each layer writes its Y where the next one (or the caller) reads it: no
// transposition.
std::tuple<Tensor, Tensor, Tensor> dynamic_quantize_lstm_stack_cpu(const Tensor& X, const Tensor& packed,
                                                                   const Tensor& numbers,
                                                                   const std::optional<Tensor>& sequence_lens,
                                                                   const std::vector<std::optional<Tensor>>& states) {
  const StackNumbers stack = stack_numbers(numbers, states, 7, 1, "dynamic_quantize_lstm_stack");
  const bool batch_first = stack.batch_first, merge_output = stack.merge_output;
  CHECK_VALUE(X.scalar_type() == ScalarType::Float, "dynamic_quantize_lstm_stack: X must be float32");
  CHECK_VALUE(X.dim() == 3, "DynamicQuantizeLSTM: X, W and R must be 3-D");
  const uint8_t* bytes = packed_bytes(packed);
  const int64_t steps = X.size(batch_first ? 1 : 0), batch = X.size(batch_first ? 0 : 1);
  // the first layer's rows t·N + n: X itself, or a copy (batch first, strided)
  Tensor x = dense(X);
  std::vector<float> rows;
  if (batch_first) {
    const int64_t I = X.size(2);
    const float* from = x.const_data_ptr<float>();
    rows.resize(steps * batch * I);
    for (int64_t t = 0; t < steps; ++t)
      for (int64_t n = 0; n < batch; ++n)
        std::memcpy(rows.data() + (t * batch + n) * I, from + (n * steps + t) * I, sizeof(float) * I);
  }
  const float* input = batch_first ? rows.data() : x.const_data_ptr<float>();
  int64_t width = X.size(2);
  std::vector<int64_t> lens;
  std::vector<Tensor> h_n, c_n;
  for (size_t l = 0; l < stack.layers; ++l) {
    const int64_t offset = stack.layer(l)[0];
    CHECK_VALUE(offset >= 0 && offset < packed.numel(), "dynamic_quantize_lstm_stack: a layer past the packed weights");
    const Node node(bytes + offset, packed.numel() - offset);
    const Config& c = node.c;
    const int64_t D = c.directions, H = node.layout.hidden;
    const std::optional<Tensor>&h0 = stack.initial[2 * l], &c0 = stack.initial[2 * l + 1];
    node.check_input(width);
    node.check_states(h0, c0, batch);
    if (l == 0) lens = lengths(sequence_lens, steps, batch);  // after X's checks, as per layer
    const bool last = l + 1 == stack.layers, out_batch_first = last && stack.batch_first_output;
    CHECK_VALUE(c.outputs[0] || last, "dynamic_quantize_lstm_stack: a layer below the last must compute Y");
    Output y;
    if (!c.outputs[0]) {
    } else if (last && !merge_output && out_batch_first) {  // Y [T, D, N, H] seen as [D, T, N, H] (transposed)
      const std::vector<int64_t> shape{D, steps, batch, H}, strides{batch * H, D * batch * H, H, 1};
      y = {empty_cpu(shape, ScalarType::Float, strides.data()), D * batch * H, batch * H, H};
    } else if (last && !merge_output) {
      y = node_output(steps, D, batch, H);
    } else if (out_batch_first) {  // [N, T, D·H]
      y = {allocate({batch, steps, D * H}, ScalarType::Float), D * H, H, steps * D * H};
    } else {  // [T, N, D·H]
      y = {allocate({steps, batch, D * H}, ScalarType::Float), batch * D * H, H, D * H};
    }
    auto [h, cell] = run(node, bytes + offset, input, steps, batch, lens.empty() ? nullptr : lens.data(), h0, c0, y);
    h_n.push_back(h);
    c_n.push_back(cell);
    x = y.y;
    input = x.defined() ? x.const_data_ptr<float>() : nullptr;
    width = D * H;
  }
  return {x, joined_states(h_n, stack.last_states), joined_states(c_n, stack.last_states)};
}

}  // namespace

STABLE_TORCH_LIBRARY_FRAGMENT(onnx2torch_rnn, m) {
  m.def("dynamic_quantize_lstm_pack(Tensor W, Tensor R, Tensor? B, Tensor? P, Tensor W_scale, Tensor W_zero_point, "
        "Tensor R_scale, Tensor R_zero_point, str config) -> Tensor");
  m.def("dynamic_quantize_lstm_packed(Tensor X, Tensor packed, Tensor? sequence_lens, Tensor? initial_h, "
        "Tensor? initial_c) -> (Tensor, Tensor, Tensor)");
  m.def("dynamic_quantize_lstm_stack(Tensor X, Tensor packed, Tensor numbers, Tensor? sequence_lens, "
        "Tensor?[] states) -> (Tensor, Tensor, Tensor)");
}

STABLE_TORCH_LIBRARY_IMPL(onnx2torch_rnn, CPU, m) {
  m.impl("dynamic_quantize_lstm_pack", TORCH_BOX(&dynamic_quantize_lstm_pack_cpu));
  m.impl("dynamic_quantize_lstm_packed", TORCH_BOX(&dynamic_quantize_lstm_packed_cpu));
  m.impl("dynamic_quantize_lstm_stack", TORCH_BOX(&dynamic_quantize_lstm_stack_cpu));
}

}  // namespace onnx2torch_rnn
