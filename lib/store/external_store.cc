// The choice of client for an external store URL, and what a build without that client says.
#include "lib/store/external_store.h"

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "adaptcomm/store.h"

namespace adaptcomm {

namespace external_store {
#ifndef ADAPTCOMM_HAVE_HIREDIS
absl::StatusOr<std::shared_ptr<Store>> ConnectRedis(const StoreUrl&, const ExternalStoreOptions&) {
  return absl::FailedPreconditionError("the redis client was not built in");
}
#endif
#ifndef ADAPTCOMM_HAVE_CURL
absl::StatusOr<std::shared_ptr<Store>> ConnectEtcd(const StoreUrl&, const ExternalStoreOptions&) {
  return absl::FailedPreconditionError("the etcd client was not built in");
}
#endif
}  // namespace external_store

bool ExternalStoreBuiltIn(const std::string& scheme) {
#ifdef ADAPTCOMM_HAVE_HIREDIS
  if (scheme == "redis") return true;
#endif
#ifdef ADAPTCOMM_HAVE_CURL
  if (scheme == "etcd") return true;
#endif
  (void)scheme;
  return false;
}

absl::StatusOr<std::shared_ptr<Store>> ConnectExternalStore(const ExternalStoreOptions& options) {
  absl::StatusOr<StoreUrl> url = ParseStoreUrl(options.url);
  if (!url.ok()) return url.status();
  if (!ExternalStoreBuiltIn(url->scheme)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "store ", RedactedStoreUrl(*url), ": this adaptcomm was built without the ", url->scheme,
        " client (",
        url->scheme == "redis" ? "hiredis: libhiredis-dev" : "libcurl: libcurl4-openssl-dev",
        " was not found at build time; install it with scripts/install-deps.sh and rebuild)"));
  }
  if (options.connect_timeout <= absl::ZeroDuration() ||
      options.io_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("store timeouts must be positive");
  }
  absl::StatusOr<std::shared_ptr<Store>> store = url->scheme == "redis"
                                                     ? external_store::ConnectRedis(*url, options)
                                                     : external_store::ConnectEtcd(*url, options);
  if (!store.ok() || options.prefix.empty()) return store;
  return CreatePrefixStore(options.prefix, *std::move(store));
}

}  // namespace adaptcomm
