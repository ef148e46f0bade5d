// Vectors of 64 bytes (16 floats or 8 doubles) as GCC/Clang vector extensions, and the activations on them.
//
// The compiler lowers a 64-byte vector to what the target has: one AVX-512 register, two AVX2 ones, four SSE/NEON
// ones, so the same source is fast on any CPU it is built for (the kernel is built for several: kernel/build.py).
// Loads and stores go through memcpy: unaligned, and compiled to single vector moves.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>

namespace onnx2torch_rnn {

// One register of the widest vectors the target has: wider vector types are lowered to several registers, and GCC
// 12 does that badly (a 64-byte vector on AVX2 ran 20-40x slower than one register's width).
#if defined(__AVX512F__)
constexpr int kVectorBytes = 64;
#elif defined(__AVX__)
constexpr int kVectorBytes = 32;
#else
constexpr int kVectorBytes = 16;
#endif

template <typename T>
struct Vec {
  typedef T type __attribute__((vector_size(kVectorBytes)));
  static constexpr int lanes = kVectorBytes / sizeof(T);
};

template <typename T>
using V = typename Vec<T>::type;

template <typename T>
inline V<T> load(const T* p) {
  V<T> v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// The first n lanes from p, zeros after (the last block of a hidden size that is not a multiple of the lanes).
template <typename T>
inline V<T> load(const T* p, int n) {
  V<T> v = {};
  std::memcpy(&v, p, sizeof(T) * n);
  return v;
}

template <typename T>
inline void store(T* p, V<T> v) {
  std::memcpy(p, &v, sizeof(v));
}

template <typename T>
inline void store(T* p, V<T> v, int n) {
  std::memcpy(p, &v, sizeof(T) * n);
}

// Makes the compiler hold v in a register rather than fold its load into each use as a memory operand.
template <typename T>
__attribute__((always_inline)) inline void in_register(V<T>& v) {
  asm volatile("" : "+v"(v));
}

template <typename T>
inline V<T> splat(T value) {
  return V<T>{} + value;
}

// NaN stays NaN: a comparison with NaN is false, so the ternary keeps x.
template <typename T>
inline V<T> clamp(V<T> x, T low, T high) {
  x = x < low ? splat(low) : x;
  return x > high ? splat(high) : x;
}

template <typename T, typename F>
inline V<T> per_lane(V<T> x, F f) {
  for (int i = 0; i < Vec<T>::lanes; ++i) x[i] = f(x[i]);
  return x;
}

// tanh as a rational function x * p(x^2) / q(x^2) on [-9, 9] (+-1 beyond, in float): the classic minimax
// approximation that Eigen and MLAS also use, accurate to a few float32 ulps (onnxruntime's own tanh and sigmoid
// are this approximation). float64 uses the C library.
__attribute__((always_inline)) inline V<float> tanh_of(V<float> x) {
  x = clamp(x, -9.0f, 9.0f);
  V<float> x2 = x * x;
  V<float> p = splat(-2.76076847742355e-16f);
  p = p * x2 + 2.00018790482477e-13f;
  p = p * x2 - 8.60467152213735e-11f;
  p = p * x2 + 5.12229709037114e-08f;
  p = p * x2 + 1.48572235717979e-05f;
  p = p * x2 + 6.37261928875436e-04f;
  p = p * x2 + 4.89352455891786e-03f;
  V<float> q = splat(1.19825839466702e-06f);
  q = q * x2 + 1.18534705686654e-04f;
  q = q * x2 + 2.26843463243900e-03f;
  q = q * x2 + 4.89352518554385e-03f;
  return x * p / q;
}

inline V<double> tanh_of(V<double> x) {
  return per_lane<double>(x, [](double v) { return std::tanh(v); });
}

__attribute__((always_inline)) inline V<float> sigmoid_of(V<float> x) {
  return 0.5f + 0.5f * tanh_of(0.5f * x);
}

inline V<double> sigmoid_of(V<double> x) {
  return per_lane<double>(x, [](double v) { return 1.0 / (1.0 + std::exp(-v)); });
}

// The ONNX recurrent activations (onnxruntime's definitions: see recurrent/cells.py).
enum class Kind { Relu, Tanh, Sigmoid, Affine, LeakyRelu, ThresholdedRelu, ScaledTanh, HardSigmoid, Elu, Softsign,
                  Softplus };

struct Activation {
  Kind kind = Kind::Tanh;
  double alpha = 0, beta = 0;
};

// Inlined into each gate loop: the switch is then a predictable branch, not a call per vector.
template <typename T>
__attribute__((always_inline)) inline V<T> activate(const Activation& f, V<T> x) {
  const T a = static_cast<T>(f.alpha), b = static_cast<T>(f.beta);
  switch (f.kind) {
    case Kind::Sigmoid: return sigmoid_of(x);
    case Kind::Tanh: return tanh_of(x);
    case Kind::Relu: return x > 0 ? x : splat<T>(0);
    case Kind::Affine: return a * x + b;
    case Kind::LeakyRelu: return x >= 0 ? x : a * x;
    case Kind::ThresholdedRelu: return x > a ? x : splat<T>(0);
    case Kind::ScaledTanh: return a * tanh_of(b * x);
    case Kind::HardSigmoid: return clamp<T>(a * x + b, 0, 1);
    case Kind::Softsign: return x / (1 + (x < 0 ? -x : x));
    case Kind::Elu: return per_lane<T>(x, [a](T v) { return v >= 0 ? v : a * (std::exp(v) - 1); });
    // the literal formula, as onnxruntime computes it: inf where exp overflows
    case Kind::Softplus: return per_lane<T>(x, [](T v) { return std::log(std::exp(v) + 1); });
  }
  return x;
}

}  // namespace onnx2torch_rnn
