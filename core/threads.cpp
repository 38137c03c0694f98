#include "core/threads.h"

#ifdef _OPENMP
#include <omp.h>
#endif

#include "core/error.h"

namespace frugal {

int get_num_threads() {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

void set_num_threads(int n) {
  FRUGAL_CHECK(n >= 1, "set_num_threads: the number of threads must be >= 1, got ", n);
#ifdef _OPENMP
  omp_set_num_threads(n);
#endif
}

}  // namespace frugal
