#include "lib/gloo/gloo_pairs.h"

#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gloo/common/error.h"
#include "gloo/transport/pair.h"

// tcp::Context::signalException(const std::string&), which Gloo itself calls when an
// unbound-buffer wait times out: it sets an IoException on every pair of the context, wakes every
// buffer waiting on them and closes the sockets (the peers then fail with "Connection closed by
// peer"). Context::closeConnections() alone closes the sockets but leaves a local waiter asleep
// until its timeout, so an abort needs this. The member is protected, and Debian's libgloo-dev
// ships gloo/transport/tcp/context.h without the gloo/common/memory.h it includes, so the class
// cannot be named here: the exported symbol is bound by its Itanium-mangled name (a non-virtual
// member taking `this` first). A Gloo without it fails at load time, not silently. It skips the
// pairs not created yet.
void AdaptcommGlooTcpContextSignalException(void* tcp_context, const std::string& message) __asm__(
    "_ZN4gloo9transport3tcp7Context15signalExceptionERKNSt7__cxx1112basic_stringIcSt11char_"
    "traitsIcESaIcEEE");

namespace adaptcomm::gloo_backend {
namespace {

// How often a wait for a peer's address looks at SignalAll: the abort latency of a rank waiting
// for a peer that has not reached the op yet.
constexpr absl::Duration kAbortPoll = absl::Milliseconds(500);

std::chrono::milliseconds Ms(absl::Duration d) {
  return std::chrono::milliseconds(std::max<int64_t>(absl::ToInt64Milliseconds(d), 1));
}

// Whether tcp::Pair::connect makes this end the one that dials (rather than accepts): it compares
// the two addresses (gloo/transport/tcp/pair.cc, "Addresses have to be ordered
// deterministically"): IP bytes, then the ports as stored; the larger address dials. The bytes
// are tcp::Address's: a sockaddr_storage first.
bool Dials(const std::string& self, const std::string& peer) {
  if (self.size() < sizeof(sockaddr_storage) || peer.size() < sizeof(sockaddr_storage)) {
    return false;
  }
  sockaddr_storage a;
  sockaddr_storage b;
  std::memcpy(&a, self.data(), sizeof(a));
  std::memcpy(&b, peer.data(), sizeof(b));
  int rv = 0;
  if (a.ss_family == AF_INET && b.ss_family == AF_INET) {
    const auto* sa = reinterpret_cast<const sockaddr_in*>(&a);
    const auto* sb = reinterpret_cast<const sockaddr_in*>(&b);
    rv = std::memcmp(&sa->sin_addr, &sb->sin_addr, sizeof(in_addr));
    if (rv == 0) rv = sa->sin_port - sb->sin_port;
  } else if (a.ss_family == AF_INET6 && b.ss_family == AF_INET6) {
    const auto* sa = reinterpret_cast<const sockaddr_in6*>(&a);
    const auto* sb = reinterpret_cast<const sockaddr_in6*>(&b);
    rv = std::memcmp(&sa->sin6_addr, &sb->sin6_addr, sizeof(in6_addr));
    if (rv == 0) rv = sa->sin6_port - sb->sin6_port;
  }
  return rv > 0;
}

std::string RankList(const std::vector<int>& ranks) {
  std::string out;
  constexpr size_t kShown = 8;
  for (size_t i = 0; i < ranks.size() && i < kShown; ++i) {
    absl::StrAppend(&out, i == 0 ? "" : ", ", ranks[i]);
  }
  if (ranks.size() > kShown) absl::StrAppend(&out, ", ... (", ranks.size(), " in all)");
  return out;
}

}  // namespace

std::string PairKey(int rank, int peer) { return absl::StrCat("pair/", rank, "/", peer); }

LazyPairs::LazyPairs(std::shared_ptr<::gloo::transport::Context> context,
                     std::shared_ptr<Store> store, int max_connections,
                     std::chrono::milliseconds context_timeout)
    : context_(std::move(context)),
      store_(std::move(store)),
      rank_(context_->rank),
      max_connections_(max_connections),
      context_timeout_(context_timeout),
      connected_(static_cast<size_t>(context_->size)),
      own_address_(static_cast<size_t>(context_->size)) {}

absl::Status LazyPairs::AbortedStatus() const {
  absl::MutexLock lock(&mu_);
  if (!aborted_) return absl::OkStatus();
  return absl::AbortedError(abort_message_);
}

void LazyPairs::SignalAll(const std::string& message) {
  absl::MutexLock lock(&mu_);
  if (!aborted_) {
    aborted_ = true;
    abort_message_ = message;
  }
  // tcp::Context is the only transport this backend creates; its transport::Context base is its
  // primary base, so the pointers coincide.
  AdaptcommGlooTcpContextSignalException(static_cast<void*>(context_.get()), message);
}

absl::StatusOr<std::string> LazyPairs::CreateEnd(int peer, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  if (aborted_) return absl::AbortedError(abort_message_);
  // A pair takes the context's timeout when created and waits up to 5 times it to connect
  // (tcp::Pair::waitUntil): a fifth of what is left of the deadline bounds that wait.
  context_->setTimeout(Ms((deadline - absl::Now()) / 5));
  std::string address;
  try {
    std::unique_ptr<::gloo::transport::Pair>& pair = context_->createPair(peer);
    const std::vector<char> bytes = pair->address().bytes();
    address.assign(bytes.begin(), bytes.end());
  } catch (const std::exception& e) {
    context_->setTimeout(context_timeout_);
    return absl::UnavailableError(
        absl::StrCat("cannot open a socket for the connection with rank ", peer, ": ", e.what()));
  }
  context_->setTimeout(context_timeout_);
  return address;
}

absl::StatusOr<std::string> LazyPairs::AwaitPeerAddress(int peer, absl::Time deadline,
                                                        absl::FunctionRef<std::string()> what) {
  const absl::Time start = absl::Now();
  for (;;) {
    if (absl::Status s = AbortedStatus(); !s.ok()) return s;
    const absl::Duration left = deadline - absl::Now();
    absl::StatusOr<std::string> value =
        store_->Get(PairKey(peer, rank_), std::clamp(left, absl::ZeroDuration(), kAbortPoll));
    if (value.ok()) return value;
    const bool timed_out =
        absl::IsDeadlineExceeded(value.status()) || absl::IsNotFound(value.status());
    if (!timed_out) {
      return absl::UnavailableError(absl::StrCat(what(), ": rank ", rank_,
                                                 ": the store failed while reading rank ", peer,
                                                 "'s address: ", value.status().ToString()));
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat(what(), ": rank ", rank_, " waited ",
                       absl::FormatDuration(absl::Now() - start), " (its bound) for rank ", peer,
                       " to publish its address for their connection (store key '",
                       PairKey(peer, rank_), "'): rank ", peer, " never reached this op"));
    }
  }
}

absl::Status LazyPairs::ConnectEnd(int peer, const std::string& address, absl::Time deadline,
                                   absl::Duration bound, absl::FunctionRef<std::string()> what) {
  std::string error;
  try {
    context_->getPair(peer)->connect(std::vector<char>(address.begin(), address.end()));
    connected_[static_cast<size_t>(peer)].store(true, std::memory_order_release);
    return absl::OkStatus();
  } catch (const std::exception& e) {
    error = e.what();
  }
  if (absl::Status s = AbortedStatus(); !s.ok()) return s;
  if (absl::StrContains(error, "timeout") || absl::Now() >= deadline) {
    return absl::DeadlineExceededError(
        absl::StrCat(what(), ": rank ", rank_, " could not connect to rank ", peer, " within ",
                     absl::FormatDuration(bound), " (its bound): ", error));
  }
  return absl::UnavailableError(
      absl::StrCat(what(), ": rank ", rank_, " could not connect to rank ", peer, ": ", error));
}

absl::Status LazyPairs::Connect(const std::vector<int>& peers, absl::Time deadline,
                                absl::FunctionRef<std::string()> what) {
  std::vector<int> fresh;
  for (const int p : peers) {
    if (!connected(p) && p != rank_) fresh.push_back(p);
  }
  if (fresh.empty()) return absl::OkStatus();
  const absl::Duration bound = deadline - absl::Now();
  if (open() + static_cast<int>(fresh.size()) > max_connections_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        what(), ": rank ", rank_, " would need ", fresh.size(), " more connection(s) (to rank ",
        RankList(fresh), ") with ", open(), " open, past gloo.max_connections = ", max_connections_,
        " (raise it for this op's world size)"));
  }
  // Publish every end first (see the header), then read the peers' ends.
  for (const int p : fresh) {
    auto& own = own_address_[static_cast<size_t>(p)];
    if (own.empty()) {
      absl::StatusOr<std::string> address = CreateEnd(p, deadline);
      if (!address.ok()) {
        return absl::Status(address.status().code(), absl::StrCat(what(), ": rank ", rank_, ": ",
                                                                  address.status().message()));
      }
      own = *std::move(address);
      ++open_;
      if (absl::Status s = store_->Set(PairKey(rank_, p), own); !s.ok()) {
        return absl::UnavailableError(absl::StrCat(what(), ": rank ", rank_,
                                                   ": the store failed while publishing the "
                                                   "address for rank ",
                                                   p, ": ", s.ToString()));
      }
    }
  }
  // Dial as soon as a peer's address is in, answer only once every dial is done: a dialled end
  // completes without its owner's help (the kernel accepts for the listening socket), so every
  // rank gets through its dials, and then finds its answers waiting. A rank that fails waiting for
  // one peer has already dialled the others, which therefore do not fail with it.
  std::vector<std::pair<int, std::string>> answers;
  for (const int p : fresh) {
    absl::StatusOr<std::string> address = AwaitPeerAddress(p, deadline, what);
    if (!address.ok()) return address.status();
    if (!Dials(own_address_[static_cast<size_t>(p)], *address)) {
      answers.emplace_back(p, *std::move(address));
      continue;
    }
    if (absl::Status s = ConnectEnd(p, *address, deadline, bound, what); !s.ok()) return s;
  }
  for (const auto& [p, address] : answers) {
    if (absl::Status s = ConnectEnd(p, address, deadline, bound, what); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace adaptcomm::gloo_backend
