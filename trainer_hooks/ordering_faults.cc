#include "trainer_hooks/ordering_faults.h"

#include <atomic>

namespace bagpipe {
namespace {

std::atomic<OrderingFault> active_fault{OrderingFault::kNone};

}  // namespace

void SetOrderingFaultForTesting(OrderingFault fault) {
  active_fault.store(fault, std::memory_order_relaxed);
}

OrderingFault OrderingFaultForTesting() { return active_fault.load(std::memory_order_relaxed); }

}  // namespace bagpipe
