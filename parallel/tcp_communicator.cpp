#include "parallel/tcp_communicator.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <tuple>

#include "core/error.h"

namespace frugal::parallel {

using Clock = std::chrono::steady_clock;
using frugal::detail::str_cat;
using net::recv_all;
using net::send_all;

namespace {

constexpr uint32_t kMagic = 0x46524731;  // "FRG1": every frame and hello starts with it

enum class Kind : uint8_t { Collective = 1, PointToPoint = 2 };
enum class OpCode : uint8_t { AllReduce = 1, AllGather, ReduceScatter, Broadcast, Barrier, Split };

const char* op_name(OpCode op) {
  switch (op) {
    case OpCode::AllReduce: return "all_reduce";
    case OpCode::AllGather: return "all_gather";
    case OpCode::ReduceScatter: return "reduce_scatter";
    case OpCode::Broadcast: return "broadcast";
    case OpCode::Barrier: return "barrier";
    case OpCode::Split: return "split";
  }
  return "?";
}

// One message on a connection: this header, then `bytes` bytes of payload.
struct Header {
  uint32_t magic = kMagic;
  Kind kind = Kind::Collective;
  OpCode op = OpCode::Barrier;  // collectives: which one (checked against the receiver's)
  uint16_t detail = 0;          // collectives: their arguments (collective_detail), checked as op is
  uint64_t group = 0;           // the communicator's id (a world and its splits share connections)
  uint64_t seq = 0;             // collectives: sequence number; point to point: the n-th send to this peer
  uint64_t bytes = 0;
};

struct Message {
  OpCode op;
  uint64_t seq;
  std::vector<char> bytes;
  uint16_t detail = 0;
};

// A collective's arguments that every rank must agree on, beyond its kind and byte count: the
// dtype (a same-width mismatch, int32 against float32, passes the byte check and reduces
// nonsense), the reduce op and broadcast's root. Ranks that disagree were silently given
// different results; now the receiving rank names both sides.
uint16_t collective_detail(DType dtype, int op_or_root) {
  return uint16_t((unsigned(dtype) << 12) | (op_or_root & 0xFFF));
}

std::string describe_detail(OpCode code, uint16_t detail) {
  const DType dtype = DType(detail >> 12);
  const int rest = detail & 0xFFF;
  switch (code) {
    case OpCode::AllReduce:
    case OpCode::ReduceScatter: return str_cat(dtype_name(dtype), ", ", to_string(ReduceOp(rest)));
    case OpCode::AllGather: return dtype_name(dtype);
    case OpCode::Broadcast: return str_cat(dtype_name(dtype), ", root ", rest);
    default: return "-";
  }
}

}  // namespace

// ---- the connections ---------------------------------------------------------------

class TcpMesh {
 public:
  TcpMesh(int rank, std::vector<int> fds) : rank_(rank), fds_(std::move(fds)), closed_(fds_.size()) {
    for (size_t p = 0; p < fds_.size(); ++p) write_mu_.push_back(std::make_unique<std::mutex>());
    for (int p = 0; p < int(fds_.size()); ++p)
      if (p != rank_) receivers_.emplace_back([this, p] { receive_loop(p); });
  }

  ~TcpMesh() {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    for (int fd : fds_)
      if (fd >= 0) ::shutdown(fd, SHUT_RDWR);  // ends the receivers' recv
    for (auto& t : receivers_) t.join();
    for (int fd : fds_)
      if (fd >= 0) ::close(fd);
  }

  /// Sends one message to world rank `peer`; throws `what` and the reason when it cannot.
  void post(int peer, Header header, const void* data, const std::string& what) {
    check_healthy(what);
    std::lock_guard lock(*write_mu_[size_t(peer)]);
    if (!send_all(fds_[size_t(peer)], &header, sizeof(header)) || !send_all(fds_[size_t(peer)], data, header.bytes)) {
      const std::string msg = str_cat(what, ": sending to rank ", peer, " failed (", std::strerror(errno),
                                      "); it exited, was killed, or stopped reading");
      fail(msg);
      FRUGAL_FAIL(msg);
    }
  }

  /// The next collective message of `group` from world rank `peer`.
  Message take_collective(int peer, uint64_t group, Clock::time_point deadline, std::chrono::milliseconds timeout,
                          const std::string& what) {
    std::unique_lock lock(mu_);
    auto& queue = collective_[{peer, group}];
    wait(lock, peer, deadline, timeout, what, [&] { return !queue.empty(); });
    Message m = std::move(queue.front());
    queue.pop_front();
    return m;
  }

  /// The `index`-th point-to-point message of `group` from `peer`; with `block` false,
  /// nullopt when it has not arrived.
  std::optional<std::vector<char>> take_p2p(int peer, uint64_t group, uint64_t index, bool block,
                                            Clock::time_point deadline, std::chrono::milliseconds timeout,
                                            const std::string& what) {
    std::unique_lock lock(mu_);
    const auto key = std::make_tuple(peer, group, index);
    if (!block && !p2p_.count(key)) return std::nullopt;
    wait(lock, peer, deadline, timeout, what, [&] { return p2p_.count(key) > 0; });
    auto node = p2p_.extract(key);
    return std::move(node.mapped());
  }

  void check_healthy(const std::string& what) {
    std::lock_guard lock(mu_);
    if (!failure_.empty()) FRUGAL_FAIL(what, ": the communicator failed earlier: ", failure_);
  }

  /// Poisons the connections: every later call throws `what` (Note [TCP backend]).
  void fail(const std::string& what) {
    std::lock_guard lock(mu_);
    if (failure_.empty()) failure_ = what;
  }

 private:
  // Waits (lock held) until ready(); a message that arrived before its sender's connection
  // closed still counts, so a peer that finished and exited is not an error.
  template <typename Ready>
  void wait(std::unique_lock<std::mutex>& lock, int peer, Clock::time_point deadline, std::chrono::milliseconds timeout,
            const std::string& what, Ready ready) {
    while (!ready()) {
      std::string msg;
      if (!failure_.empty()) FRUGAL_FAIL(what, ": the communicator failed earlier: ", failure_);
      if (!closed_[size_t(peer)].empty()) msg = str_cat(what, ": ", closed_[size_t(peer)]);
      else if (cv_.wait_until(lock, deadline) == std::cv_status::timeout && !ready())
        msg = str_cat(what, " timed out after ", timeout.count(), " ms waiting for rank ", peer,
                      " (did it fail, or call other collectives in another order?)");
      if (!msg.empty()) {
        if (failure_.empty()) failure_ = msg;
        FRUGAL_FAIL(msg);
      }
    }
  }

  void receive_loop(int peer) {
    const int fd = fds_[size_t(peer)];
    std::string why;
    while (true) {
      Header h;
      if (!recv_all(fd, &h, sizeof(h))) {
        why = errno == ECONNRESET ? str_cat("rank ", peer, " closed its connection (it exited or was killed)")
                                  : str_cat("the connection to rank ", peer, " failed (", std::strerror(errno), ")");
        break;
      }
      if (h.magic != kMagic) {
        why = str_cat("garbage from rank ", peer, " (not a frugal tcp frame)");
        break;
      }
      // The receiver owns no caller to throw to: a frame it cannot hold ends the connection
      // with a reason, as a dead peer does, instead of std::terminate.
      std::vector<char> bytes;
      try {
        bytes.resize(h.bytes);
      } catch (const std::exception& e) {
        why = str_cat("a ", h.bytes, "-byte message from rank ", peer, " could not be received (", e.what(), ")");
        break;
      }
      if (!recv_all(fd, bytes.data(), bytes.size())) {
        why = str_cat("rank ", peer, " closed its connection in the middle of a message (it exited or was killed)");
        break;
      }
      std::lock_guard lock(mu_);
      if (h.kind == Kind::Collective) collective_[{peer, h.group}].push_back({h.op, h.seq, std::move(bytes), h.detail});
      else p2p_[{peer, h.group, h.seq}] = std::move(bytes);
      cv_.notify_all();
    }
    std::lock_guard lock(mu_);
    if (!stopping_) closed_[size_t(peer)] = why;
    cv_.notify_all();
  }

  int rank_;
  std::vector<int> fds_;  // by world rank; -1 for this rank
  std::vector<std::unique_ptr<std::mutex>> write_mu_;
  std::vector<std::thread> receivers_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::pair<int, uint64_t>, std::deque<Message>> collective_;    // (peer, group)
  std::map<std::tuple<int, uint64_t, uint64_t>, std::vector<char>> p2p_;  // (peer, group, index)
  std::vector<std::string> closed_;  // by peer: why its connection ended, "" while open
  std::string failure_;              // the first error; every later call throws it
  bool stopping_ = false;
};

// ---- rendezvous ------------------------------------------------------------------------

namespace {

// This host's address on the route to `master` (what the other ranks can reach), as
// dotted IPv4: a UDP socket "connected" to it sends nothing but picks the interface.
std::string local_address_toward(const std::string& master) {
  addrinfo hints{}, *found = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  const int rc = ::getaddrinfo(master.c_str(), "9", &hints, &found);
  FRUGAL_CHECK(rc == 0, "tcp communicator: cannot resolve MASTER_ADDR '", master, "': ", ::gai_strerror(rc));
  const int fd = ::socket(AF_INET, SOCK_DGRAM, 0);
  sockaddr_in self{};
  socklen_t len = sizeof(self);
  const bool ok = fd >= 0 && ::connect(fd, found->ai_addr, found->ai_addrlen) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&self), &len) == 0;
  ::freeaddrinfo(found);
  if (fd >= 0) ::close(fd);
  FRUGAL_CHECK(ok, "tcp communicator: no route to MASTER_ADDR '", master, "'");
  char text[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &self.sin_addr, text, sizeof(text));
  return text;
}

int connect_until(const std::string& host, int port, Clock::time_point deadline, const std::string& what) {
  addrinfo hints{}, *found = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
  FRUGAL_CHECK(rc == 0, what, ": cannot resolve ", host, ": ", ::gai_strerror(rc));
  int fd = -1, err = 0;
  while (true) {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd >= 0 && ::connect(fd, found->ai_addr, found->ai_addrlen) == 0) break;
    err = errno;
    if (fd >= 0) ::close(fd);
    fd = -1;
    if (Clock::now() > deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ::freeaddrinfo(found);
  FRUGAL_CHECK(fd >= 0, what, ": cannot connect to ", host, ":", port, " (", std::strerror(err), ")");
  return fd;
}

// Every pair of `size` ranks connected once: rank r connects to the ranks below it
// (their listening sockets queue the connection until they accept) and accepts those
// above it, which name themselves in a hello. Returns one socket per world rank.
std::vector<int> connect_mesh(TcpStore& store, int rank, int size, const std::string& master_addr,
                              std::chrono::milliseconds timeout, const std::string& prefix) {
  const std::string what = str_cat("tcp communicator rendezvous on rank ", rank);
  const auto deadline = Clock::now() + timeout;
  const int listen_fd = ::socket(AF_INET, SOCK_STREAM, 0);
  FRUGAL_CHECK(listen_fd >= 0, what, ": socket: ", std::strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t len = sizeof(addr);
  if (::bind(listen_fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(listen_fd, 1024) != 0 ||
      ::getsockname(listen_fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const int err = errno;
    ::close(listen_fd);
    FRUGAL_FAIL(what, ": cannot listen: ", std::strerror(err));
  }
  const std::string host = local_address_toward(master_addr);
  store.set(str_cat(prefix, "/addr/", rank), str_cat(host, ":", ntohs(addr.sin_port)));

  std::vector<int> fds(size_t(size), -1);
  try {
    for (int peer = 0; peer < rank; ++peer) {
      const std::string at = store.get(str_cat(prefix, "/addr/", peer));
      const size_t colon = at.rfind(':');
      const int fd = connect_until(at.substr(0, colon), std::stoi(at.substr(colon + 1)), deadline, what);
      fds[size_t(peer)] = fd;
      const uint32_t hello[2] = {kMagic, uint32_t(rank)};
      FRUGAL_CHECK(send_all(fd, hello, sizeof(hello)), what, ": hello to rank ", peer, " failed");
    }
    for (int accepted = 0; accepted < size - 1 - rank; ++accepted) {
      pollfd p{listen_fd, POLLIN, 0};
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      FRUGAL_CHECK(left > 0 && ::poll(&p, 1, int(std::min<int64_t>(left, 1 << 30))) > 0, what, ": ",
                   size - 1 - rank - accepted, " higher rank(s) did not connect within ", timeout.count(), " ms");
      const int fd = ::accept(listen_fd, nullptr, nullptr);
      FRUGAL_CHECK(fd >= 0, what, ": accept: ", std::strerror(errno));
      timeval tv{5, 0};
      ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
      uint32_t hello[2] = {0, 0};
      const bool ok = recv_all(fd, hello, sizeof(hello));
      if (!ok || hello[0] != kMagic || int(hello[1]) <= rank || int(hello[1]) >= size || fds[hello[1]] >= 0) {
        ::close(fd);
        FRUGAL_FAIL(what, ": bad hello from a connecting peer (another job on this port?)");
      }
      tv = timeval{0, 0};
      ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
      fds[hello[1]] = fd;
    }
  } catch (...) {
    ::close(listen_fd);
    for (int fd : fds)
      if (fd >= 0) ::close(fd);
    throw;
  }
  ::close(listen_fd);
  // Receivers block in recv without a timeout (the mesh's destructor shuts them down);
  // a send blocks only while the peer's kernel buffer is full, which its receiver drains.
  for (int fd : fds)
    if (fd >= 0) {
      const int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      timeval tv{};
      tv.tv_sec = long(timeout.count() / 1000);
      tv.tv_usec = long(timeout.count() % 1000) * 1000;
      ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    }
  return fds;
}

// A mix of a parent group's id, the split's sequence number and the color: the same on
// every rank of the new group, different for each group.
uint64_t child_id(uint64_t parent, uint64_t seq, int color) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the three numbers
  for (uint64_t v : {parent, seq, uint64_t(uint32_t(color))})
    for (int b = 0; b < 8; ++b) h = (h ^ ((v >> (8 * b)) & 0xff)) * 1099511628211ull;
  return h;
}

class DoneWork final : public Work {
 public:
  void wait() override {}
  bool completed() override { return true; }
};

class TcpRecvWork final : public Work {
 public:
  TcpRecvWork(std::shared_ptr<TcpMesh> mesh, int peer, uint64_t group, uint64_t index, Tensor tensor, std::string what,
              std::chrono::milliseconds timeout)
      : mesh_(std::move(mesh)),
        peer_(peer),
        group_(group),
        index_(index),
        tensor_(std::move(tensor)),
        what_(std::move(what)),
        timeout_(timeout) {}

  void wait() override { take(true); }
  bool completed() override { return take(false); }

 private:
  bool take(bool block) {
    if (done_) return true;
    // The timeout counts from the first wait, not from when the recv was posted: a pipeline
    // posts its receives early and computes for a while before it waits.
    if (block && deadline_ == Clock::time_point{}) deadline_ = Clock::now() + timeout_;
    auto bytes = mesh_->take_p2p(peer_, group_, index_, block, deadline_, timeout_, what_);
    if (!bytes) return false;
    const size_t expected = size_t(tensor_.numel()) * element_size(tensor_.dtype());
    FRUGAL_CHECK(bytes->size() == expected, what_, ": got ", bytes->size(), " bytes for ", tensor_.describe(), " (",
                 expected, " bytes): the send and the recv disagree on the size");
    const Tensor flat = tensor_.contiguous();
    if (expected) std::memcpy(flat.data(), bytes->data(), expected);
    if (!tensor_.is_contiguous()) tensor_.copy_(flat);
    done_ = true;
    return true;
  }

  std::shared_ptr<TcpMesh> mesh_;
  int peer_;
  uint64_t group_, index_;
  Tensor tensor_;
  std::string what_;
  Clock::time_point deadline_{};  // set by the first blocking wait
  std::chrono::milliseconds timeout_;
  bool done_ = false;
};

void check_cpu(const char* op, const Tensor& t) {
  FRUGAL_CHECK(t.defined() && t.device().is_cpu(), "tcp ", op, ": the tcp backend takes CPU tensors, got ",
               t.defined() ? t.describe() : std::string("an undefined tensor"),
               " (use the nccl backend for CUDA tensors)");
}

}  // namespace

// ---- the communicator ----------------------------------------------------------------------

TcpCommunicator::TcpCommunicator(TcpStore& store, int rank, int size, const std::string& master_addr,
                                 std::chrono::milliseconds timeout, const std::string& prefix)
    : id_(0), rank_(rank), timeout_(timeout), sent_(size_t(size)), posted_(size_t(size)) {
  FRUGAL_CHECK(size >= 1 && rank >= 0 && rank < size, "tcp communicator: rank ", rank, " out of range for ", size,
               " ranks");
  for (int r = 0; r < size; ++r) members_.push_back(r);
  mesh_ = std::make_shared<TcpMesh>(rank, connect_mesh(store, rank, size, master_addr, timeout, prefix));
}

TcpCommunicator::TcpCommunicator(std::shared_ptr<TcpMesh> mesh, uint64_t id, std::vector<int> members, int rank,
                                 std::chrono::milliseconds timeout)
    : mesh_(std::move(mesh)),
      id_(id),
      members_(std::move(members)),
      rank_(rank),
      timeout_(timeout),
      sent_(members_.size()),
      posted_(members_.size()) {}

TcpCommunicator::~TcpCommunicator() = default;

std::string TcpCommunicator::label() const {
  return id_ == 0 ? str_cat("rank ", rank_) : str_cat("rank ", rank_, " (world rank ", members_[size_t(rank_)], ")");
}

// The collective's messages to and from the group's peers, checked against what this
// rank runs: a peer in another collective is an error naming both, not a silent mix-up.
struct TcpCommunicator::Exchange {
  TcpMesh& mesh;
  const std::vector<int>& members;
  uint64_t group;
  OpCode code;
  uint64_t seq;
  std::string what;
  Clock::time_point deadline;
  std::chrono::milliseconds timeout;
  uint16_t detail;

  void send(int peer, const void* data, size_t bytes) {
    Header h;
    h.kind = Kind::Collective, h.op = code, h.group = group, h.seq = seq, h.bytes = bytes, h.detail = detail;
    mesh.post(members[size_t(peer)], h, data, what);
  }
  std::vector<char> recv(int peer, size_t bytes) {
    Message m = mesh.take_collective(members[size_t(peer)], group, deadline, timeout, what);
    if (m.op != code || m.seq != seq || m.bytes.size() != bytes) {
      // The ranks are out of step: no later message on these connections can be trusted.
      const std::string msg =
          str_cat(what, ": rank ", peer, " sent ", m.bytes.size(), " bytes of its ", op_name(m.op), " #", m.seq,
                  ", this rank expects ", bytes, " bytes of ", op_name(code), " #", seq,
                  " (every rank must call the same collectives in the same order, with tensors of one dtype and size)");
      mesh.fail(msg);
      FRUGAL_FAIL(msg);
    }
    if (m.detail != detail) {
      const std::string msg =
          str_cat(what, ": rank ", peer, " runs this ", op_name(code), " with (", describe_detail(code, m.detail),
                  "), this rank with (", describe_detail(code, detail), "); every rank must pass the same dtype",
                  code == OpCode::Broadcast ? " and root" : " and reduce op");
      mesh.fail(msg);
      FRUGAL_FAIL(msg);
    }
    return std::move(m.bytes);
  }
};

TcpCommunicator::Exchange TcpCommunicator::begin(int code, uint16_t detail) {
  const uint64_t seq = next_seq_++;
  std::string what = str_cat("tcp ", op_name(OpCode(code)), " #", seq, " on ", label());
  mesh_->check_healthy(what);
  return Exchange{*mesh_, members_, id_, OpCode(code), seq, std::move(what), Clock::now() + timeout_, timeout_, detail};
}

std::shared_ptr<Work> TcpCommunicator::all_reduce(const Tensor& tensor, ReduceOp op) {
  check_cpu("all_reduce", tensor);
  Exchange ex = begin(int(OpCode::AllReduce), collective_detail(tensor.dtype(), int(op)));
  const int p = size();
  const int64_t n = tensor.numel();
  const size_t es = element_size(tensor.dtype());
  const Tensor flat = tensor.contiguous();  // the tensor itself when contiguous
  char* data = static_cast<char*>(flat.data());
  auto start = [&](int r) { return n * r / p; };  // balanced chunks: any length, 0 included
  auto chunk_bytes = [&](int r) { return size_t(start(r + 1) - start(r)) * es; };
  // Reduce-scatter: rank r reduces chunk r of every rank's tensor, in rank order.
  for (int q = 0; q < p; ++q)
    if (q != rank_) ex.send(q, data + size_t(start(q)) * es, chunk_bytes(q));
  std::vector<std::vector<char>> chunks(static_cast<size_t>(p));
  std::vector<const void*> src(static_cast<size_t>(p));
  for (int q = 0; q < p; ++q) {
    if (q != rank_) chunks[size_t(q)] = ex.recv(q, chunk_bytes(rank_));
    src[size_t(q)] = q == rank_ ? data + size_t(start(rank_)) * es : chunks[size_t(q)].data();
  }
  std::vector<char> mine(chunk_bytes(rank_));
  reduce_in_rank_order(tensor.dtype(), src, mine.data(), start(rank_ + 1) - start(rank_), op, "tcp all_reduce");
  // All-gather the reduced chunks.
  for (int q = 0; q < p; ++q)
    if (q != rank_) ex.send(q, mine.data(), mine.size());
  if (!mine.empty()) std::memcpy(data + size_t(start(rank_)) * es, mine.data(), mine.size());
  for (int q = 0; q < p; ++q)
    if (q != rank_) {
      const std::vector<char> got = ex.recv(q, chunk_bytes(q));
      if (!got.empty()) std::memcpy(data + size_t(start(q)) * es, got.data(), got.size());
    }
  if (!tensor.is_contiguous()) tensor.copy_(flat);
  return std::make_shared<DoneWork>();
}

std::shared_ptr<Work> TcpCommunicator::all_gather(const Tensor& input, const Tensor& output) {
  check_cpu("all_gather", input);
  check_cpu("all_gather", output);
  FRUGAL_CHECK(output.is_contiguous() && output.numel() == size() * input.numel() && output.dtype() == input.dtype(),
               "tcp all_gather: output must be contiguous with ", size(),
               " x input's elements and its dtype; got input ", input.describe(), ", output ", output.describe());
  Exchange ex = begin(int(OpCode::AllGather), collective_detail(input.dtype(), 0));
  const size_t bytes = size_t(input.numel()) * element_size(input.dtype());
  // A copy first: the input may be a view of the output (ZeRO gathers in place).
  const Tensor in = input.contiguous();
  std::vector<char> mine(static_cast<const char*>(in.data()), static_cast<const char*>(in.data()) + bytes);
  for (int q = 0; q < size(); ++q)
    if (q != rank_) ex.send(q, mine.data(), bytes);
  char* out = static_cast<char*>(output.data());
  for (int q = 0; q < size(); ++q) {
    const std::vector<char> got = q == rank_ ? std::move(mine) : ex.recv(q, bytes);
    if (bytes) std::memcpy(out + size_t(q) * bytes, got.data(), bytes);
  }
  return std::make_shared<DoneWork>();
}

std::shared_ptr<Work> TcpCommunicator::reduce_scatter(const Tensor& input, const Tensor& output, ReduceOp op) {
  check_cpu("reduce_scatter", input);
  check_cpu("reduce_scatter", output);
  const int p = size();
  FRUGAL_CHECK(input.numel() % p == 0 && output.is_contiguous() && output.numel() == input.numel() / p &&
                   output.dtype() == input.dtype(),
               "tcp reduce_scatter: input's elements must split into ", p,
               " chunks and output must be one contiguous chunk of its dtype; got input ", input.describe(),
               ", output ", output.describe());
  Exchange ex = begin(int(OpCode::ReduceScatter), collective_detail(input.dtype(), int(op)));
  const int64_t chunk = input.numel() / p;
  const size_t bytes = size_t(chunk) * element_size(input.dtype());
  const Tensor flat = input.contiguous();
  const char* data = static_cast<const char*>(flat.data());
  for (int q = 0; q < p; ++q)
    if (q != rank_) ex.send(q, data + size_t(q) * bytes, bytes);
  std::vector<std::vector<char>> chunks(static_cast<size_t>(p));
  std::vector<const void*> src(static_cast<size_t>(p));
  for (int q = 0; q < p; ++q) {
    if (q != rank_) chunks[size_t(q)] = ex.recv(q, bytes);
    src[size_t(q)] = q == rank_ ? data + size_t(rank_) * bytes : chunks[size_t(q)].data();
  }
  // Into a buffer first: the output may alias the input's chunk.
  std::vector<char> mine(bytes);
  reduce_in_rank_order(input.dtype(), src, mine.data(), chunk, op, "tcp reduce_scatter");
  if (bytes) std::memcpy(output.data(), mine.data(), bytes);
  return std::make_shared<DoneWork>();
}

std::shared_ptr<Work> TcpCommunicator::broadcast(const Tensor& tensor, int root) {
  check_cpu("broadcast", tensor);
  FRUGAL_CHECK(root >= 0 && root < size(), "tcp broadcast: root ", root, " out of range for ", size(), " ranks");
  Exchange ex = begin(int(OpCode::Broadcast), collective_detail(tensor.dtype(), root));
  const size_t bytes = size_t(tensor.numel()) * element_size(tensor.dtype());
  const Tensor flat = tensor.contiguous();
  // Every rank first tells every other the root it runs with (an empty message whose header
  // carries it): ranks that disagree would otherwise both send and both return (each keeping
  // its own tensor), or both wait, and nothing would say why.
  for (int q = 0; q < size(); ++q)
    if (q != rank_) ex.send(q, nullptr, 0);
  for (int q = 0; q < size(); ++q)
    if (q != rank_) ex.recv(q, 0);
  if (rank_ == root) {
    for (int q = 0; q < size(); ++q)
      if (q != rank_) ex.send(q, flat.data(), bytes);
  } else {
    const std::vector<char> got = ex.recv(root, bytes);
    if (bytes) std::memcpy(flat.data(), got.data(), bytes);
    if (!tensor.is_contiguous()) tensor.copy_(flat);
  }
  return std::make_shared<DoneWork>();
}

void TcpCommunicator::barrier() {
  Exchange ex = begin(int(OpCode::Barrier));
  for (int q = 0; q < size(); ++q)
    if (q != rank_) ex.send(q, nullptr, 0);
  for (int q = 0; q < size(); ++q)
    if (q != rank_) ex.recv(q, 0);
}

std::shared_ptr<Communicator> TcpCommunicator::split(int color, int key) {
  Exchange ex = begin(int(OpCode::Split));
  const int32_t mine[2] = {color, key};
  for (int q = 0; q < size(); ++q)
    if (q != rank_) ex.send(q, mine, sizeof(mine));
  // Ranks of one color, ordered by (key, parent rank), form a new group.
  std::vector<std::pair<int, int>> same;  // (key, parent rank)
  for (int q = 0; q < size(); ++q) {
    int32_t theirs[2] = {color, key};
    if (q != rank_) std::memcpy(theirs, ex.recv(q, sizeof(theirs)).data(), sizeof(theirs));
    if (color >= 0 && theirs[0] == color) same.push_back({theirs[1], q});
  }
  if (color < 0) return nullptr;
  std::sort(same.begin(), same.end());
  std::vector<int> members;
  int new_rank = 0;
  for (size_t i = 0; i < same.size(); ++i) {
    if (same[i].second == rank_) new_rank = int(i);
    members.push_back(members_[size_t(same[i].second)]);
  }
  return std::shared_ptr<TcpCommunicator>(
      new TcpCommunicator(mesh_, child_id(id_, ex.seq, color), std::move(members), new_rank, timeout_));
}

std::shared_ptr<Work> TcpCommunicator::send(const Tensor& tensor, int peer) {
  check_cpu("send", tensor);
  FRUGAL_CHECK(peer >= 0 && peer < size() && peer != rank_, "tcp send on ", label(), ": bad peer ", peer, " (", size(),
               " ranks)");
  const uint64_t index = sent_[size_t(peer)]++;
  const Tensor flat = tensor.contiguous();
  Header h;
  h.kind = Kind::PointToPoint, h.group = id_, h.seq = index;
  h.bytes = size_t(tensor.numel()) * element_size(tensor.dtype());
  mesh_->post(members_[size_t(peer)], h, flat.data(),
              str_cat("tcp send #", index + 1, " to rank ", peer, " on ", label()));
  return std::make_shared<DoneWork>();  // the receiver's thread buffers it: complete at once
}

std::shared_ptr<Work> TcpCommunicator::recv(const Tensor& tensor, int peer) {
  check_cpu("recv", tensor);
  FRUGAL_CHECK(peer >= 0 && peer < size() && peer != rank_, "tcp recv on ", label(), ": bad peer ", peer, " (", size(),
               " ranks)");
  const uint64_t index = posted_[size_t(peer)]++;
  const std::string what = str_cat("tcp recv #", index + 1, " from rank ", peer, " on ", label());
  mesh_->check_healthy(what);
  return std::make_shared<TcpRecvWork>(mesh_, members_[size_t(peer)], id_, index, tensor, what, timeout_);
}

}  // namespace frugal::parallel
