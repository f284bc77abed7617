// Test-only switches that break one ordering rule of the trainer's asynchronous iteration, to
// prove that the asynchronous CPU stream modes (core/device.h, CpuStreams) catch such mistakes:
// with a fault set, training must end with different parameters in the lazy mode (and the same
// ones on a synchronous context, where the rule is moot). A fault only lets float data be read
// early, never indices, so a faulty run ends normally with wrong numbers. Never set in production.
// The switch is read when a Trainer is created.
#ifndef BAGPIPE_TRAINER_HOOKS_ORDERING_FAULTS_H_
#define BAGPIPE_TRAINER_HOOKS_ORDERING_FAULTS_H_

namespace bagpipe {

enum class OrderingFault {
  kNone,
  // The compute stream does not wait for the copy of the prefetched rows before filling the
  // cache from them (one StreamWaitEvent dropped).
  kSkipFillWait,
};

void SetOrderingFaultForTesting(OrderingFault fault);
OrderingFault OrderingFaultForTesting();

}  // namespace bagpipe

#endif  // BAGPIPE_TRAINER_HOOKS_ORDERING_FAULTS_H_
