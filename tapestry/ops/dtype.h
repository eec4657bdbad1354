// Element types and devices, and dispatch(): call a generic lambda with the C++ type of a dtype.
#pragma once
#include <cstdint>
#include <string>

#include "tapestry/ops/error.h"

namespace tapestry {

// Bool is the element type of masks (comparisons, where, masked_fill); stored as one byte.
enum class DType : uint8_t { Float32, Float64, Int64, Bool };
enum class Device : uint8_t { CPU, CUDA };

constexpr DType kFloat32 = DType::Float32;
constexpr DType kFloat64 = DType::Float64;
constexpr DType kInt64 = DType::Int64;
constexpr DType kBool = DType::Bool;

inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::Float32: return "float32";
    case DType::Float64: return "float64";
    case DType::Int64: return "int64";
    case DType::Bool: return "bool";
  }
  return "?";
}
inline const char* device_name(Device d) { return d == Device::CPU ? "cpu" : "cuda"; }

inline size_t dtype_size(DType t) {
  switch (t) {
    case DType::Float32: return 4;
    case DType::Float64: return 8;
    case DType::Int64: return 8;
    case DType::Bool: return 1;
  }
  return 0;
}
inline bool is_floating(DType t) { return t == DType::Float32 || t == DType::Float64; }

template <class T> struct TypeTag { using type = T; };

template <class T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::Float32; }
template <> constexpr DType dtype_of<double>() { return DType::Float64; }
template <> constexpr DType dtype_of<int64_t>() { return DType::Int64; }
template <> constexpr DType dtype_of<bool>() { return DType::Bool; }

// dispatch(dtype, [&](auto tag) { using T = typename decltype(tag)::type; ... });
template <class F>
decltype(auto) dispatch(DType t, F&& f) {
  switch (t) {
    case DType::Float32: return f(TypeTag<float>{});
    case DType::Float64: return f(TypeTag<double>{});
    case DType::Int64: return f(TypeTag<int64_t>{});
    case DType::Bool: return f(TypeTag<bool>{});
  }
  throw Error("dispatch: unknown dtype");
}

// Only the two floating types (used by ops that make no sense on integers).
template <class F>
decltype(auto) dispatch_floating(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::Float32: return f(TypeTag<float>{});
    case DType::Float64: return f(TypeTag<double>{});
    default: break;
  }
  throw Error(fmt::format("{}: expected a floating-point tensor (float32 or float64), got {}", op, dtype_name(t)));
}

// Numeric types (no bool).
template <class F>
decltype(auto) dispatch_numeric(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::Float32: return f(TypeTag<float>{});
    case DType::Float64: return f(TypeTag<double>{});
    case DType::Int64: return f(TypeTag<int64_t>{});
    default: break;
  }
  throw Error(fmt::format("{}: not supported for bool tensors; convert with .to(kFloat32) first", op));
}

}  // namespace tapestry

template <> struct fmt::formatter<tapestry::DType> : fmt::formatter<std::string_view> {
  template <class Ctx> auto format(tapestry::DType t, Ctx& ctx) const {
    return fmt::formatter<std::string_view>::format(tapestry::dtype_name(t), ctx);
  }
};
