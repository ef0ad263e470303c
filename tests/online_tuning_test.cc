// Issue #15 item 3, online tuning: the profile keys (parsed, validated with file:line, explained,
// ADAPTCOMM_ONLINE_TUNING), the tuning space, and the runtime: ops run through the trial window
// and after it give results bit for bit equal to an untuned communicator's, every rank ends with
// the same winners, and a rank whose store requests for the agreement fail or come too late makes
// every rank keep the static values, with the reason, without hanging.
#include "lib/config/online_tuning.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "adaptcomm/communicator.h"
#include "adaptcomm/profile.h"
#include "adaptcomm/store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lib/config/gloo_segment.h"
#include "lib/core/tuning/online_tuner.h"

namespace adaptcomm {
namespace {

using internal::OnlineDecision;
using ::testing::HasSubstr;

std::string Temp(const std::string& name) {
  return absl::StrCat(::testing::TempDir(), "/online_tuning_test_", getpid(), "_", name);
}

// A profile with `tuning` set to `tuning_yaml` (a flow map), written to a file of its own.
std::string WriteProfile(const std::string& name, const std::string& tuning_yaml) {
  const std::string path = Temp(name + ".yaml");
  std::ofstream(path) << "schema: 1\ndefaults:\n  tuning: " << tuning_yaml
                      << "\ntiers:\n  - name: only\n";
  return path;
}

absl::StatusOr<EffectiveConfig> Resolve(const std::string& path) {
  ProfileRequest req;
  req.file = path;
  return ResolveProfile(req);
}

const SettingRecord* Row(const EffectiveConfig& cfg, const std::string& key) {
  for (const SettingRecord& s : cfg.settings) {
    if (s.key == key) return &s;
  }
  return nullptr;
}

TEST(OnlineTuningConfig, ProfileKeysAreParsedAndExplained) {
  const std::string path =
      WriteProfile("keys",
                   "{online: {enabled: true, trials_per_candidate: 3, ops: [allreduce, reduce], "
                   "threshold_pct: 5, decision_timeout: 10s}}");
  absl::StatusOr<EffectiveConfig> cfg = Resolve(path);
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  const OnlineTuningSettings& o = cfg->tuning.online;
  EXPECT_TRUE(o.enabled);
  EXPECT_EQ(o.trials_per_candidate, 3);
  EXPECT_EQ(o.ops, (std::vector<std::string>{"allreduce", "reduce"}));
  EXPECT_FALSE(o.allow_reorder);
  EXPECT_EQ(o.threshold_pct, 5);
  EXPECT_EQ(o.decision_timeout, absl::Seconds(10));
  EXPECT_THAT(o.source, HasSubstr(":"));  // file:line
  const std::string explain = cfg->Explain();
  EXPECT_THAT(explain, HasSubstr("tuning.online.trials_per_candidate"));
  EXPECT_THAT(explain, HasSubstr("allreduce,reduce"));
  // Off by default.
  absl::StatusOr<EffectiveConfig> plain = Resolve(WriteProfile("plain", "{}"));
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_FALSE(plain->tuning.online.enabled);
  EXPECT_EQ(plain->tuning.online.ops, (std::vector<std::string>{"allreduce"}));
}

TEST(OnlineTuningConfig, BadValuesAreRefusedWithFileAndLine) {
  struct Case {
    std::string yaml;
    std::string want;
  };
  const std::vector<Case> cases = {
      {"{online: {trials_per_candidate: 0}}", "tuning.online.trials_per_candidate: 0 is outside"},
      {"{online: {ops: [broadcast]}}", "'broadcast' is not one of allreduce, reduce"},
      {"{online: {ops: []}}", "names none of allreduce, reduce"},
      {"{online: {enable: true}}", "did you mean 'enabled'"},
      {"{online: true}", "tuning.online must be a map of enabled"},
      {"{online: {decision_timeout: 10}}", "tuning.online.decision_timeout"},
      {"{online: {enabled: perhaps}}", "tuning.online.enabled"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string path = WriteProfile(absl::StrCat("bad", i), cases[i].yaml);
    absl::StatusOr<EffectiveConfig> cfg = Resolve(path);
    ASSERT_FALSE(cfg.ok()) << cases[i].yaml;
    EXPECT_EQ(cfg.status().code(), absl::StatusCode::kInvalidArgument) << cases[i].yaml;
    EXPECT_THAT(cfg.status().message(), HasSubstr(cases[i].want)) << cfg.status();
    // The file and the line of the value: the tuning block is on line 3.
    EXPECT_THAT(cfg.status().message(), HasSubstr(path.substr(path.rfind('/') + 1) + ":3:"))
        << cfg.status();
  }
}

TEST(OnlineTuningConfig, EnvironmentWinsAndStaysInTheCrossRankCheck) {
  const std::string path = WriteProfile("env", "{online: {trials_per_candidate: 2}}");
  setenv(config::kOnlineTuningEnv, "1", 1);
  absl::StatusOr<EffectiveConfig> on = Resolve(path);
  setenv(config::kOnlineTuningEnv, "sometimes", 1);
  absl::StatusOr<EffectiveConfig> bad = Resolve(path);
  unsetenv(config::kOnlineTuningEnv);
  ASSERT_TRUE(on.ok()) << on.status();
  EXPECT_TRUE(on->tuning.online.enabled);
  EXPECT_EQ(on->tuning.online.source, "env ADAPTCOMM_ONLINE_TUNING");
  const SettingRecord* row = Row(*on, "tuning.online.enabled");
  ASSERT_NE(row, nullptr);
  EXPECT_EQ(row->value, "true");
  // Ranks must agree from their first op: unlike exported variables it is compared.
  EXPECT_THAT(on->CanonicalListing(), HasSubstr("tuning.online.enabled=true"));
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(),
              HasSubstr("env ADAPTCOMM_ONLINE_TUNING: tuning.online.enabled: 'sometimes'"));
}

std::vector<std::string> Names(const std::vector<config::OnlineCandidate>& cs) {
  std::vector<std::string> out;
  for (const config::OnlineCandidate& c : cs) out.push_back(c.name);
  return out;
}

// Backend::StaticKnobs of a backend built from the default options and profile, at every size:
// shm's flat exchange up to 64 KiB and 512 KiB chunks; Gloo's ring with its own 1 MiB segments.
using Knobs = std::vector<std::pair<std::string, int64_t>>;
config::OnlineSpaceInputs Statics(int world_size, Knobs knobs) {
  config::OnlineSpaceInputs in;
  in.world_size = world_size;
  in.static_knobs = [knobs](uint64_t) { return knobs; };
  return in;
}
const Knobs kShmDefaults = {{"flat_max_bytes", 64 << 10}, {"chunk_bytes", 512 << 10}};
const Knobs kGlooDefaults = {{"algorithm", 0}, {"max_segment_bytes", 0}};

TEST(OnlineTuningSpace, ShmCandidatesAreTriedOncePerBehaviour) {
  const config::OnlineSpaceInputs in = Statics(4, kShmDefaults);
  // Up to 4 KiB the static values run the flat exchange, and every two-phase chunk is a single
  // chunk: one of them is enough.
  EXPECT_EQ(Names(config::OnlineCandidates("shm", "allreduce", config::OnlineBand(4096), in)),
            (std::vector<std::string>{"static", "two-phase/64KiB"}));
  // Up to 256 KiB the static values run one 512 KiB chunk: so do 256 KiB chunks and above.
  EXPECT_EQ(Names(config::OnlineCandidates("shm", "allreduce", config::OnlineBand(200 << 10), in)),
            (std::vector<std::string>{"static", "flat", "two-phase/64KiB"}));
  EXPECT_EQ(Names(config::OnlineCandidates("shm", "reduce", config::OnlineBand(3 << 20), in)),
            (std::vector<std::string>{"static", "flat", "two-phase/64KiB", "two-phase/256KiB",
                                      "two-phase/1MiB", "two-phase/4MiB"}));
  // Above the largest flat exchange, "flat" is the static path.
  EXPECT_EQ(Names(config::OnlineCandidates("shm", "allreduce", config::OnlineBand(64 << 20), in)),
            (std::vector<std::string>{"static", "two-phase/64KiB", "two-phase/256KiB",
                                      "two-phase/1MiB", "two-phase/4MiB"}));
  for (const auto& c : config::OnlineCandidates("shm", "allreduce", 5, in)) {
    EXPECT_FALSE(c.reorders_floats) << c.name;
  }
  // No knobs: nothing but the static values.
  EXPECT_EQ(Names(config::OnlineCandidates("shm", "broadcast", 3, in)),
            (std::vector<std::string>{"static"}));
  // Static values not known: only candidates alike each other are tried once.
  config::OnlineSpaceInputs unknown;
  unknown.world_size = 4;
  EXPECT_EQ(Names(config::OnlineCandidates("shm", "allreduce", config::OnlineBand(4096), unknown)),
            (std::vector<std::string>{"static", "flat", "two-phase/64KiB"}));
}

// The static values are the backend's at the band's largest size, a tuned table's included.
TEST(OnlineTuningSpace, CandidatesAreComparedWithTheTunedValuesOfTheirBand) {
  // A table tuned 256 KiB chunks past 64 KiB: that chunk is no candidate there.
  config::OnlineSpaceInputs shm =
      Statics(2, {{"flat_max_bytes", 64 << 10}, {"chunk_bytes", 256 << 10}});
  EXPECT_EQ(
      Names(config::OnlineCandidates("shm", "allreduce", config::OnlineBand(64 << 20), shm)),
      (std::vector<std::string>{"static", "two-phase/64KiB", "two-phase/1MiB", "two-phase/4MiB"}));
  // A table tuned Gloo's bcube up to 64 KiB and left the ring above.
  config::OnlineSpaceInputs gloo;
  gloo.world_size = 2;
  gloo.static_knobs = [](uint64_t bytes) {
    return Knobs{{"algorithm", bytes <= (64 << 10) ? 1 : 0}, {"max_segment_bytes", 0}};
  };
  EXPECT_EQ(
      Names(config::OnlineCandidates("gloo", "allreduce", config::OnlineBand(16 << 10), gloo)),
      (std::vector<std::string>{"static", "ring"}));
  EXPECT_EQ(Names(config::OnlineCandidates("gloo", "allreduce", config::OnlineBand(1 << 20), gloo)),
            (std::vector<std::string>{"static", "bcube"}));
  // Recursive doubling runs where bcube's groups would be a full mesh: only the ring is tried.
  gloo.static_knobs = [](uint64_t) { return Knobs{{"algorithm", 2}, {"max_segment_bytes", 0}}; };
  EXPECT_EQ(
      Names(config::OnlineCandidates("gloo", "allreduce", config::OnlineBand(16 << 10), gloo)),
      (std::vector<std::string>{"static", "ring"}));
}

TEST(OnlineTuningSpace, GlooCandidatesThatReorderFloatSumsNeedAllowReorder) {
  const config::OnlineSpaceInputs two = Statics(2, kGlooDefaults);
  // Up to 16 MiB on 2 ranks: the profile's 0 is Gloo's 1 MiB cap, in effect past 4 MiB; 4 and
  // 16 MiB caps are not reached there, and run alike.
  const auto at_two =
      config::OnlineCandidates("gloo", "allreduce", config::OnlineBand(8 << 20), two);
  EXPECT_EQ(Names(at_two), (std::vector<std::string>{"static", "bcube", "ring/seg 4MiB"}));
  config::OnlineSpaceInputs three = Statics(3, kGlooDefaults);
  EXPECT_EQ(Names(config::OnlineCandidates("gloo", "allreduce", 6, three)),
            (std::vector<std::string>{"static"}));
  three.allow_reorder = true;
  const auto allowed = config::OnlineCandidates("gloo", "allreduce", 6, three);
  ASSERT_EQ(allowed.size(), 3u);
  EXPECT_TRUE(allowed[1].reorders_floats);
  EXPECT_EQ(allowed[1].Values(), "algorithm=bcube");
  EXPECT_TRUE(allowed[2].reorders_floats);
  EXPECT_EQ(allowed[2].Values(), "max_segment_bytes=4194304");
}

// A segment candidate is tried only where its cap changes the static ring allreduce at the band's
// largest size (the old candidates tried a twin of the static values in every band up to 4 MiB).
TEST(OnlineTuningSpace, GlooSegmentCandidatesThatRunTheStaticAllreduceAreNotTried) {
  config::OnlineSpaceInputs in = Statics(2, kGlooDefaults);
  // Up to 4 MiB no cap of 1 MiB or more is reached on 2 ranks: the other algorithm alone.
  EXPECT_EQ(Names(config::OnlineCandidates("gloo", "allreduce", config::OnlineBand(4096), in)),
            (std::vector<std::string>{"static", "bcube"}));
  EXPECT_EQ(Names(config::OnlineCandidates("gloo", "allreduce", config::OnlineBand(4 << 20), in)),
            (std::vector<std::string>{"static", "bcube"}));
  // Up to 1 GiB (the last band's probe) every cap is reached: each is its own allreduce, the
  // 1 MiB one being the static one.
  EXPECT_EQ(Names(config::OnlineCandidates("gloo", "allreduce", config::OnlineBand(512 << 20), in)),
            (std::vector<std::string>{"static", "bcube", "ring/seg 4MiB", "ring/seg 16MiB"}));
  // A profile cap of 4 MiB: 1 MiB becomes a candidate, 4 MiB is the static one.
  in = Statics(2, {{"algorithm", 0}, {"max_segment_bytes", 4 << 20}});
  EXPECT_EQ(Names(config::OnlineCandidates("gloo", "allreduce", config::OnlineBand(512 << 20), in)),
            (std::vector<std::string>{"static", "bcube", "ring/seg 1MiB", "ring/seg 16MiB"}));
  // Up to 16 MiB that cap is not reached (16 MiB is 4 segments of 4 MiB): only 1 MiB differs.
  EXPECT_EQ(Names(config::OnlineCandidates("gloo", "allreduce", config::OnlineBand(16 << 20), in)),
            (std::vector<std::string>{"static", "bcube", "ring/seg 1MiB"}));
  // bcube ignores the cap: no segment candidate is anything but the static bcube.
  in = Statics(2, {{"algorithm", 1}, {"max_segment_bytes", 4 << 20}});
  EXPECT_EQ(Names(config::OnlineCandidates("gloo", "allreduce", config::OnlineBand(512 << 20), in)),
            (std::vector<std::string>{"static", "ring"}));
}

// Gloo's ring cuts a message into 2 * ranks segments at least (gloo/allreduce.cc, ring): a
// segment cap changes the allreduce only past 2 * ranks * cap bytes, which is what lets
// tuning try alike candidates once.
TEST(GlooSegmentTest, RingSegmentCapCountsOnlyPastTwoSegmentsPerRank) {
  constexpr uint64_t kMiB = 1 << 20;
  EXPECT_EQ(config::GlooMaxSegmentBytes(0), kMiB);  // Gloo's default
  EXPECT_EQ(config::GlooMaxSegmentBytes(4 * kMiB), 4 * kMiB);
  // 2 ranks: the default cap is reached past 4 MiB, a 4 MiB cap past 16 MiB.
  EXPECT_EQ(config::GlooRingSegmentCapInEffect(4 * kMiB, 4, 2, 0), 0u);
  EXPECT_EQ(config::GlooRingSegmentCapInEffect(4 * kMiB + 4, 4, 2, 0), kMiB);
  EXPECT_EQ(config::GlooRingSegmentCapInEffect(64 * kMiB, 4, 2, kMiB), kMiB);
  EXPECT_EQ(config::GlooRingSegmentCapInEffect(16 * kMiB, 4, 2, 4 * kMiB), 0u);
  EXPECT_EQ(config::GlooRingSegmentCapInEffect(64 * kMiB, 4, 2, 4 * kMiB), 4 * kMiB);
  // 4 ranks: eight segments before a cap of 1 MiB counts.
  EXPECT_EQ(config::GlooRingSegmentCapInEffect(8 * kMiB, 4, 4, kMiB), 0u);
  EXPECT_EQ(config::GlooRingSegmentCapInEffect(16 * kMiB, 4, 4, kMiB), kMiB);
  // The cap is rounded down to whole elements, one at least.
  EXPECT_EQ(config::GlooRingSegmentCapInEffect(100, 4, 2, 10), 8u);
  EXPECT_EQ(config::GlooRingSegmentCapInEffect(100, 4, 2, 2), 4u);
  EXPECT_EQ(config::GlooRingSegmentCapInEffect(100, 8, 2, 12), 8u);
}

// ---- the runtime ----

// Fails every request under the online tuner's keys ("/online/") from the rank that uses it, or
// delays its measurement: what a rank cut off from the store, or a late one, does to the
// agreement. Everything else passes through.
class OnlineFaultStore final : public Store {
 public:
  enum class Fault { kNone, kFail, kDelayPublish };
  OnlineFaultStore(std::shared_ptr<Store> inner, Fault fault, absl::Duration delay)
      : inner_(std::move(inner)), fault_(fault), delay_(delay) {}
  absl::Status Set(const std::string& key, const std::string& value) override {
    if (Hit(key)) {
      if (fault_ == Fault::kFail) return Down();
      if (fault_ == Fault::kDelayPublish && absl::StrContains(key, "/m/")) absl::SleepFor(delay_);
    }
    return inner_->Set(key, value);
  }
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override {
    if (Hit(key) && fault_ == Fault::kFail) return Down();
    return inner_->Get(key, timeout);
  }
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override {
    if (Hit(key) && fault_ == Fault::kFail) return Down();
    return inner_->Add(key, delta);
  }
  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override {
    for (const std::string& k : keys) {
      if (Hit(k) && fault_ == Fault::kFail) return Down();
    }
    return inner_->Wait(keys, timeout);
  }
  absl::StatusOr<bool> Delete(const std::string& key) override { return inner_->Delete(key); }

 private:
  static bool Hit(const std::string& key) { return absl::StrContains(key, "/online/"); }
  static absl::Status Down() { return absl::UnavailableError("store link down (test)"); }
  const std::shared_ptr<Store> inner_;
  const Fault fault_;
  const absl::Duration delay_;
};

struct RankSetup {
  BackendChoice backend = BackendChoice::kShm;
  std::string profile;  // empty: the default profile (online tuning off)
  std::string name;
  OnlineFaultStore::Fault fault = OnlineFaultStore::Fault::kNone;
  int fault_rank = -1;
  absl::Duration delay;
  bool elastic = false;
};

// `n` ranks as threads over one in-process store; body(rank, comm) on each.
std::vector<absl::Status> OnRanks(int n, const RankSetup& setup,
                                  const std::function<absl::Status(int, Communicator&)>& body) {
  std::shared_ptr<Store> store = CreateHashStore();
  std::vector<absl::Status> st(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      CommunicatorOptions o;
      o.rank = r;
      o.world_size = n;
      o.store = r == setup.fault_rank
                    ? std::make_shared<OnlineFaultStore>(store, setup.fault, setup.delay)
                    : store;
      o.master_addr = "127.0.0.1";
      o.name = setup.name;
      if (!setup.profile.empty()) o.profile_file = setup.profile;
      o.backend = setup.backend;
      o.fallback = Fallback::kDeny;
      if (setup.elastic) o.elastic.on_loss = LossPolicy::kShrink;
      o.timeout = absl::Seconds(60);
      o.init_timeout = absl::Seconds(60);
      auto comm = Communicator::Create(o);
      if (!comm.ok()) {
        st[r] = comm.status();
        return;
      }
      st[r] = body(r, **comm);
    });
  }
  for (auto& t : threads) t.join();
  return st;
}

// One op of the sequence both communicators run.
struct OpSpec {
  bool reduce = false;  // else allreduce
  DType dtype = DType::kF32;
  ReduceOp op = ReduceOp::kSum;
  size_t bytes = 0;
};

// Inputs whose float sums depend on the order of the additions (mixed signs and magnitudes).
std::vector<uint8_t> Input(const OpSpec& s, int rank, int index) {
  const size_t count = s.bytes / DTypeSize(s.dtype);
  std::vector<uint8_t> out(count * DTypeSize(s.dtype));
  std::mt19937_64 rng(static_cast<uint64_t>(index) * 7919 + static_cast<uint64_t>(rank));
  for (size_t i = 0; i < count; ++i) {
    const uint64_t bits = rng();
    const double magnitude = std::ldexp(static_cast<double>(bits % 100000) / 1000.0 - 50.0,
                                        static_cast<int>((bits >> 20) % 40) - 20);
    uint8_t* at = out.data() + i * DTypeSize(s.dtype);
    switch (s.dtype) {
      case DType::kF32: {
        const float f = static_cast<float>(magnitude);
        std::memcpy(at, &f, 4);
        break;
      }
      case DType::kF64:
        std::memcpy(at, &magnitude, 8);
        break;
      case DType::kF16: {  // finite halves: exponent field 5..25
        const uint16_t h = static_cast<uint16_t>(((bits >> 40) & 0x8000) |
                                                 ((5 + (bits >> 8) % 21) << 10) | (bits & 0x3ff));
        std::memcpy(at, &h, 2);
        break;
      }
      case DType::kBF16: {  // finite bfloat16: exponent field 100..150
        const uint16_t h = static_cast<uint16_t>(((bits >> 40) & 0x8000) |
                                                 ((100 + (bits >> 8) % 51) << 7) | (bits & 0x7f));
        std::memcpy(at, &h, 2);
        break;
      }
      default:
        std::memcpy(at, &bits, DTypeSize(s.dtype));
        break;
    }
  }
  return out;
}

// Runs `ops` in order on `comm`, each waited for; the results in order.
absl::StatusOr<std::vector<std::vector<uint8_t>>> RunSequence(Communicator& comm, int rank,
                                                              const std::vector<OpSpec>& ops) {
  std::vector<std::vector<uint8_t>> results;
  for (size_t i = 0; i < ops.size(); ++i) {
    const OpSpec& s = ops[i];
    std::vector<uint8_t> data = Input(s, rank, static_cast<int>(i));
    TensorView v{data.data(), data.size() / DTypeSize(s.dtype), s.dtype};
    Work w = s.reduce ? comm.Reduce(v, ReduceOptions{.root = 1, .op = s.op})
                      : comm.Allreduce(v, AllreduceOptions{.op = s.op});
    if (absl::Status st = w.Wait(); !st.ok()) return st;
    results.push_back(std::move(data));
  }
  return results;
}

// Every op kind x dtype x reduce op mixed, in bands with 2, 3, 6 and 5 candidates (kShmCandidates),
// each band through its trial window (trials_per_candidate 2) and beyond it.
std::vector<OpSpec> MixedSequence() {
  const std::vector<std::pair<DType, ReduceOp>> kinds = {
      {DType::kF32, ReduceOp::kSum},  {DType::kI32, ReduceOp::kSum}, {DType::kF64, ReduceOp::kSum},
      {DType::kBF16, ReduceOp::kSum}, {DType::kF32, ReduceOp::kAvg}, {DType::kI64, ReduceOp::kProd},
      {DType::kF16, ReduceOp::kSum},  {DType::kI8, ReduceOp::kMax}};
  std::vector<OpSpec> ops;
  for (size_t bytes : {size_t{3072}, size_t{150} << 10, size_t{3} << 20, size_t{5} << 20}) {
    for (int i = 0; i < 16; ++i) {
      const auto [dtype, op] = kinds[i % kinds.size()];
      ops.push_back({false, dtype, op, bytes});
      ops.push_back({true, dtype, op, bytes});
    }
  }
  return ops;
}

// Per band of MixedSequence() on shm, allreduce then reduce: what the backend's static values do
// there is no candidate (up to 4 KiB the flat exchange, up to 256 KiB one 512 KiB chunk, above it
// 512 KiB chunks, and every chunk of the message's size or more is a single chunk).
const std::vector<int> kShmCandidates = {2, 3, 6, 5, 2, 3, 6, 5};

// How many candidates each band tried, in Decisions() order.
std::vector<int> CandidateCounts(const std::vector<OnlineDecision>& decisions) {
  std::vector<int> out;
  for (const OnlineDecision& d : decisions) out.push_back(d.candidates);
  return out;
}

// The decisions as comparable text: op, band, state, winner and values.
std::vector<std::string> Summary(const std::vector<OnlineDecision>& decisions) {
  std::vector<std::string> out;
  for (const OnlineDecision& d : decisions) {
    out.push_back(absl::StrCat(d.op, " ", d.band, " ", static_cast<int>(d.state), " ", d.winner,
                               " ", d.values, d.reason.empty() ? "" : " fallback"));
  }
  return out;
}

void ExpectBitIdenticalAndAgreed(int world, BackendChoice backend, const std::string& tag) {
  const std::string online =
      WriteProfile("on_" + tag,
                   "{online: {enabled: true, trials_per_candidate: 2, ops: [allreduce, reduce], "
                   "threshold_pct: 0, decision_timeout: 20s}}");
  const std::vector<OpSpec> ops = MixedSequence();
  std::vector<std::vector<std::vector<uint8_t>>> want(world), got(world);
  std::vector<std::vector<std::string>> decided(world);
  std::vector<std::vector<int>> counts(world);
  std::vector<std::string> explain(world);
  RankSetup plain;
  plain.backend = backend;
  plain.name = "untuned_" + tag;
  std::vector<absl::Status> st = OnRanks(world, plain, [&](int r, Communicator& comm) {
    auto res = RunSequence(comm, r, ops);
    if (!res.ok()) return res.status();
    want[r] = *std::move(res);
    return internal::OnlineTuningDecisions(comm).empty()
               ? absl::OkStatus()
               : absl::InternalError("tuned without being asked");
  });
  for (const absl::Status& s : st) ASSERT_TRUE(s.ok()) << s;
  RankSetup tuned = plain;
  tuned.profile = online;
  tuned.name = "tuned_" + tag;
  st = OnRanks(world, tuned, [&](int r, Communicator& comm) {
    auto res = RunSequence(comm, r, ops);
    if (!res.ok()) return res.status();
    got[r] = *std::move(res);
    decided[r] = Summary(internal::OnlineTuningDecisions(comm));
    counts[r] = CandidateCounts(internal::OnlineTuningDecisions(comm));
    explain[r] = comm.Explain();
    return absl::OkStatus();
  });
  for (const absl::Status& s : st) ASSERT_TRUE(s.ok()) << s;
  for (int r = 0; r < world; ++r) {
    ASSERT_EQ(got[r].size(), ops.size());
    for (size_t i = 0; i < ops.size(); ++i) {
      const bool root_only = ops[i].reduce && r != 1;  // non-roots' buffers are unspecified
      if (root_only) continue;
      ASSERT_EQ(got[r][i].size(), want[r][i].size());
      if (std::memcmp(got[r][i].data(), want[r][i].data(), got[r][i].size()) != 0) {
        size_t first = 0;
        while (got[r][i][first] == want[r][i][first]) ++first;
        ADD_FAILURE() << "rank " << r << " op " << i << " (" << (ops[i].reduce ? "reduce " : "")
                      << DTypeName(ops[i].dtype) << " " << ReduceOpName(ops[i].op) << ", "
                      << ops[i].bytes << " B) differs from the untuned result at byte " << first;
      }
    }
  }
  // Every band decided by measurement, alike on every rank.
  ASSERT_EQ(decided[0].size(), 8u);  // 2 ops x 4 bands
  for (const std::string& d : decided[0]) {
    EXPECT_THAT(
        d, HasSubstr(absl::StrCat(" ", static_cast<int>(OnlineDecision::State::kDecided), " ")));
    EXPECT_THAT(d, ::testing::Not(HasSubstr("fallback"))) << d;
  }
  for (int r = 1; r < world; ++r) EXPECT_EQ(decided[r], decided[0]) << "rank " << r;
  for (int r = 0; r < world; ++r) EXPECT_EQ(counts[r], kShmCandidates) << "rank " << r;
  EXPECT_THAT(explain[0], HasSubstr("online tuning (tuning.online.enabled from "));
  EXPECT_THAT(explain[0], HasSubstr("(online: 2 trials, median "));
}

TEST(OnlineTuning, ShmResultsAreBitIdenticalToUntunedAndRanksAgreeTwoRanks) {
  ExpectBitIdenticalAndAgreed(2, BackendChoice::kShm, "shm2");
}

TEST(OnlineTuning, ShmResultsAreBitIdenticalToUntunedAndRanksAgreeThreeRanks) {
  ExpectBitIdenticalAndAgreed(3, BackendChoice::kShm, "shm3");
}

// Gloo allreduces of `dtypes` in two bands through their windows, tuned and untuned. Up to 4 KiB
// the segment caps change nothing (bcube is the one candidate); up to 16 MiB Gloo's own 1 MiB
// segments are the static ring's, and a 4 MiB cap is reached on neither 2 nor 3 ranks (nor is
// 16 MiB): 2 and 3 candidates.
void ExpectGlooBitIdenticalAndAgreed(int world, const std::string& tuning,
                                     const std::vector<DType>& dtypes, const std::string& tag) {
  const std::string online = WriteProfile(tag, tuning);
  std::vector<OpSpec> ops;
  for (size_t bytes : {size_t{2048}, size_t{5} << 20}) {
    for (int i = 0; i < 12; ++i)
      ops.push_back({false, dtypes[i % dtypes.size()], ReduceOp::kSum, bytes});
  }
  std::vector<std::vector<std::vector<uint8_t>>> want(world), got(world);
  std::vector<std::vector<std::string>> decided(world);
  std::vector<std::vector<int>> counts(world);
  RankSetup setup;
  setup.backend = BackendChoice::kGloo;
  setup.name = tag + "_untuned";
  auto run = [&](std::vector<std::vector<std::vector<uint8_t>>>& out) {
    return [&](int r, Communicator& comm) -> absl::Status {
      auto res = RunSequence(comm, r, ops);
      if (!res.ok()) return res.status();
      out[r] = *std::move(res);
      decided[r] = Summary(internal::OnlineTuningDecisions(comm));
      counts[r] = CandidateCounts(internal::OnlineTuningDecisions(comm));
      return absl::OkStatus();
    };
  };
  for (const absl::Status& s : OnRanks(world, setup, run(want))) ASSERT_TRUE(s.ok()) << s;
  setup.name = tag + "_tuned";
  setup.profile = online;
  for (const absl::Status& s : OnRanks(world, setup, run(got))) ASSERT_TRUE(s.ok()) << s;
  for (int r = 0; r < world; ++r) {
    for (size_t i = 0; i < ops.size(); ++i) EXPECT_EQ(got[r][i], want[r][i]) << r << " " << i;
  }
  ASSERT_EQ(decided[0].size(), 2u);
  for (const std::string& d : decided[0]) EXPECT_THAT(d, ::testing::Not(HasSubstr("fallback")));
  for (int r = 1; r < world; ++r) EXPECT_EQ(decided[r], decided[0]) << "rank " << r;
  for (int r = 0; r < world; ++r) EXPECT_EQ(counts[r], (std::vector<int>{2, 3})) << "rank " << r;
}

// Allreduce only has Gloo knobs; with two ranks every candidate keeps float sums bit for bit.
TEST(OnlineTuning, GlooTwoRanksResultsAreBitIdenticalAndRanksAgree) {
  ExpectGlooBitIdenticalAndAgreed(
      2, "{online: {enabled: true, trials_per_candidate: 2, threshold_pct: 0}}",
      {DType::kF32, DType::kI32, DType::kBF16, DType::kF64}, "gloo2");
}

// With three ranks Gloo's candidates reorder float sums: allowed here, integer sums stay exact.
TEST(OnlineTuning, GlooThreeRanksAllowReorderKeepsIntegerResults) {
  ExpectGlooBitIdenticalAndAgreed(
      3,
      "{online: {enabled: true, trials_per_candidate: 2, threshold_pct: 0, allow_reorder: true}}",
      {DType::kI32, DType::kI64, DType::kU8}, "gloo3");
}

// Runs allreduces of 100 floats (one band, 3 candidates) until past the decision point, checks
// each result; the decisions on every rank.
std::vector<std::vector<OnlineDecision>> RunWithFault(const RankSetup& setup, int world) {
  std::vector<std::vector<OnlineDecision>> decisions(world);
  std::vector<absl::Status> st = OnRanks(world, setup, [&](int r, Communicator& comm) {
    for (int i = 0; i < 10; ++i) {
      std::vector<int32_t> v(100, r + i);
      if (absl::Status s = comm.Allreduce(HostView(v.data(), v.size())).Wait(); !s.ok()) return s;
      const int32_t want = world * i + world * (world - 1) / 2;
      for (int32_t x : v) {
        if (x != want) return absl::DataLossError(absl::StrCat(x, " instead of ", want));
      }
    }
    decisions[r] = internal::OnlineTuningDecisions(comm);
    return absl::OkStatus();
  });
  for (const absl::Status& s : st) EXPECT_TRUE(s.ok()) << s;
  return decisions;
}

TEST(OnlineTuning, ARankWhoseStoreFailsMakesEveryRankKeepTheStaticValues) {
  RankSetup setup;
  setup.name = "publish_fails";
  setup.profile = WriteProfile(
      "fails", "{online: {enabled: true, trials_per_candidate: 2, decision_timeout: 2s}}");
  setup.fault = OnlineFaultStore::Fault::kFail;
  setup.fault_rank = 2;
  const absl::Time start = absl::Now();
  const auto decisions = RunWithFault(setup, 3);
  EXPECT_LT(absl::Now() - start, absl::Seconds(20));  // bounded: no hang
  for (int r = 0; r < 3; ++r) {
    ASSERT_EQ(decisions[r].size(), 1u) << "rank " << r;
    const OnlineDecision& d = decisions[r][0];
    EXPECT_EQ(d.state, OnlineDecision::State::kDecided);
    EXPECT_EQ(d.winner, "static");
    EXPECT_TRUE(d.knobs.empty());
    EXPECT_THAT(d.reason, HasSubstr("fell back to the static values"));
    // The others waited for rank 2's medians; rank 2 knows it could not publish.
    EXPECT_THAT(d.reason, HasSubstr(r == 2 ? "rank 2 could not publish" : "rank(s) 2")) << d.reason;
  }
}

TEST(OnlineTuning, ALateRankMakesEveryRankKeepTheStaticValuesTogether) {
  RankSetup setup;
  setup.name = "publish_late";
  setup.profile = WriteProfile(
      "late", "{online: {enabled: true, trials_per_candidate: 2, decision_timeout: 1s}}");
  setup.fault = OnlineFaultStore::Fault::kDelayPublish;
  setup.fault_rank = 1;
  setup.delay = absl::Milliseconds(2500);
  const auto decisions = RunWithFault(setup, 3);
  for (int r = 0; r < 3; ++r) {
    ASSERT_EQ(decisions[r].size(), 1u) << "rank " << r;
    // Rank 1 saw every measurement in the end, but the verdict was taken without its own.
    EXPECT_EQ(decisions[r][0].winner, "static") << "rank " << r;
    EXPECT_THAT(decisions[r][0].reason, HasSubstr("no measurement from rank(s) 1")) << r;
  }
}

TEST(OnlineTuning, ExplainSaysWhyAnElasticCommunicatorDoesNotTune) {
  RankSetup setup;
  setup.name = "elastic";
  setup.profile = WriteProfile("elastic", "{online: {enabled: true}}");
  std::vector<std::string> explain(2);
  for (bool elastic : {false, true}) {
    setup.elastic = elastic;
    setup.name = elastic ? "elastic" : "not_elastic";
    std::vector<absl::Status> st = OnRanks(2, setup, [&](int r, Communicator& comm) {
      if (r == 0) explain[elastic] = comm.Explain();
      std::vector<float> v(8, 1.0f);
      absl::Status s = comm.Allreduce(HostView(v.data(), v.size())).Wait();
      return s.ok() && v[0] != 2.0f ? absl::DataLossError("wrong sum") : s;
    });
    for (const absl::Status& s : st) ASSERT_TRUE(s.ok()) << s;
  }
  EXPECT_THAT(explain[0], HasSubstr("online tuning (tuning.online.enabled from "));
  EXPECT_THAT(explain[0], HasSubstr("no tuned op issued yet"));
  EXPECT_THAT(explain[1], HasSubstr("off: elastic communicators do not tune online"));
}

}  // namespace
}  // namespace adaptcomm
