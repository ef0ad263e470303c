// The Store contract: what every store kind must do, as parameterized tests. A test binary
// includes this once and instantiates StoreContractTest with its kinds (tests/store_test.cc: hash,
// prefix, file, TCP; tests/external_store_test.cc: Redis, etcd).
#ifndef ADAPTCOMM_TESTS_STORE_CONTRACT_H_
#define ADAPTCOMM_TESTS_STORE_CONTRACT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <ostream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "adaptcomm/store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace adaptcomm::testing {

// Slack for scheduling on a loaded 2-core machine.
constexpr absl::Duration kSlack = absl::Milliseconds(1500);

// A store under test plus whatever keeps it alive; Another() is a second handle to the same
// keys (another client, another FileStore on the same directory).
class StoreFixture {
 public:
  virtual ~StoreFixture() = default;
  virtual std::shared_ptr<Store> store() = 0;
  virtual std::shared_ptr<Store> Another() = 0;
  // Why this kind cannot run here (its server is not installed); empty: it can.
  virtual std::string SkipReason() { return ""; }
};

struct Kind {
  std::string name;
  std::function<std::unique_ptr<StoreFixture>()> make;
};
// Keeps ctest's discovered test names stable (the default prints the object's bytes).
void PrintTo(const Kind& kind, std::ostream* os) { *os << kind.name; }

class StoreContractTest : public ::testing::TestWithParam<Kind> {
 protected:
  void SetUp() override {
    fixture_ = GetParam().make();
    if (std::string why = fixture_->SkipReason(); !why.empty()) GTEST_SKIP() << why;
    store_ = fixture_->store();
    ASSERT_NE(store_, nullptr);
  }
  std::unique_ptr<StoreFixture> fixture_;
  std::shared_ptr<Store> store_;
};

TEST_P(StoreContractTest, SetGetOverwrite) {
  ASSERT_TRUE(store_->Set("a", "1").ok());
  EXPECT_EQ(*store_->Get("a", absl::ZeroDuration()), "1");
  ASSERT_TRUE(store_->Set("a", "two").ok());
  EXPECT_EQ(*store_->Get("a", absl::Seconds(1)), "two");
  // Binary values, empty values and awkward key names round-trip unchanged.
  std::string binary("\0\1\xff/..\n", 7);
  ASSERT_TRUE(store_->Set("x/../y z%", binary).ok());
  ASSERT_TRUE(store_->Set("empty", "").ok());
  EXPECT_EQ(*store_->Get("x/../y z%", absl::ZeroDuration()), binary);
  EXPECT_EQ(*store_->Get("empty", absl::ZeroDuration()), "");
  std::string long_key(600, 'k');
  ASSERT_TRUE(store_->Set(long_key, "long").ok());
  EXPECT_EQ(*store_->Get(long_key, absl::ZeroDuration()), "long");
  EXPECT_TRUE(absl::IsNotFound(store_->Get(std::string(599, 'k'), absl::ZeroDuration()).status()));
  // Another handle sees the same keys.
  auto other = fixture_->Another();
  ASSERT_NE(other, nullptr);
  EXPECT_EQ(*other->Get("a", absl::ZeroDuration()), "two");
}

TEST_P(StoreContractTest, GetZeroTimeoutIsNotFound) {
  auto v = store_->Get("missing", absl::ZeroDuration());
  EXPECT_TRUE(absl::IsNotFound(v.status())) << v.status();
}

TEST_P(StoreContractTest, GetTimesOutWithinBound) {
  const absl::Duration timeout = absl::Milliseconds(200);
  absl::Time start = absl::Now();
  auto v = store_->Get("never", timeout);
  absl::Duration elapsed = absl::Now() - start;
  EXPECT_TRUE(absl::IsDeadlineExceeded(v.status())) << v.status();
  EXPECT_THAT(std::string(v.status().message()), ::testing::HasSubstr("never"));
  EXPECT_GE(elapsed, timeout);
  EXPECT_LT(elapsed, timeout + kSlack);
}

TEST_P(StoreContractTest, GetWaitsForALaterSet) {
  auto other = fixture_->Another();
  std::thread setter([&] {
    absl::SleepFor(absl::Milliseconds(100));
    EXPECT_TRUE(other->Set("late", "here").ok());
  });
  absl::Time start = absl::Now();
  auto v = store_->Get("late", absl::Seconds(5));
  setter.join();
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, "here");
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
}

TEST_P(StoreContractTest, ConcurrentAddsAreExact) {
  constexpr int kThreads = 8;
  constexpr int kAdds = 200;
  std::vector<std::vector<int64_t>> seen(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      // Half the threads share the fixture's handle, half use their own.
      auto store = t % 2 == 0 ? store_ : fixture_->Another();
      for (int i = 0; i < kAdds; ++i) {
        auto v = store->Add("counter", 1);
        ASSERT_TRUE(v.ok()) << v.status();
        seen[t].push_back(*v);
      }
    });
  }
  for (auto& th : threads) th.join();
  // Every intermediate value was handed out exactly once.
  std::set<int64_t> all;
  for (const auto& s : seen) all.insert(s.begin(), s.end());
  ASSERT_EQ(all.size(), static_cast<size_t>(kThreads * kAdds));
  EXPECT_EQ(*all.begin(), 1);
  EXPECT_EQ(*all.rbegin(), kThreads * kAdds);
  EXPECT_EQ(*store_->Get("counter", absl::ZeroDuration()), std::to_string(kThreads * kAdds));
  EXPECT_EQ(*store_->Add("counter", -1600), 0);
  EXPECT_EQ(*store_->Add("fresh", -5), -5);
}

TEST_P(StoreContractTest, AddToNonIntegerIsInvalidArgument) {
  ASSERT_TRUE(store_->Set("text", "hello").ok());
  EXPECT_TRUE(absl::IsInvalidArgument(store_->Add("text", 1).status()));
  EXPECT_EQ(*store_->Get("text", absl::ZeroDuration()), "hello");
}

TEST_P(StoreContractTest, WaitOnSeveralKeys) {
  ASSERT_TRUE(store_->Set("k1", "v").ok());
  absl::Time start = absl::Now();
  absl::Status s = store_->Wait({"k1", "k2", "k3"}, absl::Milliseconds(150));
  absl::Duration elapsed = absl::Now() - start;
  EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
  std::string msg(s.message());
  EXPECT_THAT(msg, ::testing::HasSubstr("k2"));
  EXPECT_THAT(msg, ::testing::HasSubstr("k3"));
  EXPECT_THAT(msg, ::testing::Not(::testing::HasSubstr("k1")));
  EXPECT_GE(elapsed, absl::Milliseconds(150));
  EXPECT_LT(elapsed, absl::Milliseconds(150) + kSlack);

  auto other = fixture_->Another();
  std::thread setter([&] {
    absl::SleepFor(absl::Milliseconds(50));
    EXPECT_TRUE(other->Set("k2", "v").ok());
    absl::SleepFor(absl::Milliseconds(50));
    EXPECT_TRUE(other->Set("k3", "v").ok());
  });
  EXPECT_TRUE(store_->Wait({"k1", "k2", "k3"}, absl::Seconds(5)).ok());
  setter.join();
  EXPECT_TRUE(store_->Wait({}, absl::ZeroDuration()).ok());
}

TEST_P(StoreContractTest, MultiGetReadsInOrderAndNamesWhatIsMissing) {
  ASSERT_TRUE(store_->Set("mg/b", "2").ok());
  ASSERT_TRUE(store_->Set("mg/a", "").ok());
  ASSERT_TRUE(store_->Set("mg/c", std::string("\0x", 2)).ok());
  absl::StatusOr<std::vector<std::string>> v =
      store_->MultiGet({"mg/c", "mg/a", "mg/b"}, absl::ZeroDuration());
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_THAT(*v, ::testing::ElementsAre(std::string("\0x", 2), "", "2"));
  EXPECT_THAT(*store_->MultiGet({}, absl::ZeroDuration()), ::testing::IsEmpty());

  v = store_->MultiGet({"mg/a", "mg/lost1", "mg/b", "mg/lost2"}, absl::ZeroDuration());
  EXPECT_TRUE(absl::IsNotFound(v.status())) << v.status();
  EXPECT_THAT(std::string(v.status().message()),
              ::testing::AllOf(::testing::HasSubstr("mg/lost1"), ::testing::HasSubstr("mg/lost2")));

  const absl::Duration timeout = absl::Milliseconds(150);
  const absl::Time start = absl::Now();
  v = store_->MultiGet({"mg/a", "mg/lost1", "mg/lost2"}, timeout);
  const absl::Duration elapsed = absl::Now() - start;
  EXPECT_TRUE(absl::IsDeadlineExceeded(v.status())) << v.status();
  const std::string msg(v.status().message());
  EXPECT_THAT(msg,
              ::testing::AllOf(::testing::HasSubstr("mg/lost1"), ::testing::HasSubstr("mg/lost2")));
  EXPECT_THAT(msg, ::testing::Not(::testing::HasSubstr("mg/a")));
  EXPECT_GE(elapsed, timeout);
  EXPECT_LT(elapsed, timeout + kSlack);

  auto other = fixture_->Another();
  std::thread setter([&] {
    absl::SleepFor(absl::Milliseconds(50));
    EXPECT_TRUE(other->Set("mg/lost2", "late2").ok());
    absl::SleepFor(absl::Milliseconds(50));
    EXPECT_TRUE(other->Set("mg/lost1", "late1").ok());
  });
  v = store_->MultiGet({"mg/lost1", "mg/b", "mg/lost2"}, absl::Seconds(5));
  setter.join();
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_THAT(*v, ::testing::ElementsAre("late1", "2", "late2"));
}

// More keys than one request of a batching store holds (etcd: 128 ranges to a transaction).
TEST_P(StoreContractTest, MultiGetOfManyKeysKeepsTheirOrderAcrossBatches) {
  constexpr int kKeys = 300;
  std::vector<std::string> keys;
  for (int i = 0; i < kKeys; ++i) {
    keys.push_back(absl::StrCat("many/", i));
    ASSERT_TRUE(store_->Set(keys.back(), absl::StrCat("v", i * 7)).ok());
  }
  absl::StatusOr<std::vector<std::string>> v = store_->MultiGet(keys, absl::ZeroDuration());
  ASSERT_TRUE(v.ok()) << v.status();
  ASSERT_EQ(v->size(), keys.size());
  for (int i = 0; i < kKeys; ++i) EXPECT_EQ((*v)[i], absl::StrCat("v", i * 7)) << "key " << i;
  keys.insert(keys.begin() + 250, "many/never");
  v = store_->MultiGet(keys, absl::ZeroDuration());
  EXPECT_TRUE(absl::IsNotFound(v.status())) << v.status();
  EXPECT_THAT(std::string(v.status().message()),
              ::testing::AllOf(::testing::HasSubstr("many/never"),
                               ::testing::Not(::testing::HasSubstr("many/2"))));
}

TEST_P(StoreContractTest, DeleteReportsExistence) {
  ASSERT_TRUE(store_->Set("d", "1").ok());
  EXPECT_TRUE(*store_->Delete("d"));
  EXPECT_FALSE(*store_->Delete("d"));
  EXPECT_TRUE(absl::IsNotFound(store_->Get("d", absl::ZeroDuration()).status()));
  EXPECT_EQ(*store_->Add("d", 3), 3);  // a deleted counter restarts from 0
}

}  // namespace adaptcomm::testing

#endif  // ADAPTCOMM_TESTS_STORE_CONTRACT_H_
