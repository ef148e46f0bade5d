// ONNX ConvInteger on the CPU for eager inference (modules/quantized.py calls it where the kernel is loaded; its
// Python implementation there is the reference and runs everywhere else):
//
//   conv_integer(Tensor x, Tensor w, Tensor? x_zero_point, Tensor? w_zero_point, int[] strides, int[] pads,
//                int[] dilations, int group) -> Tensor
//       the exact int32 convolution of x - x_zero_point [N, C, *spatial] (1 to 3 spatial axes) by
//       w - w_zero_point [M, C / group, *kernel]: x's zero point one value, w's one value or one per output
//       channel; uint8 or int8 each; pads = begins then ends per spatial axis (padding is x's zero point, i.e. zero
//       after the shift). Integer sums are exact in any order (onnxruntime's int32 accumulator, wrapping alike).
//
// im2col: a tile of output positions gathers its shifted inputs as int16 [taps][positions], then each output
// channel's row is Σ_tap w[tap] * column[tap] over the tile (contiguous: the compiler vectorises it). Raw pointers
// and few ATen calls (the stable-ABI port).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <vector>

namespace onnx2torch_rnn {
namespace {

constexpr int64_t kTile = 256;  // output positions per task

struct Geometry {  // three spatial axes (missing ones of size 1)
  int64_t in[3], out[3], kernel[3], stride[3], pad[3], dilation[3];
};

// 8-bit values as int32 (uint8 or int8 storage).
int32_t value_at(const void* data, bool is_signed, int64_t i) {
  return is_signed ? static_cast<const int8_t*>(data)[i] : static_cast<const uint8_t*>(data)[i];
}

std::vector<int32_t> zero_points(const std::optional<at::Tensor>& zero_point, int64_t count, const char* what) {
  if (!zero_point) return {0};
  const at::Tensor z = zero_point->to(at::kInt).contiguous().view({-1});
  TORCH_CHECK_VALUE(z.numel() == 1 || z.numel() == count, "conv_integer: ", what, " zero point of ", z.numel(),
                    " values, expected 1 or ", count);
  return std::vector<int32_t>(z.data_ptr<int32_t>(), z.data_ptr<int32_t>() + z.numel());
}

// One tile of output positions [p0, p1) of image n, group g: y[m][p] for the group's output channels.
void conv_tile(const void* x, bool x_signed, int32_t x_zero, const int16_t* w, const Geometry& s, int64_t C,
               int64_t M, int64_t channels, int64_t n, int64_t g, int64_t group_out, int64_t p0, int64_t p1,
               int32_t* y, std::vector<int16_t>& column) {
  const int64_t taps = channels * s.kernel[0] * s.kernel[1] * s.kernel[2], width = p1 - p0;
  const int64_t plane = s.in[0] * s.in[1] * s.in[2], positions = s.out[0] * s.out[1] * s.out[2];
  column.assign(taps * width, 0);
  for (int64_t p = p0; p < p1; ++p) {
    const int64_t o2 = p % s.out[2], o1 = p / s.out[2] % s.out[1], o0 = p / (s.out[2] * s.out[1]);
    int64_t tap = 0;
    for (int64_t c = 0; c < channels; ++c) {
      const int64_t base = (n * C + g * channels + c) * plane;
      for (int64_t k0 = 0; k0 < s.kernel[0]; ++k0) {
        const int64_t i0 = o0 * s.stride[0] - s.pad[0] + k0 * s.dilation[0];
        for (int64_t k1 = 0; k1 < s.kernel[1]; ++k1) {
          const int64_t i1 = o1 * s.stride[1] - s.pad[1] + k1 * s.dilation[1];
          for (int64_t k2 = 0; k2 < s.kernel[2]; ++k2, ++tap) {
            const int64_t i2 = o2 * s.stride[2] - s.pad[2] + k2 * s.dilation[2];
            if (i0 < 0 || i0 >= s.in[0] || i1 < 0 || i1 >= s.in[1] || i2 < 0 || i2 >= s.in[2]) continue;
            const int64_t i = base + (i0 * s.in[1] + i1) * s.in[2] + i2;
            column[tap * width + p - p0] = static_cast<int16_t>(value_at(x, x_signed, i) - x_zero);
          }
        }
      }
    }
  }
  std::vector<uint32_t> row(width);  // unsigned: wraps past 2^31 as onnxruntime's int32 accumulator does
  for (int64_t m = 0; m < group_out; ++m) {
    std::fill(row.begin(), row.end(), 0u);
    const int16_t* wm = w + (g * group_out + m) * taps;
    for (int64_t tap = 0; tap < taps; ++tap) {
      const int32_t weight = wm[tap];
      const int16_t* col = column.data() + tap * width;
      for (int64_t j = 0; j < width; ++j) row[j] += static_cast<uint32_t>(weight * int32_t{col[j]});
    }
    int32_t* out = y + (n * M + g * group_out + m) * positions + p0;
    for (int64_t j = 0; j < width; ++j) out[j] = static_cast<int32_t>(row[j]);
  }
}

at::Tensor conv_integer_cpu(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& x_zero_point,
                            const std::optional<at::Tensor>& w_zero_point, at::IntArrayRef strides,
                            at::IntArrayRef pads, at::IntArrayRef dilations, int64_t group) {
  for (const at::Tensor* t : {&x, &w})
    TORCH_CHECK_VALUE(t->scalar_type() == at::kByte || t->scalar_type() == at::kChar,
                      "conv_integer: uint8 or int8 operands expected, got ", t->scalar_type());
  const int64_t rank = x.dim() - 2;
  TORCH_CHECK_VALUE(rank >= 1 && rank <= 3 && w.dim() == x.dim() && group >= 1 && x.size(1) % group == 0 &&
                        w.size(0) % group == 0 && w.size(1) * group == x.size(1),
                    "conv_integer: x [N, C, 1-3 spatial axes] and w [M, C / group, kernel] expected, got ", x.sizes(),
                    " and ", w.sizes(), " with group ", group);
  TORCH_CHECK_VALUE(static_cast<int64_t>(strides.size()) == rank && static_cast<int64_t>(dilations.size()) == rank &&
                        static_cast<int64_t>(pads.size()) == 2 * rank,
                    "conv_integer: strides, dilations and pads (begins, ends) per spatial axis expected");
  Geometry s;
  for (int a = 0; a < 3; ++a) {
    const int64_t d = a - (3 - rank);  // the spatial axis this one is, or negative (size 1)
    s.in[a] = d >= 0 ? x.size(2 + d) : 1;
    s.kernel[a] = d >= 0 ? w.size(2 + d) : 1;
    s.stride[a] = d >= 0 ? strides[d] : 1;
    s.dilation[a] = d >= 0 ? dilations[d] : 1;
    s.pad[a] = d >= 0 ? pads[d] : 0;
    const int64_t span = (s.kernel[a] - 1) * s.dilation[a] + 1;
    const int64_t padded = s.in[a] + s.pad[a] + (d >= 0 ? pads[rank + d] : 0);
    TORCH_CHECK_VALUE(s.stride[a] >= 1 && s.dilation[a] >= 1 && padded >= span,
                      "conv_integer: the kernel does not fit the padded input");
    s.out[a] = (padded - span) / s.stride[a] + 1;
  }
  const int64_t N = x.size(0), C = x.size(1), M = w.size(0), channels = C / group, group_out = M / group;
  const int64_t taps = channels * s.kernel[0] * s.kernel[1] * s.kernel[2];
  const int64_t positions = s.out[0] * s.out[1] * s.out[2];
  const std::vector<int32_t> zx = zero_points(x_zero_point, 1, "x's");
  const std::vector<int32_t> zw = zero_points(w_zero_point, M, "w's");
  const at::Tensor xc = x.contiguous(), wc = w.contiguous();
  std::vector<int16_t> shifted(M * taps);  // w - its zero point, [M][taps]
  const bool w_signed = w.scalar_type() == at::kChar;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t t = 0; t < taps; ++t)
      shifted[m * taps + t] =
          static_cast<int16_t>(value_at(wc.data_ptr(), w_signed, m * taps + t) - zw[zw.size() == 1 ? 0 : m]);

  std::vector<int64_t> shape{N, M};
  for (int64_t d = 0; d < rank; ++d) shape.push_back(s.out[3 - rank + d]);
  at::Tensor out = at::empty(shape, x.options().dtype(at::kInt));
  int32_t* y = out.data_ptr<int32_t>();
  const void* xd = xc.data_ptr();
  const bool x_signed = x.scalar_type() == at::kChar;
  const int64_t tiles = (positions + kTile - 1) / kTile, tasks = N * group * tiles;
  const int64_t grain = std::max<int64_t>(1, (1 << 18) / (kTile * taps * group_out));  // ~2^18 products a chunk
  at::parallel_for(0, tasks, grain, [&](int64_t begin, int64_t end) {
    std::vector<int16_t> column;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t tile = task % tiles, g = task / tiles % group, n = task / (tiles * group);
      conv_tile(xd, x_signed, zx[0], shifted.data(), s, C, M, channels, n, g, group_out, tile * kTile,
                std::min(positions, (tile + 1) * kTile), y, column);
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(onnx2torch_rnn, m) {
  m.def("conv_integer(Tensor x, Tensor w, Tensor? x_zero_point, Tensor? w_zero_point, int[] strides, int[] pads, "
        "int[] dilations, int group) -> Tensor");
}

TORCH_LIBRARY_IMPL(onnx2torch_rnn, CPU, m) { m.impl("conv_integer", &conv_integer_cpu); }

}  // namespace onnx2torch_rnn
