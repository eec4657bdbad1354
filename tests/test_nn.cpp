// nn/: Module registration and naming, train/eval, state save/load in safetensors, the layers,
// and the fused label-smoothed cross-entropy.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <vector>

#include <unistd.h>

#include "tapestry/nn/layers.h"
#include "tapestry/nn/safetensors.h"
#include "tapestry/ops/runtime.h"
#include "tests/helpers.h"

using namespace tapestry;
using namespace tapestry::testing;

namespace {
struct Block : nn::Module {
  Block() {
    fc = register_module("fc", std::make_shared<nn::Linear>(3, 2));
    norm = register_module("norm", std::make_shared<nn::LayerNorm>(2));
    drop = register_module("drop", std::make_shared<nn::Dropout>(0.5));
    scale = register_buffer("scale", full({1}, 2.0));
  }
  std::shared_ptr<nn::Linear> fc;
  std::shared_ptr<nn::LayerNorm> norm;
  std::shared_ptr<nn::Dropout> drop;
  Tensor scale;
};

}  // namespace

TEST_CASE("Module names parameters with dots, in registration order") {
  nn::ModuleList list;
  list.push_back(std::make_shared<Block>());
  list.push_back(std::make_shared<Block>());
  std::vector<std::string> names;
  for (auto& [n, t] : list.named_parameters()) names.push_back(n);
  CHECK(names == std::vector<std::string>{"0.fc.weight", "0.fc.bias", "0.norm.weight", "0.norm.bias", "1.fc.weight",
                                          "1.fc.bias", "1.norm.weight", "1.norm.bias"});
  CHECK(list.num_parameters() == 2 * (6 + 2 + 2 + 2));
  CHECK(list.named_buffers().size() == 2);
  CHECK(list.state_dict().size() == 10);
  for (auto& p : list.parameters()) CHECK(p.requires_grad());
  CHECK(list.is_training());
  list.eval();
  CHECK_FALSE(list.at<Block>(1)->drop->is_training());
  list.train();
  CHECK(list.at<Block>(1)->drop->is_training());
  CHECK(error_of([&] { list.register_parameter("a.b", ones({1})); }).find("must be non-empty and contain no '.'") !=
        std::string::npos);
}

TEST_CASE("save and load round-trip through safetensors - mismatches are named") {
  manual_seed(1);
  Block a, b;
  std::string path = temp_path("block.safetensors");
  a.save(path, {{"note", "hello"}});
  CHECK_FALSE(allclose(a.fc->weight, b.fc->weight));
  Tensor handle = b.fc->weight;
  b.load(path);
  CHECK(allclose(a.fc->weight, b.fc->weight, 0, 0));
  CHECK(handle.storage() == b.fc->weight.storage());  // loaded in place: handles stay valid
  auto file = nn::load_safetensors(path);
  CHECK(file.metadata.at("note") == "hello");
  CHECK(file.tensors[0].first == "fc.weight");

  struct Other : nn::Module {
    Other() {
      register_module("fc", std::make_shared<nn::Linear>(4, 2));
      register_parameter("extra", ones({1}));
    }
  } other;
  std::string msg = error_of([&] { other.load(path); });
  CHECK(msg.find("fc.weight: checkpoint has float32 [2, 3], model has float32 [2, 4]") != std::string::npos);
  CHECK(msg.find("missing in checkpoint: extra") != std::string::npos);
  CHECK(msg.find("unexpected in checkpoint: norm.bias, norm.weight, scale") != std::string::npos);
  std::remove(path.c_str());
}

TEST_CASE("safetensors: exact bytes, all dtypes, bad files give clear errors") {
  std::string path = temp_path("t.safetensors");
  nn::save_safetensors(path, {{"a", tensor({1.f, 2.f})}, {"b", arange(3)}, {"c", tensor({0.5}, {1, 1}, kFloat64)},
                              {"m", gt(tensor({1.f, -1.f}), 0.0)}, {"t", arange(6).reshape({2, 3}).t()}});
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  CHECK(n % 8 == 0);
  std::string meta = R"({"__metadata__":{"tapestry.crc32":")";  // the data's checksum comes first
  CHECK(bytes.substr(8, meta.size()) == meta);
  std::string head = R"("},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{)";
  CHECK(bytes.substr(8 + meta.size() + 8, head.size()) == head);
  auto f = nn::load_safetensors(path).as_map();
  CHECK(values(f.at("a")) == std::vector<double>{1, 2});
  CHECK(f.at("b").dtype() == kInt64);
  CHECK(f.at("c").sizes() == Shape{1, 1});
  CHECK(f.at("m").dtype() == kBool);
  CHECK(values(f.at("t")) == std::vector<double>{0, 3, 1, 4, 2, 5});  // non-contiguous saved in logical order

  CHECK(error_of([] { nn::load_safetensors("/nonexistent/x.safetensors"); }).find("cannot open /nonexistent/x.safetensors") !=
        std::string::npos);
  {
    std::ofstream bad(path, std::ios::binary);
    bad << "garbage";
  }
  CHECK(error_of([&] { nn::load_safetensors(path); }).find("is not a safetensors file") != std::string::npos);
  {
    std::ofstream bad(path, std::ios::binary);
    std::string hdr = R"({"x":{"dtype":"F32","shape":[4],"data_offsets":[0,8]}})";
    uint64_t len = hdr.size();
    for (int i = 0; i < 8; ++i) bad.put(static_cast<char>((len >> (8 * i)) & 0xff));
    bad << hdr << std::string(8, '\0');
  }
  CHECK(error_of([&] { nn::load_safetensors(path); }).find("tensor 'x' of shape [4] does not match its 8 data bytes") !=
        std::string::npos);
  // 16-bit floats, as Hugging Face checkpoints store them, come back as float32, exactly.
  auto write_raw = [&](const std::string& hdr, const std::vector<uint16_t>& data) {
    std::ofstream out(path, std::ios::binary);
    uint64_t len = hdr.size();
    for (int i = 0; i < 8; ++i) out.put(static_cast<char>((len >> (8 * i)) & 0xff));
    out << hdr;
    for (uint16_t h : data) out.put(static_cast<char>(h & 0xff)), out.put(static_cast<char>(h >> 8));
  };
  write_raw(R"({"h":{"dtype":"F16","shape":[2,4],"data_offsets":[0,16]},"b":{"dtype":"BF16","shape":[4],"data_offsets":[16,24]}})",
            {0x3C00, 0xC000, 0x7BFF, 0x0001, 0x03FF, 0x8000, 0xFC00, 0x7E00,  // F16
             0x3F80, 0xC040, 0x7F80, 0x0001});                                 // BF16
  auto halves = nn::load_safetensors(path).as_map();
  CHECK(halves.at("h").dtype() == kFloat32);
  CHECK(halves.at("h").sizes() == Shape{2, 4});
  std::vector<double> h = values(halves.at("h"));
  CHECK(h[0] == 1.0);
  CHECK(h[1] == -2.0);
  CHECK(h[2] == 65504.0);                       // the largest finite half
  CHECK(h[3] == std::ldexp(1.0, -24));          // the smallest subnormal
  CHECK(h[4] == std::ldexp(1023.0, -24));       // the largest subnormal
  CHECK((h[5] == 0.0 && std::signbit(h[5])));  // -0
  CHECK(h[6] == -std::numeric_limits<double>::infinity());
  CHECK(std::isnan(h[7]));
  std::vector<double> b = values(halves.at("b"));
  CHECK(b[0] == 1.0);
  CHECK(b[1] == -3.0);
  CHECK(b[2] == std::numeric_limits<double>::infinity());
  CHECK(b[3] == static_cast<double>(std::ldexp(1.0f, -133)));  // a float32 subnormal
  write_raw(R"({"x":{"dtype":"F8_E4M3","shape":[2],"data_offsets":[0,2]}})", {0});
  CHECK(error_of([&] { nn::load_safetensors(path); }).find("tensor 'x' has unsupported dtype F8_E4M3") !=
        std::string::npos);
  // A failed save leaves the existing file alone.
  nn::save_safetensors(path, {{"keep", ones({2})}});
  CHECK(error_of([&] { nn::save_safetensors("/nonexistent/dir/y.safetensors", {{"k", ones({1})}}); })
            .find("save: cannot create /nonexistent/dir/y.safetensors") != std::string::npos);
  CHECK(nn::load_safetensors(path).tensors[0].first == "keep");
  std::remove(path.c_str());
}

TEST_CASE("Linear, Embedding, LayerNorm and Dropout compute what they should") {
  nn::Linear lin(3, 2);
  {
    NoGradGuard g;
    lin.weight.copy_(tensor({1.f, 0.f, -1.f, 2.f, 1.f, 0.f}, {2, 3}));
    lin.bias.copy_(tensor({0.5f, -0.5f}));
  }
  check_values(lin.forward(tensor({1.f, 2.f, 3.f})), {-1.5, 3.5});
  Tensor y = lin.forward(ones({4, 5, 3}));
  CHECK(y.sizes() == Shape{4, 5, 2});
  check_values(y.select(0, 3).select(0, 4), {0.5, 2.5});
  CHECK(error_of([&] { lin.forward(ones({2, 4})); }).find("Linear: input of shape [2, 4] does not end in in_features=3") !=
        std::string::npos);

  nn::Embedding emb(5, 3, 0);
  check_values(emb.weight.select(0, 0), {0, 0, 0});
  Tensor ids = tensor({0, 2, 2, 0}, {2, 2});
  sum(emb.forward(ids)).backward();
  check_values(emb.weight.grad().select(0, 0), {0, 0, 0});  // padding row: no gradient
  check_values(emb.weight.grad().select(0, 2), {2, 2, 2});

  nn::LayerNorm ln(4);
  check_values(ln.forward(tensor({1.f, 1.f, 1.f, 1.f})), {0, 0, 0, 0});

  nn::Dropout drop(0.5);
  Tensor x = ones({1000});
  CHECK(values(drop.forward(x)) != values(x));
  drop.eval();
  CHECK(values(drop.forward(x)) == values(x));
  CHECK(error_of([] { nn::Dropout(1.0); }).find("Dropout: probability must be in [0, 1), got 1") != std::string::npos);
}

TEST_CASE("RMSNorm and rotary_embedding: by hand, names, eps, rotation") {
  nn::RMSNorm rms(4);
  CHECK(rms.named_parameters().size() == 1);
  CHECK(rms.named_parameters()[0].first == "weight");
  // rows [3, 4, 0, 0] and [1, 1, 1, 1]: root mean squares 2.5 and 1
  check_values(rms.forward(tensor({3.f, 4.f, 0.f, 0.f, 1.f, 1.f, 1.f, 1.f}, {2, 4})), {1.2, 1.6, 0, 0, 1, 1, 1, 1});
  // eps unset: the dtype's machine epsilon, as torch.nn.functional.rms_norm
  const double e32 = std::numeric_limits<float>::epsilon();
  check_values(rms_norm(tensor({1e-3f, 1e-3f}), {2}), {1e-3 / std::sqrt(1e-6 + e32), 1e-3 / std::sqrt(1e-6 + e32)}, 1e-6);
  check_values(rms_norm(tensor({3.0, 4.0}, {}, kFloat64), {2}, Tensor(), 0.75), {3 / std::sqrt(13.25), 4 / std::sqrt(13.25)}, 1e-12);
  CHECK(error_of([] { rms_norm(ones({2, 3}), {2}); }).find("rms_norm: normalized_shape [2] does not match") !=
        std::string::npos);
  CHECK(error_of([] { rms_norm(ones({2, 3}), {3}, Tensor(), -1.0); }).find("rms_norm: eps must be at least 0") !=
        std::string::npos);

  // A quarter turn of each pair (x[i], x[i + 2]): (1, 0) -> (0, 1); angle 0 leaves the pair.
  Tensor c = tensor({0.0, 1.0}, {}, kFloat64), s = tensor({1.0, 0.0}, {}, kFloat64);
  check_values(rotary_embedding(tensor({1.0, 5.0, 0.0, 7.0}, {}, kFloat64), c, s), {0, 5, 1, 7}, 1e-12);
  // Lengths are kept: a rotation.
  Generator g(3);
  Tensor x = randn({2, 3, 8}, kFloat64, &g), ang = rand({3, 4}, kFloat64, &g);
  std::vector<double> cv, sv;
  for (double a : values(ang)) cv.push_back(std::cos(6 * a)), sv.push_back(std::sin(6 * a));
  Tensor y = rotary_embedding(x, tensor(cv, {3, 4}, kFloat64), tensor(sv, {3, 4}, kFloat64));
  CHECK(values(sum(mul(y, y)))[0] == doctest::Approx(values(sum(mul(x, x)))[0]).epsilon(1e-12));
  Tensor needs_grad = tensor(cv, {3, 4}, kFloat64).requires_grad_();
  CHECK(error_of([&] { rotary_embedding(x, needs_grad, tensor(sv, {3, 4}, kFloat64)); })
            .find("rotary_embedding: cos and sin are tables of angles and take no gradient") != std::string::npos);
}

TEST_CASE("MultiHeadAttention: masks, attention weights, and the cache") {
  manual_seed(3);
  nn::MultiHeadAttention mha(8, 2);
  Tensor x = randn({2, 5, 8});
  Tensor causal = gt(arange(5).unsqueeze(0), arange(5).unsqueeze(1));
  Tensor w;
  mha.set_attention_hook([&w](const Tensor& weights) { w = weights; });
  Tensor out = mha.forward(x, x, x, causal);
  CHECK(out.sizes() == Shape{2, 5, 8});
  CHECK(w.sizes() == Shape{2, 2, 5, 5});
  check_values(sum(w, {-1}), std::vector<double>(20, 1.0));
  CHECK(w.select(2, 0).select(2, 1).sum().item<float>() == 0.0f);  // position 0 never sees position 1
  // Causality: changing the last position leaves earlier outputs unchanged.
  Tensor x2 = x.clone();
  {
    NoGradGuard g;
    x2.select(1, 4).fill_(7.0);
  }
  Tensor out2 = mha.forward(x2, x2, x2, causal);
  CHECK(allclose(out.slice(1, 0, 4), out2.slice(1, 0, 4), 1e-5, 1e-6));
  // Key padding mask [B, 1, 1, T]: padded keys get zero weight.
  Tensor pad = gt(tensor({0, 0, 0, 1, 1, 0, 0, 0, 0, 0}, {2, 1, 1, 5}), 0.0);
  mha.forward(x, x, x, pad);
  CHECK(sum(w.select(0, 0).slice(-1, 3, 5)).item<float>() == 0.0f);
  mha.set_attention_hook(nullptr);
  // Incremental: feeding one position at a time through a cache equals the full causal pass.
  nn::KVCache cache;
  std::vector<Tensor> steps;
  for (int64_t t = 0; t < 5; ++t) {
    Tensor xt = x.slice(1, t, t + 1);
    steps.push_back(mha.forward(xt, xt, xt, Tensor(), &cache));
  }
  CHECK(allclose(cat(steps, 1), out, 1e-5, 1e-6));
  CHECK(error_of([] { nn::MultiHeadAttention(10, 3); }).find("d_model 10 is not divisible by 3 heads") !=
        std::string::npos);
}

TEST_CASE("MultiHeadAttention: G query rows per key row equal the keys repeated G times") {
  manual_seed(4);
  nn::MultiHeadAttention mha(8, 2);
  mha.eval();
  const int64_t A = 3, G = 4, S = 6;
  Tensor memory = randn({A, S, 8}), query = randn({A * G, 2, 8});
  Tensor pad = gt(tensor({0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1}, {A, 1, 1, S}), 0.0);
  std::vector<int64_t> rep;
  for (int64_t a = 0; a < A; ++a)
    for (int64_t g = 0; g < G; ++g) rep.push_back(a);
  const Tensor idx = tensor(rep);
  Tensor w_grouped, w_repeated;
  mha.set_attention_hook([&](const Tensor& w) { w_grouped = w; });
  Tensor grouped = mha.forward(query, memory, memory, pad);
  mha.set_attention_hook([&](const Tensor& w) { w_repeated = w; });
  Tensor repeated = mha.forward(query, index_select(memory, 0, idx), index_select(memory, 0, idx), index_select(pad, 0, idx));
  mha.set_attention_hook(nullptr);
  CHECK(grouped.sizes() == Shape{A * G, 2, 8});
  CHECK(max_diff(grouped, repeated) <= 1e-6);
  CHECK(w_grouped.sizes() == Shape{A * G, 2, 2, S});  // the hook sees [B, H, Tq, Tk] either way
  CHECK(max_diff(w_grouped, w_repeated) <= 1e-6);
  // With a cache (cross-attention's static keys): projected once from the A memory rows.
  nn::KVCache cache;
  Tensor first = mha.forward(query.slice(1, 0, 1), memory, memory, pad, &cache, /*static_kv=*/true);
  CHECK(cache.k.size(0) == A);
  Tensor second = mha.forward(query.slice(1, 1, 2), memory, memory, pad, &cache, true);
  CHECK(max_diff(cat({first, second}, 1), repeated) <= 1e-6);
  // Gradients reach the shared memory rows from each of their G query rows.
  Tensor mem = memory.clone().requires_grad_(), mem_rep = memory.clone().requires_grad_();
  mha.forward(query, mem, mem, pad).pow(2).sum().backward();
  mha.forward(query, index_select(mem_rep, 0, idx), index_select(mem_rep, 0, idx), index_select(pad, 0, idx)).pow(2).sum().backward();
  CHECK(max_diff(mem.grad(), mem_rep.grad()) <= 1e-5);
  // G must divide the query rows; causal attention needs one key row per query row.
  CHECK(error_of([&] { mha.forward(randn({5, 2, 8}), memory, memory); }).find("G query rows per key row") !=
        std::string::npos);
  CHECK(error_of([&] { mha.forward(query, memory, memory, Tensor(), nullptr, false, true); }).find("is_causal needs one key row") !=
        std::string::npos);
}

TEST_CASE("Linear in eval mode: W^T kept for inference, refreshed when the weight changes") {
  manual_seed(5);
  nn::Linear lin(24, 40);
  Tensor x = randn({3, 5, 24});
  const Tensor train_out = lin.forward(x).detach();
  lin.eval();
  Tensor with_grad = lin.forward(x).detach();  // the weight requires grad: recorded, no cache
  Tensor inference;
  {
    NoGradGuard no_grad;
    inference = lin.forward(x);
    CHECK(lin.forward(x).to_vector<float>() == inference.to_vector<float>());
  }
  // Eval mode gives the same bits whether or not gradients are recorded, train mode the same to rounding.
  CHECK(with_grad.to_vector<float>() == inference.to_vector<float>());
  CHECK(max_diff(inference, train_out) <= 1e-6);
  CHECK(max_diff(inference, matmul(x, lin.weight.t()) + lin.bias) <= 1e-6);
  // An in-place update (an optimizer step) and a new weight tensor are both seen.
  {
    NoGradGuard no_grad;
    lin.weight.mul_(2.0);
    CHECK(max_diff(lin.forward(x), matmul(x, lin.weight.t()) + lin.bias) <= 1e-6);
    lin.weight.select(0, 3).fill_(0.5);  // through a view: the same storage's version
    CHECK(max_diff(lin.forward(x), matmul(x, lin.weight.t()) + lin.bias) <= 1e-6);
  }
  lin.weight = randn({40, 24});
  {
    NoGradGuard no_grad;
    CHECK(max_diff(lin.forward(x), matmul(x, lin.weight.t()) + lin.bias) <= 1e-6);
    CHECK(lin.forward(randn({24})).sizes() == Shape{40});  // 1-D input
  }
  // Gradients in eval mode flow to x and the weight as in train mode.
  Tensor xg = x.clone().requires_grad_();
  lin.weight.requires_grad_();
  lin.forward(xg).sum().backward();
  CHECK(max_diff(xg.grad(), sum(lin.weight, {0}).expand({3, 5, 24})) <= 1e-5);
  CHECK(max_diff(lin.weight.grad(), sum(x.reshape({15, 24}), {0}).expand({40, 24})) <= 1e-5);
}

TEST_CASE("KVCache: steps write in place, rows reorder, gradients still flow") {
  Generator g(3);
  const int64_t B = 3, H = 2, K = 4, steps = 40;  // enough steps to grow the room twice
  std::vector<Tensor> ks, vs;
  for (int64_t t = 0; t < steps; ++t) {
    ks.push_back(randn({B, H, 1, K}, DType::Float32, &g));
    vs.push_back(randn({B, H, 1, K + 1}, DType::Float32, &g));  // values may be wider than keys
  }
  {
    NoGradGuard no_grad;
    nn::KVCache cache;
    const Storage* room = nullptr;
    int64_t moves = 0;
    for (int64_t t = 0; t < steps; ++t) {
      Tensor k = ks[t], v = vs[t];
      cache.append(k, v);
      CHECK(k.sizes() == Shape{B, H, t + 1, K});
      CHECK(v.sizes() == Shape{B, H, t + 1, K + 1});
      CHECK(max_diff(cache.k, cat(std::vector<Tensor>(ks.begin(), ks.begin() + t + 1), 2)) == 0.0);
      CHECK(max_diff(cache.v, cat(std::vector<Tensor>(vs.begin(), vs.begin() + t + 1), 2)) == 0.0);
      moves += cache.k.storage() != room;
      room = cache.k.storage();
    }
    CHECK(moves <= 4);  // the first keys, then room for 16, 32 and 64 positions: not a copy per step
    // Rows reordered (and one dropped) keep their values, and the next step still writes in place.
    cache.select_rows(tensor(std::vector<int64_t>{2, 0}));
    Tensor all_k = cat(ks, 2), all_v = cat(vs, 2);
    Tensor want_k = index_select(all_k, 0, tensor(std::vector<int64_t>{2, 0}));
    CHECK(max_diff(cache.k, want_k) == 0.0);
    CHECK(max_diff(cache.v, index_select(all_v, 0, tensor(std::vector<int64_t>{2, 0}))) == 0.0);
    room = cache.k.storage();
    Tensor k = ks[0].slice(0, 0, 2), v = vs[0].slice(0, 0, 2);
    cache.append(k, v);
    CHECK(cache.k.storage() == room);
    CHECK(max_diff(cache.k, cat({want_k, ks[0].slice(0, 0, 2)}, 2)) == 0.0);
    // Keys set from outside (not views of the room) are taken as they are.
    cache.k = all_k.clone(), cache.v = all_v.clone();
    k = ks[1], v = vs[1];
    cache.append(k, v);
    CHECK(max_diff(cache.k, cat({all_k, ks[1]}, 2)) == 0.0);
    CHECK(max_diff(cache.v, cat({all_v, vs[1]}, 2)) == 0.0);
  }
  // With gradients the cache concatenates, and the gradient reaches every step's keys.
  nn::KVCache cache;
  Tensor k0 = ks[0].clone().requires_grad_(), k1 = ks[1].clone().requires_grad_();
  Tensor a = k0, b = k1, va = vs[0], vb = vs[1];
  cache.append(a, va);
  cache.append(b, vb);
  sum(cache.k * cache.k).backward();
  CHECK(max_diff(k0.grad(), 2.0 * ks[0]) <= 1e-6);
  CHECK(max_diff(k1.grad(), 2.0 * ks[1]) <= 1e-6);
}

TEST_CASE("KVCache: rows leaving a batch move in place, unless a view of the cache is held") {
  Generator g(5);
  const int64_t B = 5, H = 2, K = 4, steps = 6;
  std::vector<Tensor> ks, vs;
  for (int64_t t = 0; t < steps; ++t) {
    ks.push_back(randn({B, H, 1, K}, DType::Float32, &g));
    vs.push_back(randn({B, H, 1, K + 1}, DType::Float32, &g));
  }
  const Tensor all_k = cat(ks, 2), all_v = cat(vs, 2);
  auto filled = [&](int64_t n_steps) {
    nn::KVCache cache;
    for (int64_t t = 0; t < n_steps; ++t) {
      Tensor k = ks[t].clone(), v = vs[t].clone();  // the cache's own: ks[0] would be held here too
      cache.append(k, v);
    }
    return cache;
  };
  auto rows = [](std::vector<int64_t> r) { return tensor(r); };
  NoGradGuard no_grad;
  for (int64_t n_steps : {int64_t{1}, steps}) {  // the first keys as they came (a cross-attention's), and a room
    INFO(n_steps, " steps");
    const Tensor want_k = all_k.narrow(2, 0, n_steps), want_v = all_v.narrow(2, 0, n_steps);
    // Rows 1 and 3 finish; row 4 takes row 1's place: only it moves, within the same storage.
    nn::KVCache cache = filled(n_steps);
    const Storage* before = cache.k.storage();
    cache.select_rows(rows({0, 4, 2}));
    CHECK(cache.k.storage() == before);
    CHECK(max_diff(cache.k, index_select(want_k, 0, rows({0, 4, 2}))) == 0.0);
    CHECK(max_diff(cache.v, index_select(want_v, 0, rows({0, 4, 2}))) == 0.0);
    Tensor k = ks[0].narrow(0, 0, 3), v = vs[0].narrow(0, 0, 3);  // and the next step appends
    cache.append(k, v);
    CHECK(max_diff(cache.k, cat({index_select(want_k, 0, rows({0, 4, 2})), ks[0].narrow(0, 0, 3)}, 2)) == 0.0);
    // A reordering within the kept rows cannot move in place, and is still right.
    nn::KVCache reordered = filled(n_steps);
    reordered.select_rows(rows({3, 0, 1}));
    CHECK(max_diff(reordered.k, index_select(want_k, 0, rows({3, 0, 1}))) == 0.0);
    // A view of the cache held outside: the cache copies, and the view keeps its values.
    nn::KVCache shared = filled(n_steps);
    const Tensor held = shared.k, held_values = shared.k.clone();
    shared.select_rows(rows({0, 4}));
    CHECK(max_diff(held, held_values) == 0.0);
    CHECK(max_diff(shared.k, index_select(want_k, 0, rows({0, 4}))) == 0.0);
    // An index out of range is an Error, as index_select's.
    nn::KVCache bad = filled(n_steps);
    CHECK_THROWS_AS(bad.select_rows(rows({0, 9})), Error);
    CHECK_THROWS_AS(bad.select_rows(rows({-1})), Error);
  }
}

TEST_CASE("KVCache: on a device, reordered rows stay in the room (no copy of the whole cache)") {
  // The emulated device stands for a GPU: the index is not read on the host, and a beam's reorder
  // (a permutation) and finished rows leaving (fewer rows) both write into the same room.
  Generator g(9);
  const int64_t B = 4, H = 2, K = 3, steps = 5;
  std::vector<Tensor> ks, vs;
  for (int64_t t = 0; t < steps; ++t) {
    ks.push_back(randn({B, H, 1, K}, DType::Float32, &g));
    vs.push_back(randn({B, H, 1, K}, DType::Float32, &g));
  }
  NoGradGuard no_grad;
  nn::KVCache cache;
  for (int64_t t = 0; t < steps; ++t) {
    Tensor k = ks[t].to(Device::Emulated), v = vs[t].to(Device::Emulated);
    cache.append(k, v);
  }
  const Tensor all_k = cat(ks, 2), all_v = cat(vs, 2);
  const Storage* room = cache.k.storage();
  const Tensor order = tensor(std::vector<int64_t>{3, 1, 0, 2}).to(Device::Emulated);
  runtime::reset_counts();
  cache.select_rows(order);
  CHECK(runtime::counts().syncs == 0);  // the index stays on the device
  CHECK(cache.k.storage() == room);
  const Tensor perm = tensor(std::vector<int64_t>{3, 1, 0, 2});
  CHECK(max_diff(cache.k.cpu(), index_select(all_k, 0, perm)) == 0.0);
  CHECK(max_diff(cache.v.cpu(), index_select(all_v, 0, perm)) == 0.0);
  cache.select_rows(tensor(std::vector<int64_t>{2, 0}).to(Device::Emulated));
  CHECK(cache.k.storage() == room);
  const Tensor kept = index_select(perm, 0, tensor(std::vector<int64_t>{2, 0}));
  CHECK(max_diff(cache.k.cpu(), index_select(all_k, 0, kept)) == 0.0);
  Tensor k = ks[0].narrow(0, 0, 2).to(Device::Emulated), v = vs[0].narrow(0, 0, 2).to(Device::Emulated);
  cache.append(k, v);  // the next step still writes in place
  CHECK(cache.k.storage() == room);
  CHECK(max_diff(cache.k.cpu(), cat({index_select(all_k, 0, kept), ks[0].narrow(0, 0, 2)}, 2)) == 0.0);
}

TEST_CASE("PositionalEncoding adds the sinusoids and extends to any length") {
  nn::PositionalEncoding pe(4, 0.0, 8);
  Tensor y = pe.forward(zeros({1, 3, 4}));
  // pos 2: sin(2), cos(2), sin(2/100), cos(2/100)
  check_values(y.select(1, 2), {std::sin(2.0), std::cos(2.0), std::sin(0.02), std::cos(0.02)}, 1e-5);
  Tensor long_y = pe.forward(zeros({1, 20, 4}), 5);
  CHECK(long_y.sizes() == Shape{1, 20, 4});
  check_values(long_y.select(0, 0).select(0, 19).slice(0, 0, 1), {std::sin(24.0)}, 1e-5);
}

TEST_CASE("cross_entropy: label smoothing beside a -1e9 logit is summed in double, in float32 too") {
  // Issue 44: the smoothing term's sum of (x - max) ran in float32, where the -1e9 of the ignored
  // class swallowed the other logits (float32's spacing at 1e9 is 64): 1.1691 instead of 0.6788.
  // The ignored class takes no smoothing mass (the Annotated Transformer's distribution), so the
  // loss is -(0.7 log p1 + 0.3 log p2) over the two real classes.
  const double x1 = -1.7094284, x2 = -1.7846442, lse = std::log(std::exp(x1) + std::exp(x2));
  const double want = -(0.7 * (x1 - lse) + 0.3 * (x2 - lse));  // 0.67881
  for (DType dt : {DType::Float32, DType::Float64}) {
    INFO(dtype_name(dt));
    Tensor x = tensor({-1e9, x1, x2}, {1, 3}, kFloat64).to(dt);
    check_values(cross_entropy(x, tensor({1}), 0.3, 0, Reduction::Sum), {want}, 1e-6);
  }
}

TEST_CASE("cross_entropy: values by hand, label smoothing, ignore index, gradcheck") {
  // logits row [0, ln 2, ln 3] -> softmax [1/6, 2/6, 3/6]
  Tensor logits = tensor({0.0, std::log(2.0), std::log(3.0), 0.0, 0.0, 0.0}, {2, 3}, kFloat64);
  Tensor target = tensor({2, 0});
  check_values(cross_entropy(logits, target), {(-std::log(0.5) - std::log(1.0 / 3)) / 2});
  check_values(cross_entropy(logits, target, 0.0, -100, Reduction::Sum), {-std::log(0.5) - std::log(1.0 / 3)});
  // ignore row 1
  check_values(cross_entropy(logits, tensor({2, 1}), 0.0, 1), {-std::log(0.5)});
  // smoothing 0.2 with ignore_index 0 as the padding class: q = [0, 0.2, 0.8] for gold 2
  check_values(cross_entropy(logits.slice(0, 0, 1), tensor({2}), 0.2, 0),
               {-(0.2 * std::log(2.0 / 6) + 0.8 * std::log(0.5))});
  // without a padding class: the 0.2 spreads over the two other classes
  check_values(cross_entropy(logits.slice(0, 0, 1), tensor({2}), 0.2),
               {-(0.1 * std::log(1.0 / 6) + 0.1 * std::log(2.0 / 6) + 0.8 * std::log(0.5))});
  // all rows ignored: 0, not NaN
  check_values(cross_entropy(logits, tensor({1, 1}), 0.1, 1), {0});

  Tensor tgt = tensor({3, 0, 1, 4, 0});
  for (double eps : {0.0, 0.1}) {
    for (auto red : {Reduction::Mean, Reduction::Sum}) {
      Generator gen(5);
      Tensor x = randn({5, 6}, kFloat64, &gen).requires_grad_();
      CHECK(gradcheck([&](const TensorList& in) { return cross_entropy(in[0], tgt, eps, 0, red); }, {x}));
      Tensor xt = randn({6, 5}, kFloat64, &gen).t().detach().requires_grad_();  // non-contiguous logits
      CHECK(gradcheck([&](const TensorList& in) { return cross_entropy(in[0], tgt, eps, 0, red) * 3.0; }, {xt}));
    }
  }
  // The fused op equals its composite definition.
  Generator gen(9);
  Tensor x = randn({5, 6}, kFloat64, &gen);
  Tensor lp = log_softmax(x, 1);
  Tensor q = full({5, 6}, 0.1 / 4, kFloat64);
  std::vector<int64_t> t = tgt.to_vector<int64_t>();
  double composite = 0;
  int counted = 0;
  for (int r = 0; r < 5; ++r) {
    if (t[r] == 0) continue;
    ++counted;
    for (int j = 0; j < 6; ++j) {
      double qj = j == t[r] ? 0.9 : (j == 0 ? 0.0 : 0.1 / 4);
      composite -= qj * lp.select(0, r).select(0, j).item<double>();
    }
  }
  CHECK(cross_entropy(x, tgt, 0.1, 0).item<double>() == doctest::Approx(composite / counted).epsilon(1e-12));
  CHECK(error_of([&] { cross_entropy(x, tensor({1, 2, 3, 4, 9}), 0.1, 0); })
            .find("cross_entropy: target 9 in row 4 is out of range for 6 classes") != std::string::npos);
  CHECK(error_of([&] { cross_entropy(x, tensor({1, 2})); }).find("target must be int64 [5]") != std::string::npos);
}
