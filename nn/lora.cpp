// LoRA adapters (see lora.h).
#include "tapestry/nn/lora.h"

#include <zlib.h>

#include <algorithm>
#include <functional>
#include <map>
#include <set>

#include "tapestry/ops/factory.h"

namespace tapestry::nn {

namespace {

// Every Linear under `root` with its path relative to root, depth first in registration order;
// a module registered twice (a shared layer) is listed once.
std::vector<std::pair<std::string, std::shared_ptr<Linear>>> linear_layers(const Module& root) {
  std::vector<std::pair<std::string, std::shared_ptr<Linear>>> out;
  std::set<const Module*> seen;
  std::function<void(const Module&, const std::string&)> walk = [&](const Module& m, const std::string& prefix) {
    for (const auto& [name, child] : m.named_children()) {
      if (!seen.insert(child.get()).second) continue;
      const std::string path = prefix.empty() ? name : prefix + "." + name;
      if (auto linear = std::dynamic_pointer_cast<Linear>(child)) {
        out.emplace_back(path, linear);
        continue;  // an adapter's own lora_A and lora_B are not layers to adapt
      }
      walk(*child, path);
    }
  };
  walk(root, "");
  return out;
}

// How many registry entries hold each parameter tensor, over every module under root: a weight
// tied to another parameter is held twice (state_dict lists it once, under whichever name came
// first, so it cannot tell).
std::map<const TensorImpl*, int> parameter_holders(const Module& root) {
  std::map<const TensorImpl*, int> holders;
  std::set<const Module*> seen;
  std::function<void(const Module&)> walk = [&](const Module& m) {
    if (!seen.insert(&m).second) return;
    for (const auto& [name, t] : m.named_parameters(false)) ++holders[&t.impl()];
    for (const auto& [name, child] : m.named_children()) walk(*child);
  };
  walk(root);
  return holders;
}

std::string last_part(const std::string& path) {
  const size_t dot = path.rfind('.');
  return dot == std::string::npos ? path : path.substr(dot + 1);
}

// The names of the adapters' own entries ("<layer>.lora_A.weight", "<layer>.lora_B.weight").
std::set<std::string> adapter_names(const Module& model) {
  std::set<std::string> names;
  for (const auto& [path, layer] : linear_layers(model))
    if (layer->lora_A) {
      names.insert(path + ".lora_A.weight");
      names.insert(path + ".lora_B.weight");
    }
  return names;
}

}  // namespace

std::vector<std::string> add_lora(Module& model, const LoRAOptions& o) {
  TP_CHECK(o.rank >= 1, "add_lora: rank must be at least 1, got {}", o.rank);
  TP_CHECK(o.alpha > 0, "add_lora: alpha must be positive, got {}", o.alpha);
  TP_CHECK(o.dropout >= 0 && o.dropout < 1, "add_lora: dropout must be in [0, 1), got {}", o.dropout);
  TP_CHECK(!o.targets.empty(), "add_lora: no target layers given");
  TP_CHECK(lora_state_dict(model).empty(), "add_lora: the model has adapters already (one set per model: merge them "
           "into a fresh model with merged_state_dict first)");
  const auto layers = linear_layers(model);
  const std::map<const TensorImpl*, int> holders = parameter_holders(model);
  std::vector<std::pair<std::string, std::shared_ptr<Linear>>> chosen;
  for (const std::string& target : o.targets) {
    size_t found = 0;
    for (const auto& [path, layer] : layers) {
      if (last_part(path) != target) continue;
      ++found;
      TP_CHECK(holders.at(&layer->weight.impl()) == 1, "add_lora: {}'s weight is tied to another parameter; merging "
               "an adapter into it would change both: leave '{}' out of the targets", path, target);
      chosen.emplace_back(path, layer);
    }
    std::vector<std::string> names;
    for (const auto& [path, layer] : layers) names.push_back(last_part(path));
    std::sort(names.begin(), names.end());
    names.erase(std::unique(names.begin(), names.end()), names.end());
    TP_CHECK(found > 0, "add_lora: no Linear layer is named '{}'; the model's are: {}", target, fmt::join(names, ", "));
  }
  std::sort(chosen.begin(), chosen.end(), [&](const auto& a, const auto& b) {  // the model's order
    auto pos = [&](const std::string& p) {
      return std::find_if(layers.begin(), layers.end(), [&](const auto& l) { return l.first == p; }) - layers.begin();
    };
    return pos(a.first) < pos(b.first);
  });
  chosen.erase(std::unique(chosen.begin(), chosen.end()), chosen.end());  // a target listed twice

  // A rank above a layer's smaller dimension adds nothing a full update lacks, and a huge one
  // failed late with a bare out-of-memory error (issue 44): refused here, with what it would take.
  int64_t adapter_elements = 0;
  for (auto& [path, layer] : chosen) adapter_elements += o.rank * (layer->weight.size(0) + layer->weight.size(1));
  for (auto& [path, layer] : chosen) {
    const int64_t out = layer->weight.size(0), in = layer->weight.size(1);
    TP_CHECK(o.rank <= std::min(in, out), "add_lora: rank {} is above the smaller dimension of {} ({} x {}), so the "
             "adapter could not add anything a full update lacks; the adapters would need {:.1f} MiB; take a rank of at "
             "most {}", o.rank, path, out, in, static_cast<double>(adapter_elements) *
             static_cast<double>(dtype_size(layer->weight.dtype())) / (1 << 20), std::min(in, out));
  }
  NoGradGuard no_grad;  // B's zeros and the casts are not part of any graph
  for (Tensor& p : model.parameters()) p.requires_grad_(false);
  std::vector<std::string> paths;
  for (auto& [path, layer] : chosen) {
    const int64_t out = layer->weight.size(0), in = layer->weight.size(1);
    auto a = std::make_shared<Linear>(in, o.rank, false);  // U(-1/sqrt(in), 1/sqrt(in)), as PEFT's A
    auto b = std::make_shared<Linear>(o.rank, out, false);
    b->weight.zero_();
    for (auto* m : {a.get(), b.get()}) {
      m->to(layer->weight.dtype());
      m->to(layer->weight.device());
    }
    layer->lora_A = layer->register_module("lora_A", a);
    layer->lora_B = layer->register_module("lora_B", b);
    layer->lora_scale = o.alpha / static_cast<double>(o.rank);
    layer->lora_dropout = o.dropout;
    paths.push_back(path);
  }
  return paths;
}

NamedTensors lora_state_dict(const Module& model) {
  const std::set<std::string> names = adapter_names(model);
  NamedTensors out;
  for (auto& [name, t] : model.state_dict())
    if (names.count(name)) out.emplace_back(name, t);
  return out;
}

NamedTensors base_state_dict(const Module& model) {
  const std::set<std::string> names = adapter_names(model);
  NamedTensors out;
  for (auto& [name, t] : model.state_dict())
    if (!names.count(name)) out.emplace_back(name, t);
  return out;
}

NamedTensors merged_state_dict(const Module& model) {
  NoGradGuard no_grad;
  std::map<std::string, const Linear*> adapted;  // "<layer>.weight" -> the layer
  for (const auto& [path, layer] : linear_layers(model))
    if (layer->lora_A) adapted[path + ".weight"] = layer.get();
  NamedTensors out = base_state_dict(model);
  for (auto& [name, t] : out) {
    auto it = adapted.find(name);
    if (it == adapted.end()) continue;
    const Linear& l = *it->second;
    const Tensor update = l.lora_B->weight.to(DType::Float64).matmul(l.lora_A->weight.to(DType::Float64));
    t = t.to(DType::Float64).add(update.mul(l.lora_scale)).to(t.dtype());
  }
  return out;
}

std::string fingerprint(const NamedTensors& state) {
  uLong crc = crc32(0L, Z_NULL, 0);
  auto feed = [&crc](const void* data, size_t size) {
    const char* p = static_cast<const char*>(data);
    while (size > 0) {  // crc32's length is 32-bit: 1 GiB pieces
      const size_t piece = std::min<size_t>(size, size_t{1} << 30);
      crc = crc32(crc, reinterpret_cast<const Bytef*>(p), static_cast<uInt>(piece));
      p += piece, size -= piece;
    }
  };
  for (const auto& [name, t] : state) {
    const Tensor c = t.detach().to(Device::CPU).contiguous();
    const std::string head = fmt::format("{}|{}|{}|", name, dtype_name(c.dtype()), c.sizes());
    feed(head.data(), head.size());
    feed(c.raw_data(), static_cast<size_t>(c.numel()) * dtype_size(c.dtype()));
  }
  return fmt::format("crc32:{:08x}", static_cast<uint32_t>(crc));
}

}  // namespace tapestry::nn
