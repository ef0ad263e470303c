// External stores: the Store contract against real redis-server and etcd processes
// (tests/external_servers.h), their URLs, credentials and job namespaces, and communicators
// that rendezvous through them (threads and processes, an elastic shrink, a wrong password).
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "adaptcomm/adaptcomm.h"
#include "adaptcomm/store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/external_servers.h"
#include "tests/harness.h"
#include "tests/store_contract.h"

namespace adaptcomm {
namespace {

using ::testing::HasSubstr;
using testing::Kind;
using ::testing::Not;
using testing::RankEnv;
using testing::ServerProcess;
using testing::StoreContractTest;
using testing::StoreFixture;

absl::StatusOr<std::shared_ptr<Store>> Connect(const std::string& url,
                                               const std::string& prefix = "job-token-123",
                                               absl::Duration connect = absl::Seconds(15)) {
  ExternalStoreOptions o;
  o.url = url;
  o.prefix = prefix;
  o.connect_timeout = connect;
  o.io_timeout = absl::Seconds(5);
  return ConnectExternalStore(o);
}

// A server of the test's own and clients of it, under one job's prefix.
class ServerFixture : public StoreFixture {
 public:
  explicit ServerFixture(ServerProcess::Kind kind) : server_(kind) {
    if (!SkipReason().empty()) return;
    EXPECT_EQ(server_.error(), "");
    store_ = Another();
  }
  std::string SkipReason() override { return server_.SkipReason(); }
  std::shared_ptr<Store> store() override { return store_; }
  std::shared_ptr<Store> Another() override {
    auto c = Connect(server_.Url());
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *c : nullptr;
  }

 private:
  ServerProcess server_;
  std::shared_ptr<Store> store_;
};

INSTANTIATE_TEST_SUITE_P(
    External, StoreContractTest,
    ::testing::Values(
        Kind{"redis", [] { return std::make_unique<ServerFixture>(ServerProcess::Kind::kRedis); }},
        Kind{"etcd", [] { return std::make_unique<ServerFixture>(ServerProcess::Kind::kEtcd); }}),
    [](const ::testing::TestParamInfo<Kind>& info) { return info.param.name; });

// ---- URLs ----

TEST(StoreUrlTest, ParsesCredentialsHostAndPort) {
  absl::StatusOr<StoreUrl> u = ParseStoreUrl("redis://alice:p%40ss:w@redis.example:6380");
  ASSERT_TRUE(u.ok()) << u.status();
  EXPECT_EQ(u->scheme, "redis");
  EXPECT_EQ(u->user, "alice");
  EXPECT_EQ(u->password, "p@ss:w");
  EXPECT_EQ(u->host, "redis.example");
  EXPECT_EQ(u->port, 6380);
  EXPECT_EQ(RedactedStoreUrl(*u), "redis://alice:***@redis.example:6380");
  u = ParseStoreUrl("etcd://[::1]");
  ASSERT_TRUE(u.ok()) << u.status();
  EXPECT_EQ(u->host, "::1");
  EXPECT_EQ(u->port, 2379);  // etcd's client port when none is given
  EXPECT_TRUE(u->password.empty());
  u = ParseStoreUrl("REDIS://:secret@h");
  ASSERT_TRUE(u.ok()) << u.status();
  EXPECT_EQ(u->scheme, "redis");
  EXPECT_EQ(u->user, "");
  EXPECT_EQ(u->password, "secret");
  EXPECT_EQ(u->port, 6379);
}

TEST(StoreUrlTest, BadUrlsAreRefusedNamingWhatIsWrongWithoutThePassword) {
  struct Case {
    std::string url, why;
  };
  for (const Case& c : std::vector<Case>{
           {"localhost:6379", "no scheme"},
           {"http://h:1", "unknown scheme 'http'"},
           {"redis://h:0", "port '0' is not a TCP port"},
           {"redis://h:70000", "port '70000' is not a TCP port"},
           {"redis://h:abc", "port 'abc'"},
           {"redis://h:", "empty port"},
           {"redis://:1", "no host"},
           {"redis://h:1/0", "unexpected '/0' after host:port"},
           {"redis://bob@h:1", "credentials need a password"},
           {"redis://bob:hunter2%zz@h:1", "broken %-escape"},
       }) {
    absl::StatusOr<StoreUrl> u = ParseStoreUrl(c.url);
    EXPECT_TRUE(absl::IsInvalidArgument(u.status())) << c.url << ": " << u.status();
    EXPECT_THAT(std::string(u.status().message()), HasSubstr(c.why)) << c.url;
    EXPECT_THAT(std::string(u.status().message()), Not(HasSubstr("hunter2"))) << c.url;
  }
}

TEST(ExternalStoreTest, UnbuiltClientIsRefusedNamingTheLibrary) {
  for (const std::string scheme : {"redis", "etcd"}) {
    if (ExternalStoreBuiltIn(scheme)) continue;  // built in: the contract tests cover it
    auto c = Connect(scheme + "://127.0.0.1:1");
    EXPECT_TRUE(absl::IsFailedPrecondition(c.status())) << c.status();
    EXPECT_THAT(std::string(c.status().message()), HasSubstr("built without the " + scheme));
  }
}

TEST(ExternalStoreTest, NobodyListeningIsUnavailableWithinTheConnectBound) {
  const int port = testing::PickFreePort();
  for (const std::string scheme : {"redis", "etcd"}) {
    if (!ExternalStoreBuiltIn(scheme)) continue;
    const absl::Time start = absl::Now();
    auto c = Connect(absl::StrCat(scheme, "://127.0.0.1:", port), "", absl::Seconds(1));
    const absl::Duration elapsed = absl::Now() - start;
    EXPECT_TRUE(absl::IsUnavailable(c.status())) << c.status();
    EXPECT_THAT(std::string(c.status().message()), HasSubstr(absl::StrCat("127.0.0.1:", port)));
    EXPECT_LT(elapsed, absl::Seconds(4)) << scheme;
  }
}

// The inodes of this process's network namespace's TCP sockets (/proc/net/tcp, tcp6).
std::set<std::string> TcpSocketInodes() {
  std::set<std::string> inodes;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // the header
    while (std::getline(in, line)) {
      std::vector<std::string> fields = absl::StrSplit(line, ' ', absl::SkipEmpty());
      if (fields.size() > 9) inodes.insert(fields[9]);
    }
  }
  return inodes;
}

// Processes the trainer starts (a checkpoint uploader, a restarted rank) must not inherit the
// job's store connections.
TEST(ExternalStoreTest, ConnectionsAreClosedOnExec) {
  for (ServerProcess::Kind kind : {ServerProcess::Kind::kRedis, ServerProcess::Kind::kEtcd}) {
    ServerProcess server(kind);
    if (!server.SkipReason().empty()) continue;
    ASSERT_EQ(server.error(), "");
    auto c = Connect(server.Url());
    ASSERT_TRUE(c.ok()) << c.status();
    ASSERT_TRUE((*c)->Set("k", "v").ok());
    const std::set<std::string> tcp = TcpSocketInodes();
    int sockets = 0;
    for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
      std::error_code ec;
      const std::string target = std::filesystem::read_symlink(entry.path(), ec).string();
      // "socket:[inode]"; libcurl's own wake-up socket pairs are not connections to the store.
      if (ec || target.rfind("socket:[", 0) != 0 ||
          tcp.count(target.substr(8, target.size() - 9)) == 0) {
        continue;
      }
      const int fd = std::stoi(entry.path().filename().string());
      ++sockets;
      EXPECT_NE(::fcntl(fd, F_GETFD) & FD_CLOEXEC, 0) << server.Url() << ": fd " << fd;
    }
    EXPECT_GE(sockets, 1) << server.Url();
  }
}

// ---- Redis specifics ----

TEST(RedisStoreTest, TwoJobsOnOneServerNeverSeeEachOthersKeys) {
  ServerProcess redis(ServerProcess::Kind::kRedis);
  if (!redis.SkipReason().empty()) GTEST_SKIP() << redis.SkipReason();
  ASSERT_EQ(redis.error(), "");
  auto a = Connect(redis.Url(), "adaptcomm/job/a");
  auto b = Connect(redis.Url(), "adaptcomm/job/b");
  ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
  ASSERT_TRUE((*a)->Set("join/0", "job a").ok());
  EXPECT_TRUE(absl::IsNotFound((*b)->Get("join/0", absl::ZeroDuration()).status()));
  EXPECT_EQ(*(*b)->Add("count", 5), 5);
  EXPECT_EQ(*(*a)->Add("count", 1), 1);
  auto raw = Connect(redis.Url(), "");
  ASSERT_TRUE(raw.ok());
  EXPECT_EQ(*(*raw)->Get("adaptcomm/job/a/join/0", absl::ZeroDuration()), "job a");
}

TEST(RedisStoreTest, PasswordIsRequiredAndCheckedAndNeverShown) {
  ServerProcess redis(ServerProcess::Kind::kRedis, "s3cret-pw");
  if (!redis.SkipReason().empty()) GTEST_SKIP() << redis.SkipReason();
  ASSERT_EQ(redis.error(), "");
  auto none = Connect(redis.Url());
  EXPECT_TRUE(absl::IsPermissionDenied(none.status())) << none.status();
  EXPECT_THAT(std::string(none.status().message()), HasSubstr("requires a password"));
  auto wrong = Connect(redis.Url(":wrong-pw@"));
  EXPECT_TRUE(absl::IsPermissionDenied(wrong.status())) << wrong.status();
  EXPECT_THAT(std::string(wrong.status().message()),
              HasSubstr("refused the credentials of user 'default'"));
  EXPECT_THAT(std::string(wrong.status().message()), Not(HasSubstr("wrong-pw")));
  auto right = Connect(redis.Url(":s3cret-pw@"));
  ASSERT_TRUE(right.ok()) << right.status();
  EXPECT_TRUE((*right)->Set("k", "v").ok());
  EXPECT_EQ(*(*right)->Get("k", absl::ZeroDuration()), "v");
}

TEST(RedisStoreTest, ServerDeathFailsRequestsWithinTheirBound) {
  ServerProcess redis(ServerProcess::Kind::kRedis);
  if (!redis.SkipReason().empty()) GTEST_SKIP() << redis.SkipReason();
  ASSERT_EQ(redis.error(), "");
  auto c = Connect(redis.Url());
  ASSERT_TRUE(c.ok()) << c.status();
  redis.Stop();
  const absl::Time start = absl::Now();
  absl::StatusOr<std::string> v = (*c)->Get("never", absl::Seconds(30));
  EXPECT_TRUE(absl::IsUnavailable(v.status())) << v.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(6));
}

// How many times the server at `port` ran `command` (INFO commandstats, over a raw connection).
int64_t RedisCalls(int port, const std::string& command) {
  // A bulk reply: "$<length>\r\n<text>\r\n".
  const std::string reply =
      testing::LoopbackExchange(port, "INFO commandstats\r\n", 5, [](const std::string& r) {
        const size_t eol = r.find("\r\n");
        return eol != std::string::npos &&
               r.size() >= eol + 2 + std::strtoul(r.c_str() + 1, nullptr, 10) + 2;
      });
  const std::string key = absl::StrCat("cmdstat_", command, ":calls=");
  const size_t at = reply.find(key);
  return at == std::string::npos ? -1 : std::strtoll(reply.c_str() + at + key.size(), nullptr, 10);
}

// A Get that waits long polls less often as it goes: over 3 s, a few dozen reads, not the 150 of a
// poll every 20 ms; and it still polls (a key set late is found).
TEST(RedisStoreTest, LongWaitsPollLessOften) {
  ServerProcess redis(ServerProcess::Kind::kRedis);
  if (!redis.SkipReason().empty()) GTEST_SKIP() << redis.SkipReason();
  ASSERT_EQ(redis.error(), "");
  auto c = Connect(redis.Url());
  ASSERT_TRUE(c.ok()) << c.status();
  const int64_t before = std::max<int64_t>(RedisCalls(redis.port(), "get"), 0);
  const absl::Time start = absl::Now();
  EXPECT_TRUE(absl::IsDeadlineExceeded((*c)->Get("never", absl::Seconds(3)).status()));
  EXPECT_LT(absl::Now() - start, absl::Seconds(3) + absl::Milliseconds(500));
  const int64_t polls = RedisCalls(redis.port(), "get") - before;
  EXPECT_GT(polls, 10);
  EXPECT_LT(polls, 70);
  std::printf("a 3 s Get polled %lld times\n", static_cast<long long>(polls));
}

// ---- etcd specifics ----

// Creates user root with `password`, gives it the root role and turns authentication on, through
// the gateway (what `etcdctl user add root && etcdctl auth enable` does).
absl::Status EnableEtcdAuth(int port, const std::string& password) {
  for (const auto& [path, body] : std::vector<std::pair<std::string, std::string>>{
           {"/v3/auth/user/add", absl::StrCat(R"({"name":"root","password":")", password, "\"}")},
           {"/v3/auth/role/add", R"({"name":"root"})"},
           {"/v3/auth/user/grant", R"({"user":"root","role":"root"})"},
           {"/v3/auth/enable", "{}"}}) {
    std::string reply = testing::HttpPost(port, path, body);
    if (reply.rfind("HTTP/1.1 200", 0) != 0) {
      return absl::InternalError(absl::StrCat(path, ": ", reply));
    }
  }
  return absl::OkStatus();
}

TEST(EtcdStoreTest, UserAndPasswordAreRequiredAndChecked) {
  ServerProcess etcd(ServerProcess::Kind::kEtcd);
  if (!etcd.SkipReason().empty()) GTEST_SKIP() << etcd.SkipReason();
  ASSERT_EQ(etcd.error(), "");
  ASSERT_TRUE(Connect(etcd.Url()).ok());  // up and serving before auth goes on
  ASSERT_TRUE(EnableEtcdAuth(etcd.port(), "r00t-pw").ok());
  auto none = Connect(etcd.Url());
  EXPECT_TRUE(absl::IsPermissionDenied(none.status())) << none.status();
  EXPECT_THAT(std::string(none.status().message()), HasSubstr("requires a user and password"));
  auto wrong = Connect(etcd.Url("root:bad-pw@"));
  EXPECT_TRUE(absl::IsPermissionDenied(wrong.status())) << wrong.status();
  EXPECT_THAT(std::string(wrong.status().message()),
              HasSubstr("refused the credentials of user 'root'"));
  EXPECT_THAT(std::string(wrong.status().message()), Not(HasSubstr("bad-pw")));
  auto right = Connect(etcd.Url("root:r00t-pw@"));
  ASSERT_TRUE(right.ok()) << right.status();
  EXPECT_EQ(*(*right)->Add("n", 2), 2);
  EXPECT_TRUE((*right)->Set("k", "v").ok());
  EXPECT_EQ(*(*right)->Get("k", absl::ZeroDuration()), "v");
}

// The server forgets a token after its TTL (1 s here); the client authenticates again and the
// request goes through.
TEST(EtcdStoreTest, ExpiredTokenIsRenewed) {
  ServerProcess etcd(ServerProcess::Kind::kEtcd, "", {"--auth-token-ttl", "1"});
  if (!etcd.SkipReason().empty()) GTEST_SKIP() << etcd.SkipReason();
  ASSERT_EQ(etcd.error(), "");
  ASSERT_TRUE(Connect(etcd.Url()).ok());
  ASSERT_TRUE(EnableEtcdAuth(etcd.port(), "r00t-pw").ok());
  auto c = Connect(etcd.Url("root:r00t-pw@"));
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE((*c)->Set("k", "1").ok());
  absl::SleepFor(absl::Seconds(3));
  EXPECT_TRUE((*c)->Set("k", "2").ok());
  EXPECT_EQ(*(*c)->Get("k", absl::ZeroDuration()), "2");
}

}  // namespace
}  // namespace adaptcomm
