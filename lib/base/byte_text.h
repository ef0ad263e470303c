// Byte sizes in messages: "64 MiB", "3 KiB", "1000 B" (exact powers of 1024, else bytes).
#ifndef ADAPTCOMM_LIB_BASE_BYTE_TEXT_H_
#define ADAPTCOMM_LIB_BASE_BYTE_TEXT_H_

#include <cstdint>
#include <string>

namespace adaptcomm {

std::string ByteSizeText(uint64_t bytes);

}  // namespace adaptcomm

#endif  // ADAPTCOMM_LIB_BASE_BYTE_TEXT_H_
