// Staging of device views on a host backend (Gloo), on the fake CUDA: one copy each way, bad
// pointers refused naming the view, pinned-allocation failure reported.
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lib/gloo/gloo_backend.h"
#include "lib/nccl/staged_backend.h"
#include "tests/fake_nccl_api.h"

namespace adaptcomm {
namespace {

using testing::FakeNcclApi;
using testing::FakeNcclFaults;
using ::testing::HasSubstr;

std::unique_ptr<Backend> Gloo1() {
  GlooBackendOptions o;
  o.store = CreateHashStore();
  o.hostname = "127.0.0.1";
  o.init_timeout = absl::Seconds(10);
  auto b = CreateGlooBackend(o);
  EXPECT_TRUE(b.ok()) << b.status();
  return b.ok() ? std::move(*b) : nullptr;
}

OpDesc Op(OpKind kind, TensorView in, TensorView out) {
  OpDesc d;
  d.kind = kind;
  d.input = in;
  d.output = out;
  d.timeout = absl::Seconds(10);
  return d;
}

TensorView Dev(float* p, size_t n) {
  return TensorView{p, n, DType::kF32, Device::Cuda(0), nullptr};
}

TEST(NcclStaged, DeviceViewsRoundTripWithOneCopyEachWay) {
  auto fake = std::make_shared<FakeNcclApi>(testing::MakeFakeNcclWorld(), FakeNcclFaults{});
  auto staged = nccl::CreateStagedBackend(Gloo1(), fake, {.initial_bytes = 16});
  ASSERT_TRUE(staged.ok()) << staged.status();
  Backend& b = **staged;
  EXPECT_STREQ(b.name(), "gloo+staged");
  EXPECT_TRUE(b.capabilities().device_memory);

  std::vector<float> in = {1, 2, 3, 4}, out(4, 0);
  ASSERT_TRUE(b.Run(Op(OpKind::kAllgather, Dev(in.data(), 4), Dev(out.data(), 4))).ok());
  EXPECT_EQ(out, in);
  EXPECT_EQ(fake->memcpy_calls(), 2);  // D2H input, H2D output; grows past 16 bytes

  std::vector<float> x(1000, 0.5f);
  ASSERT_TRUE(b.Run(Op(OpKind::kAllreduce, Dev(x.data(), 1000), Dev(x.data(), 1000))).ok());
  EXPECT_EQ(fake->memcpy_calls(), 4);  // in place: one buffer, one copy each way
  for (float v : x) ASSERT_FLOAT_EQ(v, 0.5f);

  // Host views pass through untouched.
  std::vector<float> h = {7};
  ASSERT_TRUE(b.Run(Op(OpKind::kAllreduce, HostView(h.data(), 1), HostView(h.data(), 1))).ok());
  EXPECT_EQ(fake->memcpy_calls(), 4);
  EXPECT_FLOAT_EQ(h[0], 7.0f);
}

TEST(NcclStaged, BadViewsAreRefusedNamingTheView) {
  auto fake = std::make_shared<FakeNcclApi>(testing::MakeFakeNcclWorld(), FakeNcclFaults{});
  auto staged = nccl::CreateStagedBackend(Gloo1(), fake);
  ASSERT_TRUE(staged.ok()) << staged.status();
  std::vector<float> x(4);
  fake->MarkHost(x.data(), sizeof(float) * 4);
  absl::Status s = (*staged)->Supports(Op(OpKind::kAllreduce, Dev(x.data(), 4), Dev(x.data(), 4)));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("view output of allreduce is tagged cuda:0 but its pointer is "
                                     "host memory"));
  std::vector<float> y(4);
  TensorView v = Dev(y.data(), 4);
  v.device = Device::Cuda(3);
  s = (*staged)->Supports(Op(OpKind::kAllreduce, v, v));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("cuda:3, which does not exist"));
}

TEST(NcclStaged, PinnedAllocationFailureIsResourceExhausted) {
  FakeNcclFaults f;
  f.host_alloc_fails = true;
  auto fake = std::make_shared<FakeNcclApi>(testing::MakeFakeNcclWorld(), f);
  auto staged = nccl::CreateStagedBackend(Gloo1(), fake);
  EXPECT_EQ(staged.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(staged.status().message(), HasSubstr("pinned staging memory"));
}

}  // namespace
}  // namespace adaptcomm
