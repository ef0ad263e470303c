// The Redis store: a client of a Redis server (hiredis), for jobs that outgrow rank 0's TCP store.
//
// Requests run on pooled connections, one request per connection at a time (a hiredis context is
// not thread-safe), so that a thread polling for a key never stalls another thread's Set. A
// connection that failed mid-request is dropped; the next request opens another. Add is INCRBY,
// atomic on the server; Get and Wait poll (PollBackoff) until their deadline.
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <sys/time.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "lib/base/store_multi_get.h"
#include "lib/store/external_store.h"

namespace adaptcomm::external_store {
namespace {

// Connections kept for reuse: enough for a rank's threads that use the store at once (the worker,
// the heartbeat, a waiting Get); more concurrent requests open and close their own.
constexpr size_t kMaxIdleConnections = 8;

timeval Timeval(absl::Duration d) {
  d = std::max(d, absl::Milliseconds(1));
  return absl::ToTimeval(d);
}

struct ContextDeleter {
  void operator()(redisContext* c) const { redisFree(c); }
};
using Context = std::unique_ptr<redisContext, ContextDeleter>;
struct ReplyDeleter {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using Reply = std::unique_ptr<redisReply, ReplyDeleter>;

class RedisStore final : public Store {
 public:
  RedisStore(StoreUrl url, ExternalStoreOptions options)
      : url_(std::move(url)), options_(std::move(options)), where_(RedactedStoreUrl(url_)) {}

  // Opens the first connection, retrying a server that is not up yet until connect_timeout, and
  // checks the credentials with a PING.
  absl::Status Start() {
    const absl::Time deadline = absl::Now() + options_.connect_timeout;
    absl::Duration backoff = absl::Milliseconds(10);
    for (;;) {
      absl::StatusOr<Context> c = Open(deadline);
      if (c.ok()) {
        absl::StatusOr<Reply> pong = Run(**c, {"PING"});
        if (!pong.ok()) return pong.status();
        if (absl::Status s = CheckError(**pong, "PING"); !s.ok()) return s;
        Release(*std::move(c));
        return absl::OkStatus();
      }
      if (!absl::IsUnavailable(c.status()) || absl::Now() + backoff >= deadline) {
        return c.status();
      }
      absl::SleepFor(backoff);
      backoff = std::min(backoff * 2, absl::Seconds(1));
    }
  }

  absl::Status Set(const std::string& key, const std::string& value) override {
    absl::StatusOr<Reply> r = Request({"SET", key, value});
    if (!r.ok()) return r.status();
    return CheckError(**r, "SET");
  }

  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override {
    const absl::Time deadline = absl::Now() + timeout;
    PollBackoff backoff;
    for (;;) {
      absl::StatusOr<Reply> r = Request({"GET", key});
      if (!r.ok()) return r.status();
      if (absl::Status s = CheckError(**r, "GET"); !s.ok()) return s;
      if ((*r)->type == REDIS_REPLY_STRING) return std::string((*r)->str, (*r)->len);
      if (absl::Now() >= deadline) return GetMissing(key, timeout);
      backoff.Sleep(deadline);
    }
  }

  // One MGET per poll, whatever the number of keys: the completing rank of a store exchange reads
  // every rank's contribution in one round trip instead of one per rank.
  absl::StatusOr<std::vector<std::string>> MultiGet(const std::vector<std::string>& keys,
                                                    absl::Duration timeout) override {
    if (keys.empty()) return std::vector<std::string>{};
    const absl::Time deadline = absl::Now() + timeout;
    std::vector<std::string> mget = {"MGET"};
    mget.insert(mget.end(), keys.begin(), keys.end());
    PollBackoff backoff;
    for (;;) {
      absl::StatusOr<Reply> r = Request(mget);
      if (!r.ok()) return r.status();
      if (absl::Status s = CheckError(**r, "MGET"); !s.ok()) return s;
      if ((*r)->type != REDIS_REPLY_ARRAY || (*r)->elements != keys.size()) {
        return Unexpected("MGET");
      }
      std::vector<std::string> values;
      std::vector<std::string> missing;
      for (size_t i = 0; i < keys.size(); ++i) {
        const redisReply* e = (*r)->element[i];
        if (e->type == REDIS_REPLY_STRING) {
          values.emplace_back(e->str, e->len);
        } else {
          missing.push_back(keys[i]);
        }
      }
      if (missing.empty()) return values;
      if (absl::Now() >= deadline) return MultiGetMissing(missing, timeout);
      backoff.Sleep(deadline);
    }
  }

  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override {
    absl::StatusOr<Reply> r = Request({"INCRBY", key, std::to_string(delta)});
    if (!r.ok()) return r.status();
    if ((*r)->type == REDIS_REPLY_ERROR && absl::StrContains((*r)->str, "not an integer")) {
      return absl::InvalidArgumentError(
          absl::StrCat("store key '", key, "' holds a non-integer value; cannot add to it"));
    }
    if (absl::Status s = CheckError(**r, "INCRBY"); !s.ok()) return s;
    if ((*r)->type != REDIS_REPLY_INTEGER) return Unexpected("INCRBY");
    return static_cast<int64_t>((*r)->integer);
  }

  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override {
    if (keys.empty()) return absl::OkStatus();
    const absl::Time deadline = absl::Now() + timeout;
    std::vector<std::string> exists = {"EXISTS"};
    exists.insert(exists.end(), keys.begin(), keys.end());
    PollBackoff backoff;
    for (;;) {
      // One round trip per poll: EXISTS counts every key that is there.
      absl::StatusOr<Reply> r = Request(exists);
      if (!r.ok()) return r.status();
      if (absl::Status s = CheckError(**r, "EXISTS"); !s.ok()) return s;
      if ((*r)->type != REDIS_REPLY_INTEGER) return Unexpected("EXISTS");
      if ((*r)->integer >= static_cast<long long>(keys.size())) return absl::OkStatus();
      if (absl::Now() >= deadline) break;
      backoff.Sleep(deadline);
    }
    std::vector<std::string> missing;
    for (const std::string& key : keys) {
      absl::StatusOr<Reply> r = Request({"EXISTS", key});
      if (!r.ok()) return r.status();
      if ((*r)->type == REDIS_REPLY_INTEGER && (*r)->integer == 0) missing.push_back(key);
    }
    return WaitMissing(missing, timeout);
  }

  absl::StatusOr<bool> Delete(const std::string& key) override {
    absl::StatusOr<Reply> r = Request({"DEL", key});
    if (!r.ok()) return r.status();
    if (absl::Status s = CheckError(**r, "DEL"); !s.ok()) return s;
    if ((*r)->type != REDIS_REPLY_INTEGER) return Unexpected("DEL");
    return (*r)->integer > 0;
  }

 private:
  // A new connection, authenticated. Unavailable when the server cannot be reached.
  absl::StatusOr<Context> Open(absl::Time deadline) {
    Context c(
        redisConnectWithTimeout(url_.host.c_str(), url_.port,
                                Timeval(std::min(deadline - absl::Now(), options_.io_timeout))));
    if (c == nullptr) return absl::ResourceExhaustedError("redis: cannot allocate a context");
    if (c->err != 0) {
      return absl::UnavailableError(
          absl::StrCat("redis store ", where_, ": cannot connect: ", c->errstr));
    }
    // hiredis opens its socket without close-on-exec: a process the trainer starts must not
    // inherit (and keep open) the job's store connections.
    ::fcntl(c->fd, F_SETFD, FD_CLOEXEC);
    if (redisSetTimeout(c.get(), Timeval(options_.io_timeout)) != REDIS_OK) {
      return absl::UnavailableError(
          absl::StrCat("redis store ", where_, ": cannot set the I/O timeout: ", c->errstr));
    }
    if (!url_.password.empty()) {
      std::vector<std::string> auth = {"AUTH"};
      if (!url_.user.empty()) auth.push_back(url_.user);
      auth.push_back(url_.password);
      absl::StatusOr<Reply> r = Run(*c, auth);
      if (!r.ok()) return r.status();
      if ((*r)->type == REDIS_REPLY_ERROR) {
        return absl::PermissionDeniedError(
            absl::StrCat("redis store ", where_, " refused the credentials of user '",
                         url_.user.empty() ? "default" : url_.user, "': ", (*r)->str));
      }
    }
    return c;
  }

  // One command on `c`; Unavailable (and `c` unusable) when the connection failed or timed out.
  absl::StatusOr<Reply> Run(redisContext& c, const std::vector<std::string>& argv) {
    std::vector<const char*> args;
    std::vector<size_t> lens;
    for (const std::string& a : argv) {
      args.push_back(a.data());
      lens.push_back(a.size());
    }
    Reply r(static_cast<redisReply*>(
        redisCommandArgv(&c, static_cast<int>(args.size()), args.data(), lens.data())));
    if (r == nullptr) {
      return absl::UnavailableError(
          absl::StrCat("redis store ", where_, ": ", argv[0], " failed: ", c.errstr,
                       " (bound: ", absl::FormatDuration(options_.io_timeout), ")"));
    }
    return r;
  }

  // Runs one command on a pooled connection (or a new one), returning the connection after it.
  absl::StatusOr<Reply> Request(const std::vector<std::string>& argv) {
    Context c;
    {
      absl::MutexLock lock(&mu_);
      if (!idle_.empty()) {
        c = std::move(idle_.back());
        idle_.pop_back();
      }
    }
    if (c == nullptr) {
      absl::StatusOr<Context> opened = Open(absl::Now() + options_.connect_timeout);
      if (!opened.ok()) return opened.status();
      c = *std::move(opened);
    }
    absl::StatusOr<Reply> r = Run(*c, argv);
    if (r.ok()) Release(std::move(c));
    return r;
  }

  void Release(Context c) {
    absl::MutexLock lock(&mu_);
    if (idle_.size() < kMaxIdleConnections) idle_.push_back(std::move(c));
  }

  absl::Status CheckError(const redisReply& r, const char* command) const {
    if (r.type != REDIS_REPLY_ERROR) return absl::OkStatus();
    const std::string text(r.str, r.len);
    if (absl::StartsWith(text, "NOAUTH")) {
      return absl::PermissionDeniedError(
          absl::StrCat("redis store ", where_, " requires a password (", text,
                       "): give it in the URL, redis://[user]:password@host:port"));
    }
    if (absl::StartsWith(text, "NOPERM")) {
      return absl::PermissionDeniedError(absl::StrCat("redis store ", where_, ": user '", url_.user,
                                                      "' may not ", command, ": ", text));
    }
    return absl::InternalError(absl::StrCat("redis store ", where_, ": ", command, ": ", text));
  }

  absl::Status Unexpected(const char* command) const {
    return absl::InternalError(
        absl::StrCat("redis store ", where_, ": unexpected reply type to ", command));
  }

  const StoreUrl url_;
  const ExternalStoreOptions options_;
  const std::string where_;
  absl::Mutex mu_;
  std::vector<Context> idle_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::StatusOr<std::shared_ptr<Store>> ConnectRedis(const StoreUrl& url,
                                                    const ExternalStoreOptions& options) {
  auto store = std::make_shared<RedisStore>(url, options);
  if (absl::Status s = store->Start(); !s.ok()) return s;
  return store;
}

}  // namespace adaptcomm::external_store
