// The image-classification task (see image_classification.h).
#include "apps/tasks/image_classification.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "apps/eval/image_plots.h"
#include "apps/tasks/task.h"
#include "apps/train/run_dir.h"
#include "apps/train/saved_model.h"
#include "tapestry/data/dataloader.h"
#include "tapestry/data/idx.h"
#include "tapestry/data/transforms.h"
#include "tapestry/nn/safetensors.h"
#include "tapestry/ops/file.h"

namespace tapestry::apps {

using models::ViT;
using models::ViTConfig;

std::string default_image_dir() {
  const char* env = std::getenv("TAPESTRY_IMAGE_DATA");
  return env && *env ? env : "/usr/share/datasets/fashion-mnist";
}

Tensor Normalization::apply(const Tensor& images) const { return div(sub(images, mean), std); }

std::vector<std::string> class_names(const std::string& data_dir, int64_t classes) {
  if (classes == 10 && data_dir.find("fashion") != std::string::npos)
    return {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"};
  std::vector<std::string> names;
  for (int64_t i = 0; i < classes; ++i) names.push_back(std::to_string(i));
  return names;
}

OptionTable options_table(ImageOptions& o) {
  OptionTable trainer = trainer_options(o.trainer), t("image");
  t.add("data", o.data_dir, "an MNIST-layout folder of IDX files, plain or .gz (default: $TAPESTRY_IMAGE_DATA or "
        "Debian's Fashion-MNIST, /usr/share/datasets/fashion-mnist)");
  t.take(trainer, "out");
  t.add("config", o.config, "model size").one_of(ViTConfig::names()).recipe();
  t.add("patch", o.patch, "patch size in pixels (0: the config's)").at_least(0).recipe();
  t.add("patch-stride", o.patch_stride, "pixels between patches (0: the config's, or with --patch the patch size; "
        "less than the size: overlapping)").at_least(0).recipe();
  t.add("batch", o.batch, "images per batch").positive().recipe();
  t.take(trainer, "epochs").recipe();  // the cosine schedule spans them
  o.adamw.add_rows(t, "AdamW weight decay on matrices (none on biases, LayerNorm, [CLS], positions)");
  t.add("dropout", o.dropout, "dropout").at_least(0).below(1);
  t.add("label-smoothing", o.label_smoothing, "label smoothing of the loss").at_least(0).below(1);
  t.add("val-size", o.val_size, "training images held out for validation").positive().recipe();
  t.add("crop-padding", o.crop_padding, "augmentation: random crop after zero-padding by this much (0: none)")
      .at_least(0);
  t.add("flip", o.flip, "augmentation: random horizontal flips (on or off)").one_of({"off", "on"}).recipe();
  t.take(trainer, "clip-norm");
  t.take(trainer, "seed").recipe();
  t.add("limit", o.limit, "train on the first N training images only (0: all)").at_least(0).recipe();
  t.add("classes", o.classes, "the number of classes (0: the config's, 10); every label, train and test, must be "
        "below it").at_least(0).recipe();
  add_run_rows(t, trainer);
  return t;
}

namespace {

// Shuffled, augmented batches of the training split; batch i of an epoch is the same on every
// rank and after a resume (DataLoader: the order and the augmentation follow from the seed).
class ImageData : public DataSource {
 public:
  ImageData(ViT& model, data::DataLoader loader, Device device, double label_smoothing)
      : model_(model), loader_(std::move(loader)), device_(device), smoothing_(label_smoothing) {}
  int64_t plan(int64_t epoch) override {
    epoch_ = epoch;
    return loader_.batches();
  }
  TrainBatch batch(int64_t i) override {
    data::Batch b = loader_.batch(epoch_, i);
    if (shard_world_ > 1) {
      if (shard_rank_ >= b.data.size(0)) return {0, {}};
      b = {b.data.slice(0, shard_rank_, b.data.size(0), shard_world_).contiguous(),
           b.target.slice(0, shard_rank_, b.target.size(0), shard_world_).contiguous()};
    }
    Tensor x = b.data.to(device_), y = b.target.to(device_);
    return {x.size(0), [this, x, y] { return model_.loss(x, y, smoothing_); }};
  }

 private:
  ViT& model_;
  data::DataLoader loader_;
  Device device_;
  double smoothing_;
  int64_t epoch_ = 1;
};

std::unique_ptr<optim::AdamW> vit_adamw(ViT& model, const AdamWCosine& recipe) {
  // Decay the matrices only: biases, LayerNorms, the [CLS] token and the positions keep theirs (timm's rule).
  std::vector<Tensor> decay, no_decay;
  for (auto& [name, p] : model.named_parameters())
    (p.dim() >= 2 && name != "cls_token" && name != "pos_embed" ? decay : no_decay).push_back(p);
  return recipe.adamw(decay, no_decay);
}

std::map<std::string, std::string> vit_metadata(const ViTConfig& c, const std::string& data_dir,
                                                const Normalization& norm) {
  return {{"task", "image"},
          {"pixel_mean", fmt::format("{}", norm.mean)},
          {"pixel_std", fmt::format("{}", norm.std)},
          {"image_size", std::to_string(c.image_size)},
          {"channels", std::to_string(c.channels)},
          {"patch_size", std::to_string(c.patch_size)},
          {"patch_stride", std::to_string(c.stride())},
          {"classes", std::to_string(c.classes)},
          {"layers", std::to_string(c.layers)},
          {"heads", std::to_string(c.heads)},
          {"d_model", std::to_string(c.d_model)},
          {"d_ff", std::to_string(c.d_ff)},
          {"activation", c.activation},
          {"data", data_dir}};
}

}  // namespace

ImageScores score_images(ViT& model, const Tensor& images, const Tensor& labels, int64_t batch) {
  NoGradGuard no_grad;
  const Device device = model.cls_token.device();
  const int64_t k = model.config.classes, n = images.size(0);
  ImageScores r;
  r.confusion.assign(static_cast<size_t>(k), std::vector<int64_t>(static_cast<size_t>(k), 0));
  double loss_sum = 0;
  int64_t correct = 0;
  for (int64_t s = 0; s < n; s += batch) {  // one forward per batch serves the loss and the predictions
    const int64_t e = std::min(n, s + batch);
    const Tensor truth_t = labels.slice(0, s, e).to(device);
    const Tensor logits = model.forward(images.slice(0, s, e).to(device));
    loss_sum += cross_entropy(logits, truth_t, 0.0, -100, Reduction::Sum).item<double>();
    std::vector<int64_t> pred = argmax(logits, 1).to_vector<int64_t>();
    std::vector<int64_t> truth = labels.slice(0, s, e).contiguous().to_vector<int64_t>();
    for (size_t i = 0; i < pred.size(); ++i) {
      correct += pred[i] == truth[i];
      if (truth[i] >= 0 && truth[i] < k) ++r.confusion[static_cast<size_t>(truth[i])][static_cast<size_t>(pred[i])];
    }
  }
  r.loss = n ? loss_sum / static_cast<double>(n) : 0.0;
  r.accuracy = n ? static_cast<double>(correct) / static_cast<double>(n) : 0.0;
  return r;
}

namespace {

// The images of an MNIST-layout folder: the training images split into train and val by a fixed
// seed (not --seed: the same val images for every run), standardised by the training split's
// mean and deviation, and the test images, read and checked here (before the first step, not
// after the last epoch). Sets the config's image size, classes and patches.
struct ImageSplits {
  std::string dir;
  data::TensorDataset train, val;
  data::ImageSet test;
  Normalization norm;  // recorded with the weights, so that whatever reads the model later feeds it the same
};

ImageSplits read_images(const ImageOptions& o, ViTConfig& cfg) {
  ImageSplits d;
  d.dir = o.data_dir.empty() ? default_image_dir() : o.data_dir;
  const std::string& dir = d.dir;
  data::ImageSet train_set = data::read_mnist(dir, true);
  const int64_t n_all = train_set.images.size(0);
  TP_CHECK(o.val_size < n_all, "train: --val-size {} leaves no training images of the {} in {}", o.val_size, n_all, dir);
  auto split = data::random_split(data::TensorDataset(train_set.images, train_set.labels),
                                  {n_all - o.val_size, o.val_size}, 20251124);
  d.train = split[0], d.val = split[1];
  if (o.limit > 0 && o.limit < d.train.size()) d.train = d.train.subset(arange(o.limit));
  d.norm = {d.train.data().mean().item<double>(), std::sqrt(var(d.train.data()).item<double>())};
  d.val = data::TensorDataset(d.norm.apply(d.val.data()), d.val.target());
  cfg.image_size = train_set.images.size(2);
  TP_CHECK(train_set.images.size(2) == train_set.images.size(3), "train: {} holds {}x{} images; the ViT takes square ones",
           dir, train_set.images.size(2), train_set.images.size(3));
  // The class count is the config's or the user's, never read off the labels: a stray 255 among
  // labels 0-3 made a 256-class model (issue 44).
  if (o.classes > 0) cfg.classes = o.classes;
  auto check_labels = [&](const data::ImageSet& set, const char* which) {
    const int64_t lo = set.labels.numel() ? set.labels.min().item<int64_t>() : 0;
    const int64_t hi = set.labels.numel() ? set.labels.max().item<int64_t>() : 0;
    TP_CHECK(lo >= 0 && hi < cfg.classes, "train: the {} labels in {} run from {} to {}, outside the {} classes; give "
             "--classes", which, dir, lo, hi, cfg.classes);
  };
  check_labels(train_set, "training");
  d.test = data::read_mnist(dir, false);
  check_labels(d.test, "test");
  TP_CHECK(d.test.images.size(2) == train_set.images.size(2) && d.test.images.size(3) == train_set.images.size(3),
           "train: {} holds {}x{} test images but {}x{} training images", dir, d.test.images.size(2),
           d.test.images.size(3), train_set.images.size(2), train_set.images.size(3));
  TP_CHECK(o.crop_padding < cfg.image_size, "train: --crop-padding {} is not below the image size {}: a crop could "
           "hold no pixel of the image", o.crop_padding, cfg.image_size);
  cfg.dropout = o.dropout;
  if (o.patch > 0) cfg.patch_size = o.patch, cfg.patch_stride = 0;  // a new size: non-overlapping unless told
  if (o.patch_stride > 0) cfg.patch_stride = o.patch_stride;
  cfg.validate();
  return d;
}

// Shuffled batches of the training split, augmented (a random crop of the zero-padded image, as
// torchvision's, and horizontal flips) and standardised.
data::DataLoader image_loader(const ImageOptions& o, const ImageSplits& d) {
  data::DataLoaderOptions lo;
  lo.batch_size = o.batch, lo.shuffle = true, lo.seed = o.trainer.seed;
  const int64_t pad = o.crop_padding;
  const bool flip = o.flip;
  const Normalization norm = d.norm;
  return data::DataLoader(d.train, lo, [pad, flip, norm](data::Batch b, Generator& gen) {
    if (pad > 0) b.data = data::random_crop(b.data, pad, gen);
    if (flip) b.data = data::random_horizontal_flip(b.data, gen);
    b.data = norm.apply(b.data);
    return b;
  });
}

// The run's figures; the final model's test accuracy and confusion matrix (written beside the
// weights) when the run finished.
ImageResult image_result(const FitResult& fit, ViT& model, const ImageOptions& o, const ImageSplits& d,
                         const std::string& out_dir, double seconds) {
  ImageResult r;
  r.steps = fit.steps, r.stopped = fit.stopped, r.interrupted = fit.interrupted;
  r.parameters = model.num_parameters();
  r.seconds = seconds;
  double images = 0, train_seconds = 0;
  for (const EpochRecord& e : fit.epochs) images += e.tokens_per_s * e.seconds, train_seconds += e.seconds;
  r.images_per_s = train_seconds > 0 ? images / train_seconds : 0;
  if (fit.stopped || fit.interrupted || fit.last_metrics.empty() || !dist::is_main()) return r;
  r.val_accuracy = metric(fit.last_metrics, "val_accuracy") / 100;
  model.eval();
  ImageScores t = score_images(model, d.norm.apply(d.test.images), d.test.labels, 500);
  r.test_accuracy = t.accuracy;
  r.confusion = std::move(t.confusion);
  const std::vector<std::string> names = class_names(d.dir, model.config.classes);
  const std::string table_text = confusion_table(r.confusion, names);
  if (!out_dir.empty()) {
    write_file_atomic(out_dir + "/confusion.txt", table_text);
    write_confusion_svg(out_dir + "/confusion.svg",
                        fmt::format("ViT {} on {}: test accuracy {:.2f}%", o.config, d.dir, 100 * r.test_accuracy),
                        r.confusion, names);
  }
  std::printf("test confusion matrix (%lld images):\n%s", (long long)d.test.images.size(0), table_text.c_str());
  std::printf("final: test accuracy %.2f%% (%lld images), val accuracy %.2f%%; %lld steps, %.0f train images/s, "
              "wall time %s%s\n",
              100 * r.test_accuracy, (long long)d.test.images.size(0), 100 * r.val_accuracy, (long long)r.steps,
              r.images_per_s, clock_text(r.seconds).c_str(),
              out_dir.empty() ? "" : fmt::format("; {}/confusion.svg", out_dir).c_str());
  std::fflush(stdout);
  return r;
}

}  // namespace

ImageResult train_image_classifier(const ImageOptions& options) {
  ImageOptions o = options;
  RunSetup run(options_table(o), o.trainer);
  ViTConfig cfg = ViTConfig::named(o.config);  // checks the name before the data are read
  const ImageSplits d = read_images(o, cfg);
  run.open({"confusion.txt", "confusion.svg"});

  // Model, optimizer, schedule, batches.
  ViT model(cfg);
  const Device device = training_device(o.trainer.device);
  model.to(device);
  const std::unique_ptr<optim::AdamW> adamw = vit_adamw(model, o.adamw);
  ImageData batches(model, image_loader(o, d), device, o.label_smoothing);
  const int64_t steps_per_epoch = batches.plan(1), total_steps = steps_per_epoch * o.trainer.epochs;
  const optim::CosineSchedule schedule = o.adamw.schedule(total_steps);
  std::printf("train: ViT %s (patch %lld every %lld, %lld tokens, %lld layers, %lld heads, d_model %lld, %lld parameters) on %s: %lld train, "
              "%lld val images; batch %lld, %lld epochs of %lld steps, AdamW lr %.2e -> %.2e (cosine, warmup %lld), "
              "weight decay %.2f, augmentation: crop padding %lld, flip %s\n",
              o.config.c_str(), (long long)cfg.patch_size, (long long)cfg.stride(), (long long)cfg.patches() + 1,
              (long long)cfg.layers, (long long)cfg.heads, (long long)cfg.d_model, (long long)model.num_parameters(),
              d.dir.c_str(), (long long)d.train.size(), (long long)d.val.size(), (long long)o.batch,
              (long long)o.trainer.epochs, (long long)steps_per_epoch, o.adamw.lr, o.adamw.min_lr,
              (long long)o.adamw.warmup_steps(total_steps), o.adamw.weight_decay, (long long)o.crop_padding,
              o.flip ? "on" : "off");
  std::fflush(stdout);

  TrainerOptions& to = run.record({{"task", "image"}, {"data", d.dir}}, vit_metadata(cfg, d.dir, d.norm),
                                  fmt::format("ViT {} on {}", o.config, d.dir));
  to.rate_unit = "img";
  const auto start = std::chrono::steady_clock::now();
  Trainer trainer(model, *adamw, &schedule, to);
  trainer.evaluate = [&](int64_t, int64_t) {
    const ImageScores v = score_images(model, d.val.data(), d.val.target(), 500);
    return Metrics{{"val_loss", "val loss", v.loss, 4, "", false},
                   {"val_accuracy", "val accuracy", 100 * v.accuracy, 2, "%", true}};
  };
  const FitResult fit = trainer.fit(batches);
  return image_result(fit, model, o, d, to.out_dir, seconds_since(start));
}

ImageClassifier load_image_classifier(const std::string& dir) {
  const SavedModel saved = read_saved_model(dir, {"image"}, "an image classifier", "tapestry train --task image");
  const std::string& path = saved.path;
  auto meta = [&](const char* key) { return saved.meta(key); };
  auto num = [&](const char* key) { return saved.num(key); };
  ViTConfig c;
  c.image_size = num("image_size"), c.channels = num("channels"), c.patch_size = num("patch_size");
  c.patch_stride = num("patch_stride");
  c.classes = num("classes"), c.layers = num("layers"), c.heads = num("heads"), c.d_model = num("d_model");
  c.d_ff = num("d_ff"), c.activation = meta("activation"), c.dropout = 0;
  ImageClassifier r;
  r.model = std::make_shared<ViT>(c);
  r.model->load_state_dict(saved.file.as_map());
  r.model->eval();
  r.data_dir = meta("data");
  try {
    r.norm = {std::stod(meta("pixel_mean")), std::stod(meta("pixel_std"))};
  } catch (const std::logic_error&) {
    TP_CHECK(false, "{}: metadata pixel_mean/pixel_std are not numbers", path);
  }
  r.names = class_names(r.data_dir, c.classes);
  return r;
}

Task image_task() {
  TaskSpec<ImageOptions> t;
  t.name = "image", t.summary = "a Vision Transformer on MNIST-layout images";
  t.table = [](ImageOptions& o) { return options_table(o); };
  t.run = [](const ImageOptions& o) { return exit_status(train_image_classifier(o).interrupted); };
  return make_task(std::move(t));
}

}  // namespace tapestry::apps
