// The one allocation helper of both native libraries (recurrent.cpp's `empty`, int8.h's `allocate`): a new CPU
// tensor, contiguous or laid out by `strides`. torch::stable's empty and new_empty go through the dispatcher's boxed
// path, about two microseconds each, which a batch-1 node notices (an LSTM node of hidden 64, 16 steps, batch 1:
// 30-32 us with them, 22-26 us with this); the AOTI shim's empty_strided, also part of the stable ABI, is one direct
// call.

#pragma once

#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>
#include <torch/headeronly/util/Exception.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <vector>

namespace onnx2torch_rnn {

// `Sizes`: a container with size(), data() and operator[] (a std::vector, or recurrent.cpp's Dims, which stays on the
// stack).
template <typename Sizes>
torch::stable::Tensor empty_cpu(const Sizes& sizes, torch::headeronly::ScalarType dtype,
                                const int64_t* strides = nullptr) {
  Sizes contiguous = sizes;
  int64_t stride = 1;
  for (size_t k = sizes.size(); k-- > 0;) {
    contiguous[k] = stride;
    stride *= std::max<int64_t>(sizes[k], 1);
  }
  AtenTensorHandle handle;
  STABLE_TORCH_ERROR_CODE_CHECK(aoti_torch_empty_strided(
      static_cast<int64_t>(sizes.size()), sizes.data(), strides ? strides : contiguous.data(),
      torch::stable::detail::to<int32_t>(torch::stable::detail::from(dtype)), aoti_torch_device_type_cpu(), 0,
      &handle));
  return torch::stable::Tensor(handle);
}

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

}  // namespace onnx2torch_rnn
