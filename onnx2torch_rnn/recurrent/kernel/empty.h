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

}  // namespace onnx2torch_rnn
