// A real Prometheus server (Debian's `prometheus`, installed by `scripts/install-deps.sh test`)
// scrapes the 4-rank demo trainer under `adaptcomm launch`, and its HTTP API then reports every
// allreduce the ranks ran (as counted in their final textfiles). Skipped when the prometheus binary
// is missing.
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "nlohmann/json.hpp"
#include "tests/harness.h"

namespace {

std::string FindPrometheus() {
  if (const char* env = std::getenv("ADAPTCOMM_PROMETHEUS"); env != nullptr && *env != '\0') {
    return env;
  }
  for (const char* p : {"/usr/bin/prometheus", "/usr/local/bin/prometheus"}) {
    if (access(p, X_OK) == 0) return p;
  }
  return "";
}

// Ends the server however the test ends (no stray prometheus).
class Server {
 public:
  explicit Server(pid_t pid) : pid_(pid) {}
  ~Server() {
    if (pid_ <= 0) return;
    kill(pid_, SIGTERM);
    for (int i = 0; i < 100; ++i) {
      if (waitpid(pid_, nullptr, WNOHANG) == pid_) return;
      usleep(50 * 1000);
    }
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }

 private:
  pid_t pid_;
};

// A base port with the next three free too (one per local rank), below the ephemeral range
// (32768 up), where the ports next to a free one are often some connection's.
int PickFourFreePorts() {
  std::srand(static_cast<unsigned>(getpid()));
  for (int attempt = 0; attempt < 100; ++attempt) {
    const int base = 20000 + std::rand() % 12000;
    bool free = true;
    for (int i = 0; i < 4 && free; ++i) {
      const int fd = socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in addr{};
      addr.sin_family = AF_INET;
      addr.sin_addr.s_addr = htonl(INADDR_ANY);
      addr.sin_port = htons(static_cast<uint16_t>(base + i));
      free = fd >= 0 && bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
      if (fd >= 0) close(fd);
    }
    if (free) return base;
  }
  return 0;
}

// The value of the single-sample result of `query`, or -1 (the answer in *answer).
double Query(httplib::Client& client, const std::string& query, std::string* answer = nullptr) {
  auto res = client.Get("/api/v1/query", httplib::Params{{"query", query}}, httplib::Headers{});
  if (answer != nullptr) *answer = res ? res->body : httplib::to_string(res.error());
  if (!res || res->status != 200) return -1;
  nlohmann::json doc = nlohmann::json::parse(res->body, nullptr, false);
  if (doc.is_discarded() || doc["status"] != "success" || doc["data"]["result"].empty()) return -1;
  double v = -1;
  if (!absl::SimpleAtod(doc["data"]["result"][0]["value"][1].get<std::string>(), &v)) return -1;
  return v;
}

TEST(Prometheus, ScrapesTheFourRankDemoAndCountsItsAllreduces) {
  const std::string prometheus = FindPrometheus();
  if (prometheus.empty()) {
    GTEST_SKIP() << "no prometheus binary (/usr/bin/prometheus; scripts/install-deps.sh test "
                    "installs Debian's prometheus package, or set ADAPTCOMM_PROMETHEUS)";
  }
  const std::string bin = adaptcomm::testing::BuildDir();
  char dir_template[] = "/tmp/prometheus_test.XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  const std::string dir = dir_template;
  const int base = PickFourFreePorts();
  ASSERT_GT(base, 0);
  const int web = adaptcomm::testing::PickFreePort();
  std::ofstream(dir + "/prometheus.yml")
      << "global:\n  scrape_interval: 500ms\n  scrape_timeout: 400ms\n"
      << "scrape_configs:\n  - job_name: adaptcomm\n    static_configs:\n      - targets: ["
      << "\"127.0.0.1:" << base << "\", \"127.0.0.1:" << base + 1 << "\", \"127.0.0.1:" << base + 2
      << "\", \"127.0.0.1:" << base + 3 << "\"]\n";
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const std::string config = "--config.file=" + dir + "/prometheus.yml";
    const std::string storage = "--storage.tsdb.path=" + dir + "/data";
    const std::string listen = absl::StrCat("--web.listen-address=127.0.0.1:", web);
    const std::string log = dir + "/prometheus.log";
    FILE* out = std::freopen(log.c_str(), "w", stdout);
    if (out != nullptr) dup2(fileno(stdout), STDERR_FILENO);
    execl(prometheus.c_str(), prometheus.c_str(), config.c_str(), storage.c_str(), listen.c_str(),
          static_cast<char*>(nullptr));
    _exit(127);
  }
  Server server(pid);
  httplib::Client client("127.0.0.1", web);
  client.set_connection_timeout(2);
  client.set_read_timeout(5);
  bool ready = false;
  for (const absl::Time until = absl::Now() + absl::Seconds(60); !ready && absl::Now() < until;) {
    auto res = client.Get("/-/ready");
    ready = res && res->status == 200;
    if (!ready) absl::SleepFor(absl::Milliseconds(200));
  }
  ASSERT_TRUE(ready) << "prometheus did not become ready; see " << dir << "/prometheus.log";
  // Its discovery hands targets to the scrapers a few seconds after start: wait until it scrapes
  // all four (they are down until the job starts), or the short job could end unseen.
  size_t targets = 0;
  for (const absl::Time until = absl::Now() + absl::Seconds(30);
       targets < 4 && absl::Now() < until;) {
    auto res = client.Get("/api/v1/targets");
    if (res && res->status == 200) {
      nlohmann::json doc = nlohmann::json::parse(res->body, nullptr, false);
      if (!doc.is_discarded()) targets = doc["data"]["activeTargets"].size();
    }
    if (targets < 4) absl::SleepFor(absl::Milliseconds(200));
  }
  ASSERT_EQ(targets, 4u) << "prometheus did not take the targets; see " << dir << "/prometheus.log";

  // 50 steps of at least two allreduces each on every rank (the gradients, the loss, and what the
  // bucketer and the steps' commits add); the ranks hold their endpoints 3 s after the last step,
  // for several scrapes of the final counts, and write those counts to their textfiles when they
  // end.
  const int rc = std::system(
      absl::StrCat("ADAPTCOMM_METRICS_PORT=", base, " ADAPTCOMM_METRICS_TEXTFILE=", dir,
                   "/rank{rank}.prom ", bin, "/tools/adaptcomm launch -n 4 --timeout 120 -- ", bin,
                   "/examples/adaptcomm_trainer --steps 50 --hold 3 > ", dir, "/demo_out.txt 2>&1")
          .c_str());
  ASSERT_TRUE(WIFEXITED(rc) && WEXITSTATUS(rc) == 0) << "see " << dir << "/demo_out.txt";
  // What the ranks counted, from their own final textfiles.
  double counted = 0;
  for (int r = 0; r < 4; ++r) {
    std::ifstream in(absl::StrCat(dir, "/rank", r, ".prom"));
    ASSERT_TRUE(in) << "rank " << r << " wrote no textfile";
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("adaptcomm_ops_total{", 0) != 0 ||
          line.find("collective=\"allreduce\"") == std::string::npos) {
        continue;
      }
      double v = 0;
      ASSERT_TRUE(absl::SimpleAtod(line.substr(line.rfind(' ') + 1), &v)) << line;
      counted += v;
    }
  }
  EXPECT_GE(counted, 4 * 50 * 2);

  // The ranks are gone (their series are stale now): the largest value each one reached.
  const std::string query =
      "sum(max_over_time(adaptcomm_ops_total{job=\"adaptcomm\",collective=\"allreduce\"}[10m]))";
  double count = -1;
  std::string answer;
  for (const absl::Time until = absl::Now() + absl::Seconds(20);
       count != counted && absl::Now() < until;) {
    count = Query(client, query, &answer);
    if (count != counted) absl::SleepFor(absl::Milliseconds(250));
  }
  EXPECT_EQ(count, counted) << query << ": " << answer;
  // Every rank was scraped, with its rank label.
  EXPECT_EQ(
      Query(client,
            "count(count by (rank) (max_over_time(adaptcomm_ops_total{job=\"adaptcomm\"}[10m])))"),
      4);
  EXPECT_GT(Query(client,
                  "max(max_over_time(adaptcomm_bus_bandwidth_gbs{job=\"adaptcomm\","
                  "collective=\"allreduce\"}[10m]))"),
            0);
  // Every query of the shipped Grafana dashboard is one Prometheus accepts.
  const char* source = std::getenv("ADAPTCOMM_SOURCE_DIR");
  ASSERT_NE(source, nullptr);
  std::ifstream in(std::string(source) + "/configs/grafana_dashboard.json");
  nlohmann::json dashboard = nlohmann::json::parse(in, nullptr, false);
  ASSERT_FALSE(dashboard.is_discarded());
  int queries = 0;
  for (const auto& panel : dashboard["panels"]) {
    for (const auto& target : panel["targets"]) {
      std::string expr = target["expr"].get<std::string>();
      for (size_t at; (at = expr.find("$comm_name")) != std::string::npos;) {
        expr.replace(at, 10, ".*");
      }
      auto res = client.Get("/api/v1/query", httplib::Params{{"query", expr}}, httplib::Headers{});
      ASSERT_TRUE(res);
      EXPECT_EQ(res->status, 200) << panel["title"] << ": " << expr << ": " << res->body;
      ++queries;
    }
  }
  EXPECT_GE(queries, 6);
}

}  // namespace
