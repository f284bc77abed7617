// Internal building blocks of the planner: per-table row containers (row within a table ->
// record), a slab of records addressed by stable handles, and a batch deduplicator.
//
// The planner keeps one container per (trainer, table) and one per table for global state, so
// that TBB tasks working on different tables never share one. None of these classes
// synchronises.
#ifndef BAGPIPE_ORACLE_ROW_STORE_H_
#define BAGPIPE_ORACLE_ROW_STORE_H_

#include <bit>
#include <cstdint>
#include <limits>
#include <vector>

#include "oracle/huge_pages.h"

namespace bagpipe {
namespace oracle_internal {

inline constexpr uint32_t kNoHandle = std::numeric_limits<uint32_t>::max();

// Fibonacci hashing of a row id onto 2^(64 - shift) buckets.
inline size_t HomeBucket(int64_t id, int shift) {
  return static_cast<size_t>((static_cast<uint64_t>(id) * 0x9e3779b97f4a7c15ULL) >> shift);
}

// Row id within one table -> Record, stored in place. Tables with at most `dense_max_rows`
// rows use a direct array (no hashing); larger tables an open-addressing hash table with the
// records inline (linear probing, load <= 1/2, backward-shift deletion: the insert/erase churn
// of a sliding window leaves no tombstones, probe sequences stay short), whose size follows the
// number of stored rows. Both store (8-byte key, Record) entries; with a 24-byte Record an entry
// is 32 bytes and never straddles a cache line, so a lookup usually touches one line.
//
// Record must provide `static Record Absent()` (the state of a row never stored) and
// `bool present() const` (false exactly for Absent-like records); in the dense form a row is
// stored iff its record is present. Record pointers stay valid until the next Erase, or the
// next insertion that exceeds the last Reserve.
template <typename Record>
class RowTable {
  struct Entry;

 public:
  void Init(int64_t table_rows, int64_t dense_max_rows) {
    dense_ = table_rows <= dense_max_rows;
    size_ = 0;
    if (dense_) {
      dense_records_.assign(static_cast<size_t>(table_rows), Entry{});
    } else {
      Rehash(kMinBuckets);
    }
  }

  // The record of `id`, or nullptr if it is not stored.
  Record* Find(int64_t id) {
    if (dense_) {
      Record& r = dense_records_[id].record;
      return r.present() ? &r : nullptr;
    }
    for (size_t b = HomeBucket(id, shift_);; b = (b + 1) & mask_) {
      Entry& e = buckets_[b];
      if (e.key == id) return &e.record;
      if (e.key == kEmptyKey) return nullptr;
    }
  }

  // The record of `id`; an absent row gets Record::Absent() (the caller makes it present).
  // `*inserted` tells whether it was absent.
  Record& FindOrInsert(int64_t id, bool* inserted) {
    if (dense_) {
      Record& r = dense_records_[id].record;
      *inserted = !r.present();
      return r;
    }
    if (2 * (size_ + 1) > buckets_.size()) Rehash(2 * buckets_.size());
    for (size_t b = HomeBucket(id, shift_);; b = (b + 1) & mask_) {
      Entry& e = buckets_[b];
      if (e.key == id) {
        *inserted = false;
        return e.record;
      }
      if (e.key == kEmptyKey) {
        ++size_;
        e.key = id;
        e.record = Record::Absent();
        *inserted = true;
        return e.record;
      }
    }
  }

  // Dense form: counts a record the caller made present (FindOrInsert cannot know when).
  void CountInsert() {
    if (dense_) ++size_;
  }

  // Dense form only: the record of any id, present or not (the caller counts the records it
  // makes present with CountInserts), through a copy of the array's address, which a hot loop
  // keeps in a register (stores through the records cannot change it). Lets the loop leave out
  // FindOrInsert's form test.
  class DenseRecords {
   public:
    Record& operator[](int64_t id) const { return entries_[id].record; }

   private:
    friend class RowTable;
    explicit DenseRecords(Entry* entries) : entries_(entries) {}
    Entry* entries_;
  };
  DenseRecords dense_records() { return DenseRecords(dense_records_.data()); }

  // Hashed form only: lookups and insertions that keep the table's address and shape in
  // registers, for a hot loop that has made room first. Valid until the next Reserve, Erase or
  // insertion through the RowTable itself.
  class HashedRecords {
   public:
    // The bucket where the probe for `id` starts.
    size_t Home(int64_t id) const { return HomeBucket(id, shift_); }
    // Hints that the probe starting at bucket `home` will run soon.
    void Prefetch(size_t home) const { __builtin_prefetch(buckets_ + home); }
    // The record of `id`, whose probe starts at `home` (= Home(id)); an absent row is stored
    // with Record::Absent() contents (the caller fills it in) and counted in *inserts (the
    // caller passes the count to CountInserts). A loop that prefetches ahead computes each
    // home once, keeping the hash off the lookup's path.
    // REQUIRES: Reserve() made room for this insertion.
    Record& FindOrInsert(int64_t id, size_t home, int64_t* inserts) const {
      for (size_t b = home;; b = (b + 1) & mask_) {
        Entry& e = buckets_[b];
        if (e.key == id) return e.record;
        if (e.key == kEmptyKey) {
          ++*inserts;
          e.key = id;
          e.record = Record::Absent();
          return e.record;
        }
      }
    }

   private:
    friend class RowTable;
    HashedRecords(Entry* buckets, size_t mask, int shift)
        : buckets_(buckets), mask_(mask), shift_(shift) {}
    Entry* buckets_;
    size_t mask_;
    int shift_;
  };
  HashedRecords hashed_records() { return HashedRecords(buckets_.data(), mask_, shift_); }

  // Counts the records made present through DenseRecords or HashedRecords.
  void CountInserts(int64_t count) { size_ += static_cast<size_t>(count); }

  // Forgets `id` (absent: no-op).
  void Erase(int64_t id) {
    if (dense_) {
      Record& r = dense_records_[id].record;
      if (r.present()) --size_;
      r = Record::Absent();
      return;
    }
    size_t hole = HomeBucket(id, shift_);
    while (buckets_[hole].key != id) {
      if (buckets_[hole].key == kEmptyKey) return;
      hole = (hole + 1) & mask_;
    }
    --size_;
    // Backward shift: move later entries of the cluster into the hole when their home allows.
    for (size_t b = (hole + 1) & mask_;; b = (b + 1) & mask_) {
      Entry& e = buckets_[b];
      if (e.key == kEmptyKey) break;
      const size_t home = HomeBucket(e.key, shift_);
      // e may move to `hole` iff hole lies cyclically in [home, b).
      const bool movable = hole <= b ? (home <= hole || home > b) : (home <= hole && home > b);
      if (movable) {
        buckets_[hole] = e;
        hole = b;
      }
    }
    buckets_[hole].key = kEmptyKey;
  }

  // Grows now so that `inserts` more rows fit without moving any record.
  void Reserve(size_t inserts) {
    if (dense_) return;
    size_t buckets = buckets_.size();
    while (2 * (size_ + inserts) > buckets) buckets *= 2;
    if (buckets != buckets_.size()) Rehash(buckets);
  }

  // Hints that `id` will be looked up soon.
  void Prefetch(int64_t id) const {
    if (dense_) {
      __builtin_prefetch(dense_records_.data() + id);
    } else {
      __builtin_prefetch(buckets_.data() + HomeBucket(id, shift_));
    }
  }

  int64_t size() const { return static_cast<int64_t>(size_); }
  bool dense() const { return dense_; }

 private:
  static constexpr int64_t kEmptyKey = -1;
  static constexpr size_t kMinBuckets = 1024;
  struct Entry {
    int64_t key = kEmptyKey;
    Record record = Record::Absent();
  };

  void Rehash(size_t buckets) {
    HugeVector<Entry> old(buckets, Entry{});
    old.swap(buckets_);
    mask_ = buckets - 1;
    shift_ = 64 - std::countr_zero(buckets);
    size_ = 0;
    for (const Entry& e : old) {
      if (e.key == kEmptyKey) continue;
      bool inserted;
      FindOrInsert(e.key, &inserted) = e.record;
    }
  }

  bool dense_ = true;
  HugeVector<Entry> dense_records_;  // indexed by row id; the key is unused
  HugeVector<Entry> buckets_;
  size_t mask_ = 0;
  int shift_ = 64;
  size_t size_ = 0;
};

// Row id within one table -> 32-bit handle (into a Slab), with RowTable's two forms.
class RowIndex {
 public:
  void Init(int64_t table_rows, int64_t dense_max_rows) { table_.Init(table_rows, dense_max_rows); }
  uint32_t Find(int64_t id) {
    const Handle* h = table_.Find(id);
    return h == nullptr ? kNoHandle : h->value;
  }
  // The handle of `id`, kNoHandle when it was absent (the caller stores one).
  uint32_t& FindOrInsert(int64_t id) {
    bool inserted;
    Handle& h = table_.FindOrInsert(id, &inserted);
    if (inserted) table_.CountInsert();
    return h.value;
  }
  void Erase(int64_t id) { table_.Erase(id); }
  void Prefetch(int64_t id) const { table_.Prefetch(id); }
  bool dense() const { return table_.dense(); }

 private:
  // A dense slot holding kNoHandle counts as absent; FindOrInsert's caller stores a handle.
  struct Handle {
    uint32_t value;
    static Handle Absent() { return Handle{kNoHandle}; }
    bool present() const { return value != kNoHandle; }
  };
  RowTable<Handle> table_;
};

// Records addressed by stable 32-bit handles; freed handles are reused (last freed first). A
// freed record is reset to T{}, so callers can recognise free records by a sentinel member.
template <typename T>
class Slab {
 public:
  uint32_t Allocate() {
    ++live_;
    if (!free_.empty()) {
      const uint32_t handle = free_.back();
      free_.pop_back();
      items_[handle] = T{};
      return handle;
    }
    items_.emplace_back();
    return static_cast<uint32_t>(items_.size() - 1);
  }
  void Free(uint32_t handle) {
    --live_;
    items_[handle] = T{};
    free_.push_back(handle);
  }
  T& operator[](uint32_t handle) { return items_[handle]; }
  const T& operator[](uint32_t handle) const { return items_[handle]; }
  int64_t live() const { return live_; }
  // Handles ever allocated: every handle is below this.
  size_t capacity() const { return items_.size(); }

 private:
  HugeVector<T> items_;
  std::vector<uint32_t> free_;
  int64_t live_ = 0;
};

// Assigns positions 0, 1, 2, ... to the distinct keys of one short sequence (a batch segment):
// open addressing with linear probing and generation tags, so Reset() is O(1) amortised and the
// table is reused across batches.
class BatchDedup {
 public:
  // Prepares for up to `max_keys` distinct keys; forgets the previous keys.
  void Reset(size_t max_keys) {
    size_t want = 16;
    while (want < 2 * max_keys) want *= 2;
    if (want > slots_.size()) {
      slots_.assign(want, Slot{0, 0, 0});
      tag_ = 0;
    }
    mask_ = slots_.size() - 1;
    shift_ = 64 - std::countr_zero(slots_.size());
    if (++tag_ == 0) {  // wrapped: clear the tags once every 2^32 resets
      for (Slot& s : slots_) s.tag = 0;
      tag_ = 1;
    }
    size_ = 0;
  }

  // The position of `key`; a new key gets position size() and *inserted is set.
  int32_t Insert(int64_t key, bool* inserted) {
    for (size_t h = HomeBucket(key, shift_);; h = (h + 1) & mask_) {
      Slot& s = slots_[h];
      if (s.tag != tag_) {
        s = Slot{key, tag_, size_};
        *inserted = true;
        return size_++;
      }
      if (s.key == key) {
        *inserted = false;
        return s.value;
      }
    }
  }

  // The position of `key`, or -1 if it was not inserted since the last Reset.
  int32_t Find(int64_t key) const {
    for (size_t h = HomeBucket(key, shift_);; h = (h + 1) & mask_) {
      const Slot& s = slots_[h];
      if (s.tag != tag_) return -1;
      if (s.key == key) return s.value;
    }
  }

  int32_t size() const { return size_; }

  // Starts loading the home bucket of `key` (a hint for a later Insert or Find).
  void Prefetch(int64_t key) const { __builtin_prefetch(&slots_[HomeBucket(key, shift_)]); }

 private:
  struct Slot {
    int64_t key;
    uint32_t tag;
    int32_t value;
  };

  std::vector<Slot> slots_;
  size_t mask_ = 0;
  int shift_ = 64;
  uint32_t tag_ = 0;
  int32_t size_ = 0;
};

}  // namespace oracle_internal
}  // namespace bagpipe

#endif  // BAGPIPE_ORACLE_ROW_STORE_H_
