// remat's out-of-memory errors, recognized however they arrive.
//
// The allocators throw c10::OutOfMemoryError (torch.OutOfMemoryError in Python), which the hook retries after
// making room and the executor turns into a ResourceExhausted status. But an extension built on torch's stable ABI
// (torchvision's roi_align, nms and friends) calls torch through a C shim that turns every exception into an error
// code and throws a plain error carrying the message: an allocation remat could not serve inside such a kernel
// arrives untyped, as "API call failed ... remat: CPU memory budget exhausted ...". These helpers give it its type
// back, so that it is retried, reported and caught as the out-of-memory error it is.
#pragma once

#include <exception>
#include <string>

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/DispatchKeySet.h>

namespace remat::integration {

// The message of an error without torch's C++ backtrace.
std::string MessageOf(const std::exception& error);

// A c10::OutOfMemoryError, or any error whose message carries a remat allocator's out-of-memory message.
bool IsOutOfMemory(const std::exception& error);

// op.redispatchBoxed(keys, stack), with an out-of-memory error that lost its type rethrown as c10::OutOfMemoryError.
void RedispatchTypingOutOfMemory(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack);

}  // namespace remat::integration
