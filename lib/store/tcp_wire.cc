// Framing and socket helpers of the TCP store.
#include "lib/store/tcp_wire.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace adaptcomm::store_wire {
namespace {

void PutU32(std::string* buf, uint32_t v) {
  for (int i = 0; i < 4; ++i) buf->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint32_t GetU32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i)
    v |= static_cast<uint32_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

std::string ErrnoText(int err) { return std::strerror(err); }

// Waits until fd is ready for `events`; false when the deadline passed first.
absl::StatusOr<bool> WaitReady(int fd, short events, absl::Time deadline, const std::string& what) {
  while (true) {
    pollfd p{fd, events, 0};
    int rc = ::poll(&p, 1, PollMillis(deadline));
    if (rc > 0) return true;
    if (rc == 0) {
      if (absl::Now() >= deadline) return false;
      continue;  // poll's millisecond rounding woke us early
    }
    if (errno == EINTR) continue;
    return absl::UnavailableError(absl::StrCat("poll on ", what, " failed: ", ErrnoText(errno)));
  }
}

}  // namespace

FrameWriter::FrameWriter(uint8_t first_byte) {
  buf_.assign(4, '\0');
  buf_.push_back(static_cast<char>(first_byte));
}

FrameWriter& FrameWriter::Field(std::string_view bytes) {
  PutU32(&buf_, static_cast<uint32_t>(bytes.size()));
  buf_.append(bytes.data(), bytes.size());
  return *this;
}

FrameWriter& FrameWriter::Int(int64_t value) {
  char bytes[8];
  uint64_t u = static_cast<uint64_t>(value);
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((u >> (8 * i)) & 0xff);
  return Field(std::string_view(bytes, 8));
}

std::string FrameWriter::Finish() {
  uint32_t n = static_cast<uint32_t>(body_size());
  for (int i = 0; i < 4; ++i) buf_[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return std::move(buf_);
}

FrameReader::FrameReader(std::string_view body) : body_(body) {
  if (body_.empty()) {
    ok_ = false;
    return;
  }
  first_ = static_cast<uint8_t>(body_[0]);
}

bool FrameReader::Field(std::string_view* out) {
  if (!ok_ || body_.size() - pos_ < 4) return ok_ = false;
  uint32_t n = GetU32(body_.data() + pos_);
  if (body_.size() - pos_ - 4 < n) return ok_ = false;
  *out = body_.substr(pos_ + 4, n);
  pos_ += 4 + static_cast<size_t>(n);
  return true;
}

bool FrameReader::Int(int64_t* out) {
  std::string_view f;
  if (!Field(&f)) return false;
  if (f.size() != 8) return ok_ = false;
  uint64_t u = 0;
  for (int i = 0; i < 8; ++i)
    u |= static_cast<uint64_t>(static_cast<unsigned char>(f[i])) << (8 * i);
  *out = static_cast<int64_t>(u);
  return true;
}

absl::Status SendAll(int fd, std::string_view data, absl::Time deadline, const std::string& what) {
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::send(fd, data.data() + done, data.size() - done, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      auto ready = WaitReady(fd, POLLOUT, deadline, what);
      if (!ready.ok()) return ready.status();
      if (!*ready) {
        return absl::DeadlineExceededError(
            absl::StrCat("sending to ", what, " did not complete in time"));
      }
      continue;
    }
    return absl::UnavailableError(
        absl::StrCat("sending to ", what, " failed: ", ErrnoText(n < 0 ? errno : EPIPE)));
  }
  return absl::OkStatus();
}

absl::Status RecvAll(int fd, char* data, size_t n, absl::Time deadline, const std::string& what) {
  size_t done = 0;
  while (done < n) {
    ssize_t r = ::recv(fd, data + done, n - done, MSG_DONTWAIT);
    if (r > 0) {
      done += static_cast<size_t>(r);
      continue;
    }
    if (r == 0) return absl::UnavailableError(absl::StrCat(what, " closed the connection"));
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      auto ready = WaitReady(fd, POLLIN, deadline, what);
      if (!ready.ok()) return ready.status();
      if (!*ready) {
        return absl::DeadlineExceededError(absl::StrCat("no reply from ", what, " in time"));
      }
      continue;
    }
    return absl::UnavailableError(
        absl::StrCat("receiving from ", what, " failed: ", ErrnoText(errno)));
  }
  return absl::OkStatus();
}

absl::StatusOr<uint32_t> RecvFrameLength(int fd, size_t max_body, absl::Time deadline,
                                         const std::string& what) {
  char header[4];
  if (absl::Status s = RecvAll(fd, header, 4, deadline, what); !s.ok()) return s;
  uint32_t n = GetU32(header);
  if (n == 0) return absl::InvalidArgumentError(absl::StrCat("empty frame from ", what));
  if (n > max_body) {
    return absl::ResourceExhaustedError(
        absl::StrCat("frame of ", n, " bytes from ", what, " exceeds max_frame_bytes=", max_body));
  }
  return n;
}

absl::StatusOr<std::string> RecvFrameBody(int fd, uint32_t n, absl::Time deadline,
                                          const std::string& what) {
  // Grown as bytes arrive, so that a header that merely claims a large frame costs no memory.
  constexpr size_t kChunk = 1 << 20;
  std::string body;
  while (body.size() < n) {
    size_t old = body.size();
    size_t step = std::min<size_t>(kChunk, n - old);
    body.resize(old + step);
    if (absl::Status s = RecvAll(fd, body.data() + old, step, deadline, what); !s.ok()) return s;
  }
  return body;
}

absl::StatusOr<std::string> RecvFrame(int fd, size_t max_body, absl::Time header_deadline,
                                      absl::Duration body_timeout, const std::string& what) {
  absl::StatusOr<uint32_t> n = RecvFrameLength(fd, max_body, header_deadline, what);
  if (!n.ok()) return n.status();
  return RecvFrameBody(fd, *n, absl::Now() + body_timeout, what);
}

bool ConstantTimeEquals(std::string_view a, std::string_view b) {
  size_t n = std::max(a.size(), b.size());
  volatile unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff = diff | static_cast<unsigned char>(x ^ y);
  }
  return diff == 0;
}

int PollMillis(absl::Time deadline) {
  if (deadline == absl::InfiniteFuture()) return -1;
  absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) return 0;
  int64_t ms = absl::ToInt64Milliseconds(absl::Ceil(left, absl::Milliseconds(1)));
  return static_cast<int>(std::min<int64_t>(ms, INT_MAX));
}

int64_t TimeoutToMicros(absl::Duration timeout) {
  if (timeout <= absl::ZeroDuration()) return 0;
  return absl::ToInt64Microseconds(timeout);  // saturates for InfiniteDuration
}

}  // namespace adaptcomm::store_wire
