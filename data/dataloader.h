// Datasets and batches, in the spirit of libtorch's torch::data: a TensorDataset (examples are
// the rows of a data tensor and a target tensor), random_split, and a DataLoader giving
// shuffled batches whose order follows from a seed and the epoch alone (so a resumed run sees
// the same batches), with an optional transform per batch (augmentation).
//
//   data::TensorDataset train(images, labels);
//   data::DataLoader loader(train, {.batch_size = 128, .shuffle = true, .seed = 1});
//   for (int64_t epoch = 1; epoch <= 10; ++epoch)
//     for (const data::Batch& b : loader.epoch(epoch)) ...  // b.data [128, ...], b.target [128]
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "tapestry/ops/factory.h"
#include "tapestry/ops/tensor.h"

namespace tapestry::data {

struct Batch {
  Tensor data, target;
};

class TensorDataset {
 public:
  TensorDataset() = default;
  // data [N, ...] and target [N, ...]: example i is row i of each. Throws when N differs.
  TensorDataset(Tensor data, Tensor target);
  int64_t size() const { return data_.defined() ? data_.size(0) : 0; }
  Batch get(int64_t i) const;                // one example (rows, without the leading dim)
  Batch get(const Tensor& indices) const;    // the examples at int64 `indices`, stacked (contiguous)
  TensorDataset subset(const Tensor& indices) const;  // a dataset of those rows (copied)
  const Tensor& data() const { return data_; }
  const Tensor& target() const { return target_; }

 private:
  Tensor data_, target_;
};

// Disjoint random subsets of the given sizes, which must sum to the dataset's size (as
// torch.utils.data.random_split with a seeded generator).
std::vector<TensorDataset> random_split(const TensorDataset& dataset, const std::vector<int64_t>& lengths,
                                        uint64_t seed);

// Defaults as torch.utils.data.DataLoader's: batches of 1, in the dataset's order.
struct DataLoaderOptions {
  int64_t batch_size = 1;
  bool shuffle = false;    // true: a fresh order each epoch, from (seed, epoch)
  bool drop_last = false;  // drop a last batch smaller than batch_size
  uint64_t seed = 0;
};

class DataLoader {
 public:
  // A transform receives each batch and the generator of that (epoch, batch): augmentations
  // drawn from it repeat exactly when the batch is made again.
  using Transform = std::function<Batch(Batch, Generator&)>;
  DataLoader(TensorDataset dataset, DataLoaderOptions options, Transform transform = nullptr);

  int64_t batches() const;  // per epoch
  int64_t size() const { return dataset_.size(); }
  // Batch i (0-based) of epoch `epoch` (1-based): the same for the same (seed, epoch, i).
  Batch batch(int64_t epoch, int64_t i) const;

  // Range-for over one epoch's batches.
  class Iterator {
   public:
    Iterator(const DataLoader* loader, int64_t epoch, int64_t i) : loader_(loader), epoch_(epoch), i_(i) {}
    Batch operator*() const { return loader_->batch(epoch_, i_); }
    Iterator& operator++() {
      ++i_;
      return *this;
    }
    bool operator!=(const Iterator& other) const { return i_ != other.i_; }

   private:
    const DataLoader* loader_;
    int64_t epoch_, i_;
  };
  struct Epoch {
    const DataLoader* loader;
    int64_t epoch;
    Iterator begin() const { return {loader, epoch, 0}; }
    Iterator end() const { return {loader, epoch, loader->batches()}; }
  };
  Epoch epoch(int64_t epoch) const { return {this, epoch}; }

 private:
  const Tensor& order(int64_t epoch) const;  // the permutation of the epoch (cached)

  TensorDataset dataset_;
  DataLoaderOptions o_;
  Transform transform_;
  mutable int64_t order_epoch_ = -1;
  mutable Tensor order_;
};

}  // namespace tapestry::data
