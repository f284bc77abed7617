// Internal: an allocator that backs large arrays with transparent huge pages.
//
// The planner's big arrays (row records, slot states, row indexes) are read at random, one row
// at a time; with 4 KiB pages nearly every access also misses the TLB. Allocations of at least
// 2 MiB get a private mapping of their own, aligned to 2 MiB and marked MADV_HUGEPAGE (honoured
// when the kernel's THP mode is "always" or "madvise"; harmless otherwise), and are unmapped
// when freed. They never come from malloc's heap: memory marked for huge pages that went back to
// the heap would later serve small allocations, and each first touch of such memory can fault in
// (and zero) a whole 2 MiB page. Smaller ones use operator new. Stateless and thread-safe.
#ifndef BAGPIPE_ORACLE_HUGE_PAGES_H_
#define BAGPIPE_ORACLE_HUGE_PAGES_H_

#include <sys/mman.h>

#include <cstddef>
#include <cstdint>
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
    const size_t rounded = RoundUp(bytes);
    // Map one huge page more than needed, then unmap the slack before and after the aligned
    // range.
    void* raw = mmap(nullptr, rounded + kHugePageBytes, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) throw std::bad_alloc();
    const uintptr_t start = reinterpret_cast<uintptr_t>(raw);
    const uintptr_t aligned = (start + kHugePageBytes - 1) & ~(kHugePageBytes - 1);
    const uintptr_t end = start + rounded + kHugePageBytes;
    if (aligned > start) munmap(raw, aligned - start);
    if (end > aligned + rounded)
      munmap(reinterpret_cast<void*>(aligned + rounded), end - aligned - rounded);
    madvise(reinterpret_cast<void*>(aligned), rounded, MADV_HUGEPAGE);
    return reinterpret_cast<T*>(aligned);
  }

  void deallocate(T* p, size_t n) {
    const size_t bytes = n * sizeof(T);
    if (bytes < kHugePageBytes) {
      ::operator delete(p);
    } else {
      munmap(p, RoundUp(bytes));
    }
  }

  template <typename U>
  bool operator==(const HugePageAllocator<U>&) const {
    return true;
  }

 private:
  static size_t RoundUp(size_t bytes) {
    return (bytes + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
  }
};

template <typename T>
using HugeVector = std::vector<T, HugePageAllocator<T>>;

}  // namespace oracle_internal
}  // namespace bagpipe

#endif  // BAGPIPE_ORACLE_HUGE_PAGES_H_
