// The options of the runtime's parts, read from the effective configuration: the one place a
// setting leaves EffectiveConfig for the options struct of the code that acts on it. Creation,
// selection and rebuilds (communicator_create.cc) and the running communicator (communicator.cc)
// both start from PartOptionsFor; what is not a setting (rank, names, stores, seams) is theirs to
// fill in.
#ifndef ADAPTCOMM_LIB_CORE_COMMUNICATOR_PART_OPTIONS_H_
#define ADAPTCOMM_LIB_CORE_COMMUNICATOR_PART_OPTIONS_H_

#include "adaptcomm/profile.h"
#include "lib/core/elastic/membership.h"
#include "lib/core/executor/op_executor.h"
#include "lib/core/resilience/failure_coordinator.h"
#include "lib/core/selection/backend_selection.h"
#include "lib/trace/flight_recorder.h"

namespace adaptcomm::internal {

struct PartOptions {
  ElasticPolicy elastic;                  // elastic.*
  selection::SelectionDeps selection;     // backend.*, gloo.*, the tuned table, NCCL's plan
  trace::FlightRecorderOptions recorder;  // flight_recorder.*
  ExecutorOptions executor;               // timeouts.abort, retry.*
  FailureCoordinatorOptions coordinator;  // retry.*, elastic.*, timeouts.collective and abort
};

// `config` must outlive the returned selection options: their configure_nccl reads it when NCCL
// is first initialised.
PartOptions PartOptionsFor(const EffectiveConfig& config);

}  // namespace adaptcomm::internal

#endif  // ADAPTCOMM_LIB_CORE_COMMUNICATOR_PART_OPTIONS_H_
