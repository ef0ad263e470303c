// Everything a trainer needs to run collectives: include this one header. The optional helpers
// have their own headers (profile.h, precision.h, bucketer.h, grid.h, balance.h); diagnostics
// (diagnose.h) are in the separate adaptcomm::diag library; a backend author includes
// adaptcomm/ext/backend.h.
#ifndef ADAPTCOMM_ADAPTCOMM_H_
#define ADAPTCOMM_ADAPTCOMM_H_

#include "adaptcomm/communicator.h"
#include "adaptcomm/status.h"
#include "adaptcomm/store.h"
#include "adaptcomm/types.h"
#include "adaptcomm/work.h"

#endif  // ADAPTCOMM_ADAPTCOMM_H_
