// The recurrence of one ONNX LSTM / GRU / RNN node on the CPU, in one call: the CPU implementation of the
// onnx2torch_rnn::recurrent op (schema and config format: recurrent/op.py; numbers: recurrent/runtime.py, which is
// this kernel's reference and fallback).
//
// How it is fast:
// - The input projection X·Wᵀ + biases of every step is one product per direction before the recurrence, on W
//   packed like the recurrent weights below, over all T·N rows.
// - The recurrent weights are packed once per weight version (the op recurrent_pack, whose result the Python side
//   caches, keyed on the weight tensors' identity and version counters): for each block of `lanes` hidden units (one
//   vector register: 16 floats with AVX-512, 8 with AVX2), the rows of all the cell's gates for those units,
//   interleaved over k. One pass over a block then yields every gate of those units, and the gate equations run on
//   the accumulators at once: the state's GEMM and the gate loop are one fused loop, with no gate buffer in between
//   and no allocation per step.
// - Rows (batch) go in tiles of up to 4, with enough independent accumulators to hide the FMA latency.
// - Threads: a bidirectional node runs its two directions in parallel while a direction's weights stay in cache;
//   otherwise threads share each direction's hidden blocks, in the projection and in every step, when the work
//   pays for it. The blocks are pieces claimed one by one (see `Job`): a thread the OS does not run holds up no
//   one, where a barrier per step waited for it every step (250x slower on a busy machine).
// float16/bfloat16 are computed in float32 and cast back (as onnxruntime does), float64 in float64.

#define TORCH_STABLE_ONLY  // PyTorch's headers then refuse anything outside the stable ABI
// Built against PyTorch's stable ABI (torch/csrc/stable: TORCH_STABLE_ONLY), so that one build serves every torch
// from the version it targets (build.py: STABLE_ABI) on.
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>
#if __has_include(<unistd.h>)
#include <unistd.h>  // sysconf
#endif
#if __has_include(<pthread.h>)
#include <pthread.h>  // pthread_atfork
#endif
#ifdef _OPENMP
#include <omp.h>
#endif

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include "config.h"
#include "empty.h"
#include "stack.h"
#include "vec.h"

namespace onnx2torch_rnn {
namespace {

using torch::headeronly::ScalarType;
using torch::stable::Tensor;
using Tensors = std::vector<Tensor>;
namespace ops = torch::stable;

constexpr int kTile = 4;  // batch rows per register tile

// ---- the weights of one direction, and their packed form ---------------------------------------------------------

struct Weights {  // one direction, in the weights' own gate order; undefined tensors are absent
  Tensor W, R, Wb, Rb, P;  // W [gH, I], R [gH, H], Wb and Rb [gH], P [3H] (i, o, f)
};

// For each ONNX gate, the index of its block of rows in the weights (torch's order: LSTM i f c o, GRU r z h).
std::array<int, 4> source_blocks(const Config& c) {
  if (!c.torch_weights) return {0, 1, 2, 3};
  if (c.cell == CellType::LSTM) return {0, 3, 1, 2};
  if (c.cell == CellType::GRU) return {1, 0, 2, 0};
  return {0, 0, 0, 0};
}

// A tensor's sizes or strides, up to 4, without an allocation: a batch-1 call notices each malloc, and the stable
// ABI already makes several per tensor that crosses it.
struct Dims {
  std::array<int64_t, 4> v{};
  size_t n = 0;
  Dims(std::initializer_list<int64_t> values) : n(values.size()) { std::copy(values.begin(), values.end(), v.begin()); }
  template <typename Sizes>
  static Dims of(const Sizes& sizes) {
    Dims dims{};
    dims.n = sizes.size();
    std::copy(sizes.begin(), sizes.end(), dims.v.begin());
    return dims;
  }
  size_t size() const { return n; }
  const int64_t* begin() const { return v.data(); }
  const int64_t* data() const { return v.data(); }
  const int64_t* end() const { return v.data() + n; }
  int64_t& operator[](size_t k) { return v[k]; }
  int64_t operator[](size_t k) const { return v[k]; }
};

// A new CPU tensor, contiguous or laid out by `strides` (empty.h).
Tensor empty(const Dims& shape, ScalarType dtype, const Dims* strides = nullptr) {
  return empty_cpu(shape, dtype, strides ? strides->data() : nullptr);
}

// Whether the node's weights include P (only ONNX weights can).
bool has_peepholes(const Config& c) { return !c.torch_weights && c.letters.find('P') != std::string::npos; }

std::vector<Weights> split_weights(const Config& c, const Tensors& weights) {
  std::vector<Weights> result(c.directions);
  if (c.torch_weights) {
    const size_t per = weights.size() / c.directions;
    CHECK_VALUE(per == 2 || per == 4, "recurrent op: expected 2 or 4 torch weights per direction");
    for (int d = 0; d < c.directions; ++d) {
      result[d].W = weights[d * per];
      result[d].R = weights[d * per + 1];
      if (per == 4) {
        result[d].Wb = weights[d * per + 2];
        result[d].Rb = weights[d * per + 3];
      }
    }
    return result;
  }
  CHECK_VALUE(weights.size() == c.letters.size(), "recurrent op: expected ", c.letters.size(), " weights");
  for (size_t k = 0; k < c.letters.size(); ++k) {
    const Tensor& w = weights[k];
    for (int d = 0; d < c.directions; ++d) {
      switch (c.letters[k]) {
        case 'W': result[d].W = ops::select(w, 0, d); break;
        case 'R': result[d].R = ops::select(w, 0, d); break;
        case 'B': {
          Tensor halves = ops::select(w, 0, d);
          const int64_t half = halves.size(0) / 2;
          result[d].Wb = ops::narrow(halves, 0, 0, half);
          result[d].Rb = ops::narrow(halves, 0, half, half);
          break;
        }
        case 'P': result[d].P = ops::select(w, 0, d); break;
      }
    }
  }
  return result;
}

// Where each part of a direction's packed weights lies in the node's packed buffer (recurrent_pack's tensor:
// direction after direction), in elements: every gate block in ONNX gate order, hidden units padded to whole blocks
// of `lanes`, each part a whole number of blocks.
struct PackedLayout {
  int64_t input;      // Wᵀ: [blocks, I, gates, lanes]
  int64_t bias;       // the biases folded into the input projection, [blocks, gates, lanes] (zeros if none)
  int64_t recurrent;  // Rᵀ: [blocks, H, gates, lanes] (GRU without linear_before_reset: z and r only)
  int64_t candidate;  // GRU without linear_before_reset: the h gate's Rᵀ, [blocks, H, 1, lanes]
  int64_t inner;      // GRU with linear_before_reset: Rb of the h gate, which r multiplies, [blocks, lanes]
  int64_t peepholes;  // LSTM with P: [3, Hpad] (i, o, f)
  int64_t size;       // one direction's

  PackedLayout(const Config& c, int64_t hidden, int64_t input_size, bool has_peepholes, int64_t lanes) {
    const int64_t hpad = (hidden + lanes - 1) / lanes * lanes;
    const bool split = c.cell == CellType::GRU && !c.linear_before_reset, lbr = c.cell == CellType::GRU && !split;
    input = 0;
    bias = input + hpad * input_size * c.gates;
    recurrent = bias + hpad * c.gates;
    candidate = recurrent + hpad * hidden * (split ? 2 : c.gates);
    inner = candidate + (split ? hpad * hidden : 0);
    peepholes = inner + (lbr ? hpad : 0);
    size = peepholes + (has_peepholes ? 3 * hpad : 0);
  }
};

template <typename T>
struct Packed {  // one direction's parts (PackedLayout); nullptr where absent
  const T *input, *bias, *recurrent, *candidate, *inner, *peepholes;
};

// Rows [g·H, (g+1)·H) of M [gates·H, K] for each block g of `rows`, as [blocks, K, len(rows), lanes] zero-padded
// to whole blocks: the panel a tile multiplies.
template <typename T>
void pack_rows(const T* M, int64_t K, const std::vector<int>& rows, int64_t hidden, int64_t lanes, T* out) {
  const int64_t blocks = (hidden + lanes - 1) / lanes, G = static_cast<int64_t>(rows.size());
  for (int64_t b = 0; b < blocks; ++b) {
    for (int64_t k = 0; k < K; ++k) {
      for (int64_t g = 0; g < G; ++g) {
        for (int64_t l = 0; l < lanes; ++l) {
          const int64_t unit = b * lanes + l;
          *out++ = unit < hidden ? M[(rows[g] * hidden + unit) * K + k] : T(0);
        }
      }
    }
  }
}

// t in the compute dtype and contiguous, without a dispatch when it already is.
Tensor as_compute(const Tensor& t, ScalarType dtype) {
  return t.scalar_type() == dtype && t.is_contiguous() ? t : ops::contiguous(ops::to(t, dtype));
}

// One direction's weights packed into `out` (PackedLayout's parts).
template <typename T>
void pack(const Config& c, const Weights& w, const PackedLayout& at, int64_t lanes, T* out) {
  const ScalarType dtype = torch::headeronly::CppTypeToScalarType<T>::value;
  const int64_t hidden = w.R.size(1), input = w.W.size(1), hpad = (hidden + lanes - 1) / lanes * lanes;
  const std::array<int, 4> src = source_blocks(c);
  const std::vector<int> all(src.begin(), src.begin() + c.gates);
  const bool split_candidate = c.cell == CellType::GRU && !c.linear_before_reset;
  const bool lbr = c.cell == CellType::GRU && c.linear_before_reset;
  const Tensor W = as_compute(w.W, dtype), R = as_compute(w.R, dtype);
  pack_rows(W.mutable_data_ptr<T>(), input, all, hidden, lanes, out + at.input);
  pack_rows(R.mutable_data_ptr<T>(), hidden, split_candidate ? std::vector<int>{src[0], src[1]} : all, hidden, lanes,
            out + at.recurrent);
  if (split_candidate) pack_rows(R.mutable_data_ptr<T>(), hidden, {src[2]}, hidden, lanes, out + at.candidate);
  std::vector<T> bias(c.gates * hidden, T(0)), inner(hidden, T(0));
  if (w.Wb.defined()) {
    const Tensor Wb = as_compute(w.Wb, dtype), Rb = as_compute(w.Rb, dtype);
    std::vector<T> rb(Rb.mutable_data_ptr<T>(), Rb.mutable_data_ptr<T>() + c.gates * hidden);
    if (lbr) {  // r multiplies the h gate's Rb: it stays in the step
      std::copy_n(rb.begin() + src[2] * hidden, hidden, inner.begin());
      std::fill_n(rb.begin() + src[2] * hidden, hidden, T(0));
    }
    for (int64_t k = 0; k < c.gates * hidden; ++k) bias[k] = Wb.mutable_data_ptr<T>()[k] + rb[k];
  }
  pack_rows(bias.data(), 1, all, hidden, lanes, out + at.bias);
  if (lbr) pack_rows(inner.data(), 1, {0}, hidden, lanes, out + at.inner);
  if (w.P.defined()) {
    const Tensor P = as_compute(w.P, dtype);
    for (int j = 0; j < 3; ++j)
      pack_rows(P.mutable_data_ptr<T>() + j * hidden, 1, {0}, hidden, lanes, out + at.peepholes + j * hpad);
  }
}

// The packed weights cross the op boundary as one tensor per node (recurrent_pack's): the Python side caches it
// (op.py, PackCache), keyed on the weight tensors' identity and version counters, which PyTorch's stable ABI does
// not show to C++.
template <typename T>
std::vector<Packed<T>> unpacked(const Config& c, const Tensor& buffer, int64_t hidden, int64_t input,
                                bool has_peepholes, int64_t offset, bool whole) {
  const PackedLayout at(c, hidden, input, has_peepholes, Vec<T>::lanes);
  const int64_t end = offset + at.size * c.directions;
  STD_TORCH_CHECK(buffer.scalar_type() == torch::headeronly::CppTypeToScalarType<T>::value && buffer.is_contiguous() &&
                  offset >= 0 && (whole ? buffer.numel() == end : buffer.numel() >= end),
              "recurrent op: packed weights of another node");
  std::vector<Packed<T>> packed(c.directions);
  for (int d = 0; d < c.directions; ++d) {
    const T* base = buffer.mutable_data_ptr<T>() + offset + d * at.size;
    const bool split = c.cell == CellType::GRU && !c.linear_before_reset;
    packed[d] = {base + at.input, base + at.bias, base + at.recurrent, split ? base + at.candidate : nullptr,
                 c.cell == CellType::GRU && !split ? base + at.inner : nullptr,
                 has_peepholes ? base + at.peepholes : nullptr};
  }
  return packed;
}

// ---- one direction's recurrence ---------------------------------------------------------------------------------

// The state's product for a tile of MR rows and one block: acc[m][g] = Σ_k a[m, k] · panel[k, g, :], with U
// independent partial sums over k so that at least 8 FMA chains are in flight. Not inlined: inlined into the GRU
// candidate tile (linear_before_reset=0), GCC 12 kept the partial sums on the stack, a load and a store around every
// FMA, and that GRU ran 1.5x slower; the call costs about 10 ns per tile.
template <typename T, int MR, int G>
__attribute__((noinline)) void product(const T* a, int64_t lda, const T* panel, int64_t K, V<T> (&acc)[MR][G]) {
  constexpr int L = Vec<T>::lanes;
  constexpr int U = MR * G >= 8 ? 1 : MR * G >= 4 ? 2 : 4;
  V<T> part[U][MR][G] = {};
  int64_t k = 0;
  for (; k + U <= K; k += U) {
#pragma GCC unroll 4
    for (int u = 0; u < U; ++u) {
      V<T> b[G];
#pragma GCC unroll 4
      for (int g = 0; g < G; ++g) {
        b[g] = load(panel + ((k + u) * G + g) * L);
        // in a register: folded into each FMA as a memory operand, b would be loaded MR times (load-bound)
        in_register<T>(b[g]);
      }
#pragma GCC unroll 4
      for (int m = 0; m < MR; ++m) {
        const T s = a[m * lda + k + u];
#pragma GCC unroll 4
        for (int g = 0; g < G; ++g) part[u][m][g] += b[g] * s;
      }
    }
  }
  for (; k < K; ++k) {
    for (int g = 0; g < G; ++g) {
      const V<T> b = load(panel + (k * G + g) * L);
      for (int m = 0; m < MR; ++m) part[0][m][g] += b * a[m * lda + k];
    }
  }
  for (int m = 0; m < MR; ++m) {
    for (int g = 0; g < G; ++g) {
      acc[m][g] = part[0][m][g];
      for (int u = 1; u < U; ++u) acc[m][g] += part[u][m][g];
    }
  }
}

enum class Row : char { Active, Masked, Finished };

// One direction's recurrence over buffers laid out by `run` below.
template <typename T>
struct Direction {
  static constexpr int L = Vec<T>::lanes;
  const Config* c;
  int d;
  int64_t steps, batch, hidden, hpad, blocks;
  const Packed<T>* packed;
  // the input projection: time t of batch row n is xproj + (t * row_t + n * row_n) * x_stride, blocked like the
  // packed weights: [blocks, gates, lanes]
  T* xproj;
  int64_t x_stride, row_t, row_n;
  const int64_t* lens;
  const char* mask;  // X's rows (mask_rows)
  T* y;  // nullptr when Y is not asked for; else Y + this direction's offset
  int64_t y_t, y_n;
  T *h_prev, *h_next, *cell, *z, *rh, *last;  // [batch, hpad] each
  // per step
  int64_t prepared = -1;  // the step that rows, x_rows and y_rows are for
  std::vector<Row> rows;
  std::vector<const T*> x_rows;
  std::vector<T*> y_rows;

  const Activation& act(int role) const { return c->activation(d, role); }

  // X·Wᵀ + biases for every time step and the hidden blocks [b0, b1), in tiles of rows of X (x [rows, I]).
  void project(const T* x, int64_t rows_total, int64_t input, int64_t b0, int64_t b1) const {
    switch (c->gates) {
      case 4: return project_blocks<4>(x, rows_total, input, b0, b1);
      case 3: return project_blocks<3>(x, rows_total, input, b0, b1);
      default: return project_blocks<1>(x, rows_total, input, b0, b1);
    }
  }

  template <int G>
  void project_blocks(const T* x, int64_t rows_total, int64_t input, int64_t b0, int64_t b1) const {
    const T* panels = packed->input;
    const T* bias = packed->bias;
    for (int64_t b = b0; b < b1; ++b) {
      const T* panel = panels + b * input * G * L;
      int64_t r = 0;
      for (; r + kTile <= rows_total; r += kTile) project_tile<kTile, G>(x, input, panel, bias + b * G * L, r, b);
      switch (rows_total - r) {
        case 1: project_tile<1, G>(x, input, panel, bias + b * G * L, r, b); break;
        case 2: project_tile<2, G>(x, input, panel, bias + b * G * L, r, b); break;
        case 3: project_tile<3, G>(x, input, panel, bias + b * G * L, r, b); break;
        default: break;
      }
    }
  }

  template <int MR, int G>
  void project_tile(const T* x, int64_t input, const T* panel, const T* bias, int64_t r, int64_t b) const {
    V<T> acc[MR][G];
    product<T, MR, G>(x + r * input, input, panel, input, acc);
    for (int m = 0; m < MR; ++m) {
      T* out = xproj + (r + m) * x_stride + b * G * L;
      for (int g = 0; g < G; ++g) store(out + g * L, acc[m][g] + load(bias + g * L));
    }
  }

  // Which rows run at processing step s, the x and Y rows they read and write (time order: reversed per row).
  void prepare_step(int64_t s) {
    prepared = s;
    for (int64_t n = 0; n < batch; ++n) {
      const int64_t length = lens ? lens[n] : steps;
      if (s >= length) {
        rows[n] = Row::Finished;
        continue;
      }
      const int64_t t = c->reversed(d) ? length - 1 - s : s;
      const int64_t row = t * row_t + n * row_n;
      rows[n] = mask && !mask[row] ? Row::Masked : Row::Active;
      x_rows[n] = xproj + row * x_stride;
      y_rows[n] = y ? y + t * y_t + n * y_n : nullptr;
    }
  }

  // A row that does not run this step keeps its state; a masked one outputs zeros or its previous output.
  void hold(int64_t n, int64_t b) {
    const int64_t at = n * hpad + b * L;
    store(h_next + at, load(h_prev + at));
    if (rows[n] == Row::Masked && y_rows[n])
      store(y_rows[n] + b * L, c->mask_output == 1 ? load(last + at) : V<T>{}, std::min<int64_t>(L, hidden - b * L));
  }

  void emit(int64_t n, int64_t b, V<T> h) {
    const int64_t at = n * hpad + b * L;
    store(h_next + at, h);
    if (y_rows[n]) store(y_rows[n] + b * L, h, std::min<int64_t>(L, hidden - b * L));
    if (last) store(last + at, h);
  }

  V<T> clip(V<T> x) const { return c->has_clip ? clamp<T>(x, -c->clip, c->clip) : x; }

  V<T> x_gate(int64_t n, int g, int64_t b) const { return load(x_rows[n] + (b * c->gates + g) * L); }

  template <int MR>
  void lstm_tile(int64_t n0, int64_t b) {
    V<T> acc[MR][4];
    product<T, MR, 4>(h_prev + n0 * hpad, hpad, packed->recurrent + b * hidden * 4 * L, hidden, acc);
    const T* peep = packed->peepholes ? packed->peepholes + b * L : nullptr;
    for (int m = 0; m < MR; ++m) {
      const int64_t n = n0 + m;
      if (rows[n] != Row::Active) {
        hold(n, b);
        continue;
      }
      T* c_at = cell + n * hpad + b * L;
      const V<T> c_prev = load(c_at);
      V<T> i = acc[m][0] + x_gate(n, 0, b), o = acc[m][1] + x_gate(n, 1, b);
      V<T> f = acc[m][2] + x_gate(n, 2, b), g = acc[m][3] + x_gate(n, 3, b);
      if (peep) {  // onnxruntime clips after adding the peephole term
        i += load(peep) * c_prev;
        f += load(peep + 2 * hpad) * c_prev;
      }
      i = activate<T>(act(0), clip(i));
      f = c->input_forget ? 1 - i : activate<T>(act(0), clip(f));
      const V<T> c_new = f * c_prev + i * activate<T>(act(1), clip(g));  // C itself is not clipped
      if (peep) o += load(peep + hpad) * c_new;
      store(c_at, c_new);
      emit(n, b, activate<T>(act(0), clip(o)) * activate<T>(act(2), c_new));
    }
  }

  template <int MR>
  void gru_tile(int64_t n0, int64_t b) {  // linear_before_reset: h~ = g(xh + r * (H·Rhᵀ + Rbh))
    V<T> acc[MR][3];
    product<T, MR, 3>(h_prev + n0 * hpad, hpad, packed->recurrent + b * hidden * 3 * L, hidden, acc);
    const V<T> inner = load(packed->inner + b * L);
    for (int m = 0; m < MR; ++m) {
      const int64_t n = n0 + m;
      if (rows[n] != Row::Active) {
        hold(n, b);
        continue;
      }
      const V<T> z = activate<T>(act(0), clip(acc[m][0] + x_gate(n, 0, b)));
      const V<T> r = activate<T>(act(0), clip(acc[m][1] + x_gate(n, 1, b)));
      const V<T> candidate = activate<T>(act(1), clip(x_gate(n, 2, b) + r * (acc[m][2] + inner)));
      const V<T> h = load(h_prev + n * hpad + b * L);
      emit(n, b, candidate + z * (h - candidate));  // (1 - z) * h~ + z * H
    }
  }

  template <int MR>
  void gru_gates_tile(int64_t n0, int64_t b) {  // without linear_before_reset, first z and r * H for all units
    V<T> acc[MR][2];
    product<T, MR, 2>(h_prev + n0 * hpad, hpad, packed->recurrent + b * hidden * 2 * L, hidden, acc);
    for (int m = 0; m < MR; ++m) {
      const int64_t n = n0 + m, at = n * hpad + b * L;
      if (rows[n] != Row::Active) continue;
      store(z + at, activate<T>(act(0), clip(acc[m][0] + x_gate(n, 0, b))));
      const V<T> r = activate<T>(act(0), clip(acc[m][1] + x_gate(n, 1, b)));
      store(rh + at, r * load(h_prev + at));
    }
  }

  template <int MR>
  void gru_candidate_tile(int64_t n0, int64_t b) {  // then h~ = g(xh + (r * H)·Rhᵀ + Rbh)
    V<T> acc[MR][1];
    product<T, MR, 1>(rh + n0 * hpad, hpad, packed->candidate + b * hidden * L, hidden, acc);
    for (int m = 0; m < MR; ++m) {
      const int64_t n = n0 + m, at = n * hpad + b * L;
      if (rows[n] != Row::Active) {
        hold(n, b);
        continue;
      }
      const V<T> candidate = activate<T>(act(1), clip(acc[m][0] + x_gate(n, 2, b)));
      const V<T> h = load(h_prev + at);
      emit(n, b, candidate + load(z + at) * (h - candidate));
    }
  }

  template <int MR>
  void rnn_tile(int64_t n0, int64_t b) {
    V<T> acc[MR][1];
    product<T, MR, 1>(h_prev + n0 * hpad, hpad, packed->recurrent + b * hidden * L, hidden, acc);
    for (int m = 0; m < MR; ++m) {
      const int64_t n = n0 + m;
      if (rows[n] != Row::Active) {
        hold(n, b);
        continue;
      }
      emit(n, b, activate<T>(act(0), clip(acc[m][0] + x_gate(n, 0, b))));
    }
  }

  // Every row tile of the blocks [b0, b1), through the tile function chosen at run time by the tile's rows.
  template <template <int> class Tile>
  void blocks_of(int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      int64_t n = 0;
      for (; n + kTile <= batch; n += kTile) Tile<kTile>::run(*this, n, b);
      switch (batch - n) {
        case 1: Tile<1>::run(*this, n, b); break;
        case 2: Tile<2>::run(*this, n, b); break;
        case 3: Tile<3>::run(*this, n, b); break;
        default: break;
      }
    }
  }

  template <int MR> struct Lstm { static void run(Direction& s, int64_t n, int64_t b) { s.lstm_tile<MR>(n, b); } };
  template <int MR> struct Gru { static void run(Direction& s, int64_t n, int64_t b) { s.gru_tile<MR>(n, b); } };
  template <int MR> struct GruGates {
    static void run(Direction& s, int64_t n, int64_t b) { s.gru_gates_tile<MR>(n, b); }
  };
  template <int MR> struct GruCandidate {
    static void run(Direction& s, int64_t n, int64_t b) { s.gru_candidate_tile<MR>(n, b); }
  };
  template <int MR> struct Rnn { static void run(Direction& s, int64_t n, int64_t b) { s.rnn_tile<MR>(n, b); } };

  // A step's passes: two for a GRU without linear_before_reset (its candidate's product reads r·H of every block),
  // one otherwise.
  int passes() const { return c->cell == CellType::GRU && !c->linear_before_reset ? 2 : 1; }

  // Pass `pass` of the prepared step over the hidden blocks [b0, b1).
  void step_blocks(int pass, int64_t b0, int64_t b1) {
    switch (c->cell) {
      case CellType::LSTM: return blocks_of<Lstm>(b0, b1);
      case CellType::RNN: return blocks_of<Rnn>(b0, b1);
      case CellType::GRU:
        if (c->linear_before_reset) return blocks_of<Gru>(b0, b1);
        return pass == 0 ? blocks_of<GruGates>(b0, b1) : blocks_of<GruCandidate>(b0, b1);
    }
  }

  // Makes this copy ready for step s of a recurrence whose states alternate between h0 (even steps read it) and h1.
  void at_step(int64_t s, T* h0, T* h1) {
    prepare_step(s);
    h_prev = s % 2 ? h1 : h0;
    h_next = s % 2 ? h0 : h1;
  }

  // `longest` steps: the longest row's length. Every step writes every row's state into h_next (rows that do not
  // run copy theirs), so after the loop h_prev holds each row's state after its own last step.
  void recur(int64_t longest) {
    for (int64_t s = 0; s < longest; ++s) {
      prepare_step(s);
      for (int pass = 0; pass < passes(); ++pass) step_blocks(pass, 0, blocks);
      std::swap(h_prev, h_next);
    }
  }
};

// ---- checks (the messages of runtime.py's) -------------------------------------------------------------------------

template <typename Shape>
std::string shape_text(const Shape& shape) {  // as Python prints a list: [2, 3]
  std::ostringstream text;
  text << "[";
  for (size_t k = 0; k < shape.size(); ++k) text << (k ? ", " : "") << shape[k];
  text << "]";
  return text.str();
}

// A dtype as Python prints it (torch.float32 -> float32), for validation.py's words.
std::string dtype_text(ScalarType dtype) {
  switch (dtype) {
    case ScalarType::Float: return "float32";
    case ScalarType::Double: return "float64";
    case ScalarType::Half: return "float16";
    case ScalarType::BFloat16: return "bfloat16";
    case ScalarType::Char: return "int8";
    case ScalarType::Short: return "int16";
    case ScalarType::Int: return "int32";
    case ScalarType::Long: return "int64";
    case ScalarType::Byte: return "uint8";
    case ScalarType::Bool: return "bool";
    default: return torch::headeronly::toString(dtype);
  }
}

// The messages of validation.py's (`expected` as the tensor's own layout has it).
template <typename Sizes>
void check_sizes(const char* name, const Sizes& got, const Dims& expected) {
  CHECK_VALUE(std::equal(got.begin(), got.end(), expected.begin(), expected.end()), name, " must have shape ",
              shape_text(expected), ", got ", shape_text(got));
}

void check_shape(const char* name, const Tensor& t, const Dims& expected) { check_sizes(name, t.sizes(), expected); }

void check_shape(const char* name, const std::optional<Tensor>& t, const Dims& expected) {
  if (t) check_shape(name, *t, expected);
}

// The hidden and input sizes, after checking every weight's shape.
std::pair<int64_t, int64_t> checked_weights(const Config& c, const Tensors& weights) {
  const int64_t D = c.directions;
  int64_t hidden, input;
  if (c.torch_weights) {
    const size_t per = weights.size() / D;
    CHECK_VALUE((per == 2 || per == 4) && per * D == weights.size(), "recurrent op: bad torch weights");
    hidden = c.hidden_size > 0 ? c.hidden_size : weights[1].size(-1), input = weights[0].size(-1);
    const int64_t gh = c.gates * hidden;
    for (int64_t d = 0; d < D; ++d) {
      check_shape("weight_ih", weights[d * per], {gh, input});
      check_shape("weight_hh", weights[d * per + 1], {gh, hidden});
      for (size_t k = 2; k < per; ++k) check_shape("bias", weights[d * per + k], {gh});
    }
  } else {
    CHECK_VALUE(weights.size() == c.letters.size() && c.letters.substr(0, 2) == "WR",
                "recurrent op: expected the weights ", c.letters);
    hidden = c.hidden_size > 0 ? c.hidden_size : weights[1].size(-1), input = weights[0].size(-1);
    const int64_t gh = c.gates * hidden;
    check_shape("W", weights[0], {D, gh, input});
    check_shape("R", weights[1], {D, gh, hidden});
    for (size_t k = 2; k < weights.size(); ++k) {
      if (c.letters[k] == 'B') check_shape("B", weights[k], {D, 2 * gh});
      if (c.letters[k] == 'P') check_shape("P", weights[k], {D, 3 * hidden});
    }
  }
  return {hidden, input};
}

// sequence_lens checked, as int64 (read through its strides: no tensor op).
std::vector<int64_t> checked_lengths(const Tensor& sequence_lens, int64_t steps, int64_t batch) {
  const ScalarType dtype = sequence_lens.scalar_type();
  CHECK_VALUE(dtype == ScalarType::Int || dtype == ScalarType::Long, "sequence_lens must be int32 or int64, got ",
              dtype_text(dtype));
  check_shape("sequence_lens", sequence_lens, {batch});
  std::vector<int64_t> lens(batch);
  const int64_t stride = batch > 1 ? sequence_lens.stride(0) : 1;
  const void* data = sequence_lens.const_data_ptr();
  for (int64_t n = 0; n < batch; ++n)
    lens[n] = dtype == ScalarType::Int ? static_cast<const int32_t*>(data)[n * stride]
                                       : static_cast<const int64_t*>(data)[n * stride];
  if (std::any_of(lens.begin(), lens.end(), [steps](int64_t v) { return v < 0 || v > steps; })) {
    std::ostringstream values;
    for (int64_t n = 0; n < batch; ++n) values << (n ? ", " : "") << lens[n];
    CHECK_VALUE(false, "sequence_lens values must lie in [0, ", steps, "] (the sequence length of X), got [",
                values.str(), "]");
  }
  return lens;
}

// ---- threads ----------------------------------------------------------------------------------------------------

// Waits a little without giving up the core (a few tens of cycles per call).
inline void relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Work in phases of `parts` pieces, run in order: a piece of phase p starts once every piece of phase p - 1 has
// finished. Each thread (slot) owns a range of every phase's parts, which it claims first (so that a thread keeps
// touching the same weights, which stay in its core's cache), then claims the other slots' unclaimed pieces. A
// thread holds nothing it has not started: one the OS does not run (a busy machine) costs the others at most the
// piece it was running, where a barrier per step waited for it at every step. Shared by the threads through a
// shared_ptr: a worker that comes late finds nothing to claim; `piece` (the caller's) is read only by a thread that
// has claimed a piece, which the caller waits for.
class Job {
 public:
  using Piece = std::function<void(int slot, int64_t phase, int64_t part)>;

  Job(int slots, int64_t phases, int64_t parts, const Piece* piece)
      : slots_(slots), phases_(phases), parts_(parts), piece_(piece), slot_(slots) {
    for (int k = 0; k < slots; ++k) {
      slot_[k].first = parts * k / slots;
      slot_[k].size = parts * (k + 1) / slots - slot_[k].first;
    }
  }

  int slots() const { return slots_; }

  // Runs pieces as slot `me` until none is left to claim; returns while others may still run theirs. The caller
  // (slot 0), when it waits for another thread's piece far longer than its own last piece took (the OS took that
  // thread off its core), runs every remaining piece itself: the others claim no more.
  void work(int me) {
    Clock::time_point since;  // when the caller began to wait
    for (int64_t waited = 0;;) {
      if (me != 0 && alone_.load(std::memory_order_relaxed)) return;
      int64_t phase = 0, part = 0;
      const Claim claim = next(me, phase, part);
      if (claim == Claim::None) return;
      if (claim == Claim::Wait) {  // a phase still runs on another thread
        if (me == 0 && waited == 0) since = Clock::now();
        if (me == 0 && waited % 256 == 255) stalls(since);
        pause(waited++);
        continue;
      }
      waited = 0;
      const Clock::time_point start = me == 0 ? Clock::now() : Clock::time_point();
      (*piece_)(me, phase, part);
      if (me == 0) last_ = Clock::now() - start;
      done_.fetch_add(1, std::memory_order_release);
    }
  }

  // After `work`: waits for the pieces other threads are still running. A wait here is a stall too (both
  // directions at once: the other direction is one piece, which a thread the OS took off its core holds).
  void finish() {
    const Clock::time_point since = Clock::now();
    for (int64_t waited = 0; done_.load(std::memory_order_acquire) < parts_ * phases_;) {
      if (waited % 256 == 255) stalls(since);
      pause(waited++);
    }
  }

  // Whether the caller stopped sharing because another thread stalled it.
  bool stalled() const { return alone_.load(std::memory_order_relaxed); }

 private:
  using Clock = std::chrono::steady_clock;
  enum class Claim { Piece, Wait, None };  // a piece claimed; none yet (its phase waits for the last); none left

  // The caller, waiting since `since` far longer than its own last piece took (the OS took a thread that holds a
  // piece off its core), stops sharing: the others claim no more.
  void stalls(Clock::time_point since) {
    if (Clock::now() - since > 4 * last_ + std::chrono::microseconds(50))
      alone_.store(true, std::memory_order_relaxed);
  }

  // Claims the next piece: slot `me`'s own first, then the others'.
  Claim next(int me, int64_t& phase, int64_t& part) {
    const int64_t open = done_.load(std::memory_order_acquire) / parts_;  // phases [0, open] may start
    Claim result = Claim::None;
    for (int k = 0; k < slots_; ++k) {
      Slot& s = slot_[(me + k) % slots_];
      for (int64_t q = s.next.load(std::memory_order_relaxed); q < s.size * phases_;) {
        if (q / s.size > open) {
          result = Claim::Wait;
          break;
        }
        if (s.next.compare_exchange_weak(q, q + 1, std::memory_order_relaxed)) {
          phase = q / s.size;
          part = s.first + q % s.size;
          return Claim::Piece;
        }
      }
    }
    return result;
  }

  // Spins first; past about 50 microseconds (a thread the OS took off its core) also gives the core away.
  static void pause(int64_t waited) {
    if (waited < 2000) return relax();
    std::this_thread::yield();
  }

  struct alignas(64) Slot {
    std::atomic<int64_t> next{0};  // pieces of this slot claimed, over all phases: q is part q % size of phase q / size
    int64_t first = 0, size = 0;   // the slot's parts of a phase: [first, first + size)
  };
  const int slots_;
  const int64_t phases_, parts_;
  const Piece* piece_;
  std::vector<Slot> slot_;
  alignas(64) std::atomic<int64_t> done_{0};  // pieces finished
  std::atomic<bool> alone_{false};
  Clock::duration last_{};  // the caller's last piece
};

// Worker threads for Jobs: slot k + 1 of a job is worker k's. A worker spins for a while after each job, so that
// the next one (a model calls the kernel layer after layer, step after step of a Loop) finds it awake, then sleeps.
// Not torch's thread pools: an OpenMP team's region ends by waiting for every thread of the team, scheduled or not,
// and torch's inter-op pool (at::launch) wakes its threads only by a condition variable, tens of microseconds too
// late for a node that takes a hundred. One job at a time: a second caller (two Python threads) runs alone.
class Pool {
 public:
  // This process's pool (a forked child starts a new one: its parent's threads are not in it).
  static Pool& get() {
    static std::once_flag forks;
#if __has_include(<pthread.h>)
    std::call_once(forks, [] { pthread_atfork(nullptr, nullptr, [] { current().store(nullptr); }); });
#endif
    Pool* pool = current().load(std::memory_order_acquire);
    if (!pool) {
      Pool* fresh = new Pool();  // never deleted: a worker may still spin on it as the process exits
      pool = current().compare_exchange_strong(pool, fresh) ? fresh : (delete fresh, pool);
    }
    return *pool;
  }

  // Offers `job` to workers 1 .. job->slots() - 1; false (the caller runs every piece) if another job has the pool
  // or a recent job stalled.
  bool offer(const std::shared_ptr<Job>& job) {
    if (Clock::now().time_since_epoch().count() < quiet_until_.load(std::memory_order_relaxed)) return false;
    if (busy_.exchange(true, std::memory_order_acquire)) return false;
    std::lock_guard<std::mutex> lock(mutex_);
    for (; workers_ < job->slots() - 1; ++workers_) std::thread([this, slot = workers_ + 1] { serve(slot); }).detach();
    job_ = job;
    generation_.fetch_add(1, std::memory_order_release);
    if (sleeping_) wake_.notify_all();
    return true;
  }

  // After an offered job. A job that stalled (the machine is busy: the OS runs some of our threads, not all) makes
  // the next ones run alone for a while, 1 ms at first, twice as long after each stall in a row, up to 200 ms; a
  // job that did not halves that.
  void release(bool stalled) {
    if (stalled) quiet_until_.store((Clock::now() + quiet_).time_since_epoch().count(), std::memory_order_relaxed);
    quiet_ = stalled ? std::min<Clock::duration>(2 * quiet_, std::chrono::milliseconds(200))
                     : std::max<Clock::duration>(quiet_ / 2, std::chrono::milliseconds(1));
    busy_.store(false, std::memory_order_release);
  }

 private:
  using Clock = std::chrono::steady_clock;

  static std::atomic<Pool*>& current() {
    static std::atomic<Pool*> pool{nullptr};
    return pool;
  }

  void serve(int slot) {
    uint64_t seen = 0;
    for (;;) {
      std::shared_ptr<Job> job = next(seen);
      if (slot < job->slots()) job->work(slot);
    }
  }

  // The next job after generation `seen`: spins for kSpin, then sleeps.
  std::shared_ptr<Job> next(uint64_t& seen) {
    static constexpr auto kSpin = std::chrono::microseconds(100);
    const auto start = std::chrono::steady_clock::now();
    for (int k = 1; generation_.load(std::memory_order_acquire) == seen; ++k) {
      relax();
      if (k % 256 == 0 && std::chrono::steady_clock::now() - start > kSpin) break;
    }
    std::unique_lock<std::mutex> lock(mutex_);
    ++sleeping_;
    wake_.wait(lock, [&] { return generation_.load(std::memory_order_relaxed) != seen; });
    --sleeping_;
    seen = generation_.load(std::memory_order_relaxed);
    return job_;
  }

  std::atomic<bool> busy_{false};
  Clock::duration quiet_ = std::chrono::milliseconds(1);  // how long the next stall keeps jobs alone
  std::atomic<Clock::rep> quiet_until_{0};                 // no job is offered before this time
  std::atomic<uint64_t> generation_{0};
  std::mutex mutex_;  // guards the rest
  std::condition_variable wake_;
  std::shared_ptr<Job> job_;
  int workers_ = 0, sleeping_ = 0;
};

// For its lifetime, torch's own parallel ops (at::parallel_for) called by this thread run on this thread only: the
// kernel's few tensor ops (a zero fill, packing, casts) would otherwise open an OpenMP region each, and on a busy
// machine a region waits for a descheduled OpenMP thread (milliseconds). `threads()`: the count the caller set
// (torch.set_num_threads), for the kernel's own threads.
class OneThread {
 public:
  OneThread() : threads_(omp_in_parallel() ? 1 : static_cast<int>(ops::get_num_threads())) {
#ifdef _OPENMP
    if (threads_ > 1) omp_set_num_threads(1);  // the calling thread's setting, which get_num_threads reads
#endif
  }
  ~OneThread() {
#ifdef _OPENMP
    if (threads_ > 1) omp_set_num_threads(threads_);
#endif
  }
  OneThread(const OneThread&) = delete;
  OneThread& operator=(const OneThread&) = delete;

  int threads() const { return threads_; }

 private:
  const int threads_;
};

// Runs `phases` phases of `parts` pieces (see Job) on the calling thread and up to threads - 1 workers.
void share(int threads, int64_t phases, int64_t parts, const Job::Piece& piece) {
  auto job = std::make_shared<Job>(threads, phases, parts, &piece);
  Pool* pool = threads > 1 ? &Pool::get() : nullptr;
  if (pool && !pool->offer(job)) pool = nullptr;
  job->work(0);
  job->finish();
  if (pool) pool->release(job->stalled());
}

// ---- the op -----------------------------------------------------------------------------------------------------

// The kernel reads its inputs through their strides and makes its outputs in the layout asked for: the tensor ops
// of PyTorch's stable ABI (torch/csrc/stable/ops.h: to, contiguous, transpose, ...) go through the dispatcher's
// boxed path, found by name, a microsecond or more each, which a batch-1 call notices. Only a dtype the kernel does
// not compute in (float16 and bfloat16, cast to float32) takes one.

// Copies the initial states of a [D, N, H] / [N, D, H] tensor (by layout, any strides) into the [D, N, hpad] work
// buffers.
template <typename T>
void load_states(const Config& c, const Tensor& given, T* to, int64_t batch, int64_t hidden, int64_t hpad) {
  const ScalarType dtype = torch::headeronly::CppTypeToScalarType<T>::value;
  const Tensor states = given.scalar_type() == dtype ? given : ops::to(given, dtype);
  const T* from = states.const_data_ptr<T>();
  const int64_t sd = states.stride(c.layout ? 1 : 0), sn = states.stride(c.layout ? 0 : 1), sh = states.stride(2);
  for (int d = 0; d < c.directions; ++d) {
    for (int64_t n = 0; n < batch; ++n) {
      const T* row = from + d * sd + n * sn;
      T* out = to + (d * batch + n) * hpad;
      for (int64_t k = 0; k < hidden; ++k) out[k] = row[k * sh];
    }
  }
}

// Copies the final states from the [D, N, hpad] work buffers into a [D, N, H] / [N, D, H] tensor (by layout).
template <typename T>
void store_states(const Config& c, const T* from, T* to, int64_t batch, int64_t hidden, int64_t hpad) {
  for (int d = 0; d < c.directions; ++d) {
    for (int64_t n = 0; n < batch; ++n) {
      const int64_t tensor = (c.layout ? n * c.directions + d : d * batch + n) * hidden;
      std::memcpy(to + tensor, from + (d * batch + n) * hpad, sizeof(T) * hidden);
    }
  }
}

// X's rows as one block of T, in its layout's order (t·N + n, or n·T + t for layout 1): X's own data where it is that
// block, else a copy kept in `copy`. `swapped`: X has its first two dimensions swapped (a batch-first stack's X),
// and is read as its layers read it: the same tiles of rows, the same bits.
template <typename T>
const T* rows_of(const Tensor& X, bool swapped, std::optional<Tensor>& copy) {
  const ScalarType dtype = torch::headeronly::CppTypeToScalarType<T>::value;
  if (X.scalar_type() != dtype) copy = ops::to(X, dtype);  // float16, bfloat16: cast (rare), then as below
  const Tensor source = copy ? *copy : X;
  if (!swapped && source.is_contiguous()) return source.const_data_ptr<T>();
  const int first = swapped ? 1 : 0, second = 1 - first;
  const int64_t A = source.size(first), B = source.size(second), I = source.size(2);
  const int64_t sa = source.stride(first), sb = source.stride(second), si = source.stride(2);
  Tensor rows = empty({A, B, I}, dtype);
  const T* from = source.const_data_ptr<T>();
  T* to = rows.mutable_data_ptr<T>();
  for (int64_t a = 0; a < A; ++a)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < I; ++i) *to++ = from[a * sa + b * sb + i * si];
  copy = rows;
  return rows.const_data_ptr<T>();
}

// A node's mask [A, B] (X's first two dimensions) as bytes in X's row order a·B + b.
std::vector<char> mask_rows(const Tensor& mask) {
  const int64_t A = mask.size(0), B = mask.size(1), sa = mask.stride(0), sb = mask.stride(1);
  const bool* from = mask.const_data_ptr<bool>();
  std::vector<char> rows(A * B);
  for (int64_t a = 0; a < A; ++a)
    for (int64_t b = 0; b < B; ++b) rows[a * B + b] = from[a * sa + b * sb];
  return rows;
}

// Y's shape and strides, and where its element (t, d, n, 0) lies: t·t + d·d + n·n.
struct OutputLayout {
  Dims shape, strides;
  int64_t t, d, n;
};

// A node's Y: [T, D, N, H], or [N, T, D, H] for layout 1; `swap`: dimensions 0 and 1 swapped (a view's strides).
OutputLayout node_output(bool layout1, int64_t T, int64_t D, int64_t N, int64_t H, bool swap = false) {
  OutputLayout at = layout1 ? OutputLayout{{N, T, D, H}, {T * D * H, D * H, H, 1}, D * H, H, T * D * H}
                            : OutputLayout{{T, D, N, H}, {D * N * H, N * H, H, 1}, D * N * H, N * H, H};
  if (swap) {
    std::swap(at.shape[0], at.shape[1]);
    std::swap(at.strides[0], at.strides[1]);
  }
  return at;
}

// A stack layer's Y, its directions side by side: [T, N, D·H], or [N, T, D·H] (batch first), contiguous.
OutputLayout merged_output(bool batch_first, int64_t T, int64_t D, int64_t N, int64_t H) {
  if (batch_first) return {{N, T, D * H}, {T * D * H, D * H, 1}, D * H, H, T * D * H};
  return {{T, N, D * H}, {N * D * H, D * H, 1}, N * D * H, H, D * H};
}

// One core's L2 cache in bytes, as the C library reports it (1 MiB when it does not).
int64_t l2_bytes() {
  static const int64_t bytes = [] {
#ifdef _SC_LEVEL2_CACHE_SIZE  // glibc
    const long reported = sysconf(_SC_LEVEL2_CACHE_SIZE);
#else
    const long reported = 0;
#endif
    return reported > 0 ? int64_t{reported} : int64_t{1} << 20;
  }();
  return bytes;
}

// One node's inputs, checked: X as its layout has it, or with its first two dimensions swapped (rows_of); lens: each
// row's length, empty when every row runs every step (no per-row bookkeeping); mask: X's rows (mask_rows), empty for
// none.
struct Node {
  const Tensor& X;
  bool swapped;
  int64_t steps, batch, hidden;
  const std::vector<int64_t>& lens;
  const std::optional<Tensor>&h0, &c0;
  const std::vector<char>& mask;
  int64_t offset = 0;  // where the node's weights start in its packed tensor: a stack's holds every layer's
  bool whole = true;   // the packed tensor holds this node's weights alone
  bool none = false;   // an output not computed is an undefined tensor (None in Python: the stack op), else empty
};

template <typename T>
std::tuple<Tensor, Tensor, Tensor> run(const Config& c, const Node& node, const Tensor& packs, int threads,
                                       const OutputLayout& y_at) {
  constexpr int L = Vec<T>::lanes;
  const ScalarType dtype = torch::headeronly::CppTypeToScalarType<T>::value;
  const int64_t steps = node.steps, batch = node.batch, hidden = node.hidden, input = node.X.size(2);
  const int D = c.directions;
  const int64_t gh = c.gates * hidden;
  const int64_t hpad = (hidden + L - 1) / L * L, blocks = hpad / L;
  const Dims state_shape = c.layout ? Dims{batch, D, hidden} : Dims{D, batch, hidden};
  const std::vector<Packed<T>> packed =
      unpacked<T>(c, packs, hidden, input, has_peepholes(c), node.offset, node.whole);

  // One workspace: the input projection [D, T·N, blocks·gates·lanes], then h (twice), C, z, r·H and the held
  // outputs, [D, N, hpad] each.
  const int64_t rows = steps * batch, x_stride = blocks * c.gates * L, state = D * batch * hpad;
  Tensor work = empty({D * rows * x_stride + 6 * state}, dtype);
  T* base = work.mutable_data_ptr<T>();
  T *h = base + D * rows * x_stride, *cell = h + 2 * state, *scratch = cell + state;
  std::fill(h, h + 6 * state, T(0));
  if (node.h0) load_states(c, *node.h0, h, batch, hidden, hpad);
  if (node.c0) load_states(c, *node.c0, cell, batch, hidden, hpad);

  const bool any_lens = !node.lens.empty();
  std::optional<Tensor> y;  // zeros past each row's length: only the steps that run are written
  if (c.outputs[0]) {
    y = empty(y_at.shape, dtype, &y_at.strides);
    if (any_lens) std::fill_n(y->mutable_data_ptr<T>(), y->numel(), T(0));  // dense, whatever its strides
  }
  std::optional<Tensor> x_copy;
  const T* xp = rows_of<T>(node.X, node.swapped, x_copy);
  T* y_data = y ? y->mutable_data_ptr<T>() : nullptr;
  std::vector<Direction<T>> runs(D);
  for (int d = 0; d < D; ++d) {
    Direction<T>& r = runs[d];
    r.c = &c;
    r.d = d;
    r.steps = steps;
    r.batch = batch;
    r.hidden = hidden;
    r.hpad = hpad;
    r.blocks = blocks;
    r.packed = &packed[d];
    r.xproj = base + d * rows * x_stride;
    r.x_stride = x_stride;
    r.row_t = c.layout ? 1 : batch;
    r.row_n = c.layout ? steps : 1;
    r.lens = any_lens ? node.lens.data() : nullptr;
    r.mask = node.mask.empty() ? nullptr : node.mask.data();
    r.y = y_data ? y_data + d * y_at.d : nullptr;
    r.y_t = y_at.t;
    r.y_n = y_at.n;
    r.h_prev = h + d * batch * hpad;
    r.h_next = h + state + d * batch * hpad;
    r.cell = cell + d * batch * hpad;
    r.z = scratch + d * batch * hpad;
    r.rh = scratch + state + d * batch * hpad;
    r.last = c.mask_output == 1 ? scratch + 2 * state + d * batch * hpad : nullptr;
    r.rows.assign(batch, Row::Active);
    r.x_rows.assign(batch, nullptr);
    r.y_rows.assign(batch, nullptr);
  }
  // Threads: both directions at once, or else one direction's hidden blocks, in the input projection and per step,
  // when that work is worth sharing. Both directions at once only while one direction's recurrent weights fit half
  // a core's L2: past that (hidden 512 LSTM: 4 MiB) each core streams its direction's weights from memory every
  // step, and splitting every direction's blocks (each core then re-reads the half it keeps in cache) ran 1.7x
  // faster. A job (see `share`) only for kJobWork multiply-adds or more (some 30 us of one thread's work): waking
  // a worker that sleeps takes tens of microseconds, and a worker the OS does not run holds a whole direction. The
  // bundled tagger at batch 1, 16 steps (1-2 * 10^5 a direction, a projection 1.3 * 10^5) shared both and ran
  // 1.2-2.5x slower at 2 threads than at 1, idle or busy.
  const int64_t longest = any_lens ? *std::max_element(node.lens.begin(), node.lens.end()) : steps;
  constexpr int64_t kJobWork = int64_t{1} << 20;
  auto worth_splitting = [&](int64_t step, int64_t job) {  // a phase's work, the job's
    return threads > 1 && blocks > 1 && step >= (1 << 17) && job >= kJobWork;
  };
  const bool directions_at_once = D == 2 && threads > 1 && gh * hidden * int64_t{sizeof(T)} <= l2_bytes() / 2 &&
                                  rows * gh * (input + hidden) >= kJobWork;
  if (directions_at_once) {
    const Job::Piece piece = [&](int, int64_t, int64_t d) {
      runs[d].project(xp, rows, input, 0, blocks);
      runs[d].recur(longest);
    };
    share(2, 1, 2, piece);
  } else {
    for (Direction<T>& r : runs) {
      const bool split_projection = worth_splitting(rows * gh * input, rows * gh * input);
      const bool split_steps = worth_splitting(batch * gh * hidden, longest * batch * gh * hidden);
      if (!split_projection) r.project(xp, rows, input, 0, blocks);
      if (split_projection || split_steps) {  // phase 0: the projection, then each step's passes
        const int team = static_cast<int>(std::min<int64_t>(threads, blocks)), first = split_projection;
        std::vector<Direction<T>> own(team, r);  // each thread's copy of the step's bookkeeping
        T *h0 = r.h_prev, *h1 = r.h_next;
        const Job::Piece piece = [&](int slot, int64_t phase, int64_t part) {
          if (phase < first) return r.project(xp, rows, input, part, part + 1);
          Direction<T>& mine = own[slot];
          const int64_t s = (phase - first) / r.passes();
          if (mine.prepared != s) mine.at_step(s, h0, h1);
          mine.step_blocks(static_cast<int>((phase - first) % r.passes()), part, part + 1);
        };
        share(team, first + (split_steps ? longest * r.passes() : 0), blocks, piece);
      }
      if (!split_steps) r.recur(longest);
    }
  }

  // The final states: each row's after its last step; zero for a row of length 0 and for a sequence of length 0,
  // initial states or not (onnxruntime).
  std::optional<Tensor> y_h, y_c;
  const T* last_h = h + (longest % 2) * state;
  for (int k = 1; k < 3; ++k) {
    if (!c.outputs[k] || (k == 2 && c.cell != CellType::LSTM)) continue;
    Tensor out = empty(state_shape, dtype);
    T* states = out.mutable_data_ptr<T>();
    store_states(c, k == 1 ? last_h : cell, states, batch, hidden, hpad);
    for (int64_t n = 0; n < batch; ++n) {
      if (steps > 0 && !(any_lens && node.lens[n] == 0)) continue;
      for (int d = 0; d < D; ++d)  // the row's state of each direction (layout 0 [D, N, H], layout 1 [N, D, H])
        std::fill_n(states + (c.layout ? n * D + d : d * batch + n) * hidden, hidden, T(0));
    }
    (k == 1 ? y_h : y_c) = out;
  }
  const ScalarType given = node.X.scalar_type();
  auto output = [&](const std::optional<Tensor>& t) {
    return !t ? (node.none ? Tensor() : empty({0}, given)) : dtype == given ? *t : ops::to(*t, given);
  };
  return {output(y), output(y_h), output(y_c)};
}

// Checks one node's inputs but sequence_lens (in validation.py's order: the weights, checked when they were packed,
// then X, the initial states; a wrong X is blamed on X). `swapped`: X comes with its first two dimensions swapped
// from the config's layout (a batch-first stack's), and is checked as the layer sees it.
void check_inputs(const Config& c, const Tensor& X, int64_t hidden, int64_t input, const std::optional<Tensor>& h0,
                  const std::optional<Tensor>& c0, bool swapped) {
  CHECK_VALUE(X.dim() == 3, "X must have 3 dimensions, got shape ", shape_text(X.sizes()));
  Dims got = Dims::of(X.sizes());
  if (swapped) std::swap(got[0], got[1]);
  const int64_t steps = got[c.layout ? 1 : 0], batch = got[c.layout ? 0 : 1];
  check_sizes("X", got, c.layout ? Dims{batch, steps, input} : Dims{steps, batch, input});
  const Dims state_shape = c.layout ? Dims{batch, c.directions, hidden} : Dims{c.directions, batch, hidden};
  check_shape("initial_h", h0, state_shape);
  check_shape("initial_c", c0, state_shape);
}

// sequence_lens checked; empty when every row is full (the run then needs no per-row bookkeeping).
std::vector<int64_t> partial_lengths(const std::optional<Tensor>& sequence_lens, int64_t steps, int64_t batch) {
  if (!sequence_lens) return {};
  std::vector<int64_t> lens = checked_lengths(*sequence_lens, steps, batch);
  if (std::all_of(lens.begin(), lens.end(), [steps](int64_t v) { return v == steps; })) lens.clear();
  return lens;
}

std::tuple<Tensor, Tensor, Tensor> run_node(const Config& c, const Node& node, const Tensor& packs, int threads,
                                            const OutputLayout& y_at) {
  if (node.X.scalar_type() == ScalarType::Double) return run<double>(c, node, packs, threads, y_at);
  return run<float>(c, node, packs, threads, y_at);
}

// The op recurrent_pack: a node's weights packed for the compute dtype (float64, else float32), after checking their
// shapes: one tensor, PackedLayout's parts direction after direction.
template <typename T>
Tensor pack_node(const Config& c, const Tensors& weights) {
  const auto [hidden, input] = checked_weights(c, weights);
  const PackedLayout layout(c, hidden, input, has_peepholes(c), Vec<T>::lanes);
  Tensor packed = empty({layout.size * c.directions}, torch::headeronly::CppTypeToScalarType<T>::value);
  T* out = packed.mutable_data_ptr<T>();
  for (const Weights& w : split_weights(c, weights)) {
    pack(c, w, layout, Vec<T>::lanes, out);
    out += layout.size;
  }
  return packed;
}

// The op recurrent_config: a config string's number, which the other ops take (NumberedConfigs).
int64_t recurrent_config_cpu(std::string_view config) { return NumberedConfigs::get().number(config); }

// The op recurrent_pack (see pack_node): the packed weights, the hidden size and the input size.
std::tuple<Tensor, int64_t, int64_t> recurrent_pack_cpu(const Tensors& weights, int64_t config, bool float64) {
  const OneThread one;
  const Config& c = NumberedConfigs::get().at(config);
  const auto [hidden, input] = checked_weights(c, weights);
  return {float64 ? pack_node<double>(c, weights) : pack_node<float>(c, weights), hidden, input};
}

// The op recurrent_packed: recurrent's CPU implementation, given its weights packed by recurrent_pack and `numbers`
// (int64, made once in Python: each boxed argument costs a batch-1 call some tenths of a microsecond): the config's
// number, the hidden and input sizes recurrent_pack returned.
std::tuple<Tensor, Tensor, Tensor> recurrent_packed_cpu(const Tensor& X, const Tensor& packs, const Tensor& numbers,
                                                        const std::optional<Tensor>& sequence_lens,
                                                        const std::optional<Tensor>& initial_h,
                                                        const std::optional<Tensor>& initial_c,
                                                        const std::optional<Tensor>& mask) {
  const OneThread one;
  CHECK_VALUE(numbers.scalar_type() == ScalarType::Long && numbers.dim() == 1 && numbers.numel() == 3 &&
                  numbers.is_contiguous(),
              "recurrent_packed: numbers must be int64 [config, hidden, input]");
  const int64_t* at = numbers.const_data_ptr<int64_t>();
  const int64_t hidden = at[1], input = at[2];
  const Config& c = NumberedConfigs::get().at(at[0]);
  check_inputs(c, X, hidden, input, initial_h, initial_c, false);
  const int64_t steps = X.size(c.layout ? 1 : 0), batch = X.size(c.layout ? 0 : 1);
  const std::vector<int64_t> lens = partial_lengths(sequence_lens, steps, batch);
  std::vector<char> rows;
  CHECK_VALUE(mask.has_value() == (c.mask_output >= 0),
              mask.has_value() ? "this node takes no mask input" : "this node takes a mask input");
  if (mask) {
    CHECK_VALUE(mask->scalar_type() == ScalarType::Bool && mask->dim() == 2 && mask->size(0) == X.size(0) &&
                    mask->size(1) == X.size(1),
                "mask must be a bool tensor of X's first two dims (as [T, N]: [", steps, ", ", batch,
                "]), got ", mask->scalar_type(), " ", shape_text(mask->sizes()));
    CHECK_VALUE(!sequence_lens, "a node takes either sequence_lens or a mask, not both");
    rows = mask_rows(*mask);
  }
  const Node node{X, false, steps, batch, hidden, lens, initial_h, initial_c, rows};
  return run_node(c, node, packs, one.threads(), node_output(c.layout, steps, c.directions, batch, hidden));
}

// StackedRecurrent.forward (recurrent/module.py, which documents the arguments) in one call: at batch 1 the Python
// around each layer (its op call, the transpositions and concatenations between layers) costs as much as the
// layers' work. `packed` holds every layer's packed weights one after the other (recurrent_pack's), `numbers`
// (int64, made once per stack in Python: each boxed argument costs a batch-1 call about a microsecond) the flags
// batch_first, batch_first_output, merge_output, last_states, then per layer its config's number (layout 0, no
// mask), hidden and input sizes, where its weights start in `packed` and where its initial states lie (six values:
// stack.h, stack_states) in `states`, the stack's state inputs (empty: none). Returns y, h_n, c_n (None where the
// layers do not compute them: no tensor to make). A batch-first X is read as it is, and each layer writes its Y
// where the next one (or the caller) reads it: no transposition.
std::tuple<Tensor, Tensor, Tensor> recurrent_stack_cpu(const Tensor& X, const Tensor& packed, const Tensor& numbers,
                                                       const std::optional<Tensor>& sequence_lens,
                                                       const std::vector<std::optional<Tensor>>& states) {
  const OneThread one;
  const StackNumbers stack = stack_numbers(numbers, states, 10, 4, "recurrent_stack");
  Tensor x = X;
  bool swapped = stack.batch_first && X.dim() == 3;  // x is [N, T, I] where the layers take [T, N, I]
  std::vector<int64_t> lens;
  const std::vector<char> no_mask;
  std::vector<Tensor> h_n, c_n;
  for (size_t l = 0; l < stack.layers; ++l) {
    const int64_t* layer = stack.layer(l);  // config, hidden, input, offset, the states' rows
    const Config& c = NumberedConfigs::get().at(layer[0]);
    CHECK_VALUE(c.layout == 0 && c.mask_output < 0, "recurrent_stack: layers are layout 0 without a mask");
    const int64_t hidden = layer[1];
    const std::optional<Tensor>&h0 = stack.initial[2 * l], &c0 = stack.initial[2 * l + 1];
    check_inputs(c, x, hidden, layer[2], h0, c0, swapped);
    const int64_t steps = x.size(swapped ? 1 : 0), batch = x.size(swapped ? 0 : 1);
    if (l == 0) lens = partial_lengths(sequence_lens, steps, batch);  // after X's checks, as per layer
    const bool last = l + 1 == stack.layers, out_batch_first = last && stack.batch_first_output;
    const OutputLayout y_at = last && !stack.merge_output
                                  ? node_output(false, steps, c.directions, batch, hidden, out_batch_first)
                                  : merged_output(out_batch_first, steps, c.directions, batch, hidden);
    const Node node{x, swapped, steps, batch, hidden, lens, h0, c0, no_mask, layer[3], false, true};
    auto [y, y_h, y_c] = run_node(c, node, packed, one.threads(), y_at);
    CHECK_VALUE(c.outputs[0] || last, "recurrent_stack: a layer below the last must compute Y");
    h_n.push_back(y_h);
    c_n.push_back(y_c);
    x = y;
    swapped = false;
  }
  return {x, joined_states(h_n, stack.last_states), joined_states(c_n, stack.last_states)};
}

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(onnx2torch_rnn, CompositeExplicitAutograd, m) {  // no tensor: no device to dispatch on
  m.impl("recurrent_config", TORCH_BOX(&recurrent_config_cpu));
}

STABLE_TORCH_LIBRARY_IMPL(onnx2torch_rnn, CPU, m) {
  m.impl("recurrent_pack", TORCH_BOX(&recurrent_pack_cpu));
  m.impl("recurrent_packed", TORCH_BOX(&recurrent_packed_cpu));
  m.impl("recurrent_stack", TORCH_BOX(&recurrent_stack_cpu));
}

}  // namespace onnx2torch_rnn
