#include "lib/diag/rank_group.h"

#include <memory>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "adaptcomm/store.h"
#include "lib/core/log.h"

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

}  // namespace

std::vector<absl::Status> RunRankGroup(const RankGroupOptions& options,
                                       const std::function<absl::Status(Communicator&)>& body) {
  CommunicatorOptions base = options.comm;
  if (base.init_timeout <= absl::ZeroDuration()) base.init_timeout = absl::Seconds(60);
  if (options.local_ranks <= 0) return {RunOne(base, body)};

  const int n = options.local_ranks;
  TcpStoreOptions so;
  so.host = "127.0.0.1";
  so.port = 0;
  so.connect_timeout = base.init_timeout;
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
