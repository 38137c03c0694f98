#include "parallel/init.h"

#include <cstdlib>
#include <mutex>
#include <vector>

#include "core/error.h"
#include "parallel/tcp_communicator.h"
#ifdef FRUGAL_WITH_MPI
#include "parallel/mpi_communicator.h"
#endif
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

std::string first_host_of_nodelist(const std::string& list) {
  std::string host;
  int depth = 0;
  bool in_first_range = false;  // inside brackets: copying the first number of the first range
  for (char c : list) {
    if (c == '[') {
      FRUGAL_CHECK(depth == 0, "first_host_of_nodelist: nested '[' in Slurm host list '", list, "'");
      depth = 1, in_first_range = true;
    } else if (c == ']') {
      FRUGAL_CHECK(depth == 1, "first_host_of_nodelist: unmatched ']' in Slurm host list '", list, "'");
      depth = 0;
    } else if (depth == 1) {
      if (c == ',' || c == '-') in_first_range = false;
      else if (in_first_range) host += c;
    } else if (c == ',') {
      break;  // the first entry ends
    } else {
      host += c;
    }
  }
  FRUGAL_CHECK(depth == 0, "first_host_of_nodelist: unmatched '[' in Slurm host list '", list, "'");
  FRUGAL_CHECK(!host.empty(), "first_host_of_nodelist: no host in Slurm host list '", list, "'");
  return host;
}

ProcessEnv read_process_env() {
  ProcessEnv env;
  // Explicit variables (frugal-run, torchrun) first, then mpirun's, then Slurm's.
  const char* rank = env_any({"RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"});
  const char* size = env_any({"WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS"});
  const char* local = env_any({"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"});
  const char* addr = std::getenv("MASTER_ADDR");
  const char* port = std::getenv("MASTER_PORT");
  const char* slurm_job = std::getenv("SLURM_JOB_ID");
  const bool slurm = std::getenv("SLURM_PROCID") != nullptr;
  std::vector<std::string> missing;
  if (!rank) missing.push_back("RANK");
  if (!size) missing.push_back("WORLD_SIZE");
  if (!port && !(slurm && slurm_job)) missing.push_back("MASTER_PORT");
  if (!missing.empty()) {
    std::string list;
    for (const auto& m : missing) list += (list.empty() ? "" : ", ") + m;
    FRUGAL_FAIL("init_process_group: ", list,
                " not set; start the ranks with `frugal-run --nproc N prog args...` (or torchrun, srun, or mpirun with "
                "MASTER_ADDR and MASTER_PORT set)");
  }
  env.rank = parse_int("RANK", rank);
  env.world_size = parse_int("WORLD_SIZE", size);
  env.local_rank = local ? parse_int("LOCAL_RANK", local) : env.rank;
  if (addr) env.master_addr = addr;
  else if (const char* nodes = slurm ? env_any({"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST"}) : nullptr)
    env.master_addr = first_host_of_nodelist(nodes);
  else env.master_addr = "127.0.0.1";
  env.master_port =
      port ? parse_int("MASTER_PORT", port) : kSlurmBasePort + parse_int("SLURM_JOB_ID", slurm_job) % 1000;
  FRUGAL_CHECK(env.world_size >= 1 && env.rank < env.world_size, "init_process_group: RANK ", env.rank,
               " out of range for WORLD_SIZE ", env.world_size);
  FRUGAL_CHECK(env.master_port > 0 && env.master_port < 65536, "init_process_group: MASTER_PORT ", env.master_port,
               " out of range");
  return env;
}

const char* to_string(Backend backend) {
  switch (backend) {
    case Backend::Auto: return "auto";
    case Backend::Nccl: return "nccl";
    case Backend::Tcp: return "tcp";
    case Backend::Mpi: return "mpi";
  }
  return "?";
}

Backend parse_backend(const std::string& name) {
  if (name == "auto") return Backend::Auto;
  if (name == "nccl") return Backend::Nccl;
  if (name == "tcp" || name == "gloo") return Backend::Tcp;
  if (name == "mpi") return Backend::Mpi;
  FRUGAL_FAIL("init_process_group: unknown backend '", name, "'; expected auto, nccl, tcp (or gloo) or mpi");
}

Backend resolve_backend(Backend backend) {
  if (backend != Backend::Auto) return backend;
#ifdef FRUGAL_WITH_CUDA
  if (cuda_device_count() > 0) return Backend::Nccl;
#endif
  return Backend::Tcp;
}

namespace {

// The store every backend meets through: rank 0 serves it. Lock g_store_mu.
TcpStore& open_store(const ProcessEnv& env, std::chrono::milliseconds timeout) {
  FRUGAL_CHECK(!g_store, "init_process_group: called twice in one process");
  g_store = std::make_unique<TcpStore>(env.master_addr, env.master_port, env.rank == 0, timeout);
  return *g_store;
}

std::shared_ptr<Communicator> init_nccl(const ProcessEnv& env, std::chrono::milliseconds timeout) {
#ifndef FRUGAL_WITH_CUDA
  (void)env, (void)timeout;
  FRUGAL_FAIL(
      "init_process_group: frugal was built without CUDA, and the NCCL backend needs it (for CPU tensors across "
      "processes use the tcp backend, {.backend = Backend::Tcp}; across threads, run_ranks from "
      "parallel/thread_communicator.h)");
#else
  const int gpus = cuda_device_count();
  // One GPU visible means a launcher bound one to this process (Slurm's --gpus-per-task,
  // CUDA_VISIBLE_DEVICES per rank): it is device 0 whatever LOCAL_RANK says.
  FRUGAL_CHECK(gpus == 1 || env.local_rank < gpus, "init_process_group: LOCAL_RANK ", env.local_rank, " but only ",
               gpus, " GPU(s) visible on this host");
  const Device device = cuda(gpus == 1 ? 0 : env.local_rank);
  std::lock_guard lock(g_store_mu);
  TcpStore& store = open_store(env, timeout);
  NcclUniqueId id{};
  if (env.rank == 0) {
    id = nccl_unique_id();
    store.set("nccl_unique_id", std::string(id.data(), id.size()));
  } else {
    const std::string bytes = store.get("nccl_unique_id");
    FRUGAL_CHECK(bytes.size() == id.size(), "init_process_group: malformed NCCL id from the store");
    std::copy(bytes.begin(), bytes.end(), id.begin());
  }
  // NcclCommunicator makes `device` current on this thread (cudaSetDevice(LOCAL_RANK)).
  set_cuda_device(device);
  return std::make_shared<NcclCommunicator>(id, env.rank, env.world_size, device, timeout);
#endif
}

}  // namespace

std::shared_ptr<Communicator> init_process_group(const ProcessGroupOptions& options) {
  const Backend backend = resolve_backend(options.backend);
  if (backend == Backend::Nccl) return init_nccl(read_process_env(), options.timeout);
  if (backend == Backend::Mpi) {
#ifdef FRUGAL_WITH_MPI
    return make_mpi_world(options.timeout);
#else
    FRUGAL_FAIL(
        "init_process_group: frugal was built without MPI (install libopenmpi-dev and reconfigure the build); the "
        "tcp backend needs no MPI: {.backend = Backend::Tcp}");
#endif
  }
  const ProcessEnv env = read_process_env();
  std::lock_guard lock(g_store_mu);
  TcpStore& store = open_store(env, options.timeout);
  return std::make_shared<TcpCommunicator>(store, env.rank, env.world_size, env.master_addr, options.timeout);
}

std::shared_ptr<Communicator> init_process_group(std::chrono::milliseconds timeout) {
  return init_process_group(ProcessGroupOptions{.backend = Backend::Auto, .timeout = timeout});
}

TcpStore& process_store() {
  std::lock_guard lock(g_store_mu);
  FRUGAL_CHECK(g_store != nullptr, "process_store: call init_process_group first");
  return *g_store;
}

}  // namespace frugal::parallel
