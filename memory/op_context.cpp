#include "memory/op_context.h"

namespace frugal::memory {
namespace {
thread_local const char* current_op = "";
}

OpScope::OpScope(const char* name) noexcept : outer_(current_op) { current_op = name; }
OpScope::~OpScope() { current_op = outer_; }
const char* OpScope::current() noexcept { return current_op; }

}  // namespace frugal::memory
