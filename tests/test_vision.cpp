// The vision building blocks: randperm, nn::unfold (patches), the IDX reader on good and bad
// files, TensorDataset / random_split / DataLoader, the augmentations, and the ViT (patch
// order, shapes, gradcheck, a small-data training run whose loss falls).
#include <unistd.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "tests/helpers.h"

using namespace tapestry;
using namespace tapestry::testing;

namespace {

std::string temp_dir() {
  std::string dir = fmt::format("/tmp/tapestry_test_{}_vision", ::getpid());
  std::filesystem::create_directories(dir);
  return dir;
}

void write_bytes(const std::string& path, const std::vector<unsigned char>& bytes, bool gz = false) {
  if (gz) {
    gzFile f = gzopen(path.c_str(), "wb");
    gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size()));
    gzclose(f);
    return;
  }
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()),
                                              static_cast<std::streamsize>(bytes.size()));
}

// An IDX file of unsigned bytes: magic 00 00 08 rank, big-endian sizes, the values.
std::vector<unsigned char> idx_bytes(const std::vector<uint32_t>& dims, const std::vector<unsigned char>& values) {
  std::vector<unsigned char> b = {0, 0, 0x08, static_cast<unsigned char>(dims.size())};
  for (uint32_t d : dims)
    for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<unsigned char>(d >> s));
  b.insert(b.end(), values.begin(), values.end());
  return b;
}

}  // namespace

TEST_CASE("randperm: a permutation, the same for the same seed, and errors") {
  Generator g1(7), g2(7);
  Tensor a = randperm(100, kInt64, &g1), b = randperm(100, kInt64, &g2);
  CHECK(a.sizes() == Shape{100});
  CHECK(a.dtype() == kInt64);
  std::vector<int64_t> v = a.to_vector<int64_t>();
  CHECK(std::set<int64_t>(v.begin(), v.end()).size() == 100);
  CHECK(*std::min_element(v.begin(), v.end()) == 0);
  CHECK(*std::max_element(v.begin(), v.end()) == 99);
  CHECK(v == b.to_vector<int64_t>());
  CHECK(v != randperm(100, kInt64, &g1).to_vector<int64_t>());  // the generator moved on
  CHECK(randperm(0).numel() == 0);
  CHECK(values(randperm(1)) == std::vector<double>{0});
  CHECK(randperm(5, kFloat32).dtype() == kFloat32);
  CHECK(error_of([] { randperm(-1); }) == "randperm: n must be non-negative, got -1");
  CHECK(error_of([] { randperm(3, kBool); }) == "randperm: a permutation cannot be bool");
}

TEST_CASE("Tensor::unfold is a view of windows - nn::unfold matches F.unfold's layout") {
  Tensor x = arange(0.0, 10.0, 1.0, kFloat64);
  Tensor w = x.unfold(0, 4, 3);  // windows [0..3], [3..6], [6..9]
  CHECK(w.sizes() == Shape{3, 4});
  check_values(w, {0, 1, 2, 3, 3, 4, 5, 6, 6, 7, 8, 9});
  CHECK(w.impl().storage == x.impl().storage);  // a view
  CHECK(error_of([&] { x.unfold(0, 11, 1); }) == "unfold: window size 11 exceeds dim 0 of size 10 (tensor shape [10])");
  CHECK(error_of([&] { x.unfold(0, 2, 0); }) == "unfold: step must be positive, got 0");
  // Overlapping windows: each element's gradient counts its windows.
  Tensor leaf = ones({6}, kFloat64).requires_grad_();
  leaf.unfold(0, 3, 1).sum().backward();
  check_values(leaf.grad(), {1, 2, 3, 3, 2, 1});

  // [B=1, C=2, 4, 4] in blocks of 2x2: block (r, c) holds channel 0's 4 pixels then channel 1's.
  Tensor img = arange(0.0, 32.0, 1.0, kFloat64).reshape({1, 2, 4, 4});
  Tensor cols = nn::unfold(img, {2, 2}, {2, 2});
  CHECK(cols.sizes() == Shape{1, 8, 4});
  check_values(cols.select(2, 1), {2, 3, 6, 7, 18, 19, 22, 23});  // block (0, 1)
  check_values(cols.select(2, 2), {8, 9, 12, 13, 24, 25, 28, 29});  // block (1, 0)
  CHECK(nn::unfold(img, {3, 3}, {1, 1}).sizes() == Shape{1, 18, 4});
  CHECK(error_of([&] { nn::unfold(img.select(0, 0), {2, 2}, {2, 2}); }) ==
        "unfold: input must be [B, C, H, W], got shape [2, 4, 4]");
  CHECK(gradcheck([](const TensorList& in) { return nn::unfold(in[0], {2, 3}, {1, 2}); },
                  {randn({2, 2, 4, 5}, kFloat64).requires_grad_()}));
}

TEST_CASE("read_idx reads plain and gzip IDX files, and names the file of every fault") {
  const std::string dir = temp_dir();
  std::vector<unsigned char> pixels;
  for (int i = 0; i < 2 * 3 * 4; ++i) pixels.push_back(static_cast<unsigned char>(i * 10));
  write_bytes(dir + "/images", idx_bytes({2, 3, 4}, pixels));
  write_bytes(dir + "/images.gz", idx_bytes({2, 3, 4}, pixels), true);
  for (const char* name : {"/images", "/images.gz"}) {
    Tensor t = data::read_idx(dir + name);
    CHECK(t.sizes() == Shape{2, 3, 4});
    CHECK(t.dtype() == kFloat32);
    CHECK(values(t)[23] == 230);
  }
  CHECK(data::read_idx(dir + "/images", kInt64).dtype() == kInt64);
  // A big-endian int32 file: magic 00 00 0c 01, size 2, values -2 and 70000.
  write_bytes(dir + "/ints", {0, 0, 0x0C, 1, 0, 0, 0, 2, 0xFF, 0xFF, 0xFF, 0xFE, 0, 1, 0x11, 0x70});
  CHECK(values(data::read_idx(dir + "/ints", kInt64)) == std::vector<double>{-2, 70000});

  std::vector<unsigned char> bad = idx_bytes({2, 3, 4}, pixels);
  bad[2] = 0x99;
  write_bytes(dir + "/magic", bad);
  CHECK(error_of([&] { data::read_idx(dir + "/magic"); }) ==
        dir + "/magic: not an IDX file (magic number 00009903; expected 0000 then a type 08-0e and a rank)");
  write_bytes(dir + "/text", {'h', 'e', 'l', 'l', 'o', '\n'});
  CHECK(error_of([&] { data::read_idx(dir + "/text"); }).find(dir + "/text: not an IDX file") == 0);
  std::vector<unsigned char> cut = idx_bytes({2, 3, 4}, pixels);
  cut.resize(cut.size() - 5);
  write_bytes(dir + "/cut.gz", cut, true);
  CHECK(error_of([&] { data::read_idx(dir + "/cut.gz"); }) ==
        dir + "/cut.gz: truncated: shape [2, 3, 4] of ubyte needs 24 bytes of values, the file has 19");
  write_bytes(dir + "/header", {0, 0, 8, 3, 0, 0});
  CHECK(error_of([&] { data::read_idx(dir + "/header"); }) == dir + "/header: truncated in its header (3 sizes declared)");
  std::vector<unsigned char> extra = idx_bytes({2, 3, 4}, pixels);
  extra.push_back(1);
  write_bytes(dir + "/extra", extra);
  CHECK(error_of([&] { data::read_idx(dir + "/extra"); }) ==
        dir + "/extra: bytes past the 24 values its header declares (shape [2, 3, 4])");
  write_bytes(dir + "/empty", {});
  CHECK(error_of([&] { data::read_idx(dir + "/empty"); }) ==
        dir + "/empty: not an IDX file (shorter than its 4-byte magic number)");
  CHECK(error_of([&] { data::read_idx(dir + "/missing"); }) == dir + "/missing: no such file");
  std::filesystem::remove_all(dir);
}

TEST_CASE("read_mnist: an MNIST-layout folder, scaled images and matching counts") {
  const std::string dir = temp_dir() + "/mnist";
  std::filesystem::create_directories(dir);
  std::vector<unsigned char> pixels(3 * 2 * 2, 255);
  pixels[0] = 0;
  write_bytes(dir + "/train-images-idx3-ubyte.gz", idx_bytes({3, 2, 2}, pixels), true);
  write_bytes(dir + "/train-labels-idx1-ubyte", idx_bytes({3}, {4, 0, 9}));
  data::ImageSet s = data::read_mnist(dir, true);
  CHECK(s.images.sizes() == Shape{3, 1, 2, 2});
  CHECK(values(s.images)[0] == 0);
  CHECK(values(s.images)[1] == 1);
  CHECK(values(s.labels) == std::vector<double>{4, 0, 9});
  write_bytes(dir + "/train-labels-idx1-ubyte", idx_bytes({2}, {4, 0}));
  CHECK(error_of([&] { data::read_mnist(dir, true); }) ==
        dir + "/train-images-idx3-ubyte.gz holds 3 images but " + dir + "/train-labels-idx1-ubyte holds 2 labels");
  CHECK(error_of([&] { data::read_mnist(dir, false); }).find(dir + ": no t10k-images-idx3-ubyte.gz or") == 0);
  std::filesystem::remove_all(dir);
}

TEST_CASE("TensorDataset, random_split and DataLoader: disjoint splits, seeded shuffles, whole epochs") {
  Tensor x = arange(0.0, 10.0, 1.0, kFloat32).reshape({10, 1}), y = arange(10);
  data::TensorDataset ds(x, y);
  CHECK(ds.size() == 10);
  CHECK(values(ds.get(3).target) == std::vector<double>{3});
  CHECK(error_of([&] { data::TensorDataset(x, arange(9)); }) ==
        "TensorDataset: data has 10 rows (shape [10, 1]) but target has 9 (shape [9])");
  auto parts = data::random_split(ds, {7, 3}, 5);
  std::vector<int64_t> seen;
  for (auto& p : parts)
    for (int64_t v : p.target().to_vector<int64_t>()) seen.push_back(v);
  CHECK(std::set<int64_t>(seen.begin(), seen.end()).size() == 10);
  CHECK(values(parts[1].target()) == values(data::random_split(ds, {7, 3}, 5)[1].target()));
  CHECK(error_of([&] { data::random_split(ds, {7, 4}, 5); }) ==
        "random_split: lengths sum to 11 but the dataset has 10 examples");

  data::DataLoaderOptions o;
  // PyTorch's defaults: batches of 1, in order.
  CHECK(o.batch_size == 1);
  CHECK_FALSE(o.shuffle);
  CHECK(values(data::DataLoader(ds, o).batch(3, 2).target) == std::vector<double>{2});
  o.batch_size = 4, o.shuffle = true, o.seed = 3;
  data::DataLoader loader(ds, o);
  CHECK(loader.batches() == 3);
  std::vector<int64_t> epoch1;
  for (const data::Batch& b : loader.epoch(1)) {
    CHECK(b.data.size(0) == b.target.size(0));
    CHECK(values(b.data) == values(b.target.to(kFloat64)));  // rows stay paired
    for (int64_t v : b.target.to_vector<int64_t>()) epoch1.push_back(v);
  }
  CHECK(epoch1.size() == 10);
  CHECK(std::set<int64_t>(epoch1.begin(), epoch1.end()).size() == 10);
  CHECK(values(loader.batch(2, 1).target) != values(loader.batch(1, 1).target));  // a fresh order per epoch
  CHECK(values(data::DataLoader(ds, o).batch(2, 1).target) == values(loader.batch(2, 1).target));  // seeded
  o.drop_last = true;
  CHECK(data::DataLoader(ds, o).batches() == 2);
  o.shuffle = false;
  CHECK(values(data::DataLoader(ds, o).batch(5, 1).target) == std::vector<double>{4, 5, 6, 7});
  // A transform gets the same generator whenever a batch is made again.
  data::DataLoader noisy(ds, o, [](data::Batch b, Generator& g) {
    b.data = b.data + randn(b.data.sizes(), kFloat32, &g);
    return b;
  });
  CHECK(values(noisy.batch(1, 0).data) == values(noisy.batch(1, 0).data));
  CHECK(values(noisy.batch(1, 0).data) != values(noisy.batch(2, 0).data));
  CHECK(error_of([&] { loader.batch(1, 3); }) == "DataLoader: batch 3 is out of range for 3 batches per epoch");
}

TEST_CASE("random_crop and random_horizontal_flip move pixels as torchvision's do") {
  Tensor img = arange(1.0, 17.0, 1.0, kFloat32).reshape({1, 1, 4, 4});
  Generator g(1);
  CHECK(values(data::random_crop(img, 0, g)) == values(img));
  // With padding 1 every crop is the image shifted by at most one pixel, zeros coming in.
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<double> c = values(data::random_crop(img, 1, g));
    bool matched = false;
    for (int dy = -1; dy <= 1; ++dy)
      for (int dx = -1; dx <= 1; ++dx) {
        bool same = true;
        for (int yy = 0; yy < 4; ++yy)
          for (int xx = 0; xx < 4; ++xx) {
            const int sy = yy + dy, sx = xx + dx;
            const double want = sy < 0 || sy >= 4 || sx < 0 || sx >= 4 ? 0.0 : 1.0 + sy * 4 + sx;
            same = same && c[static_cast<size_t>(yy * 4 + xx)] == want;
          }
        matched = matched || same;
      }
    CHECK(matched);
  }
  CHECK(values(data::random_horizontal_flip(img, g, 0.0)) == values(img));
  check_values(data::random_horizontal_flip(img, g, 1.0).select(2, 0).reshape({4}), {4, 3, 2, 1});
  CHECK(error_of([&] { data::random_crop(img.select(0, 0), 1, g); }) ==
        "random_crop: images must be [B, C, H, W], got shape [1, 4, 4]");
}

TEST_CASE("ViT: patches in raster order, shapes, names, gradcheck") {
  models::ViTConfig c = models::ViTConfig::named("tiny");
  c.image_size = 8, c.patch_size = 4, c.classes = 3, c.d_model = 8, c.heads = 2, c.d_ff = 16, c.layers = 1;
  manual_seed(3);
  models::ViT vit(c);
  Tensor img = arange(0.0, 64.0, 1.0, kFloat32).reshape({1, 1, 8, 8});
  Tensor p = vit.patches(img);
  CHECK(p.sizes() == Shape{1, 4, 16});
  check_values(p.select(1, 1).slice(1, 0, 4), {4, 5, 6, 7});  // patch (0, 1): columns 4..7 of row 0
  check_values(p.select(1, 2).slice(1, 0, 4), {32, 33, 34, 35});  // patch (1, 0): row 4
  CHECK(vit.forward(randn({5, 1, 8, 8})).sizes() == Shape{5, 3});
  auto named = vit.named_parameters();
  std::set<std::string> names;
  for (auto& [n, t] : named) names.insert(n);
  for (const char* n : {"patch_embed.weight", "cls_token", "pos_embed", "encoder.layers.0.self_attn.w_q.weight",
                        "encoder.layers.0.ff.w_1.weight", "encoder.norm.weight", "head.bias"})
    CHECK(names.count(n) == 1);
  CHECK(error_of([&] { vit.forward(randn({2, 1, 7, 7})); }) == "ViT: images must be [B, 1, 8, 8], got shape [2, 1, 7, 7]");
  c.patch_size = 3;
  CHECK(error_of([&] { models::ViT bad(c); }) == "ViTConfig: patches of 3 every 3 pixels do not tile image_size 8");
  c.patch_stride = 1;
  CHECK(models::ViT(c).patches(img).sizes() == Shape{1, 36, 9});  // overlapping: 6 x 6 patches of 3 x 3
  CHECK(error_of([] { models::ViTConfig::named("huge"); }) ==
        "ViTConfig: unknown config 'huge' (expected one of tiny, fmnist, small)");

  // Every parameter's gradient, in float64, against central differences.
  vit.to(kFloat64);
  Tensor x = randn({2, 1, 8, 8}, kFloat64), y = tensor({2, 0});
  auto params = vit.parameters();
  CHECK(gradcheck(
      [&](const TensorList& in) {
        (void)in;
        return vit.loss(x, y);
      },
      params));
}

TEST_CASE("ViT: a small-data training run's loss falls") {
  // Two classes of 8x8 images: a bright left half or a bright right half, plus noise.
  manual_seed(5);
  models::ViTConfig c = models::ViTConfig::named("tiny");
  c.image_size = 8, c.patch_size = 4, c.classes = 2, c.d_model = 16, c.heads = 2, c.d_ff = 32, c.layers = 1;
  models::ViT vit(c);
  const int64_t n = 64;
  Tensor labels = randint(0, 2, {n});
  Tensor cols = arange(8).to(kFloat32).reshape({1, 1, 1, 8}).expand({n, 1, 8, 8});
  Tensor left = lt(cols, 4.0), bright = eq(labels.reshape({n, 1, 1, 1}), 0.0);
  Tensor images = where(eq(left, bright), 1.0, zeros({n, 1, 8, 8})) + 0.3 * randn({n, 1, 8, 8});
  const std::pair<double, double> losses = first_and_last_loss(vit.parameters(), [&] { return vit.loss(images, labels); }, 60);
  const double first = losses.first, last = losses.second;
  INFO("loss ", first, " -> ", last);
  CHECK(last < 0.3 * first);
}
