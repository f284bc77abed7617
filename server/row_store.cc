#include "server/row_store.h"

#include <algorithm>
#include <cstring>

namespace bagpipe {

RowStore::RowStore(RowInitializer initializer)
    : initializer_(std::move(initializer)), record_floats_(initializer_.record_floats()) {}

bool RowStore::Insert(RowId row, const float* record) {
  auto [it, inserted] = index_.try_emplace(row, static_cast<uint32_t>(index_.size()));
  if (!inserted) return false;
  const uint32_t index = it->second;
  const int64_t chunk = index / kChunkRows;
  if (chunk >= static_cast<int64_t>(chunks_.size())) {
    chunks_.push_back(std::make_unique<float[]>(kChunkRows * record_floats_));
  }
  stamps_.push_back(-1);
  std::memcpy(chunks_[chunk].get() + (index % kChunkRows) * record_floats_, record,
              record_floats_ * sizeof(float));
  return true;
}

void RowStore::ForEach(const std::function<void(RowId, const float*)>& fn) const {
  for (const auto& [row, index] : index_) {
    fn(row, chunks_[index / kChunkRows].get() + (index % kChunkRows) * record_floats_);
  }
}

float* RowStore::GetOrCreate(RowId row) {
  auto [it, inserted] = index_.try_emplace(row, static_cast<uint32_t>(index_.size()));
  const uint32_t index = it->second;
  const int64_t chunk = index / kChunkRows;
  if (inserted) {
    if (chunk >= static_cast<int64_t>(chunks_.size())) {
      chunks_.push_back(std::make_unique<float[]>(kChunkRows * record_floats_));
    }
    stamps_.push_back(-1);
  }
  float* record = chunks_[chunk].get() + (index % kChunkRows) * record_floats_;
  if (inserted) initializer_.Init(row, record);
  return record;
}

const float* RowStore::Find(RowId row) const {
  auto it = index_.find(row);
  if (it == index_.end()) return nullptr;
  return chunks_[it->second / kChunkRows].get() + (it->second % kChunkRows) * record_floats_;
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
    fn(row, chunks_[index / kChunkRows].get() + (index % kChunkRows) * record_floats_);
  }
}

int64_t RowStore::bytes() const {
  const int64_t slab = static_cast<int64_t>(chunks_.size()) * kChunkRows * record_floats_ * 4;
  const int64_t map =
      static_cast<int64_t>(index_.capacity()) * (sizeof(std::pair<RowId, uint32_t>) + 1);
  return slab + map + static_cast<int64_t>(stamps_.capacity() * sizeof(Iteration));
}

double RowStore::bytes_per_row() const {
  return size() == 0 ? 0.0 : static_cast<double>(bytes()) / static_cast<double>(size());
}

}  // namespace bagpipe
