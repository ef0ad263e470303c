// The Store contract (tests/store_contract.h) run against the built-in store kinds, and the TCP
// store's defences.
#include "adaptcomm/store.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <ostream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lib/base/log_throttle.h"
#include "lib/store/tcp_wire.h"
#include "tests/sanitizer_build.h"
#include "tests/store_contract.h"

namespace adaptcomm {
namespace {

using ::testing::HasSubstr;
using testing::Kind;
using ::testing::Not;
using testing::StoreContractTest;
using testing::StoreFixture;

class HashFixture : public StoreFixture {
 public:
  std::shared_ptr<Store> store() override { return store_; }
  std::shared_ptr<Store> Another() override { return store_; }

 private:
  std::shared_ptr<Store> store_ = CreateHashStore();
};

class PrefixFixture : public StoreFixture {
 public:
  std::shared_ptr<Store> store() override { return CreatePrefixStore("job", base_); }
  std::shared_ptr<Store> Another() override { return CreatePrefixStore("job", base_); }

 private:
  std::shared_ptr<Store> base_ = CreateHashStore();
};

std::string TempDir(const std::string& tag) {
  const char* base = std::getenv("TMPDIR");
  std::string dir =
      absl::StrCat(base != nullptr ? base : "/tmp", "/adaptcomm_store_test_", ::getpid(), "_", tag);
  std::filesystem::remove_all(dir);
  return dir;
}

class FileFixture : public StoreFixture {
 public:
  FileFixture() : dir_(TempDir(absl::StrCat(counter_++))) {
    auto s = CreateFileStore(dir_ + "/nested/dir");
    EXPECT_TRUE(s.ok()) << s.status();
    store_ = *s;
  }
  ~FileFixture() override { std::filesystem::remove_all(dir_); }
  std::shared_ptr<Store> store() override { return store_; }
  std::shared_ptr<Store> Another() override { return *CreateFileStore(dir_ + "/nested/dir"); }

 private:
  static inline std::atomic<int> counter_{0};
  std::string dir_;
  std::shared_ptr<Store> store_;
};

TcpStoreOptions TcpOptions(int port = 0) {
  TcpStoreOptions o;
  o.port = port;
  o.token = "job-token-123";
  o.connect_timeout = absl::Seconds(5);
  o.io_timeout = absl::Seconds(5);
  return o;
}

class TcpFixture : public StoreFixture {
 public:
  TcpFixture() {
    auto server = StartTcpStoreServer(TcpOptions());
    EXPECT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    store_ = Another();
  }
  std::shared_ptr<Store> store() override { return store_; }
  std::shared_ptr<Store> Another() override {
    auto c = ConnectTcpStore(TcpOptions(server_->port()));
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *c : nullptr;
  }

 private:
  std::unique_ptr<TcpStoreServer> server_;
  std::shared_ptr<Store> store_;
};

INSTANTIATE_TEST_SUITE_P(
    AllKinds, StoreContractTest,
    ::testing::Values(Kind{"hash", [] { return std::make_unique<HashFixture>(); }},
                      Kind{"prefix", [] { return std::make_unique<PrefixFixture>(); }},
                      Kind{"file", [] { return std::make_unique<FileFixture>(); }},
                      Kind{"tcp", [] { return std::make_unique<TcpFixture>(); }}),
    [](const ::testing::TestParamInfo<Kind>& info) { return info.param.name; });

TEST(PrefixStoreTest, KeysAreNamespaced) {
  auto base = CreateHashStore();
  auto a = CreatePrefixStore("a", base);
  ASSERT_TRUE(a->Set("k", "1").ok());
  EXPECT_EQ(*base->Get("a/k", absl::ZeroDuration()), "1");
  EXPECT_TRUE(
      absl::IsNotFound(CreatePrefixStore("b", base)->Get("k", absl::ZeroDuration()).status()));
}

// ---- TCP store specifics ----

// A raw loopback connection for forging frames.
class RawConn {
 public:
  explicit RawConn(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  }
  ~RawConn() { ::close(fd_); }
  bool connected() const { return connected_; }
  void Send(const std::string& bytes) {
    ASSERT_EQ(::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(bytes.size()));
  }
  void Hello(const std::string& token) {
    store_wire::FrameWriter w(store_wire::kHello);
    w.Field(store_wire::kMagic).Int(store_wire::kVersion).Field(token);
    Send(w.Finish());
    std::string reply = ReadSome(absl::Seconds(2));
    ASSERT_GE(reply.size(), 5u);
    EXPECT_EQ(reply[4], 0) << "handshake refused";
  }
  // Reads whatever arrives until EOF or `bound`; *eof says whether the server closed.
  std::string ReadSome(absl::Duration bound, bool* eof = nullptr) {
    std::string out;
    absl::Time deadline = absl::Now() + bound;
    while (absl::Now() < deadline) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, store_wire::PollMillis(deadline)) <= 0) break;
      char buf[4096];
      ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
      if (n <= 0) {
        if (eof != nullptr) *eof = true;
        return out;
      }
      out.append(buf, static_cast<size_t>(n));
      if (eof == nullptr) return out;
    }
    if (eof != nullptr) *eof = false;
    return out;
  }
  // True if the server closes the connection within `bound`.
  bool ClosedWithin(absl::Duration bound) {
    bool eof = false;
    ReadSome(bound, &eof);
    return eof;
  }

 private:
  int fd_ = -1;
  bool connected_ = false;
};

class TcpStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto server = StartTcpStoreServer(TcpOptions());
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    port_ = server_->port();
    ASSERT_GT(port_, 0);
  }
  // A fresh good client completes a round trip, connecting within `connect`.
  void ExpectServerHealthy(absl::Duration connect = absl::Seconds(5)) {
    TcpStoreOptions o = TcpOptions(port_);
    o.connect_timeout = connect;
    auto c = ConnectTcpStore(o);
    ASSERT_TRUE(c.ok()) << c.status();
    ASSERT_TRUE((*c)->Set("health", "ok").ok());
    EXPECT_EQ(*(*c)->Get("health", absl::ZeroDuration()), "ok");
  }
  std::unique_ptr<TcpStoreServer> server_;
  int port_ = 0;
};

TEST_F(TcpStoreTest, WrongTokenIsRefused) {
  for (const char* token : {"wrong-token", "", "job-token-1234", "job-token-12"}) {
    TcpStoreOptions o = TcpOptions(port_);
    o.token = token;
    absl::Time start = absl::Now();
    auto c = ConnectTcpStore(o);
    EXPECT_TRUE(absl::IsPermissionDenied(c.status())) << token << ": " << c.status();
    EXPECT_THAT(std::string(c.status().message()), HasSubstr("token"));
    EXPECT_LT(absl::Now() - start, absl::Seconds(2)) << "a refused token must not be retried";
  }
  ExpectServerHealthy();
}

TEST_F(TcpStoreTest, GarbageBytesAreRefused) {
  RawConn raw(port_);
  ASSERT_TRUE(raw.connected());
  std::string garbage;
  for (int i = 0; i < 256; ++i) garbage.push_back(static_cast<char>((i * 131 + 7) & 0xff));
  raw.Send(garbage);
  EXPECT_TRUE(raw.ClosedWithin(absl::Seconds(2)));
  ExpectServerHealthy();
}

TEST_F(TcpStoreTest, HugeFrameHeaderIsRefused) {
  for (bool authenticated : {false, true}) {
    RawConn raw(port_);
    ASSERT_TRUE(raw.connected());
    if (authenticated) raw.Hello("job-token-123");
    raw.Send(std::string("\xff\xff\xff\xff", 4));  // claims 4 GiB
    EXPECT_TRUE(raw.ClosedWithin(absl::Seconds(2))) << "authenticated=" << authenticated;
  }
  ExpectServerHealthy();
}

TEST_F(TcpStoreTest, TruncatedFrameIsRefused) {
  {
    RawConn raw(port_);
    ASSERT_TRUE(raw.connected());
    raw.Hello("job-token-123");
    std::string frame = store_wire::FrameWriter(store_wire::kSet).Field("k").Field("v").Finish();
    raw.Send(frame.substr(0, frame.size() - 3));
  }  // closes mid-frame
  {
    // Fields that overrun the frame they are in.
    RawConn raw(port_);
    ASSERT_TRUE(raw.connected());
    raw.Hello("job-token-123");
    raw.Send(std::string("\x06\0\0\0\x02\x50\0\0\0k", 10));
    bool eof = false;
    std::string reply = raw.ReadSome(absl::Seconds(2), &eof);
    EXPECT_TRUE(eof);
    ASSERT_GE(reply.size(), 5u);
    EXPECT_EQ(reply[4], static_cast<char>(absl::StatusCode::kInvalidArgument));
  }
  ExpectServerHealthy();
  auto c = ConnectTcpStore(TcpOptions(port_));
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(absl::IsNotFound((*c)->Get("k", absl::ZeroDuration()).status()));
}

TEST_F(TcpStoreTest, UnknownOpcodeIsRefused) {
  RawConn raw(port_);
  ASSERT_TRUE(raw.connected());
  raw.Hello("job-token-123");
  raw.Send(store_wire::FrameWriter(99).Field("x").Finish());
  bool eof = false;
  std::string reply = raw.ReadSome(absl::Seconds(2), &eof);
  EXPECT_TRUE(eof);
  ASSERT_GE(reply.size(), 5u);
  EXPECT_EQ(reply[4], static_cast<char>(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(reply, HasSubstr("opcode 99"));
  ExpectServerHealthy();
}

TEST_F(TcpStoreTest, RandomFramesNeverCrashTheServer) {
  // Well-framed bodies of random bytes behind a valid opcode (after the handshake) and random
  // handshakes: the server answers or closes, and keeps serving.
  uint32_t seed = 12345;
  auto next = [&seed] {
    seed = seed * 1664525u + 1013904223u;
    return seed >> 8;
  };
  for (int i = 0; i < 200; ++i) {
    RawConn raw(port_);
    ASSERT_TRUE(raw.connected());
    bool authenticated = i % 4 != 0;
    if (authenticated) raw.Hello("job-token-123");
    std::string body(1 + next() % 40, '\0');
    for (char& c : body) c = static_cast<char>(next() & 0xff);
    body[0] = static_cast<char>(authenticated ? 2 + next() % 5 : next() % 3);
    std::string frame;
    for (int b = 0; b < 4; ++b) frame.push_back(static_cast<char>((body.size() >> (8 * b)) & 0xff));
    raw.Send(frame + body);
  }
  ExpectServerHealthy();
}

TEST_F(TcpStoreTest, UnauthenticatedFrameIsRefusedBeforeItsBodyIsRead) {
  // A peer that has not said HELLO gets no more than a handshake's worth of reading: a header
  // claiming 1 MiB closes the connection at once instead of buffering what follows (#11 item 5).
  RawConn raw(port_);
  ASSERT_TRUE(raw.connected());
  raw.Send(std::string("\x00\x00\x10\x00", 4));
  raw.Send(std::string(64 << 10, 'x'));
  EXPECT_TRUE(raw.ClosedWithin(absl::Seconds(1)));
  ExpectServerHealthy();
}

TEST_F(TcpStoreTest, IdleConnectionFloodDoesNotLockOutTheJob) {
  // More idle connections than the server's connection cap, none of which ever says HELLO: the
  // job's own clients must still connect and be served, promptly (#11 items 3 and 5).
  std::vector<std::unique_ptr<RawConn>> flood;
  for (int i = 0; i < 4200; ++i) {
    flood.push_back(std::make_unique<RawConn>(port_));
    ASSERT_TRUE(flood.back()->connected()) << "connection " << i;
  }
  const absl::Time start = absl::Now();
  // Well inside a job's connect timeout (the profiles give 60 s); the old server refused the job
  // outright. The job's client is accepted behind the flood's 4,200 connections, each accepted and
  // then dropped or refused first: under TSan on a 2-core machine that took 3.6 ms apiece (15 s in
  // all). It is itself refused until the flood's pending handshakes are old enough to be dropped
  // (a second), and retries.
  constexpr absl::Duration kBound = absl::Seconds(testing::kUnderSanitizer ? 30 : 10);
  ExpectServerHealthy(kBound);
  EXPECT_LT(absl::Now() - start, kBound);
}

TEST(LogThrottleTest, OneLinePerIntervalThenTheCountOfSuppressedOnes) {
  log::LogThrottle throttle(absl::Milliseconds(200));
  std::string suffix = "unset";
  ASSERT_TRUE(throttle.Allow(&suffix));
  EXPECT_EQ(suffix, "");
  for (int i = 0; i < 1000; ++i) EXPECT_FALSE(throttle.Allow(&suffix));
  absl::SleepFor(absl::Milliseconds(250));
  ASSERT_TRUE(throttle.Allow(&suffix));
  EXPECT_THAT(suffix, HasSubstr("[1000 similar lines suppressed in the last "));
  EXPECT_FALSE(throttle.Allow(&suffix));
}

TEST_F(TcpStoreTest, SilentConnectionDoesNotBlockOthers) {
  RawConn idle(port_);  // never says hello
  ASSERT_TRUE(idle.connected());
  ExpectServerHealthy();
}

TEST_F(TcpStoreTest, TooLargeValues) {
  server_.reset();
  TcpStoreOptions small = TcpOptions();
  small.max_frame_bytes = 1024;
  auto server = StartTcpStoreServer(small);
  ASSERT_TRUE(server.ok());
  small.port = (*server)->port();
  auto client = ConnectTcpStore(small);
  ASSERT_TRUE(client.ok()) << client.status();
  // Refused by the client before sending; the client stays usable.
  absl::Status s = (*client)->Set("big", std::string(2000, 'x'));
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("max_frame_bytes"));
  ASSERT_TRUE((*client)->Set("small", std::string(900, 'y')).ok());
  EXPECT_EQ((*client)->Get("small", absl::ZeroDuration())->size(), 900u);
  // A client with a larger limit gets its connection closed by the server, then reconnects.
  TcpStoreOptions large = small;
  large.max_frame_bytes = 1 << 20;
  auto lax = ConnectTcpStore(large);
  ASSERT_TRUE(lax.ok());
  s = (*lax)->Set("big", std::string(2000, 'x'));
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  EXPECT_TRUE((*lax)->Set("after", "1").ok());
  EXPECT_TRUE(absl::IsNotFound((*client)->Get("big", absl::ZeroDuration()).status()));
}

TEST_F(TcpStoreTest, MultiGetIsOneRequestAnsweredInKeyOrder) {
  auto client = ConnectTcpStore(TcpOptions(port_));
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE((*client)->Set("m/1", "one").ok());
  ASSERT_TRUE((*client)->Set("m/2", "").ok());
  RawConn raw(port_);
  raw.Hello("job-token-123");
  raw.Send(store_wire::FrameWriter(store_wire::kMultiGet)
               .Int(0)
               .Field("m/2")
               .Field("m/1")
               .Field("m/2")
               .Finish());
  std::string reply = raw.ReadSome(absl::Seconds(2));
  ASSERT_GE(reply.size(), 5u);
  store_wire::FrameReader r(std::string_view(reply).substr(4));
  EXPECT_EQ(r.first_byte(), 0);
  std::string_view a, b, c;
  ASSERT_TRUE(r.Field(&a) && r.Field(&b) && r.Field(&c));
  EXPECT_TRUE(r.AtEnd());
  EXPECT_EQ(a, "");
  EXPECT_EQ(b, "one");
  EXPECT_EQ(c, "");
  // One missing key, no wait: NotFound naming it, and the connection stays open.
  raw.Send(
      store_wire::FrameWriter(store_wire::kMultiGet).Int(0).Field("m/1").Field("m/9").Finish());
  reply = raw.ReadSome(absl::Seconds(2));
  ASSERT_GE(reply.size(), 5u);
  EXPECT_EQ(reply[4], static_cast<char>(absl::StatusCode::kNotFound));
  EXPECT_THAT(reply, HasSubstr("m/9"));
  EXPECT_THAT(reply, Not(HasSubstr("m/1")));
  // The message, then each missing key as a field of its own (the client names them from it).
  store_wire::FrameReader missing(std::string_view(reply).substr(4));
  std::string_view message, named;
  ASSERT_TRUE(missing.Field(&message) && missing.Field(&named));
  EXPECT_EQ(named, "m/9");
  EXPECT_TRUE(missing.AtEnd());
  EXPECT_FALSE(raw.ClosedWithin(absl::Milliseconds(100)));
}

TEST_F(TcpStoreTest, MultiGetSplitsBatchesAndRereadsRepliesOverTheFrameLimit) {
  TcpStoreOptions small = TcpOptions(port_);
  small.max_frame_bytes = 1024;
  auto client = ConnectTcpStore(small);
  ASSERT_TRUE(client.ok()) << client.status();
  // 60 keys of 40 bytes: three requests at least; 300-byte values: every batch's reply is over
  // the client's limit, so it is read again key by key.
  std::vector<std::string> keys;
  for (int i = 0; i < 60; ++i) {
    keys.push_back(absl::StrCat("batch/", std::string(30, 'k'), absl::Dec(i, absl::kZeroPad3)));
    ASSERT_TRUE(
        (*client)->Set(keys.back(), std::string(300, static_cast<char>('a' + i % 26))).ok());
  }
  absl::StatusOr<std::vector<std::string>> v = (*client)->MultiGet(keys, absl::Seconds(5));
  ASSERT_TRUE(v.ok()) << v.status();
  ASSERT_EQ(v->size(), keys.size());
  for (int i = 0; i < 60; ++i) {
    EXPECT_EQ((*v)[i], std::string(300, static_cast<char>('a' + i % 26))) << "key " << i;
  }
  // Small values fit: batches answered by the server in one reply each, in order.
  for (int i = 0; i < 60; ++i) ASSERT_TRUE((*client)->Set(keys[i], absl::StrCat(i)).ok());
  v = (*client)->MultiGet(keys, absl::Seconds(5));
  ASSERT_TRUE(v.ok()) << v.status();
  for (int i = 0; i < 60; ++i) EXPECT_EQ((*v)[i], absl::StrCat(i)) << "key " << i;
  // A key missing from the last batch is named, not one of the first batch's.
  keys.push_back("batch/never");
  v = (*client)->MultiGet(keys, absl::ZeroDuration());
  EXPECT_TRUE(absl::IsNotFound(v.status())) << v.status();
  EXPECT_THAT(std::string(v.status().message()), HasSubstr("batch/never"));
  EXPECT_THAT(std::string(v.status().message()), Not(HasSubstr(keys[0])));
}

TEST(TcpStoreConnectTest, NobodyListening) {
  int port = 0;
  {
    // Bind-then-close gives a port that is very likely unused for the next seconds.
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    socklen_t len = sizeof(a);
    ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
    port = ntohs(a.sin_port);
    ::close(fd);
  }
  TcpStoreOptions o = TcpOptions(port);
  o.connect_timeout = absl::Seconds(1);
  absl::Time start = absl::Now();
  auto c = ConnectTcpStore(o);
  absl::Duration elapsed = absl::Now() - start;
  EXPECT_TRUE(absl::IsUnavailable(c.status())) << c.status();
  std::string msg(c.status().message());
  EXPECT_THAT(msg, HasSubstr(absl::StrCat("127.0.0.1:", port)));
  EXPECT_THAT(msg, HasSubstr("refused"));
  EXPECT_GE(elapsed, absl::Seconds(1));
  EXPECT_LE(elapsed, absl::Seconds(3));
}

TEST(TcpStoreConnectTest, ClientStartedBeforeServerConnects) {
  auto probe = StartTcpStoreServer(TcpOptions());
  ASSERT_TRUE(probe.ok());
  int port = (*probe)->port();
  probe->reset();  // the port is free again; SO_REUSEADDR lets the server take it back
  std::thread late([&] {
    absl::SleepFor(absl::Milliseconds(300));
    auto server = StartTcpStoreServer(TcpOptions(port));
    ASSERT_TRUE(server.ok()) << server.status();
    absl::SleepFor(absl::Seconds(1));  // serves long enough for the client's round trip
  });
  auto c = ConnectTcpStore(TcpOptions(port));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE((*c)->Set("k", "v").ok());
  late.join();
}

TEST_F(TcpStoreTest, ShutdownWakesBlockedClients) {
  auto c = ConnectTcpStore(TcpOptions(port_));
  ASSERT_TRUE(c.ok());
  std::atomic<bool> returned{false};
  absl::Status get_status, wait_status;
  absl::Time stopped;
  std::thread getter([&] { get_status = (*c)->Get("never", absl::Seconds(20)).status(); });
  std::thread waiter([&] { wait_status = (*c)->Wait({"never", "either"}, absl::Seconds(20)); });
  absl::SleepFor(absl::Milliseconds(200));
  absl::Time start = absl::Now();
  server_.reset();
  EXPECT_LT(absl::Now() - start, absl::Seconds(2)) << "server destructor hung";
  getter.join();
  waiter.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(2)) << "blocked clients not woken";
  EXPECT_TRUE(absl::IsUnavailable(get_status)) << get_status;
  EXPECT_TRUE(absl::IsUnavailable(wait_status)) << wait_status;
  // With the server gone, requests fail fast instead of retrying for connect_timeout.
  start = absl::Now();
  EXPECT_TRUE(absl::IsUnavailable((*c)->Set("k", "v")));
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
}

TEST_F(TcpStoreTest, ClientsThatHangUpMidWaitAreReleased) {
  {
    RawConn raw(port_);
    raw.Hello("job-token-123");
    raw.Send(store_wire::FrameWriter(store_wire::kGet).Field("never").Int(60'000'000).Finish());
  }  // hangs up with the server waiting 60 s for it
  absl::SleepFor(absl::Milliseconds(50));
  absl::Time start = absl::Now();
  server_.reset();
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
}

TEST_F(TcpStoreTest, SixteenConcurrentClients) {
  constexpr int kClients = 16;
  std::vector<std::thread> threads;
  std::vector<std::string> keys;
  for (int i = 0; i < kClients; ++i) keys.push_back(absl::StrCat("rank/", i));
  std::atomic<int> ok{0};
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] {
      auto c = ConnectTcpStore(TcpOptions(port_));
      ASSERT_TRUE(c.ok()) << c.status();
      Store& s = **c;
      ASSERT_TRUE(s.Set(keys[i], absl::StrCat("addr-", i)).ok());
      ASSERT_TRUE(s.Add("arrived", 1).ok());
      ASSERT_TRUE(s.Wait(keys, absl::Seconds(10)).ok());
      for (int j = 0; j < kClients; ++j) {
        auto v = s.Get(keys[j], absl::ZeroDuration());
        ASSERT_TRUE(v.ok()) << v.status();
        EXPECT_EQ(*v, absl::StrCat("addr-", j));
      }
      ++ok;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), kClients);
  auto c = ConnectTcpStore(TcpOptions(port_));
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(*(*c)->Get("arrived", absl::ZeroDuration()), std::to_string(kClients));
}

// Far more ranks than the server's table of pending handshakes (64) connect at the same instant
// and all stay connected until every one has been served. Each rank uses its client from two
// threads (one waits for its neighbour's key while the other sets its own), so that besides
// ConnectTcpStore's first connection it opens a pooled one in the middle of the crowd, the path
// that used to give up after three quick tries. The server asks the surplus to come back and each
// client retries with backoff until its connect deadline, so none is lost (the "Scale" issue: 96
// and 128 ranks no longer started). 1,000 ranks (2,000 connections) take a few seconds on a
// 2-core VM; fewer where descriptors are short (four per rank: two client, two server sockets)
// or under a sanitizer.
TEST_F(TcpStoreTest, AThousandRanksConnectingAtOnceAllGetIn) {
  rlimit files{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &files), 0);
  const int kRanks =
      static_cast<int>(std::min<rlim_t>(testing::kUnderSanitizer ? 250 : 1000,
                                        files.rlim_cur > 1024 ? (files.rlim_cur - 256) / 5 : 0));
  ASSERT_GT(kRanks, 128) << "too few file descriptors (RLIMIT_NOFILE " << files.rlim_cur << ")";
  auto key = [](int i) { return absl::StrCat("rank/", i); };
  auto value = [](int i) { return absl::StrCat("value-", i); };
  // A value read back, or why not.
  auto expect = [](const absl::StatusOr<std::string>& got, const std::string& want) {
    if (!got.ok()) return got.status();
    if (*got == want) return absl::OkStatus();
    return absl::InternalError(absl::StrCat("read back '", *got, "', not '", want, "'"));
  };
  std::atomic<int> ready{0}, served{0};
  absl::Notification go, release;
  std::vector<absl::Status> own(kRanks), neighbour(kRanks);
  std::vector<std::thread> threads;
  threads.reserve(kRanks);
  for (int i = 0; i < kRanks; ++i) {
    threads.emplace_back([&, i] {
      TcpStoreOptions o = TcpOptions(port_);
      o.connect_timeout = absl::Seconds(30);
      o.io_timeout = absl::Seconds(30);
      ++ready;
      go.WaitForNotification();
      absl::StatusOr<std::shared_ptr<Store>> c = ConnectTcpStore(o);
      if (!c.ok()) {
        own[i] = neighbour[i] = c.status();
        return;
      }
      Store& store = **c;
      const int next = (i + 1) % kRanks;
      std::thread waiter([&] {
        neighbour[i] = store.Wait({key(next)}, absl::Seconds(30));
        if (neighbour[i].ok())
          neighbour[i] = expect(store.Get(key(next), absl::ZeroDuration()), value(next));
      });
      own[i] = store.Set(key(i), value(i));
      if (own[i].ok()) own[i] = expect(store.Get(key(i), absl::ZeroDuration()), value(i));
      waiter.join();
      ++served;
      // Keeps its connections open until all have been served (bounded: the test fails first).
      release.WaitForNotificationWithTimeout(absl::Seconds(60));
    });
  }
  while (ready.load() < kRanks) absl::SleepFor(absl::Milliseconds(1));
  const absl::Time start = absl::Now();
  go.Notify();
  const absl::Duration kBound = absl::Seconds(testing::kUnderSanitizer ? 60 : 20);
  while (served.load() < kRanks && absl::Now() - start < kBound) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  const absl::Duration elapsed = absl::Now() - start;
  release.Notify();
  for (auto& t : threads) t.join();
  int failed = 0;
  for (int i = 0; i < kRanks; ++i) {
    if ((!own[i].ok() || !neighbour[i].ok()) && ++failed <= 5) {
      ADD_FAILURE() << "rank " << i << ": own key: " << own[i] << "; neighbour's: " << neighbour[i];
    }
  }
  EXPECT_EQ(failed, 0) << "ranks failed, of " << kRanks;
  EXPECT_EQ(served.load(), kRanks);
  EXPECT_LT(elapsed, kBound);
  std::printf("%d ranks connected at once, %d served in %s\n", kRanks, served.load(),
              absl::FormatDuration(elapsed).c_str());
  // Every value is there, read back through another client.
  auto check = ConnectTcpStore(TcpOptions(port_));
  ASSERT_TRUE(check.ok()) << check.status();
  int missing = 0;
  for (int i = 0; i < kRanks; ++i) {
    absl::Status s = expect((*check)->Get(key(i), absl::ZeroDuration()), value(i));
    if (!s.ok() && ++missing <= 5) ADD_FAILURE() << "rank " << i << "'s value: " << s;
  }
  EXPECT_EQ(missing, 0) << "values missing, of " << kRanks;
}

// A newcomer that finds the table of pending handshakes full of young ones is refused with a
// "busy" answer, not left hanging; the job's client, refused the same way, retries until it gets
// in, once the idle ones have pended long enough to be dropped for it.
TEST_F(TcpStoreTest, FullPendingTableRefusesNewcomersWhoRetry) {
  auto client = ConnectTcpStore(TcpOptions(port_));  // pooled connection made before the crowd
  ASSERT_TRUE(client.ok()) << client.status();
  std::vector<std::unique_ptr<RawConn>> idle;
  for (int i = 0; i < 64; ++i) {  // kMaxPendingHandshakes
    idle.push_back(std::make_unique<RawConn>(port_));
    ASSERT_TRUE(idle.back()->connected());
  }
  RawConn newcomer(port_);  // accepted after the 64 (the accept queue is in order)
  ASSERT_TRUE(newcomer.connected());
  bool eof = false;
  std::string reply = newcomer.ReadSome(absl::Seconds(2), &eof);
  EXPECT_TRUE(eof) << "refused newcomers are closed at once";
  ASSERT_GE(reply.size(), 5u);
  EXPECT_EQ(reply[4], static_cast<char>(absl::StatusCode::kUnavailable));
  EXPECT_THAT(reply, HasSubstr("busy"));
  // The pooled connection is taken by a blocked GET, so the SET needs a new one: its handshake is
  // refused while the idle connections are young, then retried until one of them is dropped.
  std::thread blocked([&] { (void)(*client)->Get("later", absl::Seconds(5)); });
  absl::SleepFor(absl::Milliseconds(50));
  const absl::Time start = absl::Now();
  ASSERT_TRUE((*client)->Set("later", "v").ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(4));
  blocked.join();
  EXPECT_EQ(*(*client)->Get("later", absl::ZeroDuration()), "v");
  // The flood's connections were dropped one by one as room was needed; it gets no more.
  int closed = 0;
  for (auto& c : idle) closed += c->ClosedWithin(absl::Milliseconds(1)) ? 1 : 0;
  EXPECT_GE(closed, 1);
}

TEST(TcpStoreOptionsTest, BadArguments) {
  TcpStoreOptions o = TcpOptions();
  o.port = 70000;
  EXPECT_TRUE(absl::IsInvalidArgument(StartTcpStoreServer(o).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(ConnectTcpStore(o).status()));
  o.port = 0;
  EXPECT_TRUE(absl::IsInvalidArgument(ConnectTcpStore(o).status()));
}

TEST(ConstantTimeEqualsTest, ComparesWholeStrings) {
  EXPECT_TRUE(store_wire::ConstantTimeEquals("", ""));
  EXPECT_TRUE(store_wire::ConstantTimeEquals("abc", "abc"));
  EXPECT_FALSE(store_wire::ConstantTimeEquals("abc", "abd"));
  EXPECT_FALSE(store_wire::ConstantTimeEquals("abc", "ab"));
  EXPECT_FALSE(store_wire::ConstantTimeEquals("ab", "abc"));
  EXPECT_FALSE(store_wire::ConstantTimeEquals(std::string("a\0", 2), "a"));
}

// ---- file store specifics ----

TEST(FileStoreTest, SharedAcrossProcesses) {
  std::string dir = TempDir("fork");
  auto store = CreateFileStore(dir);
  ASSERT_TRUE(store.ok()) << store.status();
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    auto child = CreateFileStore(dir);
    bool good = child.ok();
    for (int i = 0; good && i < 100; ++i) good = (*child)->Add("n", 1).ok();
    good = good && (*child)->Set("child", "done").ok();
    ::_exit(good ? 0 : 1);
  }
  for (int i = 0; i < 100; ++i) ASSERT_TRUE((*store)->Add("n", 1).ok());
  auto v = (*store)->Get("child", absl::Seconds(10));
  int wstatus = 0;
  ASSERT_EQ(::waitpid(pid, &wstatus, 0), pid);
  EXPECT_TRUE(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*(*store)->Get("n", absl::ZeroDuration()), "200");
  std::filesystem::remove_all(dir);
}

TEST(FileStoreTest, RefusesAFileAsDirectory) {
  std::string dir = TempDir("notadir");
  ASSERT_TRUE(CreateFileStore(dir).ok());
  std::string file = dir + "/plain";
  FILE* f = std::fopen(file.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fclose(f);
  EXPECT_FALSE(CreateFileStore(file).ok());
  EXPECT_FALSE(CreateFileStore("").ok());
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace adaptcomm
