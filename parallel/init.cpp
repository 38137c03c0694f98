#include "parallel/init.h"

#include <cstdlib>
#include <mutex>
#include <vector>

#include "core/error.h"
#ifdef FRUGAL_WITH_CUDA
#include "parallel/nccl_communicator.h"
#endif

namespace frugal::parallel {

namespace {

std::unique_ptr<TcpStore> g_store;  // serves the other ranks' lookups until exit (rank 0)
std::mutex g_store_mu;

// The first of `names` that is set, or nullptr.
const char* env_any(std::initializer_list<const char*> names) {
  for (const char* n : names)
    if (const char* v = std::getenv(n)) return v;
  return nullptr;
}

int parse_int(const char* name, const char* value) {
  char* end = nullptr;
  const long v = std::strtol(value, &end, 10);
  FRUGAL_CHECK(end != value && *end == '\0' && v >= 0 && v < (1L << 30), "init_process_group: ", name, "='", value,
               "' is not a non-negative integer");
  return int(v);
}

}  // namespace

ProcessEnv read_process_env() {
  ProcessEnv env;
  const char* rank = env_any({"RANK", "OMPI_COMM_WORLD_RANK"});
  const char* size = env_any({"WORLD_SIZE", "OMPI_COMM_WORLD_SIZE"});
  const char* local = env_any({"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK"});
  const char* addr = std::getenv("MASTER_ADDR");
  const char* port = std::getenv("MASTER_PORT");
  std::vector<std::string> missing;
  if (!rank) missing.push_back("RANK");
  if (!size) missing.push_back("WORLD_SIZE");
  if (!port) missing.push_back("MASTER_PORT");
  if (!missing.empty()) {
    std::string list;
    for (const auto& m : missing) list += (list.empty() ? "" : ", ") + m;
    FRUGAL_FAIL("init_process_group: ", list,
                " not set; start the ranks with `frugal-run --nproc N prog args...` (or torchrun/mpirun with "
                "MASTER_ADDR and MASTER_PORT set)");
  }
  env.rank = parse_int("RANK", rank);
  env.world_size = parse_int("WORLD_SIZE", size);
  env.local_rank = local ? parse_int("LOCAL_RANK", local) : env.rank;
  env.master_addr = addr ? addr : "127.0.0.1";
  env.master_port = parse_int("MASTER_PORT", port);
  FRUGAL_CHECK(env.world_size >= 1 && env.rank < env.world_size, "init_process_group: RANK ", env.rank,
               " out of range for WORLD_SIZE ", env.world_size);
  FRUGAL_CHECK(env.master_port > 0 && env.master_port < 65536, "init_process_group: MASTER_PORT ", env.master_port,
               " out of range");
  return env;
}

std::shared_ptr<Communicator> init_process_group(std::chrono::milliseconds timeout) {
#ifndef FRUGAL_WITH_CUDA
  (void)timeout;
  FRUGAL_FAIL(
      "init_process_group: frugal was built without CUDA, and the NCCL backend needs it (for CPU-only "
      "parallel code use run_ranks from parallel/thread_communicator.h)");
#else
  const ProcessEnv env = read_process_env();
  const int gpus = cuda_device_count();
  FRUGAL_CHECK(env.local_rank < gpus, "init_process_group: LOCAL_RANK ", env.local_rank, " but only ", gpus,
               " GPU(s) visible on this host");
  const Device device = cuda(env.local_rank);
  std::lock_guard lock(g_store_mu);
  FRUGAL_CHECK(!g_store, "init_process_group: called twice in one process");
  g_store = std::make_unique<TcpStore>(env.master_addr, env.master_port, env.rank == 0, timeout);
  NcclUniqueId id{};
  if (env.rank == 0) {
    id = nccl_unique_id();
    g_store->set("nccl_unique_id", std::string(id.data(), id.size()));
  } else {
    const std::string bytes = g_store->get("nccl_unique_id");
    FRUGAL_CHECK(bytes.size() == id.size(), "init_process_group: malformed NCCL id from the store");
    std::copy(bytes.begin(), bytes.end(), id.begin());
  }
  // NcclCommunicator makes `device` current on this thread (cudaSetDevice(LOCAL_RANK)).
  set_cuda_device(device);
  return std::make_shared<NcclCommunicator>(id, env.rank, env.world_size, device, timeout);
#endif
}

TcpStore& process_store() {
  std::lock_guard lock(g_store_mu);
  FRUGAL_CHECK(g_store != nullptr, "process_store: call init_process_group first");
  return *g_store;
}

}  // namespace frugal::parallel
