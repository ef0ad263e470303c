// What each absl::StatusCode returned by adaptcomm means, and what retrying can do about it.
//
//   Unavailable        transient: a peer or the store could not be reached, a connection broke.
//                      Retrying after re-creating the communicator can succeed.
//   DeadlineExceeded   an operation or a wait ran past its bound. The communicator that timed out
//                      is broken (its transport state is unknown); re-create it to retry.
//   Aborted            the operation was cancelled because this or another rank failed or the
//                      communicator was aborted. A coordinated retry can succeed.
//   InvalidArgument    the call itself is wrong (null data, sizes, dtype/op, rank out of range).
//                      Never retry: every attempt fails the same way.
//   FailedPrecondition the communicator is not in a state for the call (already broken, name
//                      already taken on the store, mismatched configuration). Not retryable as is.
//   Aborted with the kMembershipChangedPayload payload (IsMembershipChanged): the membership
//                      changed. A rank was lost for good and the communicator shrank
//                      (elastic.on_loss: shrink), and this op's meaning depends on the old world
//                      (allgather, reduce_scatter, alltoall, a lost root or peer) so it was not
//                      re-run; or AdmitJoiners grew the world. The communicator works on the new
//                      membership (MembershipChangedWorldSize); redo the step. Never retried by
//                      the library.
//   Aborted with the kStepRedoPayload payload (IsStepRedo): returned by Communicator::CommitStep
//                      when some op of the step failed on some rank, and by an op outside a step
//                      that failed on every rank and could not be re-run (retry.replay auto). The
//                      communicator has recovered (aborted, rebuilt, agreed by every rank); the
//                      results are not to be used: redo the step (or the op's work) from the
//                      trainer's own state.
//   DataLoss           an op's result may already have been read while it was still incomplete
//                      (a device op whose Wait let the caller's stream go on, then the device
//                      failed outside a step): nothing can repair it; the communicator is broken.
//   Internal           a bug in adaptcomm or its dependencies; report it.
#ifndef ADAPTCOMM_STATUS_H_
#define ADAPTCOMM_STATUS_H_

#include <optional>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "adaptcomm/export.h"

namespace adaptcomm {

// True for Unavailable, Aborted and DeadlineExceeded: the codes a coordinated retry may fix.
ADAPTCOMM_EXPORT bool IsRetryable(const absl::Status& status);

// The payload type URL that marks a membership-changed status. Its value is the world size after
// the change, in decimal ("3").
inline constexpr char kMembershipChangedPayload[] = "type.adaptcomm/membership-changed";
// True for an Aborted status with the kMembershipChangedPayload payload: the op was not run on the
// communicator's new membership; the communicator itself is healthy. The message says what
// changed, for people; only the payload identifies the status.
ADAPTCOMM_EXPORT bool IsMembershipChanged(const absl::Status& status);
// The world size after the change, when IsMembershipChanged(status); else nullopt.
ADAPTCOMM_EXPORT std::optional<int> MembershipChangedWorldSize(const absl::Status& status);
// The membership-changed status: Aborted "membership changed: <what>", the payload holding
// `world_size` (for a trainer's own tests of its handling, as the library builds it).
ADAPTCOMM_EXPORT absl::Status MembershipChangedError(int world_size, absl::string_view what);

// The payload type URL that marks a step-redo status.
inline constexpr char kStepRedoPayload[] = "type.adaptcomm/step-redo";
// True for the Aborted status CommitStep returns when the step must be redone (see above).
ADAPTCOMM_EXPORT bool IsStepRedo(const absl::Status& status);

// Process exit code used by adaptcomm's tools and by a trainer that ends because of a
// communication failure (distinct from crashes, signals and generic errors 1 and 2).
inline constexpr int kExitCommunicationFailure = 75;

}  // namespace adaptcomm

#endif  // ADAPTCOMM_STATUS_H_
