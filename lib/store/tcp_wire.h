// Wire format of the TCP store, shared by its server and client (and spelled out here so that
// tests can forge frames byte by byte).
//
// Every message is one frame: u32 body length (little-endian), then the body. A request body is
// u8 opcode + fields; a response body is u8 status code (absl::StatusCode, 0 = OK) + fields. A
// field is u32 length (little-endian) + bytes; integers are 8-byte little-endian fields.
//
//   HELLO  magic, version, token      -> OK | PermissionDenied(message)   (must come first)
//   SET    key, value                 -> OK
//   GET    key, timeout_us            -> OK value | NotFound | DeadlineExceeded
//   ADD    key, delta                 -> OK new_value
//   WAIT   timeout_us, key...         -> OK | DeadlineExceeded(message naming the missing keys)
//   DELETE key                        -> OK u8 existed
//   MGET   timeout_us, key...         -> OK value... (in key order) | NotFound (timeout 0) |
//                                        DeadlineExceeded (both: message, then each missing key)
//
// A frame longer than the receiver's max_frame_bytes, a malformed frame or an unknown opcode
// makes the server close that connection (after an error response where the framing is intact).
#ifndef ADAPTCOMM_LIB_STORE_TCP_WIRE_H_
#define ADAPTCOMM_LIB_STORE_TCP_WIRE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace adaptcomm::store_wire {

inline constexpr char kMagic[] = "adaptcomm-store";
// Version 2 added MGET; a server of version 1 refuses a version 2 client at its HELLO, by name,
// rather than closing the connection at the first MGET.
inline constexpr int64_t kVersion = 2;

enum Op : uint8_t {
  kHello = 1,
  kSet = 2,
  kGet = 3,
  kAdd = 4,
  kWait = 5,
  kDelete = 6,
  kMultiGet = 7,  // since version 2
};

// Builds a frame: header placeholder first, patched by Finish().
class FrameWriter {
 public:
  explicit FrameWriter(uint8_t first_byte);
  FrameWriter& Field(std::string_view bytes);
  FrameWriter& Int(int64_t value);
  // Body length, without the 4-byte header.
  size_t body_size() const { return buf_.size() - 4; }
  std::string Finish();

 private:
  std::string buf_;
};

// Reads the fields of a frame body (the first byte is taken by the constructor).
class FrameReader {
 public:
  explicit FrameReader(std::string_view body);
  uint8_t first_byte() const { return first_; }
  bool ok() const { return ok_; }
  bool AtEnd() const { return pos_ >= body_.size(); }
  // False (and !ok()) on a truncated field.
  bool Field(std::string_view* out);
  bool Int(int64_t* out);

 private:
  std::string_view body_;
  size_t pos_ = 1;
  uint8_t first_ = 0;
  bool ok_ = true;
};

// Socket helpers for non-blocking fds. Errors: Unavailable (peer closed, socket error),
// DeadlineExceeded (deadline passed). `what` names the peer in messages.
absl::Status SendAll(int fd, std::string_view data, absl::Time deadline, const std::string& what);
absl::Status RecvAll(int fd, char* data, size_t n, absl::Time deadline, const std::string& what);

// Receives one frame body. The header may take until `header_deadline` (idle connections wait
// there); the rest must follow within `body_timeout` of the header. A body longer than
// `max_body` gives ResourceExhausted (nothing more is read); an empty one InvalidArgument.
absl::StatusOr<std::string> RecvFrame(int fd, size_t max_body, absl::Time header_deadline,
                                      absl::Duration body_timeout, const std::string& what);
// The two halves of RecvFrame, for a receiver that must account for a body's memory before
// reading it: the body length (checked against `max_body`), then exactly `n` body bytes.
absl::StatusOr<uint32_t> RecvFrameLength(int fd, size_t max_body, absl::Time deadline,
                                         const std::string& what);
absl::StatusOr<std::string> RecvFrameBody(int fd, uint32_t n, absl::Time deadline,
                                          const std::string& what);

// A HELLO carries the magic, the version and the token: nothing in it needs more than this, so a
// server reads no more from a peer that has not yet proven it belongs to the job.
inline constexpr size_t kMaxHandshakeBytes = 512;
inline constexpr size_t kMaxTokenBytes = 256;

// Equal contents, in time that depends only on the lengths (no early exit on the first
// difference), so that a token cannot be guessed byte by byte from response times.
bool ConstantTimeEquals(std::string_view a, std::string_view b);

// Milliseconds for poll() until `deadline`: -1 for an infinite one, rounded up, at most INT_MAX.
int PollMillis(absl::Time deadline);

// Microseconds on the wire for a wait timeout: negative becomes 0, infinite saturates.
int64_t TimeoutToMicros(absl::Duration timeout);

}  // namespace adaptcomm::store_wire

#endif  // ADAPTCOMM_LIB_STORE_TCP_WIRE_H_
