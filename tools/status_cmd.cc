// `adaptcomm status`: one line per rank of a running job, read from the state records the ranks
// publish to the job's store (lib/core/communicator/observability.h); no collective, so it answers
// while the job hangs, and names the ranks whose records stopped moving.
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "adaptcomm/store.h"
#include "lib/core/communicator/observability.h"
#include "lib/core/selection/rendezvous.h"
#include "nlohmann/json.hpp"
#include "tools/subcommands.h"

namespace adaptcomm::tools {
namespace {

// Exit codes besides 0 (every rank healthy) and kExitUsage.
constexpr int kExitStore = 1;      // the store refused us or could not be reached
constexpr int kExitUnhealthy = 3;  // a rank is stopped, hung, failed or gone

struct Args {
  std::string store;
  std::string token;
  std::string comm = "default";
  bool json = false;
  double timeout_s = 5;
};

struct RankState {
  int rank = 0;
  bool found = false;
  nlohmann::json record;
  int64_t age_ms = -1;  // since its last look
  std::string state;    // ok, stopped, left, failed, missing
  std::vector<int> waits_on;
};

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? std::string() : std::string(v);
}

std::string DefaultStore() {
  std::string host = Env("ADAPTCOMM_MASTER_ADDR");
  if (host.empty()) host = Env("MASTER_ADDR");
  std::string port = Env("ADAPTCOMM_MASTER_PORT");
  if (port.empty()) port = Env("MASTER_PORT");
  if (port.empty()) return "";
  return absl::StrCat(host.empty() ? "127.0.0.1" : host, ":", port);
}

std::string Bytes(uint64_t b) {
  if (b >= (uint64_t{1} << 20)) return absl::StrFormat("%.1f MiB", b / 1048576.0);
  if (b >= 1024) return absl::StrFormat("%.1f KiB", b / 1024.0);
  return absl::StrCat(b, " B");
}

std::string Millis(int64_t ms) {
  return ms >= 1000 ? absl::StrFormat("%.1f s", ms / 1000.0) : absl::StrCat(ms, " ms");
}

// Who holds each rank up: a rank in collective #N waits on every rank that is stopped, or has not
// entered #N yet. Only for an op older than a publish interval: a live peer's record is at most
// that old, so it was taken after the rank entered #N (younger ops would compare snapshots of
// different moments).
void InferWaits(std::vector<RankState>& ranks, int64_t now_ms) {
  for (RankState& r : ranks) {
    if (!r.found || r.state != "ok" || !r.record["op"].is_object()) continue;
    const nlohmann::json& op = r.record["op"];
    const int64_t entered = op["entered_ms"].get<int64_t>();
    if (now_ms - entered <= r.record["interval_ms"].get<int64_t>()) continue;
    const uint64_t seq = op["seq"].get<uint64_t>();
    for (const RankState& q : ranks) {
      if (q.rank == r.rank) continue;
      const bool stuck = !q.found || q.state == "stopped" || q.state == "left";
      const bool behind = q.found && q.record["last_enqueued"].get<uint64_t>() < seq;
      if (stuck || behind) r.waits_on.push_back(q.rank);
    }
  }
}

std::string Line(const RankState& r, int64_t now_ms) {
  if (!r.found) return absl::StrCat("rank ", r.rank, "  missing  (no state record)");
  const nlohmann::json& j = r.record;
  std::string line = absl::StrFormat("rank %d  %-8s", r.rank, r.state);
  if (r.state == "stopped") {
    absl::StrAppend(&line, " (no update for ", Millis(r.age_ms), ": stopped, hung or dead)");
  } else if (r.state == "failed") {
    absl::StrAppend(&line, " (", j["health"].get<std::string>(), ")");
  }
  if (j["op"].is_object()) {
    const nlohmann::json& op = j["op"];
    const int64_t started = op["started_ms"].get<int64_t>();
    const int64_t since = started > 0 ? started : op["entered_ms"].get<int64_t>();
    absl::StrAppend(&line, "  in ", op["kind"].get<std::string>(), " #", op["seq"].get<uint64_t>(),
                    " (", Bytes(op["bytes"].get<uint64_t>()), ", ",
                    started > 0 ? "running" : "queued", " for ", Millis(now_ms - since), ")");
  } else {
    absl::StrAppend(&line, "  idle");
  }
  absl::StrAppend(&line, "  last completed #", j["last_completed"].get<uint64_t>());
  if (!r.waits_on.empty()) absl::StrAppend(&line, "  waits on ", absl::StrJoin(r.waits_on, ","));
  absl::StrAppend(&line, "  slowness ", j["slowness"].get<double>(), "  pid ",
                  j["pid"].get<int64_t>(), "@", j["host"].get<std::string>());
  return line;
}

// The job's store at `where`: a Redis or etcd URL (the job's keys under its token), or the TCP
// store at HOST:PORT. `*shown` is `where` as it may be printed (no password).
absl::StatusOr<std::shared_ptr<Store>> ConnectJobStore(const Args& a, const std::string& where,
                                                       std::string* shown) {
  const std::string token = a.token.empty() ? Env("ADAPTCOMM_STORE_TOKEN") : a.token;
  *shown = where;
  if (where.find("://") != std::string::npos) {
    absl::StatusOr<StoreUrl> url = ParseStoreUrl(where);
    if (!url.ok()) return url.status();
    *shown = RedactedStoreUrl(*url);
    ExternalStoreOptions e;
    e.url = where;
    e.prefix = internal::ExternalStorePrefix(token);
    e.connect_timeout = absl::Seconds(a.timeout_s);
    e.io_timeout = absl::Seconds(a.timeout_s);
    return ConnectExternalStore(e);
  }
  const size_t colon = where.rfind(':');
  int port = 0;
  if (where.empty() || colon == std::string::npos ||
      !absl::SimpleAtoi(where.substr(colon + 1), &port) || port <= 0 || port > 65535) {
    return absl::InvalidArgumentError(
        "no store address: give --store HOST:PORT or a redis:// or etcd:// URL (or set "
        "ADAPTCOMM_STORE, or MASTER_ADDR and MASTER_PORT)");
  }
  TcpStoreOptions o;
  o.host = where.substr(0, colon);
  o.port = port;
  o.token = token;
  o.connect_timeout = absl::Seconds(a.timeout_s);
  o.io_timeout = absl::Seconds(a.timeout_s);
  return ConnectTcpStore(o);
}

int Run(const Args& a) {
  std::string where = a.store;
  if (where.empty()) where = Env("ADAPTCOMM_STORE");
  if (where.empty()) where = DefaultStore();
  std::string shown;
  absl::StatusOr<std::shared_ptr<Store>> store = ConnectJobStore(a, where, &shown);
  where = shown;
  if (absl::IsInvalidArgument(store.status())) {
    std::fprintf(stderr, "status: %s\n", std::string(store.status().message()).c_str());
    return kExitUsage;
  }
  absl::StatusOr<std::string> world_text =
      store.ok() ? (*store)->Get(internal::StatusKey(a.comm, "world"), absl::ZeroDuration())
                 : absl::StatusOr<std::string>(store.status());
  if (!world_text.ok()) {
    // A refused token says so and nothing else: the store reveals nothing to a stranger.
    if (absl::IsNotFound(world_text.status())) {
      std::fprintf(stderr, "status: no state records of communicator '%s' in the store at %s\n",
                   a.comm.c_str(), where.c_str());
    } else {
      std::fprintf(stderr, "status: store %s: %s\n", where.c_str(),
                   std::string(world_text.status().message()).c_str());
    }
    return kExitStore;
  }
  int world = 0;
  if (!absl::SimpleAtoi(*world_text, &world) || world < 1) {
    std::fprintf(stderr, "status: bad world size record '%s'\n", world_text->c_str());
    return kExitStore;
  }
  const int64_t now_ms = absl::ToUnixMillis(absl::Now());
  std::vector<RankState> ranks(static_cast<size_t>(world));
  bool healthy = true;
  for (int r = 0; r < world; ++r) {
    RankState& s = ranks[static_cast<size_t>(r)];
    s.rank = r;
    absl::StatusOr<std::string> record =
        (*store)->Get(internal::StatusKey(a.comm, absl::StrCat("rank", r)), absl::ZeroDuration());
    if (record.ok()) s.record = nlohmann::json::parse(*record, nullptr, false);
    s.found = record.ok() && s.record.is_object();
    if (!s.found) {
      s.state = "missing";
      healthy = false;
      continue;
    }
    int64_t seen = s.record["t_ms"].get<int64_t>();
    absl::StatusOr<std::string> alive =
        (*store)->Get(internal::StatusKey(a.comm, absl::StrCat("alive", r)), absl::ZeroDuration());
    int64_t stamp = 0;
    if (alive.ok() && absl::SimpleAtoi(*alive, &stamp)) seen = std::max(seen, stamp);
    s.age_ms = now_ms - seen;
    const int64_t interval = s.record["interval_ms"].get<int64_t>();
    const std::string health = s.record["health"].get<std::string>();
    // A live rank looks every interval: half an interval more is the publisher's own jitter.
    if (health == "left") {
      s.state = "left";
    } else if (s.age_ms > interval + interval / 2) {
      s.state = "stopped";
    } else {
      s.state = health == "ok" ? "ok" : "failed";
    }
    healthy = healthy && s.state == "ok";
  }
  InferWaits(ranks, now_ms);
  if (a.json) {
    nlohmann::json out;
    out["communicator"] = a.comm;
    out["world"] = world;
    out["ranks"] = nlohmann::json::array();
    for (const RankState& s : ranks) {
      nlohmann::json j = s.found ? s.record : nlohmann::json::object();
      j["rank"] = s.rank;
      j["state"] = s.state;
      j["age_ms"] = s.age_ms;
      j["waits_on"] = s.waits_on;
      if (s.found && j["op"].is_object()) {
        const int64_t started = j["op"]["started_ms"].get<int64_t>();
        j["op"]["for_ms"] = now_ms - (started > 0 ? started : j["op"]["entered_ms"].get<int64_t>());
      }
      out["ranks"].push_back(std::move(j));
    }
    std::printf("%s\n", out.dump(2).c_str());
  } else {
    std::printf("communicator '%s', %d ranks (store %s)\n", a.comm.c_str(), world, where.c_str());
    for (const RankState& s : ranks) std::printf("%s\n", Line(s, now_ms).c_str());
  }
  return healthy ? 0 : kExitUnhealthy;
}

std::function<int()> SetupStatus(CLI::App& sub) {
  auto a = std::make_shared<Args>();
  sub.add_option("--store", a->store,
                 "The job's store, HOST:PORT or a redis:// or etcd:// URL (default: "
                 "$ADAPTCOMM_STORE, else MASTER_ADDR:MASTER_PORT, or the ADAPTCOMM_ variants)");
  sub.add_option("--token", a->token, "The job's store token (default: $ADAPTCOMM_STORE_TOKEN)");
  sub.add_option("--comm", a->comm, "Communicator name (default: default)");
  sub.add_option("--timeout", a->timeout_s, "Bound of the store connection and each read")
      ->check(DurationSeconds(false));
  sub.add_flag("--json", a->json, "Machine-readable output");
  sub.footer(
      "One line per rank: state (ok; stopped: its record has not moved for 1.5 publish "
      "intervals, so it is stopped, hung or dead; failed; left; missing), its current op (kind, "
      "sequence number, bytes, how long it runs), the last op it completed, the ranks it waits "
      "on (stopped, or not yet in its op), its slowness score, pid and host. Reads the records "
      "ranks publish to the store (profile status.*); runs no collective, so it answers while "
      "the job hangs. A store that refuses the token reveals nothing.\n"
      "Exit codes: 0 every rank ok, 1 store unreachable or refused or no records, 2 usage, 3 a "
      "rank is not ok.");
  return [a] { return Run(*a); };
}

}  // namespace

ADAPTCOMM_SUBCOMMAND(status, "One line per rank of a running job, from the store (no collective)",
                     SetupStatus);

}  // namespace adaptcomm::tools
