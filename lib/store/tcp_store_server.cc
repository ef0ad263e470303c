// The TCP store server: rank 0 (or `adaptcomm launch --elastic`) serves the job's keys to every
// rank.
//
// One thread accepts, one thread serves each connection (rendezvous traffic is a few requests
// per rank, and a thread per connection keeps blocking GET/WAIT simple). Connections are
// bounded; anything malformed closes only the connection that sent it. The threads are detached
// and counted (ThreadCount); Stop() waits for the count to reach zero: a process that exits while
// a server is still stopping (a rank that stopped waiting for its departure, LeaveRendezvous)
// leaves running threads, not finished ones that no one joined.
//
// A peer proves it belongs to the job (HELLO with the token) before the server reads more than
// kMaxHandshakeBytes from it. Connections still in their handshake are few
// (kMaxPendingHandshakes) and short-lived (kMaxHandshakeTime). When one more arrives and the table
// of pending ones is full:
//   - the oldest pending one that is suspicious is dropped: pending for kEvictableAge (1 s) or
//     more AND with nothing unread in its socket. A real client sends its HELLO microseconds after
//     connecting, so one that has sent nothing for a second is idle or slow on purpose; one whose
//     HELLO sits unread is waiting for this server (its thread not yet scheduled), not the other
//     way round, and is kept whatever its age;
//   - if none is suspicious, the newcomer is refused instead: it gets an Unavailable "busy" frame
//     and is closed. The job's own client treats that (and any handshake the server closes) as
//     "try again" and retries with exponential backoff and jitter until its connect deadline
//     (tcp_store_client.cc), so a refusal costs a rank milliseconds, never the job.
// Why this and not the old "always drop the oldest pending one": when a big job's ranks connect
// at once (128 ranks started together), the accept loop outran the threads that read the HELLOs,
// and it dropped the job's own ranks whose HELLOs were waiting unread; they gave up after three
// quick tries. Why not a bound that grows with the job's size: the server is not told the world
// size (TcpStoreOptions has no such field and its callers are outside this layer), and a bound
// that is merely larger only moves the cliff; refusing young newcomers is safe at any job size.
// A flood still gets little: at most kMaxPendingHandshakes threads, each for at most a second
// once newcomers need its slot, and newcomers that find no suspicious slot cost one accept and
// one close. Frame bodies of authenticated clients share a memory budget.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "adaptcomm/store.h"
#include "lib/base/log.h"
#include "lib/base/log_throttle.h"
#include "lib/base/store_multi_get.h"
#include "lib/store/tcp_wire.h"

namespace adaptcomm {
namespace {

namespace wire = store_wire;

// More concurrent connections than any job has ranks, yet far below what would exhaust threads.
constexpr size_t kMaxConnections = 4096;
// A client sends HELLO right after connecting (microseconds); one that does not is not a client.
constexpr absl::Duration kMaxHandshakeTime = absl::Seconds(5);
constexpr size_t kMaxPendingHandshakes = 64;
// A pending handshake younger than this is never dropped to make room (see the top comment).
constexpr absl::Duration kEvictableAge = absl::Seconds(1);
// Frame bodies being received at once, over all connections, in units of max_frame_bytes.
constexpr size_t kFrameBudgetFrames = 4;
// Lines about refused peers: a scan or flood must not flood the log.
constexpr absl::Duration kRefusalLogInterval = absl::Seconds(10);
// How often a blocked GET/WAIT checks whether its client is still there.
constexpr absl::Duration kPeerCheckInterval = absl::Milliseconds(200);

std::string PeerName(int fd) {
  sockaddr_in addr{};
  socklen_t len = sizeof(addr);
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return "unknown peer";
  char ip[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &addr.sin_addr, ip, sizeof(ip));
  return absl::StrCat(ip, ":", ntohs(addr.sin_port));
}

bool PeerGone(int fd) {
  pollfd p{fd, POLLRDHUP, 0};
  return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

std::string ErrorResponse(const absl::Status& s) {
  std::string msg(s.message());
  return wire::FrameWriter(static_cast<uint8_t>(s.code())).Field(msg).Finish();
}

class TcpStoreServerImpl final : public TcpStoreServer {
 public:
  explicit TcpStoreServerImpl(const TcpStoreOptions& options) : options_(options) {}

  ~TcpStoreServerImpl() override { Stop(); }

  int port() const override { return port_; }

  absl::Status Start() {
    addrinfo hints{};
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    addrinfo* res = nullptr;
    std::string port_text = std::to_string(options_.port);
    const char* host = options_.host.empty() ? nullptr : options_.host.c_str();
    if (int rc = ::getaddrinfo(host, port_text.c_str(), &hints, &res); rc != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("TCP store: cannot resolve host '", options_.host, "': ", gai_strerror(rc)));
    }
    std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> guard(res, freeaddrinfo);
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (listen_fd_ < 0) {
      return absl::UnavailableError(absl::StrCat("TCP store: socket: ", std::strerror(errno)));
    }
    int one = 1;
    ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    std::string where = absl::StrCat(options_.host, ":", options_.port);
    if (::bind(listen_fd_, res->ai_addr, res->ai_addrlen) != 0) {
      return absl::UnavailableError(
          absl::StrCat("TCP store: cannot listen on ", where, ": bind: ", std::strerror(errno)));
    }
    if (::listen(listen_fd_, SOMAXCONN) != 0) {
      return absl::UnavailableError(
          absl::StrCat("TCP store: cannot listen on ", where, ": listen: ", std::strerror(errno)));
    }
    sockaddr_in bound{};
    socklen_t len = sizeof(bound);
    if (::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&bound), &len) != 0) {
      return absl::InternalError(absl::StrCat("TCP store: getsockname: ", std::strerror(errno)));
    }
    port_ = ntohs(bound.sin_port);
    if (::pipe2(wake_pipe_, O_CLOEXEC | O_NONBLOCK) != 0) {
      return absl::UnavailableError(absl::StrCat("TCP store: pipe: ", std::strerror(errno)));
    }
    if (!Spawn([this] { AcceptLoop(); })) {
      return absl::UnavailableError("TCP store: cannot start the thread that accepts connections");
    }
    ADAPTCOMM_LOG(kDebug, "TCP store serving on ", options_.host, ":", port_);
    return absl::OkStatus();
  }

 private:
  struct Conn {
    int fd = -1;  // closed (and set to -1) under conns_mu_ by the serving thread
    absl::Time accepted;
    bool done = false;
    bool authenticated = false;  // set under conns_mu_ once its HELLO was accepted
    bool evicted = false;        // set under conns_mu_ when dropped from the pending table
    bool pending() const { return !done && !authenticated && !evicted && fd >= 0; }
  };

  // The server's threads that have not ended. Shared with them, so that a thread that has left
  // the server (its last access) may still report its end after the server is gone.
  struct ThreadCount {
    absl::Mutex mu;
    int live ABSL_GUARDED_BY(mu) = 0;
  };

  // Runs `body` on a detached thread counted in threads_; false if no thread could be started.
  template <typename Body>
  bool Spawn(Body body) {
    {
      absl::MutexLock lock(&threads_->mu);
      ++threads_->live;
    }
    try {
      std::thread([body = std::move(body), count = threads_] {
        body();
        absl::MutexLock lock(&count->mu);
        --count->live;
      }).detach();
      return true;
    } catch (const std::system_error&) {
      absl::MutexLock lock(&threads_->mu);
      --threads_->live;
      return false;
    }
  }

  void Stop() {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
      for (auto& [key, waiting] : waiters_) waiting.cv.SignalAll();
    }
    if (wake_pipe_[1] >= 0) {
      char b = 1;
      (void)!::write(wake_pipe_[1], &b, 1);  // the accept loop returns
    }
    {
      absl::MutexLock lock(&conns_mu_);
      closing_ = true;  // a connection accepted from now on is closed at once
      // Wakes every serving thread out of recv/poll; the fds stay open until their threads close
      // them, so no fd number is reused under us.
      for (auto& c : conns_)
        if (c->fd >= 0) ::shutdown(c->fd, SHUT_RDWR);
    }
    {
      absl::MutexLock lock(&threads_->mu);
      ThreadCount* count = threads_.get();
      auto ended = [count]() ABSL_SHARED_LOCKS_REQUIRED(count->mu) { return count->live == 0; };
      threads_->mu.Await(absl::Condition(&ended));
    }
    {
      absl::MutexLock lock(&conns_mu_);
      conns_.clear();
    }
    if (listen_fd_ >= 0) ::close(listen_fd_);
    for (int& fd : wake_pipe_)
      if (fd >= 0) ::close(fd);
    listen_fd_ = -1;
  }

  void AcceptLoop() {
    while (true) {
      pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_pipe_[0], POLLIN, 0}};
      int rc = ::poll(fds, 2, 1000);
      ReapFinished();
      if (rc < 0 && errno != EINTR) {
        ADAPTCOMM_LOG(kError, "TCP store: poll on the listener failed: ", std::strerror(errno));
        absl::SleepFor(absl::Milliseconds(50));
        continue;
      }
      if (fds[1].revents != 0) return;
      if (rc <= 0 || (fds[0].revents & POLLIN) == 0) continue;
      int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
          // Out of descriptors: back off instead of spinning on a listener that stays readable.
          ADAPTCOMM_LOG_THROTTLED(refusals_, kWarning,
                                  "TCP store: accept failed: ", std::strerror(errno));
          absl::SleepFor(absl::Milliseconds(50));
        }
        continue;
      }
      absl::MutexLock lock(&conns_mu_);
      if (closing_) {
        ::close(fd);
        return;
      }
      if (!MakeRoomForHandshakeLocked(fd)) continue;
      if (conns_.size() >= kMaxConnections) {
        ADAPTCOMM_LOG_THROTTLED(refusals_, kWarning, "TCP store: refusing connection from ",
                                PeerName(fd), ": ", kMaxConnections, " connections already open");
        ::close(fd);
        continue;
      }
      int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      auto conn = std::make_unique<Conn>();
      conn->fd = fd;
      conn->accepted = absl::Now();
      Conn* raw = conn.get();
      // Listed before its thread starts: the thread marks it done under conns_mu_, held here.
      conns_.push_back(std::move(conn));
      if (!Spawn([this, raw] { Serve(raw); })) {
        ADAPTCOMM_LOG(kWarning, "TCP store: cannot start a thread for a connection from ",
                      PeerName(fd));
        ::close(fd);
        conns_.pop_back();
      }
    }
  }

  // Makes room in the table of pending handshakes for the connection just accepted on `fd`:
  // drops the oldest suspicious pending one if the table is full (see the top comment). False if
  // there is none to drop: then `fd` has been refused (told the server is busy) and closed.
  bool MakeRoomForHandshakeLocked(int fd) ABSL_EXCLUSIVE_LOCKS_REQUIRED(conns_mu_) {
    size_t pending = 0;
    Conn* victim = nullptr;  // connections are kept in accept order: the first is the oldest
    const absl::Time now = absl::Now();
    for (auto& c : conns_) {
      if (!c->pending()) continue;
      ++pending;
      if (victim == nullptr && now - c->accepted >= kEvictableAge && UnreadBytes(c->fd) == 0) {
        victim = c.get();
      }
    }
    if (pending < kMaxPendingHandshakes) return true;
    if (victim != nullptr) {
      ::shutdown(victim->fd, SHUT_RDWR);  // its thread sees the connection fail and closes it
      victim->evicted = true;
      ++evicted_;
      ADAPTCOMM_LOG_THROTTLED(
          refusals_, kWarning, "TCP store: dropped a connection from ", PeerName(victim->fd),
          " that sent nothing for ", absl::FormatDuration(now - victim->accepted), " (",
          kMaxPendingHandshakes, " handshakes pending; ", evicted_,
          " dropped so far): a scan or flood, or a client that is not adaptcomm");
      return true;
    }
    ++busy_refusals_;
    ADAPTCOMM_LOG_THROTTLED(busy_, kInfo, "TCP store: ", kMaxPendingHandshakes,
                            " handshakes pending, none idle for ",
                            absl::FormatDuration(kEvictableAge), ": asked ", PeerName(fd),
                            " to retry (", busy_refusals_, " asked so far)");
    const std::string busy = ErrorResponse(absl::UnavailableError(absl::StrCat(
        "the TCP store server is busy (", kMaxPendingHandshakes, " handshakes pending); retry")));
    (void)!::send(fd, busy.data(), busy.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    // Reads what the peer already sent (its HELLO), so that the close ends with a FIN after the
    // busy frame rather than a reset that could discard it.
    char sink[wire::kMaxHandshakeBytes];
    (void)!::recv(fd, sink, sizeof(sink), MSG_DONTWAIT);
    ::close(fd);
    return false;
  }

  // Bytes received on `fd` that no one has read yet; 0 if unknown.
  static int UnreadBytes(int fd) {
    int n = 0;
    return ::ioctl(fd, FIONREAD, &n) == 0 ? n : 0;
  }

  // Forgets the connections whose threads are done with them.
  void ReapFinished() {
    absl::MutexLock lock(&conns_mu_);
    std::erase_if(conns_, [](const std::unique_ptr<Conn>& c) { return c->done; });
  }

  void Serve(Conn* conn) {
    const int fd = conn->fd;
    const std::string peer = PeerName(fd);
    // Log lines already name the peer.
    const std::string what = "the client";
    bool authenticated = Handshake(fd, peer, what);
    if (authenticated) {
      // Leaves the pending table before the client hears OK, so that it is never dropped after
      // its handshake succeeded; one dropped just before this point gets no OK and retries.
      absl::MutexLock lock(&conns_mu_);
      authenticated = !conn->evicted;
      conn->authenticated = authenticated;
    }
    const absl::Duration handshake_limit = std::min(options_.io_timeout, kMaxHandshakeTime);
    authenticated =
        authenticated &&
        wire::SendAll(fd, wire::FrameWriter(0).Finish(), absl::Now() + handshake_limit, what).ok();
    while (authenticated) {
      absl::StatusOr<std::string> frame = ReceiveWithinBudget(fd, what);
      if (!frame.ok()) {
        // A client that disconnects between requests is normal; anything else is refused.
        if (!absl::IsUnavailable(frame.status())) {
          ADAPTCOMM_LOG_THROTTLED(refusals_, kWarning, "TCP store: closing connection from ", peer,
                                  ": ", frame.status().message());
        }
        break;
      }
      bool close_after = false;
      const std::string response = Handle(fd, *frame, &close_after);
      ReleaseBudget(frame->size());
      *frame = std::string();  // the budget no longer counts it: free it now
      if (!response.empty() &&
          !wire::SendAll(fd, response, absl::Now() + options_.io_timeout, what).ok()) {
        break;
      }
      if (close_after) break;
    }
    absl::MutexLock lock(&conns_mu_);
    ::close(fd);
    conn->fd = -1;
    conn->done = true;
  }

  // One request frame of an authenticated client. Its body is counted against the budget
  // shared by all connections (waiting up to io_timeout for room) before any of it is read;
  // the caller releases it with ReleaseBudget(size) once the request is handled.
  absl::StatusOr<std::string> ReceiveWithinBudget(int fd, const std::string& what) {
    absl::StatusOr<uint32_t> n =
        wire::RecvFrameLength(fd, options_.max_frame_bytes, absl::InfiniteFuture(), what);
    if (!n.ok()) return n.status();
    const absl::Time deadline = absl::Now() + options_.io_timeout;
    {
      absl::MutexLock lock(&budget_mu_);
      auto fits = [this, n = *n]() ABSL_SHARED_LOCKS_REQUIRED(budget_mu_) {
        return frame_bytes_in_flight_ + n <= FrameBudget();
      };
      if (!budget_mu_.AwaitWithDeadline(absl::Condition(&fits), deadline)) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "a frame of ", *n, " bytes did not fit in the server's receive budget of ",
            FrameBudget(), " bytes within ", absl::FormatDuration(options_.io_timeout)));
      }
      frame_bytes_in_flight_ += *n;
    }
    absl::StatusOr<std::string> body = wire::RecvFrameBody(fd, *n, deadline, what);
    if (!body.ok()) ReleaseBudget(*n);
    return body;
  }

  size_t FrameBudget() const { return kFrameBudgetFrames * options_.max_frame_bytes; }

  void ReleaseBudget(size_t n) {
    absl::MutexLock lock(&budget_mu_);
    frame_bytes_in_flight_ -= n;
  }

  // Reads and checks the HELLO; true if it is valid (the caller then answers OK). A refused one
  // gets its error response here.
  bool Handshake(int fd, const std::string& peer, const std::string& what) {
    absl::Duration limit = std::min(options_.io_timeout, kMaxHandshakeTime);
    auto frame = wire::RecvFrame(fd, wire::kMaxHandshakeBytes, absl::Now() + limit, limit, what);
    if (!frame.ok()) {
      if (!absl::IsUnavailable(frame.status())) {
        ADAPTCOMM_LOG_THROTTLED(refusals_, kWarning, "TCP store: refused connection from ", peer,
                                ": ", frame.status().message());
      }
      return false;
    }
    wire::FrameReader r(*frame);
    std::string_view magic, token;
    int64_t version = 0;
    if (r.first_byte() != wire::kHello || !r.Field(&magic) || !r.Int(&version) ||
        !r.Field(&token) || !r.AtEnd() || magic != wire::kMagic) {
      ADAPTCOMM_LOG_THROTTLED(refusals_, kWarning, "TCP store: refused connection from ", peer,
                              ": it did not start with an adaptcomm store handshake");
      return false;
    }
    if (version != wire::kVersion) {
      ADAPTCOMM_LOG_THROTTLED(refusals_, kWarning, "TCP store: refused connection from ", peer,
                              ": protocol version ", version, ", this server speaks ",
                              wire::kVersion);
      (void)wire::SendAll(
          fd,
          ErrorResponse(absl::FailedPreconditionError(absl::StrCat(
              "store protocol version ", version, " unsupported; server speaks ", wire::kVersion))),
          absl::Now() + limit, what);
      return false;
    }
    // An empty server token means the job runs without one.
    if (!options_.token.empty() && !wire::ConstantTimeEquals(token, options_.token)) {
      ADAPTCOMM_LOG_THROTTLED(refusals_, kWarning, "TCP store: refused connection from ", peer,
                              ": wrong job token (a process of another job, or a token mismatch)");
      (void)wire::SendAll(fd,
                          ErrorResponse(absl::PermissionDeniedError(
                              "the store server refused this client's token: the job token "
                              "(ADAPTCOMM_STORE_TOKEN / store_token) differs from rank 0's")),
                          absl::Now() + limit, what);
      return false;
    }
    return true;  // the caller answers OK once the connection has left the pending table
  }

  // The response frame for one request; empty when none is to be sent.
  std::string Handle(int fd, const std::string& body, bool* close_after) {
    wire::FrameReader r(body);
    std::string_view key, value;
    int64_t n = 0;
    auto malformed = [&](const char* op) {
      *close_after = true;
      absl::Status s = absl::InvalidArgumentError(absl::StrCat("malformed ", op, " request"));
      ADAPTCOMM_LOG_THROTTLED(refusals_, kWarning, "TCP store: closing connection from ",
                              PeerName(fd), ": ", s.message());
      return ErrorResponse(s);
    };
    switch (r.first_byte()) {
      case wire::kSet: {
        if (!r.Field(&key) || !r.Field(&value) || !r.AtEnd()) return malformed("SET");
        absl::MutexLock lock(&mu_);
        data_[std::string(key)] = std::string(value);
        WakeWaitersOn(key);
        return wire::FrameWriter(0).Finish();
      }
      case wire::kGet: {
        if (!r.Field(&key) || !r.Int(&n) || !r.AtEnd()) return malformed("GET");
        std::string k(key);
        std::vector<std::string> found;
        absl::Status s = WaitFor(fd, {k}, n, &found, nullptr);
        if (s.ok()) return wire::FrameWriter(0).Field(found[0]).Finish();
        if (absl::IsCancelled(s)) *close_after = true;
        if (absl::IsDeadlineExceeded(s)) {
          s = n == 0 ? absl::NotFoundError(absl::StrCat("store key '", k, "' is not set"))
                     : absl::DeadlineExceededError(
                           absl::StrCat("store key '", k, "' not set within ",
                                        absl::FormatDuration(absl::Microseconds(n))));
        }
        return ErrorResponse(s);
      }
      case wire::kAdd: {
        if (!r.Field(&key) || !r.Int(&n) || !r.AtEnd()) return malformed("ADD");
        absl::MutexLock lock(&mu_);
        std::string& slot = data_[std::string(key)];
        int64_t v = 0;
        if (!slot.empty() && !absl::SimpleAtoi(slot, &v)) {
          return ErrorResponse(absl::InvalidArgumentError(absl::StrCat(
              "store key '", std::string(key), "' holds a non-integer value; cannot add to it")));
        }
        if (__builtin_add_overflow(v, n, &v)) {
          return ErrorResponse(absl::OutOfRangeError(
              absl::StrCat("adding ", n, " to store key '", std::string(key), "' overflows")));
        }
        slot = std::to_string(v);
        WakeWaitersOn(key);
        return wire::FrameWriter(0).Int(v).Finish();
      }
      case wire::kWait: {
        std::vector<std::string> keys;
        if (!r.Int(&n) || !ReadKeys(r, &keys)) return malformed("WAIT");
        absl::Status s = WaitFor(fd, keys, n, nullptr, nullptr);
        if (absl::IsCancelled(s)) *close_after = true;
        return s.ok() ? wire::FrameWriter(0).Finish() : ErrorResponse(s);
      }
      case wire::kMultiGet: {
        std::vector<std::string> keys;
        if (!r.Int(&n) || !ReadKeys(r, &keys)) return malformed("MGET");
        std::vector<std::string> found, missing;
        absl::Status s = WaitFor(fd, keys, n, &found, &missing);
        if (s.ok()) {
          wire::FrameWriter w(0);
          for (const std::string& v : found) w.Field(v);
          return w.Finish();
        }
        if (absl::IsCancelled(s)) *close_after = true;
        if (!absl::IsDeadlineExceeded(s)) return ErrorResponse(s);
        // The missing keys follow the message, so that the client names them without asking again.
        s = MultiGetMissing(missing, absl::Microseconds(n));
        wire::FrameWriter w(static_cast<uint8_t>(s.code()));
        w.Field(std::string(s.message()));
        for (const std::string& k : missing) w.Field(k);
        return w.Finish();
      }
      case wire::kDelete: {
        if (!r.Field(&key) || !r.AtEnd()) return malformed("DELETE");
        absl::MutexLock lock(&mu_);
        bool existed = data_.erase(std::string(key)) > 0;
        return wire::FrameWriter(0).Field(existed ? "\1" : std::string_view("\0", 1)).Finish();
      }
      default: {
        *close_after = true;
        absl::Status s = absl::InvalidArgumentError(
            absl::StrCat("unknown store opcode ", static_cast<int>(r.first_byte())));
        ADAPTCOMM_LOG_THROTTLED(refusals_, kWarning, "TCP store: closing connection from ",
                                PeerName(fd), ": ", s.message());
        return ErrorResponse(s);
      }
    }
  }

  // The key fields that end a WAIT or MGET request; false on a truncated one.
  static bool ReadKeys(wire::FrameReader& r, std::vector<std::string>* keys) {
    std::string_view key;
    while (!r.AtEnd()) {
      if (!r.Field(&key)) return false;
      keys->emplace_back(key);
    }
    return true;
  }

  // Waits until every key is set, then copies their values into *values (optional). Past the
  // deadline: DeadlineExceeded naming the keys still missing, which go to *missing (optional).
  // Unavailable when the server stops; Cancelled when the client hung up (nobody to answer).
  //
  // Why per-key waiting: at creation every rank waits on keys that the other ranks set one by
  // one. Woken by every set and rechecking every key, N waiters of N keys cost the server N^3
  // map lookups under its one lock (and N^2 thread wake-ups); waiting on the first missing key
  // only, and never rechecking a key already seen, costs N lookups per waiter.
  absl::Status WaitFor(int fd, const std::vector<std::string>& keys, int64_t timeout_us,
                       std::vector<std::string>* values, std::vector<std::string>* missing_out)
      ABSL_LOCKS_EXCLUDED(mu_) {
    absl::Time deadline = absl::Now() + absl::Microseconds(timeout_us);
    absl::MutexLock lock(&mu_);
    size_t seen = 0;  // keys[0, seen) were set at some point during this wait
    while (true) {
      if (stopping_) return absl::UnavailableError("the store server is shutting down");
      while (seen < keys.size() && data_.count(keys[seen]) != 0) ++seen;
      if (seen == keys.size()) {
        if (values != nullptr) {
          values->clear();
          values->reserve(keys.size());
          for (const std::string& k : keys) values->push_back(data_[k]);
        }
        return absl::OkStatus();
      }
      absl::Time now = absl::Now();
      if (now >= deadline) {
        std::vector<std::string> missing;
        for (size_t i = seen; i < keys.size(); ++i) {
          if (data_.count(keys[i]) == 0) missing.push_back(keys[i]);
        }
        if (missing_out != nullptr) *missing_out = missing;
        return absl::DeadlineExceededError(absl::StrCat(
            "store keys not set within ", absl::FormatDuration(absl::Microseconds(timeout_us)),
            ": ", absl::StrJoin(missing, ", ")));
      }
      auto waiting = waiters_.try_emplace(keys[seen]).first;
      ++waiting->second.count;
      const bool timed_out =
          waiting->second.cv.WaitWithDeadline(&mu_, std::min(deadline, now + kPeerCheckInterval));
      if (--waiting->second.count == 0) waiters_.erase(waiting);
      if (timed_out && PeerGone(fd)) return absl::CancelledError("client hung up");
    }
  }

  void WakeWaitersOn(std::string_view key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (auto it = waiters_.find(key); it != waiters_.end()) it->second.cv.SignalAll();
  }

  const TcpStoreOptions options_;
  int listen_fd_ = -1;
  int port_ = 0;
  int wake_pipe_[2] = {-1, -1};
  const std::shared_ptr<ThreadCount> threads_ = std::make_shared<ThreadCount>();

  absl::Mutex conns_mu_;
  std::vector<std::unique_ptr<Conn>> conns_ ABSL_GUARDED_BY(conns_mu_);
  bool closing_ ABSL_GUARDED_BY(conns_mu_) = false;
  int64_t evicted_ ABSL_GUARDED_BY(conns_mu_) = 0;
  int64_t busy_refusals_ ABSL_GUARDED_BY(conns_mu_) = 0;
  log::LogThrottle refusals_{kRefusalLogInterval};
  log::LogThrottle busy_{kRefusalLogInterval};

  absl::Mutex budget_mu_;
  size_t frame_bytes_in_flight_ ABSL_GUARDED_BY(budget_mu_) = 0;

  absl::Mutex mu_;
  // The requests blocked on each key, so a set wakes only those (std::map: a waiter's entry
  // stays put while others come and go).
  struct KeyWaiters {
    absl::CondVar cv;
    int count = 0;
  };
  std::map<std::string, KeyWaiters, std::less<>> waiters_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::map<std::string, std::string> data_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::StatusOr<std::unique_ptr<TcpStoreServer>> StartTcpStoreServer(
    const TcpStoreOptions& options) {
  if (options.port < 0 || options.port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("TCP store: port ", options.port, " is out of range 0..65535"));
  }
  if (options.token.size() > wire::kMaxTokenBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "TCP store: the job token (ADAPTCOMM_STORE_TOKEN / store_token) is ", options.token.size(),
        " bytes; at most ", wire::kMaxTokenBytes, " are allowed"));
  }
  auto server = std::make_unique<TcpStoreServerImpl>(options);
  if (absl::Status s = server->Start(); !s.ok()) return s;
  return std::unique_ptr<TcpStoreServer>(std::move(server));
}

}  // namespace adaptcomm
