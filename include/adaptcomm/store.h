// Store: the key-value rendezvous that ranks use to find each other (and, later, to agree on
// retries, fallbacks and configuration hashes).
//
// Implementations: a TCP store (rank 0 or the launcher serves, every rank is a client), clients
// of an existing distributed store (Redis, etcd: docs/stores.md), a file store (a shared
// directory), an in-process hash store (ranks as threads), and a prefix view of any of them.
// Thread safety: every Store method is safe to call concurrently from many threads.
// Every blocking call has a bound; none waits forever.
#ifndef ADAPTCOMM_STORE_H_
#define ADAPTCOMM_STORE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "adaptcomm/export.h"

namespace adaptcomm {

class ADAPTCOMM_EXPORT Store {
 public:
  virtual ~Store() = default;

  // Sets key to value, replacing any earlier value, and wakes waiters on key.
  [[nodiscard]] virtual absl::Status Set(const std::string& key, const std::string& value) = 0;
  // The value of key, waiting up to `timeout` for it to be set. DeadlineExceeded names the key.
  // A zero timeout checks once: NotFound if the key is absent.
  [[nodiscard]] virtual absl::StatusOr<std::string> Get(const std::string& key,
                                                        absl::Duration timeout) = 0;
  // Adds delta to the integer stored at key (absent = 0) and returns the new value, atomically.
  [[nodiscard]] virtual absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) = 0;
  // Waits until every key exists; DeadlineExceeded names the keys still missing.
  [[nodiscard]] virtual absl::Status Wait(const std::vector<std::string>& keys,
                                          absl::Duration timeout) = 0;
  // Deletes key; returns whether it existed.
  [[nodiscard]] virtual absl::StatusOr<bool> Delete(const std::string& key) = 0;
  // The values of `keys`, in their order, waiting up to `timeout` in all for every one to be set.
  // DeadlineExceeded names the keys still missing; a zero timeout checks once (NotFound naming
  // them). A store that can read many keys in one request overrides it (Redis: MGET); this
  // default reads them one after the other through Get.
  [[nodiscard]] virtual absl::StatusOr<std::vector<std::string>> MultiGet(
      const std::vector<std::string>& keys, absl::Duration timeout);
};

// ---- TCP store ----
struct TcpStoreOptions {
  std::string host = "127.0.0.1";  // where the server listens (server) or connects (client)
  int port = 0;                    // 0 on the server: pick a free port (see TcpStoreServer::port)
  // Shared secret of the job: a client must present it; compared in constant time. Empty = none.
  std::string token;
  absl::Duration connect_timeout = absl::Seconds(60);  // client: retry connecting until then
  absl::Duration io_timeout = absl::Seconds(300);      // bound of any single request
  size_t max_frame_bytes = 64 << 20;                   // larger frames are refused
};

// The server side. Runs its own threads; the destructor stops them and closes every connection.
class ADAPTCOMM_EXPORT TcpStoreServer {
 public:
  virtual ~TcpStoreServer() = default;
  virtual int port() const = 0;
};
[[nodiscard]] ADAPTCOMM_EXPORT absl::StatusOr<std::unique_ptr<TcpStoreServer>> StartTcpStoreServer(
    const TcpStoreOptions& options);
// A client. Unavailable after connect_timeout names host:port.
[[nodiscard]] ADAPTCOMM_EXPORT absl::StatusOr<std::shared_ptr<Store>> ConnectTcpStore(
    const TcpStoreOptions& options);

// ---- external stores: a Redis or etcd server run apart from the job (docs/stores.md) ----
// "redis://[user:password@]host[:port]" (port 6379 when left out) or
// "etcd://[user:password@]host[:port]" (2379; etcd's v3 HTTP/JSON gateway). User and password
// may be percent-encoded; "redis://:password@host" authenticates as Redis's default user.
struct StoreUrl {
  std::string scheme;    // "redis" or "etcd"
  std::string user;      // empty: none (Redis: AUTH with the password alone)
  std::string password;  // empty: no authentication
  std::string host;
  int port = 0;
};
// InvalidArgument naming what is wrong with `url` (the password never appears in it).
[[nodiscard]] ADAPTCOMM_EXPORT absl::StatusOr<StoreUrl> ParseStoreUrl(const std::string& url);
// The URL as text with the password replaced by "***": for logs, errors and Explain().
ADAPTCOMM_EXPORT std::string RedactedStoreUrl(const StoreUrl& url);
// Whether this build has the client of `scheme` ("redis": hiredis, "etcd": libcurl).
ADAPTCOMM_EXPORT bool ExternalStoreBuiltIn(const std::string& scheme);

struct ExternalStoreOptions {
  std::string url;     // see StoreUrl
  std::string prefix;  // every key is stored under prefix + "/" (the job's namespace); empty: none
  absl::Duration connect_timeout = absl::Seconds(60);  // retry reaching the server until then
  absl::Duration io_timeout = absl::Seconds(300);      // bound of any single request
};
// A client of the server at options.url, checked with one round trip (and the credentials).
// InvalidArgument for a bad URL; FailedPrecondition when this build lacks the scheme's client
// library; PermissionDenied for missing or refused credentials; Unavailable when the server does
// not answer within connect_timeout.
[[nodiscard]] ADAPTCOMM_EXPORT absl::StatusOr<std::shared_ptr<Store>> ConnectExternalStore(
    const ExternalStoreOptions& options);

// ---- other stores ----
// Keys are files in `directory` (created if missing); suits a shared file system.
[[nodiscard]] ADAPTCOMM_EXPORT absl::StatusOr<std::shared_ptr<Store>> CreateFileStore(
    const std::string& directory);
// In-process store, for ranks run as threads of one process.
ADAPTCOMM_EXPORT std::shared_ptr<Store> CreateHashStore();
// A view of `base` in which every key is prefixed with `prefix` + "/".
ADAPTCOMM_EXPORT std::shared_ptr<Store> CreatePrefixStore(std::string prefix,
                                                          std::shared_ptr<Store> base);

}  // namespace adaptcomm

#endif  // ADAPTCOMM_STORE_H_
