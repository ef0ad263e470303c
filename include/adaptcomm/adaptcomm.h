// Everything a trainer needs: include this one header.
#ifndef ADAPTCOMM_ADAPTCOMM_H_
#define ADAPTCOMM_ADAPTCOMM_H_

#include "adaptcomm/backend.h"
#include "adaptcomm/communicator.h"
#include "adaptcomm/status.h"
#include "adaptcomm/store.h"
#include "adaptcomm/types.h"
#include "adaptcomm/work.h"

#endif  // ADAPTCOMM_ADAPTCOMM_H_
