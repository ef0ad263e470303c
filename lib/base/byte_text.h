// Byte sizes in messages: "64 MiB", "3 KiB", "1000 B" (exact multiples of a power of 1024, else
// bytes).
#ifndef ADAPTCOMM_LIB_BASE_BYTE_TEXT_H_
#define ADAPTCOMM_LIB_BASE_BYTE_TEXT_H_

#include <cstdint>
#include <string>

namespace adaptcomm {

std::string ByteSizeText(uint64_t bytes);
// The same without the space, for names ("two-phase/64KiB", "ring/seg 4MiB"): what ParseByteSize
// (lib/config/units.h) reads back.
std::string CompactByteSizeText(uint64_t bytes);

}  // namespace adaptcomm

#endif  // ADAPTCOMM_LIB_BASE_BYTE_TEXT_H_
