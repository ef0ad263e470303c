// The etcd store: a client of etcd's v3 HTTP/JSON gateway (POST /v3/kv/..., libcurl), for jobs
// that outgrow rank 0's TCP store.
//
// Keys and values travel base64-encoded, as the gateway wants them. Add is a compare-and-swap
// transaction on the key's mod_revision (absent: 0) whose failure branch returns the current
// value, retried after a random sleep until it wins. Get and Wait poll (PollBackoff) until their
// deadline: a watch over the gateway is a long-lived stream per waiter, which costs the server more
// than a bounded poll for the few keys a rank waits on. With credentials, the client gets a token
// from /v3/auth/authenticate and sends it with each request, fetching a new one when the server
// says it expired.
#include <curl/curl.h>
#include <fcntl.h>

#include <algorithm>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "lib/base/store_multi_get.h"
#include "lib/store/external_store.h"
#include "nlohmann/json.hpp"

namespace adaptcomm::external_store {
namespace {

using Json = nlohmann::json;
// Handles (each with its open connection) kept for reuse, as the Redis store keeps connections.
constexpr size_t kMaxIdleHandles = 8;
// etcd refuses a transaction of more operations than its --max-txn-ops, 128 by default.
constexpr size_t kMaxTxnRanges = 128;
// The window of the random sleep after an add lost its compare-and-swap to another client's.
constexpr absl::Duration kFirstAddWindow = absl::Milliseconds(1);
constexpr absl::Duration kMaxAddWindow = absl::Milliseconds(64);

std::minstd_rand& Rng() {
  thread_local std::minstd_rand rng(std::random_device{}());
  return rng;
}

struct CurlDeleter {
  void operator()(CURL* c) const { curl_easy_cleanup(c); }
};
using Handle = std::unique_ptr<CURL, CurlDeleter>;

size_t Append(char* data, size_t size, size_t n, void* out) {
  static_cast<std::string*>(out)->append(data, size * n);
  return size * n;
}

// A process the trainer starts must not inherit (and keep open) the job's store connections.
int CloseOnExec(void*, curl_socket_t fd, curlsocktype) {
  ::fcntl(fd, F_SETFD, FD_CLOEXEC);
  return CURL_SOCKOPT_OK;
}

std::string B64(const std::string& s) { return absl::Base64Escape(s); }

// The string at j[name] (the gateway writes int64 fields as strings), or `fallback` when absent:
// proto3's JSON leaves out fields at their default (an empty value, a zero count).
std::string Field(const Json& j, const char* name, std::string fallback = "") {
  if (!j.is_object()) return fallback;
  auto it = j.find(name);
  if (it == j.end() || !it->is_string()) return fallback;
  return it->get<std::string>();
}

// The first key-value of a range response, if any: (value, mod_revision).
struct Found {
  bool present = false;
  std::string value;
  std::string mod_revision = "0";
};
absl::StatusOr<Found> FirstKv(const Json& range) {
  Found f;
  auto kvs = range.is_object() ? range.find("kvs") : range.end();
  if (!range.is_object() || kvs == range.end() || !kvs->is_array() || kvs->empty()) return f;
  const Json& kv = (*kvs)[0];
  f.present = true;
  f.mod_revision = Field(kv, "mod_revision", "0");
  if (!absl::Base64Unescape(Field(kv, "value"), &f.value)) {
    return absl::DataLossError("etcd returned a value that is not base64");
  }
  return f;
}

class EtcdStore final : public Store {
 public:
  EtcdStore(StoreUrl url, ExternalStoreOptions options)
      : url_(std::move(url)),
        options_(std::move(options)),
        where_(RedactedStoreUrl(url_)),
        base_(absl::StrCat("http://",
                           url_.host.find(':') != std::string::npos
                               ? absl::StrCat("[", url_.host, "]")
                               : url_.host,
                           ":", url_.port)) {}

  // Reaches the server (retrying until connect_timeout while nobody listens), authenticates and
  // reads one key.
  absl::Status Start() {
    const absl::Time deadline = absl::Now() + options_.connect_timeout;
    absl::Duration backoff = absl::Milliseconds(10);
    for (;;) {
      absl::Status s = url_.password.empty() ? absl::OkStatus() : Authenticate();
      if (s.ok()) s = Range("adaptcomm/ping").status();
      if (s.ok() || !absl::IsUnavailable(s) || absl::Now() + backoff >= deadline) return s;
      absl::SleepFor(backoff);
      backoff = std::min(backoff * 2, absl::Seconds(1));
    }
  }

  absl::Status Set(const std::string& key, const std::string& value) override {
    return Post("/v3/kv/put", {{"key", B64(key)}, {"value", B64(value)}}).status();
  }

  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override {
    const absl::Time deadline = absl::Now() + timeout;
    PollBackoff backoff;
    for (;;) {
      absl::StatusOr<Found> f = Range(key);
      if (!f.ok()) return f.status();
      if (f->present) return std::move(f->value);
      if (absl::Now() >= deadline) return GetMissing(key, timeout);
      backoff.Sleep(deadline);
    }
  }

  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override {
    const absl::Time deadline = absl::Now() + options_.io_timeout;
    absl::Duration window = kFirstAddWindow;
    absl::StatusOr<Found> current = Range(key);
    for (;;) {
      if (!current.ok()) return current.status();
      int64_t value = 0;
      if (current->present && !absl::SimpleAtoi(current->value, &value)) {
        return absl::InvalidArgumentError(
            absl::StrCat("store key '", key, "' holds a non-integer value; cannot add to it"));
      }
      value += delta;
      Json txn = {{"compare", Json::array({{{"key", B64(key)},
                                            {"target", "MOD"},
                                            {"result", "EQUAL"},
                                            {"mod_revision", current->mod_revision}}})},
                  {"success",
                   Json::array({{{"request_put",
                                  {{"key", B64(key)}, {"value", B64(std::to_string(value))}}}}})},
                  {"failure", Json::array({{{"request_range", {{"key", B64(key)}}}}})}};
      absl::StatusOr<Json> r = Post("/v3/kv/txn", txn);
      if (!r.ok()) return r.status();
      if (r->is_object() && r->value("succeeded", false)) return value;
      // Another client changed the key first: the failure branch read its new value.
      const Json* range = nullptr;
      if (auto rs = r->find("responses"); rs != r->end() && rs->is_array() && !rs->empty()) {
        if (auto rr = (*rs)[0].find("response_range"); rr != (*rs)[0].end()) range = &*rr;
      }
      if (range == nullptr) {
        return absl::InternalError(
            absl::StrCat("etcd store ", where_, ": a failed txn returned no range"));
      }
      if (absl::Now() >= deadline) {
        return absl::UnavailableError(absl::StrCat("etcd store ", where_, ": add to '", key,
                                                   "' lost every race for ",
                                                   absl::FormatDuration(options_.io_timeout)));
      }
      current = FirstKv(*range);
      // Ranks that retried at once would collide again: of n contenders one wins per round, so
      // the server would serve n^2/2 transactions for n adds. A sleep drawn uniformly below a
      // doubling window ("full jitter") spreads them out.
      std::uniform_int_distribution<int64_t> draw(0, absl::ToInt64Microseconds(window));
      absl::SleepFor(std::min(absl::Microseconds(draw(Rng())), deadline - absl::Now()));
      window = std::min(window * 2, kMaxAddWindow);
    }
  }

  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override {
    const absl::Time deadline = absl::Now() + timeout;
    std::vector<std::string> missing = keys;
    PollBackoff backoff;
    for (;;) {
      absl::StatusOr<std::vector<Found>> found = RangeMany(missing);
      if (!found.ok()) return found.status();
      std::vector<std::string> still;
      for (size_t i = 0; i < missing.size(); ++i) {
        if (!(*found)[i].present) still.push_back(missing[i]);
      }
      missing.swap(still);
      if (missing.empty()) return absl::OkStatus();
      if (absl::Now() >= deadline) return WaitMissing(missing, timeout);
      backoff.Sleep(deadline);
    }
  }

  // One transaction per kMaxTxnRanges keys per poll: the completing rank of a store exchange reads
  // every rank's contribution in a few round trips instead of one per rank.
  absl::StatusOr<std::vector<std::string>> MultiGet(const std::vector<std::string>& keys,
                                                    absl::Duration timeout) override {
    const absl::Time deadline = absl::Now() + timeout;
    PollBackoff backoff;
    for (;;) {
      absl::StatusOr<std::vector<Found>> found = RangeMany(keys);
      if (!found.ok()) return found.status();
      std::vector<std::string> values, missing;
      for (size_t i = 0; i < keys.size(); ++i) {
        if ((*found)[i].present) {
          values.push_back(std::move((*found)[i].value));
        } else {
          missing.push_back(keys[i]);
        }
      }
      if (missing.empty()) return values;
      if (absl::Now() >= deadline) return MultiGetMissing(missing, timeout);
      backoff.Sleep(deadline);
    }
  }

  absl::StatusOr<bool> Delete(const std::string& key) override {
    absl::StatusOr<Json> r = Post("/v3/kv/deleterange", {{"key", B64(key)}});
    if (!r.ok()) return r.status();
    return Field(*r, "deleted", "0") != "0";
  }

 private:
  absl::StatusOr<Found> Range(const std::string& key) {
    absl::StatusOr<Json> r = Post("/v3/kv/range", {{"key", B64(key)}});
    if (!r.ok()) return r.status();
    return FirstKv(*r);
  }

  // Reads every key, kMaxTxnRanges to a transaction (a transaction without compares runs its
  // success branch: one range per key, answered in order).
  absl::StatusOr<std::vector<Found>> RangeMany(const std::vector<std::string>& keys) {
    std::vector<Found> found;
    found.reserve(keys.size());
    for (size_t first = 0; first < keys.size(); first += kMaxTxnRanges) {
      const size_t end = std::min(keys.size(), first + kMaxTxnRanges);
      if (end - first == 1) {
        absl::StatusOr<Found> f = Range(keys[first]);
        if (!f.ok()) return f.status();
        found.push_back(*std::move(f));
        continue;
      }
      Json ranges = Json::array();
      for (size_t i = first; i < end; ++i) {
        ranges.push_back({{"request_range", {{"key", B64(keys[i])}}}});
      }
      absl::StatusOr<Json> r = Post("/v3/kv/txn", {{"success", std::move(ranges)}});
      if (!r.ok()) return r.status();
      auto rs = r->is_object() ? r->find("responses") : r->end();
      if (!r->is_object() || rs == r->end() || !rs->is_array() || rs->size() != end - first) {
        return absl::InternalError(absl::StrCat("etcd store ", where_, ": a txn of ", end - first,
                                                " ranges returned another number of responses"));
      }
      for (const Json& one : *rs) {
        auto range = one.is_object() ? one.find("response_range") : one.end();
        // An empty range comes back as an empty object, or without the field at all.
        absl::StatusOr<Found> f =
            FirstKv(one.is_object() && range != one.end() ? *range : Json::object());
        if (!f.ok()) return f.status();
        found.push_back(*std::move(f));
      }
    }
    return found;
  }

  absl::Status Authenticate() {
    absl::StatusOr<Json> r = Exchange("/v3/auth/authenticate",
                                      Json{{"name", url_.user}, {"password", url_.password}}.dump(),
                                      /*token=*/"");
    if (!r.ok()) {
      if (absl::IsUnavailable(r.status()) || absl::IsDeadlineExceeded(r.status())) {
        return r.status();
      }
      return absl::PermissionDeniedError(absl::StrCat("etcd store ", where_,
                                                      " refused the credentials of user '",
                                                      url_.user, "': ", r.status().message()));
    }
    const std::string token = Field(*r, "token");
    if (token.empty()) {
      return absl::PermissionDeniedError(absl::StrCat("etcd store ", where_,
                                                      ": authentication returned no token (is auth "
                                                      "enabled on the server?)"));
    }
    absl::MutexLock lock(&mu_);
    token_ = token;
    return absl::OkStatus();
  }

  // A request with the current token; on an expired or unknown token, authenticates once more.
  absl::StatusOr<Json> Post(const char* path, const Json& body) {
    const std::string text = body.dump();
    std::string token;
    {
      absl::MutexLock lock(&mu_);
      token = token_;
    }
    absl::StatusOr<Json> r = Exchange(path, text, token);
    if (r.ok()) return r;
    if (!url_.password.empty()) {
      if (!absl::IsUnauthenticated(r.status())) return r;
      if (absl::Status s = Authenticate(); !s.ok()) return s;
      absl::MutexLock lock(&mu_);
      token = token_;
    } else if (absl::IsUnauthenticated(r.status()) || absl::IsPermissionDenied(r.status())) {
      return absl::PermissionDeniedError(absl::StrCat(
          "etcd store ", where_, " requires a user and password (", r.status().message(),
          "): give them in the URL, etcd://user:password@host:port"));
    } else {
      return r;
    }
    return Exchange(path, text, token);
  }

  // One HTTP POST. Unavailable when the server cannot be reached or does not answer within
  // io_timeout; Unauthenticated for a refused token; Internal for other errors it reports.
  absl::StatusOr<Json> Exchange(const char* path, const std::string& body,
                                const std::string& token) {
    Handle h = Take();
    if (h == nullptr) return absl::ResourceExhaustedError("curl: cannot allocate a handle");
    CURL* c = h.get();
    const std::string url = base_ + path;
    std::string response;
    curl_slist* headers = curl_slist_append(nullptr, "Content-Type: application/json");
    std::string auth;
    if (!token.empty()) {
      auth = absl::StrCat("Authorization: ", token);
      headers = curl_slist_append(headers, auth.c_str());
    }
    std::unique_ptr<curl_slist, decltype(&curl_slist_free_all)> header_guard(headers,
                                                                             curl_slist_free_all);
    curl_easy_setopt(c, CURLOPT_URL, url.c_str());
    curl_easy_setopt(c, CURLOPT_POST, 1L);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, body.data());
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE, static_cast<long>(body.size()));
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, &Append);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &response);
    curl_easy_setopt(c, CURLOPT_SOCKOPTFUNCTION, &CloseOnExec);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);  // timeouts without SIGALRM: many threads call
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS,
                     static_cast<long>(absl::ToInt64Milliseconds(options_.io_timeout)));
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS,
                     static_cast<long>(absl::ToInt64Milliseconds(
                         std::min(options_.io_timeout, options_.connect_timeout))));
    const CURLcode rc = curl_easy_perform(c);
    if (rc != CURLE_OK) {
      return absl::UnavailableError(absl::StrCat("etcd store ", where_, ": POST ", path,
                                                 " failed: ", curl_easy_strerror(rc)));
    }
    long status = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    Give(std::move(h));
    Json j = Json::parse(response, nullptr, /*allow_exceptions=*/false);
    if (status == 200 && !j.is_discarded()) return j;
    std::string message = Field(j, "message", Field(j, "error", response.substr(0, 200)));
    const int code = j.is_object() && j.contains("code") && j["code"].is_number_integer()
                         ? j["code"].get<int>()
                         : 0;
    if (code == 16 || status == 401 || absl::StrContains(message, "invalid auth token") ||
        absl::StrContains(message, "user name is empty")) {
      return absl::UnauthenticatedError(message);
    }
    if (code == 7 || absl::StrContains(message, "permission denied") ||
        absl::StrContains(message, "authentication failed")) {
      return absl::PermissionDeniedError(message);
    }
    if (status >= 500 || code == 14) {
      return absl::UnavailableError(
          absl::StrCat("etcd store ", where_, ": POST ", path, ": HTTP ", status, ": ", message));
    }
    return absl::InternalError(
        absl::StrCat("etcd store ", where_, ": POST ", path, ": HTTP ", status, ": ", message));
  }

  Handle Take() {
    {
      absl::MutexLock lock(&mu_);
      if (!idle_.empty()) {
        Handle h = std::move(idle_.back());
        idle_.pop_back();
        return h;
      }
    }
    return Handle(curl_easy_init());
  }
  void Give(Handle h) {
    absl::MutexLock lock(&mu_);
    if (idle_.size() < kMaxIdleHandles) idle_.push_back(std::move(h));
  }

  const StoreUrl url_;
  const ExternalStoreOptions options_;
  const std::string where_;
  const std::string base_;
  absl::Mutex mu_;
  std::string token_ ABSL_GUARDED_BY(mu_);
  // Idle handles keep their connections open for the next request.
  std::vector<Handle> idle_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::StatusOr<std::shared_ptr<Store>> ConnectEtcd(const StoreUrl& url,
                                                   const ExternalStoreOptions& options) {
  // Not thread-safe, and needed once per process before any handle.
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
  auto store = std::make_shared<EtcdStore>(url, options);
  if (absl::Status s = store->Start(); !s.ok()) return s;
  return store;
}

}  // namespace adaptcomm::external_store
