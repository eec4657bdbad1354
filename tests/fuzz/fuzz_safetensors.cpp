// libFuzzer target: the safetensors reader (nn/safetensors.h) on arbitrary bytes.
// A tapestry::Error is the expected answer to a malformed file. Any other exception, a crash or a
// sanitizer report is a bug: other exception types are left to propagate, so libFuzzer reports
// them ("uncaught exception") and saves the input.
// On success every tensor's values are read (summed), so a header that describes more data than
// the file holds, or a shape/offset mismatch, shows up under AddressSanitizer.
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "tapestry/nn/safetensors.h"
#include "tapestry/ops/error.h"
#include "tapestry/ops/tensor.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static tapestry_fuzz::ScratchFile file("safetensors", ".safetensors");
  file.write(data, size);

  tapestry::nn::SafetensorsFile loaded;
  try {
    loaded = tapestry::nn::load_safetensors(file.path());
  } catch (const tapestry::Error&) {
    return 0;  // malformed input, refused with a message: the expected outcome
  }

  double total = 0;
  size_t bytes = 0;
  for (const auto& [name, t] : loaded.tensors) {
    bytes += name.size();
    if (!t.defined()) tapestry_fuzz::fail("fuzz_safetensors", "tensor '" + name + "' is undefined");
    std::vector<double> values = t.to_vector<double>();
    if (static_cast<int64_t>(values.size()) != t.numel())
      tapestry_fuzz::fail("fuzz_safetensors", "tensor '" + name + "': to_vector gave " + std::to_string(values.size()) +
                                                  " values for " + std::to_string(t.numel()) + " elements");
    for (double v : values) total += v;
  }
  for (const auto& [k, v] : loaded.metadata) bytes += k.size() + v.size();
  // Keep the reads from being optimized away.
  volatile double sink = total + static_cast<double>(bytes);
  (void)sink;
  return 0;
}
