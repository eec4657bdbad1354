#include "tapestry/ops/autocast.h"

#include <atomic>
#include <unordered_map>

#include "tapestry/ops/cpu/gemm.h"
#include "tapestry/ops/cuda.h"
#include "tapestry/ops/error.h"
#include "tapestry/ops/tensor.h"

namespace tapestry {

namespace {
thread_local Precision current_precision = Precision::Float32;
thread_local int guard_depth = 0;

// Note [Autocast weight cache]. Keyed by the storage's address; `source` tells a live storage from
// a new one at a dead one's address (a weak pointer to another control block).
struct CachedMirror {
  std::weak_ptr<Storage> source;
  uint64_t version = 0;
  std::shared_ptr<Storage> mirror;  // null until the first use
};
struct WeightCache {
  std::unordered_map<const Storage*, CachedMirror> entries;
  AutocastCacheCounts counts;
};
thread_local WeightCache weight_cache;

bool same_storage(const std::weak_ptr<Storage>& a, const std::shared_ptr<Storage>& b) {
  return !a.owner_before(b) && !b.owner_before(a);
}
}  // namespace

void autocast_cache_weight(const Tensor& weight) {
  if (guard_depth == 0 || current_precision != Precision::BFloat16 || weight.dtype() != DType::Float32) return;
  const std::shared_ptr<Storage>& s = weight.impl().storage;
  CachedMirror& e = weight_cache.entries[s.get()];
  if (!same_storage(e.source, s)) e = CachedMirror{s, 0, nullptr};
}

std::shared_ptr<Storage> autocast_bf16_mirror(const std::shared_ptr<Storage>& storage,
                                              const std::function<std::shared_ptr<Storage>(const Storage&)>& convert) {
  if (guard_depth == 0 || !storage) return nullptr;
  auto it = weight_cache.entries.find(storage.get());
  if (it == weight_cache.entries.end() || !same_storage(it->second.source, storage)) return nullptr;
  CachedMirror& e = it->second;
  if (e.mirror && e.version == storage->version) {
    ++weight_cache.counts.reuses;
    return e.mirror;
  }
  e.mirror = convert(*storage);
  e.version = storage->version;
  ++weight_cache.counts.copies;
  return e.mirror;
}

AutocastCacheCounts autocast_cache_counts() { return weight_cache.counts; }

Precision autocast_precision() { return current_precision; }

bool bf16_supported(std::string* why) {
  // Asked at every matmul under autocast: the CPU's features and oneDNN's cap do not change.
  static std::string reason;
  static const bool supported = kernels::cpu::bf16_hardware(&reason);
  if (!supported && why) *why = reason;
  return supported;
}

bool bf16_supported(Device device, std::string* why) {
  // The emulated device runs the CPU's kernels (Note [Emulated device]), so it needs the CPU's support.
  return device.is_cuda() ? cuda::bf16_supported(device, why) : bf16_supported(why);
}

AutocastGuard::AutocastGuard(Precision p, Device device) : prev_(current_precision) {
  // Checked only on a change: every matmul's backward opens a guard at its forward's precision.
  std::string why;
  TP_CHECK(p != Precision::BFloat16 || prev_ == p || bf16_supported(device, &why), "autocast to bfloat16 on {}: {}",
           device_name(device), why);
  current_precision = p;
  if (guard_depth++ == 0) weight_cache = WeightCache{};
}

AutocastGuard::~AutocastGuard() {
  current_precision = prev_;
  if (--guard_depth == 0) weight_cache.entries.clear();  // the counts stay readable until the next guard
}

std::string gemm_library() { return kernels::cpu::gemm_library(); }

// The TF32 switch (ops/cuda.h) lives here, in every build: it is the GPU's float32 matmul
// precision, which gemm_library reports, and a program that sets it runs on a CPU build too.
namespace cuda {
namespace {
std::atomic<bool> tf32_allowed{false};
}  // namespace
void set_allow_tf32(bool on) { tf32_allowed = on; }
bool allow_tf32() { return tf32_allowed; }
}  // namespace cuda

std::string gemm_library(Device device, Precision p) {
  if (!device.is_cuda()) return gemm_library() + (p == Precision::BFloat16 ? "+bf16" : "");
  if (p == Precision::BFloat16) return "cublas-bf16";
  return cuda::allow_tf32() ? "cublas-tf32" : "cublas-fp32";
}

}  // namespace tapestry
