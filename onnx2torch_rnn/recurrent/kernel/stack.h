// What the two stack ops (recurrent.cpp's recurrent_stack, dynamic_quantize_lstm.cpp's
// dynamic_quantize_lstm_stack) share: StackedRecurrent.forward (recurrent/module.py) passes each one `numbers`, one
// int64 tensor made once per stack (each boxed argument costs a batch-1 call about a microsecond): four flags, then
// a fixed count of values per layer, among them where the layer's initial states lie in the stack's state inputs.

#pragma once

#include "empty.h"

#include <cstring>

namespace onnx2torch_rnn {

// A stack's initial states (StackedRecurrent: each layer's initial_h / initial_c is rows start:end of one of the
// stack's state inputs, or none), read from the op's numbers: per layer six values, the source's index (negative:
// none), start and end as Python's slice takes them (kNoBound for None; negative counts from the end). Each state is
// a view of its source's rows (the AOTI shim's _reinterpret_tensor, one direct call: a slice in Python costs the call
// a microsecond); `at` points at layer 0's six values, `stride` apart per layer.
constexpr int64_t kNoBound = INT64_MIN;

inline std::vector<std::optional<torch::stable::Tensor>> stack_states(
    const std::vector<std::optional<torch::stable::Tensor>>& sources, const int64_t* at, size_t layers,
    int64_t stride) {
  std::vector<std::optional<torch::stable::Tensor>> states(2 * layers);
  for (size_t k = 0; k < 2 * layers; ++k) {
    const int64_t* where = at + (k / 2) * stride + (k % 2) * 3;
    if (where[0] < 0) continue;
    STD_TORCH_CHECK(where[0] < static_cast<int64_t>(sources.size()) && sources[where[0]].has_value() &&
                        sources[where[0]]->dim() >= 1,
                    "stack op: initial state ", k, " reads a missing state input");
    const torch::stable::Tensor& source = *sources[where[0]];
    const int64_t size = source.size(0);
    auto bound = [size](int64_t v, int64_t none) {
      if (v == kNoBound) return none;
      return std::clamp<int64_t>(v < 0 ? v + size : v, 0, size);
    };
    const int64_t start = bound(where[1], 0), end = std::max(start, bound(where[2], size));
    std::vector<int64_t> sizes(source.sizes().begin(), source.sizes().end()),
        strides(source.strides().begin(), source.strides().end());
    sizes[0] = end - start;
    AtenTensorHandle handle;
    STABLE_TORCH_ERROR_CODE_CHECK(aoti_torch__reinterpret_tensor(source.get(), source.dim(), sizes.data(),
                                                                 strides.data(), start * strides[0], &handle));
    states[k] = torch::stable::Tensor(handle);
  }
  return states;
}

// `numbers` read: the flags, the layer count and each layer's initial states. `per_layer` values per layer, of which
// the states' six start at `states_at`.
struct StackNumbers {
  bool batch_first, batch_first_output, merge_output, last_states;
  size_t layers;
  const int64_t* values;  // layer 0's
  int64_t per_layer;
  std::vector<std::optional<torch::stable::Tensor>> initial;  // initial_h, initial_c of layer 0, 1, ...

  const int64_t* layer(size_t l) const { return values + per_layer * l; }
};

inline StackNumbers stack_numbers(const torch::stable::Tensor& numbers,
                                  const std::vector<std::optional<torch::stable::Tensor>>& sources, int64_t per_layer,
                                  int64_t states_at, const char* op) {
  constexpr int64_t kFlags = 4;
  STD_TORCH_CHECK(numbers.scalar_type() == torch::headeronly::ScalarType::Long && numbers.dim() == 1 &&
                      numbers.is_contiguous() && numbers.numel() > kFlags &&
                      (numbers.numel() - kFlags) % per_layer == 0,
                  op, ": numbers must be int64 [4 + ", per_layer, " * layers]");
  const int64_t* at = numbers.const_data_ptr<int64_t>();
  const size_t layers = (numbers.numel() - kFlags) / per_layer;
  return {at[0] != 0,     at[1] != 0,         at[2] != 0, at[3] != 0, layers, at + kFlags, per_layer,
          stack_states(sources, at + kFlags + states_at, layers, per_layer)};
}

// The stack's final states as one [L·D, N, H] tensor from each layer's (contiguous, run's own): the last layer's
// alone with last_states; the first layer's (undefined) where the layers do not compute them.
inline torch::stable::Tensor joined_states(const std::vector<torch::stable::Tensor>& per_layer, bool last_states) {
  if (last_states) return per_layer.back();
  if (per_layer.size() == 1 || !per_layer[0].defined()) return per_layer[0];
  std::vector<int64_t> shape(per_layer[0].sizes().begin(), per_layer[0].sizes().end());
  shape[0] = 0;
  for (const torch::stable::Tensor& t : per_layer) {
    STD_TORCH_CHECK(t.defined(), "stack op: the layers compute their final states alike");
    shape[0] += t.size(0);
  }
  torch::stable::Tensor all = empty_cpu(shape, per_layer[0].scalar_type());
  char* out = static_cast<char*>(all.mutable_data_ptr());
  for (const torch::stable::Tensor& t : per_layer) {
    const size_t bytes = t.numel() * t.element_size();
    if (bytes) std::memcpy(out, t.const_data_ptr(), bytes);
    out += bytes;
  }
  return all;
}

}  // namespace onnx2torch_rnn
