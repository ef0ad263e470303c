#include "lib/diag/rank_group.h"

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "adaptcomm/store.h"
#include "lib/base/log.h"

namespace adaptcomm::diag {
namespace {

absl::Status RunOne(const CommunicatorOptions& options,
                    const std::function<absl::Status(Communicator&)>& body) {
  auto comm = Communicator::Create(options);
  if (!comm.ok()) {
    return absl::Status(comm.status().code(),
                        absl::StrCat("creating the communicator: ", comm.status().message()));
  }
  return body(**comm);
}

// 16 bytes of /dev/urandom as hex; nullopt if it cannot be read.
std::optional<std::string> RandomToken() {
  std::FILE* f = std::fopen("/dev/urandom", "rb");
  if (f == nullptr) return std::nullopt;
  char bytes[16];
  const bool read = std::fread(bytes, 1, sizeof(bytes), f) == sizeof(bytes);
  std::fclose(f);
  if (!read) return std::nullopt;
  return absl::BytesToHexString(absl::string_view(bytes, sizeof(bytes)));
}

// The loopback store's token: the job's (options, else ADAPTCOMM_STORE_TOKEN), as the ranks of a
// launched job would use it; with none, a fresh one, since only this process's threads ever need
// to reach that store and any local process could otherwise join or rewrite it.
absl::StatusOr<std::string> LoopbackStoreToken(const CommunicatorOptions& options) {
  if (options.store_token.has_value()) {
    if (!options.store_token->empty()) return *options.store_token;
    // Set to "" (no job token): only this process's threads reach the store, so a fresh one.
  } else if (const char* env = std::getenv("ADAPTCOMM_STORE_TOKEN");
             env != nullptr && *env != '\0') {
    return std::string(env);
  }
  std::optional<std::string> fresh = RandomToken();
  if (!fresh) return absl::UnavailableError("cannot read /dev/urandom for the store token");
  return *fresh;
}

}  // namespace

std::vector<absl::Status> RunRankGroup(const RankGroupOptions& options,
                                       const std::function<absl::Status(Communicator&)>& body) {
  CommunicatorOptions base = options.comm;
  if (!base.init_timeout) base.init_timeout = absl::Seconds(60);
  if (options.local_ranks <= 0) return {RunOne(base, body)};

  const int n = options.local_ranks;
  TcpStoreOptions so;
  so.host = "127.0.0.1";
  so.port = 0;
  so.connect_timeout = *base.init_timeout;
  absl::StatusOr<std::string> token = LoopbackStoreToken(base);
  if (!token.ok()) return std::vector<absl::Status>(n, token.status());
  so.token = *std::move(token);
  auto server = StartTcpStoreServer(so);
  if (!server.ok()) {
    return std::vector<absl::Status>(
        n, absl::Status(server.status().code(), absl::StrCat("starting the loopback TCP store: ",
                                                             server.status().message())));
  }
  so.port = (*server)->port();
  std::vector<absl::Status> out(n);
  std::vector<std::thread> threads;
  threads.reserve(n);
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      log::ScopedThreadRank rank_for_logs(r);
      auto store = ConnectTcpStore(so);
      if (!store.ok()) {
        out[r] = store.status();
        return;
      }
      CommunicatorOptions o = base;
      o.rank = r;
      o.world_size = n;
      o.master_addr = "127.0.0.1";
      o.store = *store;
      out[r] = RunOne(o, body);
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

absl::Status FirstError(const std::vector<absl::Status>& statuses) {
  for (size_t i = 0; i < statuses.size(); ++i) {
    if (statuses[i].ok()) continue;
    if (statuses.size() == 1) return statuses[i];
    return absl::Status(statuses[i].code(), absl::StrCat("rank ", i, ": ", statuses[i].message()));
  }
  return absl::OkStatus();
}

}  // namespace adaptcomm::diag
