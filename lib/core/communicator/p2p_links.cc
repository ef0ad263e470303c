#include "lib/core/communicator/p2p_links.h"

#include <deque>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "lib/base/wall_clock.h"

namespace adaptcomm::internal {

struct P2PLinks::Link {
  explicit Link(int other) : peer(other) {}
  const int peer;  // the other rank in the link (this rank is 0 when it sends)
  absl::Mutex mu;
  std::deque<std::shared_ptr<WorkImpl>> queue ABSL_GUARDED_BY(mu);
  // The link's communicator while its thread serves it (owned by the thread, which clears this
  // under mu before destroying it: whoever reads it under mu may use it while holding mu).
  Communicator* comm ABSL_GUARDED_BY(mu) = nullptr;
  bool made ABSL_GUARDED_BY(mu) = false;     // the thread is past making the link
  bool running ABSL_GUARDED_BY(mu) = false;  // an op of the queue is on the link's communicator
  // The ops queued while the link was being made have ended: later ones go straight to the link's
  // communicator (its worker orders them), without the thread's hand-off.
  bool direct ABSL_GUARDED_BY(mu) = false;
  bool stopping ABSL_GUARDED_BY(mu) = false;
  absl::Status failed ABSL_GUARDED_BY(mu);  // every op fails with it from now on
  std::thread thread;                       // started and joined under P2PLinks::mu_ only
};

namespace {

std::string LinkName(int from, int to) {
  return absl::StrCat("the point-to-point link ", from, " -> ", to);
}

}  // namespace

P2PLinks::P2PLinks(int rank, MakeLink make) : rank_(rank), make_(std::move(make)) {}

P2PLinks::~P2PLinks() {
  std::map<std::pair<int, int>, std::shared_ptr<Link>> links;
  {
    absl::MutexLock lock(&mu_);
    links.swap(links_);
    if (aborted_.ok()) aborted_ = absl::CancelledError("the communicator was destroyed");
  }
  const absl::Status gone =
      absl::CancelledError("the communicator was destroyed with this point-to-point op pending");
  for (auto& [ends, link] : links) {
    FailLink(*link, gone, /*stop=*/true);
    bool made;
    {
      absl::MutexLock lock(&link->mu);
      made = link->made;
    }
    if (made) {
      link->thread.join();
    } else {
      // Still meeting its peer (bounded by the init timeout): it ends on its own, holding only
      // what it shares.
      link->thread.detach();
    }
  }
}

void P2PLinks::FailLink(Link& link, const absl::Status& reason, bool stop) {
  std::deque<std::shared_ptr<WorkImpl>> dropped;
  {
    absl::MutexLock lock(&link.mu);
    if (link.failed.ok()) link.failed = reason;
    dropped.swap(link.queue);
    // Stopping leaves an idle link as a communicator goes (no failure for its peer to hear of);
    // an op of the queue in progress ends now.
    if (link.comm != nullptr && (!stop || link.running)) link.comm->Abort(reason);
    link.stopping = link.stopping || stop;
  }
  for (const std::shared_ptr<WorkImpl>& w : dropped) w->Finish(reason);
}

namespace {

// `op` (a send or receive of the parent) queued on the link `comm`, whose other rank is `peer`.
Work SubmitOnLink(Communicator& comm, const OpDesc& op, int peer) {
  const P2POptions options{.tag = op.tag, .timeout = op.timeout, .async = false};
  return op.kind == OpKind::kSend ? comm.Send(op.input, peer, options)
                                  : comm.Recv(op.output, peer, options);
}

}  // namespace

Work P2PLinks::Post(OpDesc desc) {
  const bool send = desc.kind == OpKind::kSend;
  const int from = send ? rank_ : desc.peer;
  const int to = send ? desc.peer : rank_;
  desc.seq = 0;  // the parent's numbers are its own ops'
  absl::MutexLock lock(&mu_);
  if (!aborted_.ok()) return Work(WorkImpl::Failed(std::move(desc), aborted_));
  std::shared_ptr<Link>& link = links_[{from, to}];
  if (link == nullptr) {
    link = std::make_shared<Link>(send ? 1 : 0);
    link->thread = std::thread(&P2PLinks::Serve, link, make_, from, to);
  }
  absl::MutexLock link_lock(&link->mu);
  if (!link->failed.ok()) return Work(WorkImpl::Failed(std::move(desc), link->failed));
  if (link->direct) {
    // On the link's own worker, which refuses it once the link broke or was aborted.
    return SubmitOnLink(*link->comm, desc, link->peer);
  }
  std::shared_ptr<WorkImpl> work = MakeWorkImpl(std::move(desc), WallNow());
  link->queue.push_back(work);
  return Work(std::move(work));
}

void P2PLinks::Abort(const absl::Status& reason) {
  std::vector<std::shared_ptr<Link>> links;
  {
    absl::MutexLock lock(&mu_);
    if (aborted_.ok()) aborted_ = reason;
    for (const auto& [ends, link] : links_) links.push_back(link);
  }
  for (const std::shared_ptr<Link>& link : links) FailLink(*link, reason, /*stop=*/false);
}

void P2PLinks::Serve(std::shared_ptr<Link> link, MakeLink make, int from, int to) {
  absl::StatusOr<std::unique_ptr<Communicator>> made = make(from, to);
  std::unique_ptr<Communicator> comm;
  {
    absl::MutexLock lock(&link->mu);
    link->made = true;
    if (!made.ok()) {
      if (link->failed.ok()) {
        link->failed = absl::Status(
            made.status().code(),
            absl::StrCat(LinkName(from, to), " could not be made: ", made.status().message()));
      }
    } else if (link->failed.ok()) {
      comm = *std::move(made);
      link->comm = comm.get();
    }
  }
  if (made.ok() && comm == nullptr) made->reset();  // made after an abort: not used
  auto ready = [&link]() ABSL_SHARED_LOCKS_REQUIRED(link->mu) {
    return !link->queue.empty() || link->stopping;
  };
  while (true) {
    std::shared_ptr<WorkImpl> work;
    absl::Status failed;
    {
      absl::MutexLock lock(&link->mu);
      // The ops queued while the link was made have ended: the next go straight to it.
      if (link->queue.empty() && link->comm != nullptr && link->failed.ok()) link->direct = true;
      link->mu.Await(absl::Condition(&ready));
      if (link->queue.empty()) break;  // stopping
      work = std::move(link->queue.front());
      link->queue.pop_front();
      failed = link->failed;
      link->running = failed.ok();
    }
    if (!failed.ok()) {
      work->Finish(failed);
      continue;
    }
    absl::Status status;
    if (work->MarkRunning(WallNow())) {
      // Bounded by the link's watchdog.
      status = SubmitOnLink(*comm, work->desc(), link->peer).Wait();
    }
    {
      absl::MutexLock lock(&link->mu);
      link->running = false;
      if (absl::Status health = comm->health(); !health.ok() && link->failed.ok()) {
        link->failed = absl::Status(health.code(),
                                    absl::StrCat(LinkName(from, to), " broke: ", health.message()));
      }
    }
    work->Finish(std::move(status));
  }
  {
    absl::MutexLock lock(&link->mu);
    link->comm = nullptr;
  }
}

}  // namespace adaptcomm::internal
