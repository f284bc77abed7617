// Internal: an allocator that backs large arrays with transparent huge pages.
//
// The planner's big arrays (row records, slot states, row indexes) are read at random, one row
// at a time; with 4 KiB pages nearly every access also misses the TLB. Allocations of at least
// 2 MiB are aligned to 2 MiB and marked MADV_HUGEPAGE (honoured when the kernel's THP mode is
// "always" or "madvise"; harmless otherwise). Smaller ones use operator new. Stateless and
// thread-safe.
#ifndef BAGPIPE_ORACLE_HUGE_PAGES_H_
#define BAGPIPE_ORACLE_HUGE_PAGES_H_

#include <sys/mman.h>

#include <cstddef>
#include <cstdlib>
#include <new>
#include <vector>

namespace bagpipe {
namespace oracle_internal {

inline constexpr size_t kHugePageBytes = size_t{2} << 20;

template <typename T>
class HugePageAllocator {
 public:
  using value_type = T;

  HugePageAllocator() = default;
  template <typename U>
  HugePageAllocator(const HugePageAllocator<U>&) {}  // NOLINT: allocators convert implicitly

  T* allocate(size_t n) {
    const size_t bytes = n * sizeof(T);
    if (bytes < kHugePageBytes) return static_cast<T*>(::operator new(bytes));
    const size_t rounded = (bytes + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
    void* p = std::aligned_alloc(kHugePageBytes, rounded);
    if (p == nullptr) throw std::bad_alloc();
    madvise(p, rounded, MADV_HUGEPAGE);
    return static_cast<T*>(p);
  }

  void deallocate(T* p, size_t n) {
    if (n * sizeof(T) < kHugePageBytes) {
      ::operator delete(p);
    } else {
      std::free(p);
    }
  }

  template <typename U>
  bool operator==(const HugePageAllocator<U>&) const {
    return true;
  }
};

template <typename T>
using HugeVector = std::vector<T, HugePageAllocator<T>>;

}  // namespace oracle_internal
}  // namespace bagpipe

#endif  // BAGPIPE_ORACLE_HUGE_PAGES_H_
