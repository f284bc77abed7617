#include "server/row_store.h"

#include <algorithm>
#include <cstring>

namespace bagpipe {

RowStore::RowStore(RowInitializer initializer)
    : initializer_(std::move(initializer)), record_floats_(initializer_.record_floats()) {
  const int64_t record_bytes = std::max<int64_t>(1, record_floats_) * sizeof(float);
  chunk_shift_ = 16;
  while (chunk_shift_ > 0 && (int64_t{1} << chunk_shift_) * record_bytes > kChunkBytes) {
    --chunk_shift_;
  }
  chunk_mask_ = (uint32_t{1} << chunk_shift_) - 1;
}

void RowStore::Grow(uint32_t index) {
  if ((index >> chunk_shift_) >= chunks_.size()) {
    chunks_.push_back(std::make_unique<float[]>(static_cast<size_t>(chunk_mask_ + 1) *
                                                static_cast<size_t>(record_floats_)));
  }
}

bool RowStore::Insert(RowId row, const float* record) {
  auto [it, inserted] = index_.try_emplace(row, static_cast<uint32_t>(index_.size()));
  if (!inserted) return false;
  const uint32_t index = it->second;
  Grow(index);
  stamps_.push_back(-1);
  std::memcpy(RecordAt(index), record, record_floats_ * sizeof(float));
  return true;
}

void RowStore::ForEach(const std::function<void(RowId, const float*)>& fn) const {
  for (const auto& [row, index] : index_) {
    fn(row, RecordAt(index));
  }
}

float* RowStore::GetOrCreate(RowId row) {
  auto [it, inserted] = index_.try_emplace(row, static_cast<uint32_t>(index_.size()));
  const uint32_t index = it->second;
  if (inserted) {
    Grow(index);
    stamps_.push_back(-1);
  }
  float* record = RecordAt(index);
  if (inserted) initializer_.Init(row, record);
  return record;
}

const float* RowStore::Find(RowId row) const {
  auto it = index_.find(row);
  if (it == index_.end()) return nullptr;
  return RecordAt(it->second);
}

Iteration RowStore::stamp(RowId row) const {
  auto it = index_.find(row);
  return it == index_.end() ? -1 : stamps_[it->second];
}

void RowStore::set_stamp(RowId row, Iteration stamp) {
  GetOrCreate(row);
  stamps_[index_.at(row)] = stamp;
}

void RowStore::ForEachSorted(const std::function<void(RowId, const float*)>& fn) const {
  std::vector<std::pair<RowId, uint32_t>> sorted(index_.begin(), index_.end());
  std::sort(sorted.begin(), sorted.end());
  for (const auto& [row, index] : sorted) {
    fn(row, RecordAt(index));
  }
}

int64_t RowStore::bytes() const {
  const int64_t slab =
      static_cast<int64_t>(chunks_.size()) * (int64_t{chunk_mask_} + 1) * record_floats_ * 4;
  const int64_t map =
      static_cast<int64_t>(index_.capacity()) * (sizeof(std::pair<RowId, uint32_t>) + 1);
  return slab + map + static_cast<int64_t>(stamps_.capacity() * sizeof(Iteration));
}

double RowStore::bytes_per_row() const {
  return size() == 0 ? 0.0 : static_cast<double>(bytes()) / static_cast<double>(size());
}

}  // namespace bagpipe
