#include "core/graph_capture.h"

#include "core/error.h"

namespace frugal::core {

namespace {
thread_local GraphCapture* tl_capture = nullptr;
}

GraphCapture* current_graph_capture() { return tl_capture; }

void set_current_graph_capture(GraphCapture* capture) { tl_capture = capture; }

void refuse_in_graph_capture(const char* what, const char* why) {
  FRUGAL_CHECK(tl_capture == nullptr, what, " cannot run inside a CUDA graph capture: ", why,
               ". Run it outside the captured function (before capture() or after replay()).");
}

}  // namespace frugal::core
