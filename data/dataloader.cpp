// TensorDataset, random_split and DataLoader (see dataloader.h).
#include "tapestry/data/dataloader.h"

#include <numeric>

#include "tapestry/autograd/functions.h"
#include "tapestry/ops/factory.h"

namespace tapestry::data {

namespace {
// A seed for stream (kind, epoch, batch) of a loader: splitmix64 over the parts, so that the
// order of an epoch and the augmentations of its batches never share a generator.
uint64_t mix(uint64_t seed, uint64_t kind, uint64_t epoch, uint64_t batch) {
  uint64_t h = seed;
  for (uint64_t part : {kind, epoch, batch}) {
    h += 0x9e3779b97f4a7c15ull + part;
    h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
    h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
    h ^= h >> 31;
  }
  return h;
}
}  // namespace

TensorDataset::TensorDataset(Tensor data, Tensor target) : data_(std::move(data)), target_(std::move(target)) {
  TP_CHECK(data_.defined() && target_.defined(), "TensorDataset: data and target must be defined");
  TP_CHECK(data_.dim() >= 1 && target_.dim() >= 1, "TensorDataset: data {} and target {} need a leading dim",
           data_.sizes(), target_.sizes());
  TP_CHECK(data_.size(0) == target_.size(0), "TensorDataset: data has {} rows (shape {}) but target has {} (shape {})",
           data_.size(0), data_.sizes(), target_.size(0), target_.sizes());
}

Batch TensorDataset::get(int64_t i) const {
  TP_CHECK(i >= 0 && i < size(), "TensorDataset: example {} is out of range for {} examples", i, size());
  return {data_.select(0, i), target_.select(0, i)};
}

Batch TensorDataset::get(const Tensor& indices) const {
  NoGradGuard no_grad;  // examples are data, not part of a graph
  return {index_select(data_, 0, indices), index_select(target_, 0, indices)};
}

TensorDataset TensorDataset::subset(const Tensor& indices) const {
  Batch rows = get(indices);
  return {rows.data, rows.target};
}

std::vector<TensorDataset> random_split(const TensorDataset& dataset, const std::vector<int64_t>& lengths,
                                        uint64_t seed) {
  int64_t total = 0;
  for (int64_t n : lengths) {
    TP_CHECK(n >= 0, "random_split: negative length {}", n);
    total += n;
  }
  TP_CHECK(total == dataset.size(), "random_split: lengths sum to {} but the dataset has {} examples", total,
           dataset.size());
  Generator gen(seed);
  Tensor order = randperm(dataset.size(), DType::Int64, &gen);
  std::vector<TensorDataset> parts;
  int64_t start = 0;
  for (int64_t n : lengths) {
    parts.push_back(dataset.subset(order.slice(0, start, start + n)));
    start += n;
  }
  return parts;
}

DataLoader::DataLoader(TensorDataset dataset, DataLoaderOptions options, Transform transform)
    : dataset_(std::move(dataset)), o_(options), transform_(std::move(transform)) {
  TP_CHECK(o_.batch_size > 0, "DataLoader: batch_size must be positive, got {}", o_.batch_size);
}

int64_t DataLoader::batches() const {
  const int64_t n = dataset_.size();
  return o_.drop_last ? n / o_.batch_size : (n + o_.batch_size - 1) / o_.batch_size;
}

const Tensor& DataLoader::order(int64_t epoch) const {
  if (order_epoch_ != epoch) {
    if (o_.shuffle) {
      // One generator per (seed, epoch): any epoch's order is made without the ones before it.
      Generator gen(mix(o_.seed, 1, static_cast<uint64_t>(epoch), 0));
      order_ = randperm(dataset_.size(), DType::Int64, &gen);
    } else {
      order_ = arange(0, static_cast<double>(dataset_.size()), 1, DType::Int64);
    }
    order_epoch_ = epoch;
  }
  return order_;
}

Batch DataLoader::batch(int64_t epoch, int64_t i) const {
  TP_CHECK(epoch >= 0, "DataLoader: epoch {} must be non-negative", epoch);
  TP_CHECK(i >= 0 && i < batches(), "DataLoader: batch {} is out of range for {} batches per epoch", i, batches());
  const int64_t start = i * o_.batch_size, end = std::min(start + o_.batch_size, dataset_.size());
  Batch b = dataset_.get(order(epoch).slice(0, start, end));
  if (!transform_) return b;
  Generator gen(mix(o_.seed, 2, static_cast<uint64_t>(epoch), static_cast<uint64_t>(i)));
  return transform_(std::move(b), gen);
}

}  // namespace tapestry::data
