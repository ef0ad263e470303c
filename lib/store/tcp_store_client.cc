// The TCP store client.
//
// Requests run on pooled connections: a thread that finds none idle opens another, so that one
// thread blocked in GET/WAIT never stalls the Set another thread makes through the same client.
// A connection that failed mid-request is dropped (its framing state is unknown); the next
// request opens another. A refused connect (nobody listening) fails that request at once, so a
// dead server fails fast. A connection the server accepted but then closed or refused during the
// handshake is retried, with exponential backoff and jitter, until the connect deadline
// (min(connect_timeout, io_timeout)): the server bounds the handshakes it holds at once against
// floods and asks the surplus to come back (tcp_store_server.cc), which happens to the job's own
// ranks when hundreds of them connect together. The jitter spreads ranks that were refused
// together, so that they do not all come back together.
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "adaptcomm/store.h"
#include "lib/base/store_multi_get.h"
#include "lib/store/tcp_wire.h"

namespace adaptcomm {
namespace {

namespace wire = store_wire;

// Idle connections kept for reuse; more concurrent requests than this open and close their own.
constexpr size_t kMaxIdleConnections = 8;
// Backoff between tries to connect: doubles from the first to the cap; each sleep is drawn
// between half the backoff and all of it.
constexpr absl::Duration kFirstBackoff = absl::Milliseconds(10);
constexpr absl::Duration kMaxBackoff = absl::Seconds(1);

// A sleep for `backoff` with jitter: uniform in [backoff/2, backoff].
absl::Duration Jittered(absl::Duration backoff) {
  thread_local std::minstd_rand rng(std::random_device{}());
  std::uniform_real_distribution<double> unit(0.5, 1.0);
  return backoff * unit(rng);
}

// Sleeps for the jittered `*backoff` (not past `deadline`) and doubles it up to kMaxBackoff.
void BackOff(absl::Duration* backoff, absl::Time deadline) {
  absl::SleepFor(std::min(Jittered(*backoff), deadline - absl::Now()));
  *backoff = std::min(*backoff * 2, kMaxBackoff);
}

// Connects one socket to host:port before `deadline`; on failure returns -1 and sets *error.
int ConnectOnce(const std::string& host, int port, absl::Time deadline, std::string* error) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  std::string port_text = std::to_string(port);
  if (int rc = ::getaddrinfo(host.c_str(), port_text.c_str(), &hints, &res); rc != 0) {
    *error = absl::StrCat("cannot resolve '", host, "': ", gai_strerror(rc));
    return -1;
  }
  std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> guard(res, freeaddrinfo);
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      *error = absl::StrCat("socket: ", std::strerror(errno));
      continue;
    }
    int rc = ::connect(fd, ai->ai_addr, ai->ai_addrlen);
    int err = rc == 0 ? 0 : errno;
    if (err == EINPROGRESS) {
      while (true) {
        pollfd p{fd, POLLOUT, 0};
        int pr = ::poll(&p, 1, wire::PollMillis(deadline));
        if (pr < 0 && errno == EINTR) continue;
        if (pr <= 0) {
          err = pr == 0 ? ETIMEDOUT : errno;
        } else {
          socklen_t len = sizeof(err);
          if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
        }
        break;
      }
    }
    if (err == 0) {
      int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      return fd;
    }
    *error = std::strerror(err);
    ::close(fd);
  }
  return -1;
}

absl::Status ParseStatus(wire::FrameReader* r) {
  if (r->first_byte() == 0) return absl::OkStatus();
  std::string_view msg;
  if (!r->Field(&msg)) msg = "(no message)";
  return absl::Status(static_cast<absl::StatusCode>(r->first_byte()), std::string(msg));
}

class TcpStoreClient final : public Store {
 public:
  explicit TcpStoreClient(const TcpStoreOptions& options)
      : options_(options), addr_(absl::StrCat(options.host, ":", options.port)) {}

  ~TcpStoreClient() override {
    absl::MutexLock lock(&mu_);
    for (int fd : idle_) ::close(fd);
  }

  // The first connection: retries until connect_timeout, so that ranks may start before rank 0.
  absl::Status Connect() {
    absl::Time deadline = absl::Now() + options_.connect_timeout;
    absl::Duration backoff = kFirstBackoff;
    int attempts = 0;
    std::string last_error = "no attempt made";
    while (true) {
      ++attempts;
      auto fd = Dial(deadline, &last_error);
      if (fd.ok()) {
        Release(*fd);
        return absl::OkStatus();
      }
      if (absl::IsPermissionDenied(fd.status()) || absl::IsFailedPrecondition(fd.status())) {
        return fd.status();
      }
      if (absl::Now() >= deadline) break;
      BackOff(&backoff, deadline);
    }
    return absl::UnavailableError(absl::StrCat("cannot reach the TCP store at ", addr_, " within ",
                                               absl::FormatDuration(options_.connect_timeout), " (",
                                               attempts, " attempts): ", last_error,
                                               ". Is rank 0 up and serving at this address?"));
  }

  absl::Status Set(const std::string& key, const std::string& value) override {
    wire::FrameWriter w(wire::kSet);
    w.Field(key).Field(value);
    return Call(w, key, absl::ZeroDuration()).status();
  }

  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override {
    wire::FrameWriter w(wire::kGet);
    int64_t us = wire::TimeoutToMicros(timeout);
    w.Field(key).Int(us);
    auto body = Call(w, key, absl::Microseconds(us));
    if (!body.ok()) return body.status();
    wire::FrameReader r(*body);
    std::string_view value;
    if (!r.Field(&value) || !r.AtEnd()) return Malformed("GET");
    return std::string(value);
  }

  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override {
    wire::FrameWriter w(wire::kAdd);
    w.Field(key).Int(delta);
    auto body = Call(w, key, absl::ZeroDuration());
    if (!body.ok()) return body.status();
    wire::FrameReader r(*body);
    int64_t value = 0;
    if (!r.Int(&value) || !r.AtEnd()) return Malformed("ADD");
    return value;
  }

  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override {
    wire::FrameWriter w(wire::kWait);
    int64_t us = wire::TimeoutToMicros(timeout);
    w.Int(us);
    for (const auto& k : keys) w.Field(k);
    return Call(w, keys.empty() ? std::string() : keys[0], absl::Microseconds(us)).status();
  }

  // One MGET per batch of keys (a batch is as many as fit one request frame), which the server
  // answers once every key of it is set, or at the deadline with the keys still missing: the
  // completing rank of a store exchange reads every rank's contribution in one round trip instead
  // of one per rank. A reply over this client's max_frame_bytes is read again key by key.
  absl::StatusOr<std::vector<std::string>> MultiGet(const std::vector<std::string>& keys,
                                                    absl::Duration timeout) override {
    const absl::Time deadline = absl::Now() + timeout;
    std::vector<std::string> values, missing;
    values.reserve(keys.size());
    size_t next = 0;
    while (next < keys.size()) {
      const absl::Duration left = std::max(deadline - absl::Now(), absl::ZeroDuration());
      const int64_t us = wire::TimeoutToMicros(left);
      wire::FrameWriter w(wire::kMultiGet);
      w.Int(us);
      const size_t first = next;
      // Fields are u32 length + bytes; the first key always goes, so an oversized one is refused
      // by Call with its name.
      size_t bytes = w.body_size();
      do {
        bytes += 4 + keys[next].size();
        w.Field(keys[next++]);
      } while (next < keys.size() && bytes + 4 + keys[next].size() <= options_.max_frame_bytes);
      std::string error_reply;
      absl::StatusOr<std::string> body = Call(w, keys[first], absl::Microseconds(us), &error_reply);
      if (absl::IsResourceExhausted(body.status())) {
        const std::vector<std::string> batch(keys.begin() + first, keys.begin() + next);
        absl::StatusOr<std::vector<std::string>> one_by_one = Store::MultiGet(batch, left);
        if (!one_by_one.ok()) return one_by_one.status();
        for (std::string& v : *one_by_one) values.push_back(std::move(v));
        continue;
      }
      if (absl::IsNotFound(body.status()) || absl::IsDeadlineExceeded(body.status())) {
        // The reply names this batch's missing keys after its message; the later batches are
        // read too (without waiting: the deadline has passed), so that every missing key is named.
        wire::FrameReader r(error_reply);
        std::string_view field;
        const size_t named = missing.size();
        if (r.Field(&field)) {
          while (!r.AtEnd() && r.Field(&field)) missing.emplace_back(field);
        }
        if (!r.ok() || missing.size() == named) return body.status();
        continue;
      }
      if (!body.ok()) return body.status();
      if (!missing.empty()) continue;  // values are not returned: skip parsing
      wire::FrameReader r(*body);
      std::string_view value;
      for (size_t i = first; i < next; ++i) {
        if (!r.Field(&value)) return Malformed("MGET");
        values.emplace_back(value);
      }
      if (!r.AtEnd()) return Malformed("MGET");
    }
    if (!missing.empty()) return MultiGetMissing(missing, timeout);
    return values;
  }

  absl::StatusOr<bool> Delete(const std::string& key) override {
    wire::FrameWriter w(wire::kDelete);
    w.Field(key);
    auto body = Call(w, key, absl::ZeroDuration());
    if (!body.ok()) return body.status();
    wire::FrameReader r(*body);
    std::string_view existed;
    if (!r.Field(&existed) || existed.size() != 1 || !r.AtEnd()) return Malformed("DELETE");
    return existed[0] != 0;
  }

 private:
  absl::Status Malformed(const char* op) const {
    return absl::InternalError(
        absl::StrCat("malformed ", op, " reply from the TCP store at ", addr_));
  }

  // One connected, authenticated socket, or an error; *error gets the reason of a failed
  // connect (kept by the caller for its final message).
  // *reached (optional) says whether the TCP connection was made before the failure.
  absl::StatusOr<int> Dial(absl::Time connect_deadline, std::string* error,
                           bool* reached = nullptr) {
    int fd = ConnectOnce(options_.host, options_.port, connect_deadline, error);
    if (fd < 0) return absl::UnavailableError(*error);
    if (reached != nullptr) *reached = true;
    std::string what = absl::StrCat("the TCP store at ", addr_);
    absl::Time deadline = absl::Now() + options_.io_timeout;
    wire::FrameWriter hello(wire::kHello);
    hello.Field(wire::kMagic).Int(wire::kVersion).Field(options_.token);
    absl::Status s = wire::SendAll(fd, hello.Finish(), deadline, what);
    absl::StatusOr<std::string> reply;
    if (s.ok()) {
      reply = wire::RecvFrame(fd, options_.max_frame_bytes, deadline, options_.io_timeout, what);
      s = reply.status();
    }
    if (s.ok()) {
      wire::FrameReader r(*reply);
      s = ParseStatus(&r);
      if (absl::IsPermissionDenied(s)) {
        s = absl::PermissionDeniedError(
            absl::StrCat("the TCP store at ", addr_, " refused this client: ", s.message()));
      }
    }
    if (!s.ok()) {
      ::close(fd);
      *error = std::string(s.message());
      return s;
    }
    return fd;
  }

  absl::StatusOr<int> Acquire() {
    {
      absl::MutexLock lock(&mu_);
      if (!idle_.empty()) {
        int fd = idle_.back();
        idle_.pop_back();
        return fd;
      }
    }
    std::string error;
    const absl::Duration bound = std::min(options_.connect_timeout, options_.io_timeout);
    const absl::Time deadline = absl::Now() + bound;
    absl::Duration backoff = kFirstBackoff;
    int attempts = 0;
    while (true) {
      ++attempts;
      bool reached = false;
      absl::StatusOr<int> fd = Dial(deadline, &error, &reached);
      if (fd.ok() || absl::IsPermissionDenied(fd.status())) return fd;
      // Nobody listening (a refused connect) fails at once; so does an answer that another try
      // would not change (a protocol version the server does not speak).
      if (!reached || !absl::IsUnavailable(fd.status())) {
        return absl::UnavailableError(
            absl::StrCat("lost the TCP store at ", addr_, " and cannot reconnect: ", error));
      }
      // The server closed or refused the handshake (too many at once): try again.
      if (absl::Now() >= deadline) break;
      BackOff(&backoff, deadline);
    }
    return absl::UnavailableError(absl::StrCat(
        "lost the TCP store at ", addr_, " and cannot reconnect: ", attempts, " handshakes in ",
        absl::FormatDuration(bound), " closed or refused, the last: ", error));
  }

  void Release(int fd) {
    absl::MutexLock lock(&mu_);
    if (idle_.size() < kMaxIdleConnections) {
      idle_.push_back(fd);
    } else {
      ::close(fd);
    }
  }

  // Sends a request and returns the reply body of a successful request (its fields follow the
  // status byte, which FrameReader skips); a reply with an error becomes that status.
  // `wait` is how long the server may legitimately hold the request (GET/WAIT).
  // `error_reply` (optional) gets the body of a reply with an error, for requests whose errors
  // carry fields after the message (MGET).
  absl::StatusOr<std::string> Call(wire::FrameWriter& request, const std::string& key,
                                   absl::Duration wait, std::string* error_reply = nullptr) {
    if (request.body_size() > options_.max_frame_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "TCP store request for key '", key, "' is ", request.body_size(),
          " bytes, over max_frame_bytes=", options_.max_frame_bytes, "; store smaller values"));
    }
    std::string frame = request.Finish();
    auto fd = Acquire();
    if (!fd.ok()) return fd.status();
    std::string what = absl::StrCat("the TCP store at ", addr_);
    absl::Status s = wire::SendAll(*fd, frame, absl::Now() + options_.io_timeout, what);
    absl::StatusOr<std::string> reply;
    if (s.ok()) {
      absl::Time deadline = absl::Now() + wait + options_.io_timeout;
      reply = wire::RecvFrame(*fd, options_.max_frame_bytes, deadline, options_.io_timeout, what);
      s = reply.status();
    }
    if (!s.ok()) {
      ::close(*fd);
      // A reply over max_frame_bytes (MGET of large values): the caller may read less at once.
      if (absl::IsResourceExhausted(s)) return s;
      if (absl::IsDeadlineExceeded(s)) {
        return absl::DeadlineExceededError(
            absl::StrCat("TCP store request for key '", key, "' got no reply within ",
                         absl::FormatDuration(wait + options_.io_timeout), " (io_timeout ",
                         absl::FormatDuration(options_.io_timeout), "): ", s.message()));
      }
      return absl::UnavailableError(
          absl::StrCat("TCP store request for key '", key, "' failed: ", s.message()));
    }
    Release(*fd);
    wire::FrameReader r(*reply);
    absl::Status status = ParseStatus(&r);
    if (!status.ok()) {
      if (error_reply != nullptr) *error_reply = std::move(*reply);
      return status;
    }
    return std::move(*reply);
  }

  const TcpStoreOptions options_;
  const std::string addr_;
  absl::Mutex mu_;
  std::vector<int> idle_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::StatusOr<std::shared_ptr<Store>> ConnectTcpStore(const TcpStoreOptions& options) {
  if (options.port <= 0 || options.port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("TCP store: client port ", options.port, " is out of range 1..65535"));
  }
  if (options.token.size() > store_wire::kMaxTokenBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "TCP store: the job token (ADAPTCOMM_STORE_TOKEN / store_token) is ", options.token.size(),
        " bytes; at most ", store_wire::kMaxTokenBytes, " are allowed"));
  }
  auto client = std::make_shared<TcpStoreClient>(options);
  if (absl::Status s = client->Connect(); !s.ok()) return s;
  return std::shared_ptr<Store>(std::move(client));
}

}  // namespace adaptcomm
