// Specification of the batch layout's index arithmetic.
#include "data/batch.h"

#include <limits>

#include "gtest/gtest.h"

namespace bagpipe {
namespace {

TEST(BatchTest, BagIndexIsComputedIn64Bits) {
  // 26 tables of 100M samples: table * num_samples leaves the int range.
  EXPECT_EQ(Batch::BagIndex(25, 7, 100'000'000), int64_t{2'500'000'007});
  EXPECT_EQ(Batch::BagIndex(30, 0, std::numeric_limits<int32_t>::max()),
            int64_t{30} * std::numeric_limits<int32_t>::max());
  // The accessors use it.
  Batch batch;
  batch.Reset(0, 2);
  batch.num_samples = 2;
  batch.offsets = {0, 1, 3, 4, 6};
  batch.ids = {0, 1, 2, 3, 4, 5};
  EXPECT_EQ(batch.bag_begin(1, 0), 3);
  EXPECT_EQ(batch.bag_end(1, 1), 6);
  EXPECT_EQ(batch.table_begin(1), 3);
}

}  // namespace
}  // namespace bagpipe
