// A digest of plans: XXH3 over every field of every TrainerPlan, in the order they are added.
//
// For checking that a change to the planner leaves its plans byte-identical (the plan-replay
// tool prints it; tests/oracle/plan_digest_test.cc pins the digests of a fixed trace for 1-8
// trainers). Header-only; a target that includes it links bagpipe_xxhash. Not thread-safe: one
// PlanDigest per thread.
#ifndef BAGPIPE_ORACLE_PLAN_DIGEST_H_
#define BAGPIPE_ORACLE_PLAN_DIGEST_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "oracle/plan.h"
#include "xxhash.h"

namespace bagpipe {

class PlanDigest {
 public:
  // Folds every field of `p` into the digest (vectors with their sizes, flags as one byte).
  void Add(const TrainerPlan& p) {
    Bytes(&p.iteration, sizeof(p.iteration));
    Bytes(&p.trainer, sizeof(p.trainer));
    Bytes(&p.num_trainers, sizeof(p.num_trainers));
    Bytes(&p.first_sample, sizeof(p.first_sample));
    Bytes(&p.num_samples, sizeof(p.num_samples));
    Bytes(&p.global_samples, sizeof(p.global_samples));
    Bytes(&p.num_dense, sizeof(p.num_dense));
    Bytes(&p.num_tables, sizeof(p.num_tables));
    Vector(p.labels);
    Vector(p.dense);
    Vector(p.offsets);
    Vector(p.unique_index);
    Vector(p.unique_rows);
    Vector(p.unique_slots);
    Count(p.extract.size());
    for (const Extraction& e : p.extract) {
      Bytes(&e.slot, sizeof(e.slot));
      Bytes(&e.row, sizeof(e.row));
      const uint8_t flags = static_cast<uint8_t>((e.evict ? 2 : 0) | (e.write_back ? 1 : 0));
      Bytes(&flags, 1);
    }
    Count(p.fills.size());
    for (const Fill& f : p.fills) {
      Bytes(&f.slot, sizeof(f.slot));
      Bytes(&f.row, sizeof(f.row));
      Bytes(&f.after_stamp, sizeof(f.after_stamp));
    }
    Vector(p.private_unique);
    Count(p.shared.size());
    for (const SharedRow& s : p.shared) {
      Bytes(&s.slot, sizeof(s.slot));
      Bytes(&s.row, sizeof(s.row));
      Bytes(&s.own_unique, sizeof(s.own_unique));
      const uint8_t now = s.now ? 1 : 0;
      Bytes(&now, 1);
    }
    Count(p.peers.size());
    for (const PeerExchange& e : p.peers) {
      Bytes(&e.peer, sizeof(e.peer));
      Vector(e.send);
      Vector(e.recv);
    }
  }

  // The digest of every plan added so far (0 before the first).
  uint64_t value() const { return hash_; }

 private:
  void Bytes(const void* data, size_t size) { hash_ = XXH3_64bits_withSeed(data, size, hash_); }
  void Count(uint64_t n) { Bytes(&n, sizeof(n)); }
  template <typename T>
  void Vector(const std::vector<T>& v) {
    Count(v.size());
    if (!v.empty()) Bytes(v.data(), v.size() * sizeof(T));
  }

  uint64_t hash_ = 0;
};

}  // namespace bagpipe

#endif  // BAGPIPE_ORACLE_PLAN_DIGEST_H_
