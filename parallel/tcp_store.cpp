#include "parallel/tcp_store.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "core/error.h"

namespace frugal::parallel {

// Wire format, both ways little-endian host order (every rank runs the same build):
//   request:  u8 command, u32 key length, key, u64 value length, value
//   reply:    u8 status (0 ok, 1 error), u64 length, payload (value or message)
enum Command : uint8_t { kSet = 1, kGet = 2, kAdd = 3 };

namespace net {

// False when the peer closed the connection or the socket timed out (errno says which).
bool send_all(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    p += k, n -= size_t(k);
  }
  return true;
}

bool recv_all(int fd, void* data, size_t n) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t k = ::recv(fd, p, n, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) {
      if (k == 0) errno = ECONNRESET;
      return false;
    }
    p += k, n -= size_t(k);
  }
  return true;
}

}  // namespace net

namespace {

using net::recv_all;
using net::send_all;

bool send_frame(int fd, uint8_t head, const std::string& a, const std::string* b) {
  bool ok = send_all(fd, &head, 1);
  if (b) {  // a request: u32 key, u64 value
    const uint32_t ka = uint32_t(a.size());
    const uint64_t kb = b->size();
    ok = ok && send_all(fd, &ka, 4) && send_all(fd, a.data(), a.size()) && send_all(fd, &kb, 8) &&
         send_all(fd, b->data(), b->size());
  } else {  // a reply: u64 payload
    const uint64_t ka = a.size();
    ok = ok && send_all(fd, &ka, 8) && send_all(fd, a.data(), a.size());
  }
  return ok;
}

template <typename Len>
bool recv_string(int fd, std::string& out) {
  Len n = 0;
  if (!recv_all(fd, &n, sizeof(n))) return false;
  out.resize(size_t(n));
  return recv_all(fd, out.data(), out.size());
}

}  // namespace

// ---- the server (rank 0) ----------------------------------------------------------

class TcpStoreServer {
 public:
  explicit TcpStoreServer(int port) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    FRUGAL_CHECK(listen_fd_ >= 0, "tcp_store: socket: ", std::strerror(errno));
    const int one = 1;
    ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
    addr.sin_port = htons(uint16_t(port));
    if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(listen_fd_, 128) != 0) {
      const int err = errno;
      ::close(listen_fd_);
      FRUGAL_FAIL("tcp_store: cannot serve on port ", port, ": ", std::strerror(err),
                  " (another job on this port? set MASTER_PORT)");
    }
    socklen_t len = sizeof(addr);
    ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    acceptor_ = std::thread([this] { accept_loop(); });
  }

  ~TcpStoreServer() {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
      for (int fd : clients_) ::shutdown(fd, SHUT_RDWR);  // unblocks their threads' recv
    }
    cv_.notify_all();
    ::shutdown(listen_fd_, SHUT_RDWR);  // unblocks accept
    acceptor_.join();
    ::close(listen_fd_);
    for (auto& t : handlers_) t.join();
    for (int fd : clients_) ::close(fd);
  }

  int port() const { return port_; }

 private:
  void accept_loop() {
    while (true) {
      const int fd = ::accept(listen_fd_, nullptr, nullptr);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        return;  // shut down
      }
      std::lock_guard lock(mu_);
      if (stopping_) {
        ::close(fd);
        return;
      }
      clients_.push_back(fd);
      handlers_.emplace_back([this, fd] { serve(fd); });
    }
  }

  // One client's requests, in order, until it disconnects.
  void serve(int fd) {
    while (true) {
      uint8_t command = 0;
      std::string key, value;
      if (!recv_all(fd, &command, 1) || !recv_string<uint32_t>(fd, key) || !recv_string<uint64_t>(fd, value)) return;
      std::string reply;
      uint8_t status = 0;
      {
        std::unique_lock lock(mu_);
        if (command == kSet) {
          data_[key] = value;
          cv_.notify_all();
        } else if (command == kGet) {
          cv_.wait(lock, [&] { return stopping_ || data_.count(key); });
          if (stopping_) return;
          reply = data_[key];
        } else if (command == kAdd) {
          int64_t delta = 0, now = 0;
          std::memcpy(&delta, value.data(), std::min(value.size(), sizeof(delta)));
          if (auto it = data_.find(key); it != data_.end())
            std::memcpy(&now, it->second.data(), std::min(it->second.size(), sizeof(now)));
          now += delta;
          data_[key] = std::string(reinterpret_cast<const char*>(&now), sizeof(now));
          reply = data_[key];
          cv_.notify_all();
        } else {
          status = 1;
          reply = "unknown command " + std::to_string(command);
        }
      }
      if (!send_frame(fd, status, reply, nullptr)) return;
    }
  }

  int listen_fd_ = -1;
  int port_ = 0;
  std::thread acceptor_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::map<std::string, std::string> data_;
  std::vector<int> clients_;
  std::vector<std::thread> handlers_;
};

// ---- the client ---------------------------------------------------------------------

namespace {

// One connection attempt; -1 (errno set) when nobody listens yet.
int try_connect(const std::string& host, int port) {
  addrinfo hints{}, *found = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
  FRUGAL_CHECK(rc == 0, "tcp_store: cannot resolve MASTER_ADDR '", host, "': ", ::gai_strerror(rc));
  int fd = -1;
  for (addrinfo* a = found; a && fd < 0; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd >= 0 && ::connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
      const int err = errno;
      ::close(fd);
      fd = -1;
      errno = err;
    }
  }
  ::freeaddrinfo(found);
  return fd;
}

}  // namespace

TcpStore::TcpStore(const std::string& host, int port, bool serve, std::chrono::milliseconds timeout)
    : port_(port), host_(host), timeout_(timeout) {
  FRUGAL_CHECK(port >= 0 && port < 65536 && (serve || port > 0), "tcp_store: bad port ", port);
  if (serve) {
    server_ = std::make_unique<TcpStoreServer>(port);
    port_ = server_->port();
  }
  // The server may not be up yet (ranks start in any order): retry until the timeout.
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto pause = std::chrono::milliseconds(10);
  while ((fd_ = try_connect(serve ? "127.0.0.1" : host, port_)) < 0) {
    const int err = errno;
    FRUGAL_CHECK(std::chrono::steady_clock::now() < deadline, "tcp_store: no server at ", host, ":", port_, " after ",
                 timeout.count(), " ms (", std::strerror(err),
                 "); is rank 0 running, and MASTER_ADDR/MASTER_PORT right?");
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(500));
  }
  const int one = 1;
  ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  timeval tv{};
  tv.tv_sec = long(timeout.count() / 1000);
  tv.tv_usec = long(timeout.count() % 1000) * 1000;
  ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

TcpStore::~TcpStore() {
  if (fd_ >= 0) ::close(fd_);
  server_.reset();  // after our own connection closed
}

std::string TcpStore::request(uint8_t command, const std::string& key, const std::string& value, const char* op) {
  FRUGAL_CHECK(fd_ >= 0, "tcp_store ", op, " '", key, "': the connection failed earlier");
  uint8_t status = 0;
  std::string reply;
  if (!send_frame(fd_, command, key, &value) || !recv_all(fd_, &status, 1) || !recv_string<uint64_t>(fd_, reply)) {
    const int err = errno;
    ::close(fd_);
    fd_ = -1;  // a late reply would come out of step with the next request
    if (err == EAGAIN || err == EWOULDBLOCK)
      FRUGAL_FAIL("tcp_store ", op, " '", key, "': timed out after ", timeout_.count(), " ms",
                  command == kGet ? " (no rank set the key; did one fail before the rendezvous?)" : "");
    FRUGAL_FAIL("tcp_store ", op, " '", key, "': connection to ", host_, ":", port_, " lost (", std::strerror(err),
                ")");
  }
  FRUGAL_CHECK(status == 0, "tcp_store ", op, " '", key, "': ", reply);
  return reply;
}

void TcpStore::set(const std::string& key, const std::string& value) { request(kSet, key, value, "set"); }

std::string TcpStore::get(const std::string& key) { return request(kGet, key, "", "get"); }

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  const std::string reply =
      request(kAdd, key, std::string(reinterpret_cast<const char*>(&delta), sizeof(delta)), "add");
  int64_t now = 0;
  std::memcpy(&now, reply.data(), std::min(reply.size(), sizeof(now)));
  return now;
}

}  // namespace frugal::parallel
