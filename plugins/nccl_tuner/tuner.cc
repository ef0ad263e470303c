#include "plugins/nccl_tuner/tuner.h"

#include <cstdlib>
#include <set>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "lib/config/tuned_table.h"

namespace adaptcomm::nccl_tuner {
namespace {

using config::TunedEntry;
using config::TunedTable;

// The table is read once per process and path: NCCL creates a tuner context per communicator,
// and a job may create many (splits, per-stage groups). Refusals are logged once each.
struct TableCache {
  std::string path;
  std::shared_ptr<const absl::StatusOr<TunedTable>> table;
  bool load_error_logged = false;
  std::set<std::pair<size_t, size_t>> shapes_logged;  // (nRanks, nNodes) refused and logged
};

absl::Mutex cache_mu(absl::kConstInit);
TableCache* cache ABSL_GUARDED_BY(cache_mu) = nullptr;

// NCCL dlclose()s the plugin with the last communicator and may load it again: the cache goes
// with the library instead of leaking once per load.
__attribute__((destructor)) void FreeCacheAtUnload() {
  absl::MutexLock lock(&cache_mu);
  delete cache;
  cache = nullptr;
}
std::atomic<bool> unset_logged{false};

int FuncOf(const std::string& op) {
  if (op == "broadcast") return kNcclFuncBroadcast;
  if (op == "reduce") return kNcclFuncReduce;
  if (op == "allgather") return kNcclFuncAllGather;
  if (op == "reduce_scatter") return kNcclFuncReduceScatter;
  if (op == "allreduce") return kNcclFuncAllReduce;
  return -1;  // the loader admits only the five above (config::TunedNcclOps())
}

bool IsCollNet(int algorithm) {
  return algorithm == kNcclAlgoCollnetDirect || algorithm == kNcclAlgoCollnetChain;
}
bool IsNvls(int algorithm) { return algorithm == kNcclAlgoNvls || algorithm == kNcclAlgoNvlsTree; }

static_assert(static_cast<int>(config::NcclAlgorithm::kTree) == kNcclAlgoTree);
static_assert(static_cast<int>(config::NcclAlgorithm::kRing) == kNcclAlgoRing);
static_assert(static_cast<int>(config::NcclAlgorithm::kCollnetDirect) == kNcclAlgoCollnetDirect);
static_assert(static_cast<int>(config::NcclAlgorithm::kCollnetChain) == kNcclAlgoCollnetChain);
static_assert(static_cast<int>(config::NcclAlgorithm::kNvls) == kNcclAlgoNvls);
static_assert(static_cast<int>(config::NcclAlgorithm::kNvlsTree) == kNcclAlgoNvlsTree);
static_assert(static_cast<int>(config::NcclAlgorithm::kPat) == kNcclAlgoPat);
static_assert(static_cast<int>(config::NcclProtocol::kLl) == kNcclProtoLl);
static_assert(static_cast<int>(config::NcclProtocol::kLl128) == kNcclProtoLl128);
static_assert(static_cast<int>(config::NcclProtocol::kSimple) == kNcclProtoSimple);

}  // namespace

void Log(NcclDebugLogger log, NcclLogLevel level, const std::string& message) {
  if (log == nullptr) return;
  unsigned long flags = kNcclSubsysInit | kNcclSubsysTuning;
  log(level, flags, __FILE__, __LINE__, "%s", absl::StrCat("adaptcomm tuner: ", message).c_str());
}

std::unique_ptr<TunerContext> TunerContext::Create(size_t n_ranks, size_t n_nodes,
                                                   NcclDebugLogger log) {
  std::unique_ptr<TunerContext> context(new TunerContext(log));
  const char* path = std::getenv(kTableEnv);
  if (path == nullptr || *path == '\0') {
    if (!unset_logged.exchange(true)) {
      Log(log, kNcclLogInfo, absl::StrCat(kTableEnv, " is not set: NCCL's own choices are used"));
    }
    return context;
  }

  std::shared_ptr<const absl::StatusOr<TunedTable>> table;
  {
    absl::MutexLock lock(&cache_mu);
    if (cache == nullptr) cache = new TableCache;
    if (cache->table == nullptr || cache->path != path) {
      cache->path = path;
      cache->table =
          std::make_shared<const absl::StatusOr<TunedTable>>(config::LoadTunedTable(path));
      cache->load_error_logged = false;
      cache->shapes_logged.clear();
    }
    table = cache->table;
    if (!table->ok()) {
      if (!cache->load_error_logged) {
        cache->load_error_logged = true;
        Log(log, kNcclLogWarn,
            absl::StrCat(kTableEnv, "=", path, " refused: ", table->status().message(),
                         "; NCCL's own choices are used"));
      }
      return context;
    }
    const config::TopologyFingerprint& fp = (*table)->fingerprint;
    const size_t tuned_ranks = static_cast<size_t>(fp.hosts) * fp.ranks_per_host;
    if (static_cast<size_t>(fp.hosts) != n_nodes || tuned_ranks != n_ranks) {
      if (cache->shapes_logged.emplace(n_ranks, n_nodes).second) {
        auto where = (*table)->fingerprint_where.find(
            static_cast<size_t>(fp.hosts) != n_nodes ? "hosts" : "ranks_per_host");
        Log(log, kNcclLogWarn,
            absl::StrCat(where != (*table)->fingerprint_where.end() ? where->second : path,
                         ": tuned for hosts=", fp.hosts, " ranks_per_host=", fp.ranks_per_host,
                         " (", tuned_ranks, " ranks), this communicator has ", n_ranks,
                         " ranks on ", n_nodes, n_nodes == 1 ? " node" : " nodes",
                         "; NCCL's own choices are used"));
      }
      return context;
    }
  }

  size_t count = 0;
  for (const TunedEntry& e : (*table)->entries) {
    int func = e.backend == "nccl" ? FuncOf(e.op) : -1;
    if (func < 0) continue;
    Band band;
    band.min_bytes = e.min_bytes;
    band.max_bytes = e.max_bytes;
    if (e.algorithm && e.protocol) {
      band.algorithm = static_cast<int>(*e.algorithm);
      band.protocol = static_cast<int>(*e.protocol);
    }
    band.channels = e.channels;
    band.label = absl::StrCat(e.where, " ", e.Describe());
    band.index = count++;
    context->bands_[func].push_back(std::move(band));
  }
  context->warned_ = std::make_unique<std::atomic<bool>[]>(count);
  for (size_t i = 0; i < count; ++i) context->warned_[i].store(false);
  Log(log, kNcclLogInfo,
      absl::StrCat(count, " NCCL bands from ", path, " for ", n_ranks, " ranks on ", n_nodes,
                   n_nodes == 1 ? " node" : " nodes"));
  return context;
}

size_t TunerContext::band_count() const {
  size_t n = 0;
  for (const auto& bands : bands_) n += bands.size();
  return n;
}

const TunerContext::Band* TunerContext::Find(NcclFunc func, size_t n_bytes) const {
  const int f = static_cast<int>(func);
  if (f < 0 || f >= kNcclNumTunedFunctions) return nullptr;
  for (const Band& band : bands_[f]) {
    if (n_bytes > band.min_bytes && n_bytes <= band.max_bytes) return &band;
  }
  return nullptr;
}

void TunerContext::WarnOnce(const Band& band, const char* why) const {
  if (warned_[band.index].exchange(true)) return;
  Log(log_, kNcclLogWarn,
      absl::StrCat(band.label, ": ", why, "; NCCL's own choice is used for this band"));
}

void TunerContext::ApplyToCostTable(NcclFunc func, size_t n_bytes, float* table, int num_algo,
                                    int num_proto, int* n_channels) const {
  const Band* band = Find(func, n_bytes);
  if (band == nullptr) return;
  if (band->algorithm >= 0) {
    if (table == nullptr || band->algorithm >= num_algo || band->protocol >= num_proto) {
      WarnOnce(*band, "this NCCL's cost table has no entry for it");
      return;
    }
    float& cost = table[band->algorithm * num_proto + band->protocol];
    // NCCL marks what it cannot run on this communicator (NCCL_ALGO_PROTO_IGNORE, -1).
    if (cost < 0.0f) {
      WarnOnce(*band, "NCCL cannot run this algorithm/protocol here");
      return;
    }
    cost = 0.0f;
  }
  if (band->channels > 0 && n_channels != nullptr) *n_channels = band->channels;
}

void TunerContext::ApplyToChoice(NcclFunc func, size_t n_bytes, int coll_net_support,
                                 int nvls_support, int* algorithm, int* protocol,
                                 int* n_channels) const {
  const Band* band = Find(func, n_bytes);
  if (band == nullptr) return;
  if (band->algorithm >= 0) {
    // The v2 interface predates PAT and says only whether CollNet and NVLS can run.
    if (band->algorithm == kNcclAlgoPat || (IsCollNet(band->algorithm) && coll_net_support != 1) ||
        (IsNvls(band->algorithm) && nvls_support != 1)) {
      WarnOnce(*band, "NCCL cannot run this algorithm here");
      return;
    }
    if (algorithm == nullptr || protocol == nullptr) return;
    *algorithm = band->algorithm;
    *protocol = band->protocol;
  }
  if (band->channels > 0 && n_channels != nullptr) *n_channels = band->channels;
}

}  // namespace adaptcomm::nccl_tuner
