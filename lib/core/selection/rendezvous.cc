#include "lib/core/selection/rendezvous.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "lib/base/log.h"
#include "lib/base/store_allgather.h"

namespace adaptcomm::internal {
namespace {

const char* Env(const char* name) {
  const char* v = std::getenv(name);
  return (v != nullptr && *v != '\0') ? v : nullptr;
}

bool IsLoopbackName(const std::string& host) {
  return host.empty() || host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1";
}

// The local IPv4 address the kernel would use to reach `host` (no packet is sent: a UDP connect
// only selects a route). Empty if the host does not resolve.
std::string LocalAddressToward(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port > 0 ? port : 9).c_str(), &hints, &res) != 0) {
    return "";
  }
  std::string local;
  int fd = socket(AF_INET, SOCK_DGRAM, 0);
  if (fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
    sockaddr_in addr{};
    socklen_t len = sizeof(addr);
    char text[INET_ADDRSTRLEN];
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0 &&
        inet_ntop(AF_INET, &addr.sin_addr, text, sizeof(text)) != nullptr) {
      local = text;
    }
  }
  if (fd >= 0) close(fd);
  freeaddrinfo(res);
  return local;
}

// Where rank 0's store listens: only on loopback when the job's master address is local (every
// rank on this host), on the master's own address when it names one of this host's interfaces,
// and on every interface otherwise (a host name that resolves to 127.0.1.1 here, as Debian's
// /etc/hosts does, is reached from other hosts through a real address).
std::string StoreBindAddress(const std::string& master) {
  if (IsLoopbackName(master)) return "127.0.0.1";
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(master.c_str(), nullptr, &hints, &res) != 0 || res == nullptr) return "0.0.0.0";
  char text[INET_ADDRSTRLEN] = {};
  const auto* addr = reinterpret_cast<const sockaddr_in*>(res->ai_addr);
  const bool resolved = inet_ntop(AF_INET, &addr->sin_addr, text, sizeof(text)) != nullptr;
  freeaddrinfo(res);
  if (!resolved || std::string(text).rfind("127.", 0) == 0) return "0.0.0.0";
  return text;
}

std::string ClaimKey(const CommunicatorOptions& o) {
  return absl::StrCat("adaptcomm/claims/", o.name, "/", *o.rank);
}
// Who holds the claim ("host:pid"), for the message that refuses a second claimant.
std::string ClaimantKey(const CommunicatorOptions& o) { return ClaimKey(o) + "/by"; }
// How long a refused claimant waits for the holder's name: the holder writes it right after its
// claim, so only a holder that died in between leaves it missing.
constexpr absl::Duration kClaimantBound = absl::Seconds(2);

std::string ThisProcess() {
  char host[256] = "unknown";
  gethostname(host, sizeof(host) - 1);
  return absl::StrCat(host, ":", getpid());
}

// Every rank's "join/<rank>" (who it is) is in before any rank goes on; returns rank 0's.
absl::StatusOr<std::string> JoinAllRanks(Store& store, const CommunicatorOptions& o,
                                         const std::string& me, absl::Time deadline) {
  absl::StatusOr<StoreGathered> joined =
      AllGatherThroughStore(store, "join/", *o.rank, *o.world_size, me, deadline);
  if (!joined.ok()) return joined.status();
  if (joined->complete) return *joined->values[0];
  return absl::DeadlineExceededError(
      absl::StrCat("rank(s) ", absl::StrJoin(joined->Missing(), ", "), " of ", *o.world_size,
                   " did not join communicator '", o.name, "' within the init timeout of ",
                   absl::FormatDuration(o.init_timeout.value_or(absl::ZeroDuration()))));
}

}  // namespace

std::string ExternalStorePrefix(const std::string& token) {
  return absl::StrCat("adaptcomm/job/", token.empty() ? "default" : token);
}

absl::StatusOr<StoreServer> ResolveStoreServer(const CommunicatorOptions& o) {
  if (o.store != nullptr) return StoreServer::kCaller;
  if (!o.store_url.value_or("").empty()) return StoreServer::kUrl;
  const char* external = Env("ADAPTCOMM_STORE_EXTERNAL");
  if (external == nullptr || std::string(external) == "0") return StoreServer::kRankZero;
  if (std::string(external) == "1") return StoreServer::kExternal;
  return absl::InvalidArgumentError(absl::StrCat(
      "ADAPTCOMM_STORE_EXTERNAL='", external,
      "': must be 1 (another process serves the store at MASTER_ADDR:MASTER_PORT and rank 0 "
      "connects to it like every other rank) or 0 (rank 0 serves it)"));
}

std::string StoreServerName(StoreServer server) {
  switch (server) {
    case StoreServer::kRankZero:
      return "rank 0";
    case StoreServer::kExternal:
      return "the process that started the ranks (ADAPTCOMM_STORE_EXTERNAL=1)";
    case StoreServer::kUrl:
      return "an external store server (CommunicatorOptions::store_url, ADAPTCOMM_STORE or the "
             "profile's store.url)";
    case StoreServer::kCaller:
      break;
  }
  return "the caller (CommunicatorOptions::store)";
}

namespace {

// Connects to the Redis or etcd server of store_url; `master` becomes its host when unset.
absl::Status ConnectUrlStore(const CommunicatorOptions& o, const std::string& token,
                             absl::Duration store_connect, absl::Time deadline, Rendezvous& rv,
                             std::string& master) {
  // A server that other jobs may share: this job's keys live under its token.
  ExternalStoreOptions external;
  external.url = *o.store_url;
  external.prefix = ExternalStorePrefix(token);
  external.connect_timeout =
      std::max(std::min(store_connect, deadline - absl::Now()), absl::Milliseconds(1));
  external.io_timeout = std::max(store_connect, absl::Seconds(1));
  absl::StatusOr<std::shared_ptr<Store>> client = ConnectExternalStore(external);
  if (!client.ok()) return client.status();
  rv.root_store = *std::move(client);
  absl::StatusOr<StoreUrl> url = ParseStoreUrl(*o.store_url);
  if (!url.ok()) return url.status();  // ConnectExternalStore accepted it: not reached
  rv.description = absl::StrCat(url->scheme, " store ", RedactedStoreUrl(*url),
                                token.empty() ? " (no job token: keys under 'default')" : "");
  // Without a master address, the transport binds to the address that routes to the store.
  if (master.empty()) master = url->host;
  return absl::OkStatus();
}

// Connects to the TCP store at master:port (MASTER_PORT), which rank 0 serves unless
// ADAPTCOMM_STORE_EXTERNAL=1.
absl::Status ConnectTcpStoreOf(const CommunicatorOptions& o, const std::string& token,
                               absl::Duration store_connect, absl::Time deadline, Rendezvous& rv,
                               std::string& master) {
  int port = o.master_port.value_or(0);
  if (!o.master_port.has_value()) {
    const char* env =
        Env("ADAPTCOMM_MASTER_PORT") ? Env("ADAPTCOMM_MASTER_PORT") : Env("MASTER_PORT");
    if (env != nullptr && (!absl::SimpleAtoi(env, &port) || port <= 0 || port > 65535)) {
      return absl::InvalidArgumentError(absl::StrCat("MASTER_PORT='", env, "' is not a TCP port"));
    }
  }
  if (port == 0) {  // neither the option nor the environment names one
    return absl::InvalidArgumentError(
        "no rendezvous: set CommunicatorOptions::store, or master_port (or MASTER_PORT), e.g. "
        "by starting ranks with `adaptcomm launch -n N -- ...` or torchrun");
  }
  if (master.empty()) master = "127.0.0.1";
  TcpStoreOptions tcp;
  tcp.host = master;
  tcp.port = port;
  tcp.token = token;
  tcp.connect_timeout =
      std::max(std::min(store_connect, deadline - absl::Now()), absl::Milliseconds(1));
  // A request the store has not answered this long past its own wait is lost (a cut link, a
  // dead rank 0): the profile's store bound, not TCP's minutes of retransmissions.
  tcp.io_timeout = std::max(store_connect, absl::Seconds(1));
  if (*o.rank == 0 && rv.store_server == StoreServer::kRankZero) {
    TcpStoreOptions serve = tcp;
    serve.host = StoreBindAddress(master);
    absl::StatusOr<std::unique_ptr<TcpStoreServer>> server = StartTcpStoreServer(serve);
    if (!server.ok() && serve.host != "0.0.0.0" && serve.host != "127.0.0.1") {
      // The master address is not one of this host's (NAT, a floating address): listen on all.
      ADAPTCOMM_LOG(kInfo, "store: cannot listen on ", serve.host, " (", server.status().message(),
                    "); listening on every interface");
      serve.host = "0.0.0.0";
      server = StartTcpStoreServer(serve);
    }
    if (!server.ok()) {
      const bool taken = absl::IsAlreadyExists(server.status()) ||
                         absl::StrContains(server.status().message(), "in use");
      return absl::Status(
          server.status().code(),
          absl::StrCat("rank 0 cannot serve the store on port ", port, ": ",
                       server.status().message(),
                       taken ? absl::StrCat("; this process (", ThisProcess(),
                                            ") is refused: another process serves that port "
                                            "(a second rank 0 of this job, or another job)")
                             : ""));
    }
    rv.server = std::move(*server);
    tcp.host = serve.host == "0.0.0.0" ? "127.0.0.1" : serve.host;
  }
  absl::StatusOr<std::shared_ptr<Store>> client = ConnectTcpStore(tcp);
  if (!client.ok() && rv.store_server == StoreServer::kExternal) {
    // No rank serves it: the process that set the variable must (adaptcomm launch --elastic).
    return absl::Status(
        client.status().code(),
        absl::StrCat(client.status().message(),
                     "; ADAPTCOMM_STORE_EXTERNAL=1 says that the process that started the ranks "
                     "(e.g. `adaptcomm launch --elastic`) serves the store, so rank 0 does not"));
  }
  if (!client.ok()) return client.status();
  rv.root_store = std::move(*client);
  rv.description = absl::StrCat("tcp store ", master, ":", port,
                                rv.store_server == StoreServer::kExternal
                                    ? " (served apart from the ranks: ADAPTCOMM_STORE_EXTERNAL=1)"
                                    : "");
  return absl::OkStatus();
}

// Who a rank is in its communicator: the incarnation and rank 0's "host:pid".
struct Joined {
  int64_t incarnation = 0;
  std::string rank_zero = "?";
};

// A replacement for a lost rank: finds the running incarnation, claiming nothing.
absl::StatusOr<Joined> FindRunningCommunicator(const CommunicatorOptions& o, absl::Time deadline,
                                               Rendezvous& rv) {
  Joined joined;
  // The running communicator is the latest incarnation that rank 0 at creation counted (every
  // rank counts the same; the count outlives rank 0 when rank 0 does not serve the store, and
  // with it a replacement for rank 0 finds the job). A lost rank's claim stays behind, so
  // nothing is claimed here. A replacement started before the job is up waits for it (bounded
  // by the init timeout).
  for (;;) {
    absl::StatusOr<int64_t> current =
        rv.root_store->Add(absl::StrCat("adaptcomm/incarnations/", o.name, "/0"), 0);
    if (!current.ok()) return current.status();
    joined.incarnation = *current;
    rv.store = CreatePrefixStore(absl::StrCat("adaptcomm/comm/", o.name, "/", joined.incarnation),
                                 rv.root_store);
    if (joined.incarnation > 0) {
      if (absl::StatusOr<std::string> zero = rv.store->Get("join/0", absl::ZeroDuration());
          zero.ok()) {
        joined.rank_zero = *std::move(zero);
        return joined;
      }
    }
    if (absl::Now() >= deadline) {
      return absl::NotFoundError(absl::StrCat("no running communicator '", o.name, "' on ",
                                              rv.description, " to join as a replacement"));
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
}

// A rank at creation: claims its rank, counts the incarnation and joins every other rank.
absl::StatusOr<Joined> ClaimAndJoin(const CommunicatorOptions& o, absl::Time deadline,
                                    Rendezvous& rv) {
  Joined joined;
  const std::string me = ThisProcess();
  absl::StatusOr<int64_t> claims = rv.root_store->Add(ClaimKey(o), 1);
  if (!claims.ok()) return claims.status();
  if (*claims != 1) {
    // Refused without touching anything of the holder's communicator: the holder and its peers
    // go on with the membership they had, which this process never entered.
    (void)rv.root_store->Add(ClaimKey(o), -1);
    const std::string holder = rv.root_store->Get(ClaimantKey(o), kClaimantBound)
                                   .value_or("a process that did not say who it is");
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", *o.rank, " of communicator '", o.name, "' is already held by ", holder,
        "; this process (", me, ") is refused: two processes were started as rank ", *o.rank,
        " (check the launcher's RANK), or two communicators sharing a store have the same "
        "CommunicatorOptions::name (give each its own); a process replacing a lost rank joins "
        "with ElasticOptions::join (ADAPTCOMM_ELASTIC_JOIN=1)"));
  }
  if (absl::Status s = rv.root_store->Set(ClaimantKey(o), me); !s.ok()) {
    (void)rv.root_store->Add(ClaimKey(o), -1);
    return s;
  }
  // Every rank creates a given name the same number of times, so the count of this rank's
  // creations is an incarnation number all ranks agree on; it keeps the keys of a communicator
  // apart from those of an earlier one of the same name on the same store.
  absl::StatusOr<int64_t> created =
      rv.root_store->Add(absl::StrCat("adaptcomm/incarnations/", o.name, "/", *o.rank), 1);
  if (!created.ok()) return created.status();
  joined.incarnation = *created;
  rv.store = CreatePrefixStore(absl::StrCat("adaptcomm/comm/", o.name, "/", joined.incarnation),
                               rv.root_store);
  absl::StatusOr<std::string> zero = JoinAllRanks(*rv.store, o, me, deadline);
  if (!zero.ok()) {
    (void)rv.root_store->Add(ClaimKey(o), -1);
    return zero.status();
  }
  joined.rank_zero = *std::move(zero);
  return joined;
}

// The interface or address the transport binds to: CommunicatorOptions::iface,
// GLOO_SOCKET_IFNAME, else the local address that routes to the master.
absl::Status ChooseTransport(const CommunicatorOptions& o, const std::string& master,
                             Rendezvous& rv) {
  if (o.iface.has_value()) {
    rv.transport_iface = *o.iface;  // "": the routed address, whatever GLOO_SOCKET_IFNAME says
  } else if (Env("GLOO_SOCKET_IFNAME") != nullptr) {
    rv.transport_iface = Env("GLOO_SOCKET_IFNAME");
  }
  if (rv.transport_iface.empty()) {
    rv.transport_host = IsLoopbackName(master) ? "127.0.0.1" : LocalAddressToward(master, 0);
    if (rv.transport_host.empty()) {
      return absl::UnavailableError(absl::StrCat(
          "no route to the master address '", master,
          "': set GLOO_SOCKET_IFNAME or CommunicatorOptions::iface to the interface to use"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Rendezvous> JoinRendezvous(const CommunicatorOptions& o,
                                          absl::Duration store_connect, absl::Time deadline,
                                          bool replacement) {
  Rendezvous rv;
  absl::StatusOr<StoreServer> server_kind = ResolveStoreServer(o);
  if (!server_kind.ok()) return server_kind.status();
  rv.store_server = *server_kind;
  std::string master = o.master_addr.value_or("");
  if (!o.master_addr.has_value()) {
    const char* env =
        Env("ADAPTCOMM_MASTER_ADDR") ? Env("ADAPTCOMM_MASTER_ADDR") : Env("MASTER_ADDR");
    if (env != nullptr) master = env;
  }
  const std::string token = o.store_token.has_value()                 ? *o.store_token
                            : Env("ADAPTCOMM_STORE_TOKEN") != nullptr ? Env("ADAPTCOMM_STORE_TOKEN")
                                                                      : "";
  if (o.store != nullptr) {
    rv.root_store = o.store;
    rv.description = "store given by the caller";
  } else if (absl::Status s =
                 rv.store_server == StoreServer::kUrl
                     ? ConnectUrlStore(o, token, store_connect, deadline, rv, master)
                     : ConnectTcpStoreOf(o, token, store_connect, deadline, rv, master);
             !s.ok()) {
    return s;
  }
  absl::StatusOr<Joined> joined =
      replacement ? FindRunningCommunicator(o, deadline, rv) : ClaimAndJoin(o, deadline, rv);
  if (!joined.ok()) return joined.status();
  // Names this job in flight-recorder dumps, so an analysis never mixes in a stale run's files.
  rv.job_id = absl::StrCat(o.name, "#", joined->incarnation, "@", joined->rank_zero);
  if (absl::Status s = ChooseTransport(o, master, rv); !s.ok()) return s;
  return rv;
}

void LeaveRendezvous(Rendezvous rendezvous, const CommunicatorOptions& o, bool healthy,
                     absl::Duration bound) {
  if (rendezvous.root_store == nullptr) return;
  struct Departure {
    Rendezvous rv;
    std::string claim;
    int rank;
    int world_size;
    absl::Duration serve_for;
    absl::Notification done;
  };
  auto departure = std::make_shared<Departure>();
  departure->rv = std::move(rendezvous);
  departure->claim = ClaimKey(o);
  departure->rank = *o.rank;
  departure->world_size = *o.world_size;
  departure->serve_for =
      healthy ? std::min(o.init_timeout.value_or(absl::Seconds(30)), absl::Seconds(30))
              : absl::Seconds(1);
  std::thread([departure] {
    Rendezvous& rv = departure->rv;
    // The name first: once the claim is gone, a new holder may write its own.
    (void)rv.root_store->Delete(departure->claim + "/by");
    (void)rv.root_store->Delete(departure->claim);
    (void)rv.store->Set(absl::StrCat("left/", departure->rank), "1");
    absl::StatusOr<int64_t> left = rv.store->Add("left", 1);
    if (rv.server != nullptr && left.ok()) {
      // Serve until the others have left too, within a bound: a dead peer must not hold us here.
      const absl::Time until = absl::Now() + departure->serve_for;
      while (absl::Now() < until) {
        absl::StatusOr<int64_t> count = rv.store->Add("left", 0);
        if (!count.ok() || *count >= departure->world_size) break;
        absl::SleepFor(absl::Milliseconds(10));
      }
    }
    rv.store.reset();
    rv.root_store.reset();
    rv.server.reset();
    departure->done.Notify();
  }).detach();
  if (!departure->done.WaitForNotificationWithTimeout(bound)) {
    ADAPTCOMM_LOG(kWarning, "communicator '", o.name, "' rank ", *o.rank,
                  ": leaving the rendezvous did not finish within ", absl::FormatDuration(bound),
                  " (the store is unreachable or overloaded); not waiting for it");
  }
}

}  // namespace adaptcomm::internal
