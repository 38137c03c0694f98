#pragma once
// A small TCP key-value store for rendezvous, as torch.distributed's TCPStore: rank 0
// serves it at MASTER_ADDR:MASTER_PORT, every rank (rank 0 included) is a client.
// The ranks share the NCCL unique id through it:
//
//   TcpStore store(addr, port, /*serve=*/rank == 0);
//   if (rank == 0) store.set("nccl_id", id);
//   std::string id = store.get("nccl_id");  // waits until rank 0 has set it
//
// Note [Store timeouts]
// Nothing here waits forever: connecting retries until the timeout (the server
// may start after its clients), and get() fails with the key's name when no rank
// sets it in time, so a rank that died before the rendezvous shows up as an
// error, not a hang.
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "parallel/communicator.h"

namespace frugal::parallel {

class TcpStoreServer;  // tcp_store.cpp

namespace net {
/// Sends or receives exactly n bytes on a blocking socket, retrying on EINTR; false when the
/// peer closed the connection (errno ECONNRESET) or the socket's timeout expired (EAGAIN).
/// Shared with the TCP communicator (parallel/tcp_communicator.cpp).
bool send_all(int fd, const void* data, size_t n);
bool recv_all(int fd, void* data, size_t n);
}  // namespace net

class TcpStore {
 public:
  /// Connects to host:port; with `serve`, first starts the server there (port 0
  /// picks a free port: see port()). Throws when no server answers within `timeout`.
  TcpStore(const std::string& host, int port, bool serve, std::chrono::milliseconds timeout = std::chrono::minutes(5));
  ~TcpStore();
  TcpStore(const TcpStore&) = delete;
  TcpStore& operator=(const TcpStore&) = delete;

  void set(const std::string& key, const std::string& value);
  /// The key's value, waiting until some rank sets it (at most timeout()).
  std::string get(const std::string& key);
  /// Adds `delta` to the integer at `key` (0 when unset) and returns the new value.
  int64_t add(const std::string& key, int64_t delta);

  /// The server's port (the one chosen when constructed with port 0).
  int port() const { return port_; }
  std::chrono::milliseconds timeout() const { return timeout_; }

 private:
  std::string request(uint8_t command, const std::string& key, const std::string& value, const char* op);

  std::unique_ptr<TcpStoreServer> server_;
  int fd_ = -1;
  int port_;
  std::string host_;
  std::chrono::milliseconds timeout_;
};

}  // namespace frugal::parallel
