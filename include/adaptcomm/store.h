// Store: the key-value rendezvous that ranks use to find each other (and, later, to agree on
// retries, fallbacks and configuration hashes).
//
// Implementations: a TCP store (rank 0 or the launcher serves, every rank is a client), a file
// store (a shared directory), an in-process hash store (ranks as threads), and a prefix view of
// any of them.
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
