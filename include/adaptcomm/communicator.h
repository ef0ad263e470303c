// Communicator: a group of ranks running collectives over one Backend.
//
//   auto comm = adaptcomm::Communicator::Create({});   // rank/world from torchrun, OpenMPI, Slurm
//   if (!comm.ok()) return Fail(comm.status());
//   adaptcomm::Work w = (*comm)->Allreduce(adaptcomm::HostView(grad.data(), grad.size()),
//                                          {.op = adaptcomm::ReduceOp::kAvg});
//   absl::Status s = w.Wait();
//
// Ownership: Create() returns the only owner; the Communicator owns its Backend and threads.
// Destruction waits for queued operations (each within its own timeout), then closes the backend.
// Thread safety: every method may be called from any thread. Operations run one at a time, in the
// order they were issued (the sequence number); REQUIRES: every rank issues the same collectives
// in the same order, as with every collective library.
#ifndef ADAPTCOMM_COMMUNICATOR_H_
#define ADAPTCOMM_COMMUNICATOR_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "adaptcomm/capabilities.h"
#include "adaptcomm/export.h"
#include "adaptcomm/profile.h"
#include "adaptcomm/store.h"
#include "adaptcomm/types.h"
#include "adaptcomm/work.h"

namespace adaptcomm {

// BackendChoice and Fallback are in profile.h (a profile chooses them too).

class Backend;  // the extension interface, adaptcomm/ext/backend.h

// Where rank, world size and the master address came from.
struct LaunchInfo {
  int rank = -1;
  int world_size = -1;
  int local_rank = -1;
  int local_world_size = -1;
  std::string master_addr;
  int master_port = 0;
  std::string source;  // "torchrun", "openmpi", "slurm", "options"
};
// Reads the variables of torchrun (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT),
// OpenMPI (OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK) or Slurm (SLURM_PROCID, SLURM_NTASKS,
// SLURM_LOCALID), in that order; MASTER_ADDR/MASTER_PORT (or ADAPTCOMM_MASTER_ADDR/_PORT) give
// the store address under every launcher. NotFound when no launcher is recognised.
[[nodiscard]] ADAPTCOMM_EXPORT absl::StatusOr<LaunchInfo> DetectLaunchEnvironment();
// The CUDA device of this process's rank, as the NCCL backend picks it: ADAPTCOMM_CUDA_DEVICE,
// else the launcher's local rank (LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID), else 0.
// Allocate the tensors you pass to the communicator there.
ADAPTCOMM_EXPORT int DefaultCudaDevice();

// LossPolicy (what a lost rank does to the job) is in profile.h: a profile chooses it too.

// The communicator's current members, as a trainer sees them (Communicator::membership()).
struct Membership {
  int rank = 0;
  int world_size = 1;
  int generation = 0;  // of the backend; every coordinated retry or membership change adds one
  int changes = 0;     // membership changes since creation
  // The ranks lost in the last change, numbered as before it (empty if none happened).
  std::vector<int> lost_ranks;
  // initial_ranks[r]: what rank r was at creation.
  std::vector<int> initial_ranks;
  std::string reason;  // the last change, in words ("rank 2 lost (...); world 4 -> 3")
  // The ranks (current numbering) that joined in the last change: a grow appends them after the
  // members, who keep their ranks (Communicator::AdmitJoiners).
  std::vector<int> joined_ranks;
  // This process joined a running job (ElasticOptions::join): it has none of the job's state yet
  // and receives it from the members (e.g. a Broadcast from rank 0 right after creation).
  bool joined = false;
};

// Unset fields take ADAPTCOMM_ELASTIC / ADAPTCOMM_ELASTIC_MIN_WORLD, else the profile's elastic.*.
struct ElasticOptions {
  std::optional<LossPolicy> on_loss;
  // Never shrink below this many ranks (the change then fails every rank).
  std::optional<int> min_world_size;
  // A rank that has not voted this long after a coordinated retry began is lost.
  std::optional<absl::Duration> loss_window;
  // kWaitForReplacement: how long past the loss window to wait, then what to do (kShrink or
  // kFail).
  std::optional<absl::Duration> replacement_timeout;
  std::optional<LossPolicy> after_timeout;
  // Called once per membership change, on the communicator's worker thread, after the new backend
  // is in place and before the interrupted op runs again. It may read membership() and queue ops
  // but must not wait for one (that op runs only after the callback returns).
  std::function<void(const Membership&)> on_change;
  // This process replaces a lost rank of a running job (also ADAPTCOMM_ELASTIC_JOIN=1, which
  // `adaptcomm launch --elastic --max-restarts N` exports to a restarted rank): Create connects to
  // the job's store (same name, master address and port; rank 0 only when rank 0 does not serve
  // the store: ADAPTCOMM_STORE_EXTERNAL=1, as under `adaptcomm launch --elastic`), asks to join,
  // and returns once the members admitted it at their next AdmitJoiners(), bounded by the init
  // timeout, with the communicator on the grown world (membership().joined). Refused, naming why,
  // when its profile differs from rank 0's.
  bool join = false;
};

// Which part of a slow rank's score dominates (docs/monitoring.md, "Fail-slow detection").
enum class SlowKind : uint8_t {
  kCompute,  // it enters its collectives late: its work between them takes longer
  kComm,     // it enters in time but starts moving data late
};

// The fail-slow detector naming a rank slow, or no longer slow (CommunicatorOptions::on_slow_rank).
struct SlowRankEvent {
  int rank = 0;  // current numbering (membership().rank on that rank)
  std::string host;
  bool slow = true;  // true: named slow; false: its score fell below half the threshold
  // Median over the window of the fraction by which the others' op-to-op time grows while they
  // wait for this rank (0.3: 30%), and its two parts.
  double score = 0;
  double compute = 0;
  double comm = 0;
  SlowKind kind = SlowKind::kCompute;
  double threshold = 0;  // the profile's monitor.slow_threshold
  std::string evidence;  // the measured times behind the score, in words
};

struct CommunicatorOptions {
  // Unset: from the launcher's environment (DetectLaunchEnvironment), as are master_addr and
  // master_port when those are unset too.
  std::optional<int> rank;
  std::optional<int> world_size;
  // Distinguishes communicators that share one store; two live communicators may not share a name.
  std::string name = "default";
  // Every setting below that is a std::optional, when set, wins over the environment and the
  // profile (precedence: profile.h); unset, they take the profile's (Explain() says which won).
  std::optional<BackendChoice> backend;  // backend.choice
  std::optional<Fallback> fallback;      // backend.fallback
  // Profile (see profile.h): a model size ("7B", "235B", "1.5T", a parameter count) or a tier
  // name, and the YAML file. Unset: ADAPTCOMM_MODEL_SIZE / ADAPTCOMM_PROFILE, else the smallest
  // tier of the default profiles.yaml.
  std::optional<std::string> model_size;
  std::optional<std::string> profile_file;
  bool profile_strict =
      false;  // refuse dead or unknown NCCL_* names (also ADAPTCOMM_PROFILE_STRICT=1)

  // Default bound of each operation, counted from when it starts running (not when queued).
  // Unset: the profile's collective timeout (scaled by world size); set, it is used as given.
  std::optional<absl::Duration> timeout;
  // Bound of creation: store connection, rendezvous of every rank, backend init.
  std::optional<absl::Duration> init_timeout;

  // Rendezvous. If `store` is set it is used as is; otherwise rank 0 serves a TCP store at
  // master_addr:master_port (unless ADAPTCOMM_STORE_EXTERNAL=1: another process serves it) and
  // every rank connects to it.
  std::shared_ptr<Store> store;
  // Unset: MASTER_ADDR / ADAPTCOMM_MASTER_ADDR, else 127.0.0.1. Set: not empty.
  std::optional<std::string> master_addr;
  std::optional<int> master_port;  // unset: MASTER_PORT / ADAPTCOMM_MASTER_PORT; set: 1..65535
  // Unset: ADAPTCOMM_STORE_TOKEN (unset there too: no token). Set to "": no token.
  std::optional<std::string> store_token;
  // A Redis or etcd server instead of rank 0's TCP store (docs/stores.md):
  // "redis://[user:password@]host:port" or "etcd://[user:password@]host:port". Unset:
  // ADAPTCOMM_STORE, else the profile's store.url, else the TCP store; set to "": the TCP store,
  // whatever the environment and the profile say. Every key goes under the
  // job's token (store_token), so jobs sharing one server never see each other's keys. Rank 0
  // serves nothing then: its loss does not end an elastic job.
  std::optional<std::string> store_url;

  // Flight recorder: the last `flight_recorder_entries` ops of this rank, dumped as JSON to
  // flight_recorder_dir/flight.rank<R>.json on a timeout or fatal error, or by DumpFlightRecord().
  // Unset dir: $ADAPTCOMM_FLIGHT_RECORDER_DIR, else the profile's, else $TMPDIR/adaptcomm-flight.
  std::optional<std::string> flight_recorder_dir;
  std::optional<int> flight_recorder_entries;
  // After a failure, how long a rank waits for every other rank to report before naming the
  // silent ones as dead or stalled (retry.report_window, 5s by default).
  std::optional<absl::Duration> failure_report_window;
  // Coordinated retry: attempts per op including the first (1 = off). The
  // retry happens only when every rank agrees (docs/resilience.md). What it can re-run is
  // `replay`'s: with kAuto (the default profile's) no input is ever copied; a failed op of a step
  // (BeginStep/CommitStep) makes the step be redone, and outside a step only ops whose input
  // survives them (stable_input) are re-run. kCopy copies every op's input first (one memcpy, or
  // one device copy, per op) so that any op can be re-run alone, bit for bit.
  std::optional<int> max_retry_attempts;
  std::optional<ReplayMode> replay;
  // Debug mode: before each collective every rank checks through the store that all ranks call
  // the same op (op, dtype, count, reduce op, root); a mismatch fails that op on every rank with
  // InvalidArgument naming each rank's call, before any data moves. One store round trip per op.
  // Unset: ADAPTCOMM_CHECK_COLLECTIVES=1 turns it on. Off: a mismatch is still named, but only
  // once it made an op fail or time out (the retry vote compares the ops).
  std::optional<bool> check_collectives;
  // Elastic membership (README, "Elastic membership"): what a permanently lost rank does to the
  // job. Anything but fail turns coordinated retry on (at least 2 attempts).
  ElasticOptions elastic;
  // Fail-slow detection (profile monitor.*): called on every rank when the detector names a rank
  // slow, and again when it no longer is, on the communicator's monitor thread, one call at a
  // time, never on a thread that issues or runs ops. It may call the communicator's methods but
  // should return quickly: the destructor waits at most about a second for a call in progress,
  // and makes no new call once it began. Empty: none (the log line, the adaptcomm_slowness_score
  // metric and the flight-record event happen either way).
  std::function<void(const SlowRankEvent&)> on_slow_rank;

  // Network interface for the Gloo transport. Unset: GLOO_SOCKET_IFNAME; if unset too (or set
  // to ""), the local address that routes to master_addr (loopback when the master is local).
  std::optional<std::string> iface;
};

struct AllreduceOptions {
  ReduceOp op = ReduceOp::kSum;
  // Bound of this op, counted from when it starts running. Unset: the communicator's default
  // (CommunicatorOptions::timeout, or the long-operation bound inside a LongOperationScope). Set:
  // positive (InvalidArgument otherwise). The explicit initializer keeps {ReduceOp::kMax} free of
  // -Wmissing-field-initializers, as in every options struct a trainer brace-initializes.
  std::optional<absl::Duration> timeout = std::nullopt;
};
struct BroadcastOptions {
  int root = 0;
  std::optional<absl::Duration> timeout = std::nullopt;  // as AllreduceOptions::timeout
};
struct ReduceOptions {
  int root = 0;
  ReduceOp op = ReduceOp::kSum;
  std::optional<absl::Duration> timeout = std::nullopt;  // as AllreduceOptions::timeout
};
struct AllgatherOptions {
  std::optional<absl::Duration> timeout = std::nullopt;  // as AllreduceOptions::timeout
  // A promise that saves the retry's copy of the input (one memcpy per op while retries are on):
  // the caller leaves the input unchanged until this op and the next op on this communicator have
  // both completed. A coordinated retry can re-run an op only until every rank has entered the
  // next one, so the input itself serves as the retry's record. If the next op does not prove that
  // (broadcast, reduce, send, recv) the copy is taken when it starts, so the promise stays enough.
  bool stable_input = false;
};
struct ReduceScatterOptions {
  ReduceOp op = ReduceOp::kSum;
  std::optional<absl::Duration> timeout = std::nullopt;  // as AllreduceOptions::timeout
  bool stable_input = false;                             // as AllgatherOptions::stable_input
};
struct AlltoallOptions {
  std::optional<absl::Duration> timeout = std::nullopt;  // as AllreduceOptions::timeout
  bool stable_input = false;                             // as AllgatherOptions::stable_input
};
struct BarrierOptions {
  std::optional<absl::Duration> timeout = std::nullopt;  // as AllreduceOptions::timeout
};
struct P2POptions {
  uint32_t tag = 0;  // a send matches the recv of the same tag between the same two ranks
  std::optional<absl::Duration> timeout = std::nullopt;  // as AllreduceOptions::timeout
  // Outside a group, on host memory: posted and run beside the communicator's other ops, on a
  // link of its own per direction between the two ranks (docs/groups.md, "Asynchronous sends and
  // receives"). An asynchronous op matches only asynchronous ones: both ranks of a pair must ask
  // for it. False: ordered like every op (it starts once the ops issued before it ended, and takes
  // a sequence number). Ignored (ordered) in a group, in an open step, on CUDA views and after a
  // membership change.
  bool async = false;
};

// Communicator::Split's choices for the child.
struct SplitOptions {
  // The child's backend; unset: the profile's backend.choice, where kAuto chooses for the
  // child's own ranks (shared memory for a group on one host, NCCL for CUDA tensors, ...),
  // whatever the parent runs.
  std::optional<BackendChoice> backend;
  // The child's name on the store (flight records and logs name it); unset:
  // "<parent name>/split<n>/color<c>", n counting this communicator's splits. Set: not empty.
  std::optional<std::string> name = std::nullopt;
};

namespace internal {
class CommunicatorImpl;
struct CommunicatorAccess;
}  // namespace internal

class ADAPTCOMM_EXPORT Communicator {
 public:
  // Rendezvous of all ranks and backend creation, bounded by options.init_timeout. A rank that
  // never joins makes the others fail with DeadlineExceeded naming it.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Communicator>> Create(
      const CommunicatorOptions& options);
  // Wraps an already-built backend (tests, composite backends; the backend's author includes
  // adaptcomm/ext/backend.h). options.rank/world_size must match the backend's.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Communicator>> CreateWithBackend(
      std::unique_ptr<Backend> backend, const CommunicatorOptions& options);

  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;
  ~Communicator();

  // The current rank and world size (they change when the communicator shrinks).
  int rank() const;
  int size() const;
  // Rank, world size, generation and the ranks lost in the last membership change.
  Membership membership() const;
  // Elastic grow: admits the processes waiting to join (ElasticOptions::join). A
  // collective: every member calls it at the same point of its op sequence, at a step boundary
  // (every op it issued finished; FailedPrecondition otherwise). Rank 0 looks up the waiting
  // joiners in the store (one request) and broadcasts their count (one 16-byte broadcast); with
  // none it returns OK. Otherwise every member and joiner rebuilds the backend at the next
  // generation, the joiners appended as the last ranks (the members keep theirs), on_change runs,
  // and it returns Aborted "membership changed: ..." (IsMembershipChanged): broadcast the state
  // the joiners need, then go on with the new world. An error other than that breaks the
  // communicator (the joiner died while the backend was rebuilt).
  [[nodiscard]] absl::Status AdmitJoiners();
  const char* backend_name() const;
  // Why this backend was chosen ("backend=gloo requested", "auto: NCCL not built", ...).
  const std::string& selection_reason() const;
  // The effective configuration: every setting, its value, where it came from, how it is applied.
  std::string Explain() const;
  // The effective configuration Explain() prints, as values.
  const EffectiveConfig& config() const;

  // While a LongOperationScope lives, operations issued without an explicit timeout get the
  // profile's long-operation bound instead of the collective one: wrap the collective that waits
  // for a checkpoint save (on every rank) so the save does not trip the watchdog.
  class ADAPTCOMM_EXPORT LongOperationScope {
   public:
    explicit LongOperationScope(Communicator& comm);
    ~LongOperationScope();
    LongOperationScope(const LongOperationScope&) = delete;
    LongOperationScope& operator=(const LongOperationScope&) = delete;

   private:
    Communicator& comm_;
  };
  Capabilities capabilities() const;

  // In place: every rank's `data` ends as the reduction over all ranks.
  Work Allreduce(TensorView data, const AllreduceOptions& options = {});
  // In place: root's `data` is copied to every rank.
  Work Broadcast(TensorView data, const BroadcastOptions& options = {});
  // In place on root: root's `data` ends as the reduction; other ranks' data is left unspecified
  // (Gloo uses it as scratch).
  Work Reduce(TensorView data, const ReduceOptions& options = {});
  // output.count == input.count * size(); rank i's input lands in block i.
  Work Allgather(TensorView input, TensorView output, const AllgatherOptions& options = {});
  // input.count == output.count * size(); output = reduction of block rank() over all ranks.
  Work ReduceScatter(TensorView input, TensorView output, const ReduceScatterOptions& options = {});
  // input.count == output.count, divisible by size(); block j of input goes to rank j, where it
  // lands in block rank() of output.
  Work Alltoall(TensorView input, TensorView output, const AlltoallOptions& options = {});
  Work Barrier(const BarrierOptions& options = {});
  // Point to point. Ordered (the default): each completes before the next operation of this
  // communicator starts: order pairs so that they match (as with blocking MPI), or issue them in a
  // group (below), where any order completes. A send matches the receive of the same tag between
  // the same two ranks; sends of one pair and tag match its receives in issue order.
  // Asynchronous (P2POptions::async, outside a group and a step, on host memory): posted and
  // returned at once; each direction between two ranks runs on a link of its own, beside this
  // communicator's other ops and the other directions, so matching sends and receives complete
  // whatever order the ranks issued them in. One direction's asynchronous messages match in issue
  // order (a receive names the tag of the send it meets), never an ordered or grouped op; the
  // buffers are the communicator's until Wait returns; Work::seq() is not this communicator's
  // (the link's, or 0 for an op queued while its link is made).
  Work Send(TensorView data, int peer, const P2POptions& options = {});
  Work Recv(TensorView data, int peer, const P2POptions& options = {});

  // ---- Groups: ops issued together, run as one unit (docs/groups.md) ----
  //
  //   comm->GroupStart();
  //   adaptcomm::Work s = comm->Send(HostView(out.data(), n), (rank + 1) % size);
  //   adaptcomm::Work r = comm->Recv(HostView(in.data(), n), (rank + size - 1) % size);
  //   if (absl::Status g = comm->GroupEnd(); !g.ok()) return g;   // both run now, together
  //   s.Wait(); r.Wait();
  //
  // The ops issued between GroupStart and GroupEnd (any mix of collectives, sends and receives)
  // take consecutive sequence numbers and start only at GroupEnd, as one unit: their sends and
  // receives progress concurrently, so matching ones complete whatever order each rank issued them
  // in (a ring shift, a pipeline exchange, an all-to-all as pairs); collectives run in issue order.
  // No other order holds inside a group: no op may read a buffer that another op of the group
  // writes. On NCCL the launches are one ncclGroupStart/ncclGroupEnd, stream-ordered as one op:
  // each op's place in its view's stream is taken at GroupEnd (a stream under CUDA graph capture is
  // refused there, FailedPrecondition, and the group takes no sequence number), the group runs
  // behind all of them on the communicator's stream, and Wait() on any of its ops makes that op's
  // stream wait for the whole group without blocking the caller (Synchronize() waits for the
  // device). Each op has its own Work;
  // the group completes or fails as a whole: a failure (an op refused at issue included) fails
  // every op of the group with the same status. Waiting on an op of a group that has not ended
  // fails at once with FailedPrecondition (it would never start otherwise). The group runs within
  // the largest timeout of its ops. Its ops are never re-run alone by a coordinated retry: inside
  // BeginStep/CommitStep a failure redoes the step; outside a step the ops fail with the redo
  // status (IsStepRedo) after the ranks' vote, as any op without a replay record (on NCCL, once a
  // Wait let a stream past the group, DataLoss: the stream may have read an incomplete result).
  // Ownership: the open group belongs to the communicator, not to a thread: ops that any thread
  // issues while it is open join it. Groups do not nest.
  // REQUIRES: every rank issues the same groups in the same order relative to its other ops, each
  // with the same collectives in the same order (sends and receives may differ per rank).
  // BeginStep, CommitStep and AdmitJoiners refuse to run inside a group (FailedPrecondition).
  // GroupStart: FailedPrecondition if a group is already open. GroupEnd: FailedPrecondition without
  // an open group; the status of an op refused at issue (the group's ops then fail with it);
  // otherwise OK once the group is queued (not completed: wait on its ops).
  [[nodiscard]] absl::Status GroupStart();
  [[nodiscard]] absl::Status GroupEnd();
  // GroupStart(), issue(), GroupEnd(): the ops `issue` makes form the group.
  [[nodiscard]] absl::Status Group(const std::function<void()>& issue);

  // ---- Steps: recovery of a whole training step (docs/resilience.md) ----
  //
  //   for (;;) {
  //     ASSIGN_OR_RETURN(... comm->BeginStep());
  //     ... forward, backward, the step's collectives (Wait as usual) ...
  //     absl::Status commit = comm->CommitStep();
  //     if (adaptcomm::IsStepRedo(commit)) { restore nothing; redo the same step; continue; }
  //     if (!commit.ok()) return Fail(commit);
  //     optimizer.step();   // only now: the step's results are good on every rank
  //   }
  //
  // Ops issued between BeginStep and CommitStep take no replay record and are never re-run alone.
  // When one fails on any rank, every rank's communicator recovers at once (the coordinated vote
  // and rebuild, or an elastic shrink), the step's other ops fail fast (IsStepRedo), and
  // CommitStep returns a status for which IsStepRedo is true on every rank. Redo the step from the
  // trainer's own state: the model before the optimizer update. CommitStep returns OK only when
  // every op of the step succeeded on every rank. Both are collectives: every rank calls them at
  // the same points. REQUIRES: retries on (retry.max_attempts >= 2, the default) for a failed
  // step to be redone; without them a failure breaks the communicator as outside a step.
  // FailedPrecondition: a step is already open (steps do not nest).
  [[nodiscard]] absl::Status BeginStep();
  // Ends the step: waits for its ops (each within its timeout), then agrees with every rank (one
  // allgather of each rank's count of ops in the step; a barrier on a backend that takes device
  // memory only). OK: committed on every rank. IsStepRedo: redo it. FailedPrecondition: no step is
  // open here, or the ranks issued different numbers of ops in the step (each rank's count named;
  // the communicator is then broken). Any other error: the communicator is broken (the error
  // names the rank at fault).
  [[nodiscard]] absl::Status CommitStep();

  // ---- Sub-communicators ----
  // MPI_Comm_split: a collective over every rank of this communicator. The ranks that pass the
  // same `color` form a child communicator, ranked by `key`, ties broken by their rank here; a
  // rank that passes kNoColor takes part and gets no child (nullptr). Every rank publishes its
  // (color, key) through this communicator's store and reads the others' (one key per rank, so a
  // rank that never calls Split is named in the DeadlineExceeded of the others, within the init
  // timeout); then each child rendezvouses under its own name through the same store and builds
  // its own backend, with this communicator's options (profile, timeouts, retry, elastic policy)
  // but its own op sequence, flight record and Explain(). On NCCL, where every rank's NCCL has
  // ncclCommSplit and no rank asked its child for another backend, the ops issued here before
  // Split end first and NCCL splits this communicator's (a child on NCCL is built on that, without
  // a fresh init); otherwise, or where a rank's split failed, the child inits NCCL afresh.
  // Children of one Split are independent:
  // their ops may be issued in any order relative to each other and to this communicator's.
  // Failures (docs/groups.md, "Failure semantics"): the communicators split from one root,
  // recursively, form a family in each process. When one member breaks (health() turns non-OK: an
  // abort, an op that failed for good, a coordinated retry that failed, a lost rank) every other
  // member in this process is aborted with Aborted "communicator 'X' (child of 'Y') broke:
  // <cause>", and tells its own ranks elsewhere, so the parent and every sibling fail on every
  // rank within the failure-report window rather than at their op timeout. A retry that recovers
  // breaks nothing, and neither does destroying a member (in any order). An elastic membership
  // change (shrink, AdmitJoiners) of a member that has relatives fails the whole family in each
  // process that holds that member, the changed member included: FailedPrecondition naming the
  // change; rebuild the groups with Split from a communicator of the new world.
  // REQUIRES: every rank calls Split in the same order relative to its other Splits; this
  // communicator outlives its children when one of its ranks serves the store.
  static constexpr int kNoColor = -1;
  [[nodiscard]] absl::StatusOr<std::unique_ptr<Communicator>> Split(int color, int key,
                                                                    const SplitOptions& split = {});

  // Writes this rank's flight record now; returns the file's path.
  [[nodiscard]] absl::StatusOr<std::string> DumpFlightRecord(const std::string& reason);

  // OK, or the error that broke the communicator (it then fails every new op fast).
  absl::Status health() const;
  // Fails every pending op with Aborted(reason) and interrupts the running one. Idempotent.
  void Abort(const absl::Status& reason);

 private:
  // The library's internal factories (injected CUDA/NCCL seams, tests), not part of the API.
  friend struct internal::CommunicatorAccess;
  explicit Communicator(std::unique_ptr<internal::CommunicatorImpl> impl);
  std::unique_ptr<internal::CommunicatorImpl> impl_;
};

}  // namespace adaptcomm

#endif  // ADAPTCOMM_COMMUNICATOR_H_
