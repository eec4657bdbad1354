// Element types and devices, and dispatch(): call a generic lambda with the C++ type of a dtype.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

#include "tapestry/ops/error.h"

namespace tapestry {

// Bool is the element type of masks (comparisons, where, masked_fill); stored as one byte.
enum class DType : uint8_t { Float32, Float64, Int64, Bool };

// Where a tensor's memory lives: the CPU, GPU number `index` of the CUDA backend (a build with
// -DTAPESTRY_CUDA=ON), or the emulated device. Device::CPU and Device::CUDA (GPU 0) read as
// PyTorch's strings do.
// Note [Emulated device]: Device::Emulated ("emulated") is in every build and exists for tests. Its
// kernels are the CPU kernels, but its tensors are another device in every respect the engine
// checks: mixing them with CPU tensors is an Error, to() copies, item()/to_vector() count as
// synchronisations, and reading its memory from the host outside a kernel (a data_ptr() or
// raw_data() in glue code) throws an Error (ops/runtime.h). So the device-placement mistakes a
// GPU run would hit fail on a CPU machine, in CI, before any GPU time is spent.
enum class DeviceType : uint8_t { CPU, CUDA, Emulated };
struct Device {
  DeviceType type = DeviceType::CPU;
  int16_t index = 0;  // which GPU; always 0 for the CPU

  constexpr Device() = default;
  constexpr Device(DeviceType t, int i = 0) : type(t), index(static_cast<int16_t>(t == DeviceType::CUDA ? i : 0)) {}  // NOLINT
  static const Device CPU;
  static const Device CUDA;
  static const Device Emulated;
  // "cpu", "cuda", "cuda:1", "emulated"; anything else throws an Error naming the string.
  static Device parse(std::string_view name);

  bool is_cpu() const { return type == DeviceType::CPU; }
  bool is_cuda() const { return type == DeviceType::CUDA; }
  bool is_emulated() const { return type == DeviceType::Emulated; }
  friend constexpr bool operator==(Device a, Device b) { return a.type == b.type && a.index == b.index; }
  friend constexpr bool operator!=(Device a, Device b) { return !(a == b); }
};
inline constexpr Device Device::CPU{DeviceType::CPU, 0};
inline constexpr Device Device::CUDA{DeviceType::CUDA, 0};
inline constexpr Device Device::Emulated{DeviceType::Emulated, 0};

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
inline std::string device_name(Device d) {
  if (d.is_cpu()) return "cpu";
  if (d.is_emulated()) return "emulated";
  return "cuda:" + std::to_string(d.index);
}
inline Device Device::parse(std::string_view name) {
  if (name == "cpu") return CPU;
  if (name == "cuda") return CUDA;
  if (name == "emulated") return Emulated;
  if (name.substr(0, 5) == "cuda:" && name.size() > 5 && name.size() <= 8) {
    int index = 0;
    for (char c : name.substr(5)) {
      if (c < '0' || c > '9') index = -1;
      if (index < 0) break;
      index = index * 10 + (c - '0');
    }
    if (index >= 0) return Device(DeviceType::CUDA, index);
  }
  throw Error(fmt::format("device: '{}' is not a device; expected cpu, cuda, cuda:N or emulated", name));
}

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

template <> struct fmt::formatter<tapestry::Device> : fmt::formatter<std::string_view> {
  template <class Ctx> auto format(tapestry::Device d, Ctx& ctx) const {
    return fmt::formatter<std::string_view>::format(tapestry::device_name(d), ctx);
  }
};

template <> struct fmt::formatter<tapestry::DType> : fmt::formatter<std::string_view> {
  template <class Ctx> auto format(tapestry::DType t, Ctx& ctx) const {
    return fmt::formatter<std::string_view>::format(tapestry::dtype_name(t), ctx);
  }
};
