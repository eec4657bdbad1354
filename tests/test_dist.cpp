// The dist module on one process (what every build runs, MPI or not: the Trainer's path when
// nobody started mpirun) and the sharding rule. tests/dist.sh runs 2 real ranks.
#include "apps/train/trainer.h"
#include "tapestry/dist/dist.h"
#include <cstdlib>

#include "tests/helpers.h"

using namespace tapestry;
using namespace tapestry::testing;

TEST_CASE("dist on one process: rank 0 of 1, and every collective is the identity") {
  CHECK(dist::rank() == 0);
  CHECK(dist::world_size() == 1);
  CHECK(dist::is_main());
  Tensor t = tensor({1.5f, -2.0f, 3.0f});
  dist::allreduce_(t);
  check_values(t, {1.5, -2.0, 3.0});
  dist::allreduce_(t, dist::ReduceOp::Max);
  check_values(t, {1.5, -2.0, 3.0});
  CHECK(dist::allreduce(2.5) == 2.5);
  CHECK(dist::allreduce(int64_t(7)) == 7);
  dist::broadcast_(t);
  check_values(t, {1.5, -2.0, 3.0});
  std::string s = "same";
  dist::broadcast_(s);
  CHECK(s == "same");
  dist::barrier();
  Tensor empty_t = zeros({0});
  dist::allreduce_(empty_t);
  // What it cannot send is refused by name, on one process as on many.
  Tensor strided = zeros({4, 4}).transpose(0, 1);
  CHECK(error_of([&] { dist::allreduce_(strided); }).find("must be contiguous") != std::string::npos);
  CHECK(error_of([&] { dist::broadcast_(t, 3); }).find("root 3 is not a rank of 1") != std::string::npos);
}

TEST_CASE("dist::GradReducer: buckets in reverse parameter order, sizes capped - one rank scales in place") {
  Tensor a = zeros({1000}).requires_grad_(), b = zeros({10, 10}).requires_grad_(), c = zeros({300}).requires_grad_();
  // 4-byte floats: first bucket <= 1600 bytes (c's 1200 fits, b's 400 fits), the rest <= 4000 (a's).
  dist::GradReducer r({a, b, c}, 4000, 1600);
  CHECK(r.buckets() == 2);
  CHECK(r.bytes() == 4 * 1400);
  dist::GradReducer one_bucket({a, b, c});
  CHECK(one_bucket.buckets() == 1);
  (a.sum() * 2.0 + b.sum() * 3.0).backward();  // c has no gradient
  r.reduce(0.5);
  check_values(a.grad().slice(0, 0, 2), {1.0, 1.0});
  check_values(b.grad().reshape({-1}).slice(0, 0, 2), {1.5, 1.5});
  CHECK_FALSE(c.grad().defined());  // on one rank nothing is created
  // One rank never overlaps (there is nothing to send): prepare() is a no-op and no hook is set.
  dist::GradReducer overlapped({a, b, c}, 4000, 1600, true);
  CHECK_FALSE(overlapped.overlap());
  overlapped.prepare();
  a.sum().backward();
  CHECK(overlapped.started_early() == 0);
}

TEST_CASE("dist::GradReducer: TAPESTRY_ALLREDUCE_OVERLAP is 0 or 1") {
  ::unsetenv("TAPESTRY_ALLREDUCE_OVERLAP");
  CHECK(dist::GradReducer::overlap_from_environment());
  ::setenv("TAPESTRY_ALLREDUCE_OVERLAP", "0", 1);
  CHECK_FALSE(dist::GradReducer::overlap_from_environment());
  ::setenv("TAPESTRY_ALLREDUCE_OVERLAP", "yes", 1);
  CHECK(error_of([] { dist::GradReducer::overlap_from_environment(); }).find("must be 0 or 1, got 'yes'") !=
        std::string::npos);
  ::unsetenv("TAPESTRY_ALLREDUCE_OVERLAP");
}

TEST_CASE("apps::shard_of: strided shards, disjoint and together complete") {
  std::vector<int> items(11);
  for (int i = 0; i < 11; ++i) items[static_cast<size_t>(i)] = 100 + i;
  CHECK(apps::shard_of(items, 0, 1) == items);
  CHECK(apps::shard_of(items, 1, 3) == std::vector<int>{101, 104, 107, 110});
  for (int world : {1, 2, 3, 4, 11, 12}) {
    std::vector<int> seen;
    for (int r = 0; r < world; ++r) {
      auto part = apps::shard_of(items, r, world);
      CHECK(part.size() >= items.size() / static_cast<size_t>(world));
      seen.insert(seen.end(), part.begin(), part.end());
    }
    std::sort(seen.begin(), seen.end());
    CHECK(seen == items);  // every item once: disjoint, and nothing left out
  }
  CHECK(apps::shard_of(std::vector<int>{5}, 1, 2).empty());  // a rank may get an empty shard
}
