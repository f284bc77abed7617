// Internal: a std::vector whose growth leaves trivially constructible elements uninitialised.
//
// The planner sizes some per-batch lists for their largest possible length, writes them through
// a pointer and cuts them to the length written (a hot loop then keeps no size and makes no
// capacity test per element). With std::allocator, resize() would first zero every element it
// adds: for the lists of one batch, megabytes written only to be overwritten. Stateless and
// thread-safe; otherwise std::allocator.
#ifndef BAGPIPE_ORACLE_UNINIT_VECTOR_H_
#define BAGPIPE_ORACLE_UNINIT_VECTOR_H_

#include <memory>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

namespace bagpipe {
namespace oracle_internal {

template <typename T>
class DefaultInitAllocator : public std::allocator<T> {
 public:
  using value_type = T;
  template <typename U>
  struct rebind {
    using other = DefaultInitAllocator<U>;
  };

  DefaultInitAllocator() = default;
  template <typename U>
  DefaultInitAllocator(const DefaultInitAllocator<U>&) {}  // NOLINT: allocators convert implicitly

  // Value-initialisation (what resize(n) and vector(n) ask for) becomes default-initialisation:
  // nothing is written for trivially constructible types.
  template <typename U>
  void construct(U* p) noexcept(std::is_nothrow_default_constructible_v<U>) {
    ::new (static_cast<void*>(p)) U;
  }
  template <typename U, typename... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};

template <typename T>
using UninitVector = std::vector<T, DefaultInitAllocator<T>>;

}  // namespace oracle_internal
}  // namespace bagpipe

#endif  // BAGPIPE_ORACLE_UNINIT_VECTOR_H_
