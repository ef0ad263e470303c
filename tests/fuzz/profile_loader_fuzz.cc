// libFuzzer target for the profile loader and the NCCL registry parser: any input must give a
// config or an error status, never a crash, hang or exception.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "adaptcomm/profile.h"
#include "lib/config/nccl_plan.h"
#include "lib/config/nccl_registry.h"
#include "lib/config/profile_loader.h"

namespace {

const adaptcomm::config::NcclRegistry& Registry() {
  static const auto* reg = [] {
    auto r = adaptcomm::config::NcclRegistry::Load(ADAPTCOMM_FUZZ_REGISTRY);
    if (!r.ok()) std::abort();  // the shipped registry must load
    return new adaptcomm::config::NcclRegistry(*std::move(r));
  }();
  return *reg;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  setenv("ADAPTCOMM_LOG_LEVEL", "off", 1);
  Registry();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  for (uint64_t params : {uint64_t{0}, uint64_t{20000000000}, uint64_t{235000000000}}) {
    adaptcomm::config::ResolveInputs in;
    in.text = text;
    in.file = "fuzz.yaml";
    in.model_params = params;
    in.world_size = 1 + static_cast<int>(size % 4096);
    in.strict = (size % 2) == 1;
    in.user_env = {{"NCCL_IB_HCA", "mlx5_1"}};
    auto cfg = adaptcomm::config::ResolveFromText(in, Registry());
    if (cfg.ok()) {
      if (cfg->timeouts.collective <= absl::ZeroDuration()) std::abort();
      (void)cfg->Explain();
      (void)cfg->ExplainJson();
      (void)cfg->Hash();
      (void)adaptcomm::config::PlanNccl(*cfg, 22809);
      (void)adaptcomm::config::PlanNccl(*cfg, 21600);
    } else if (cfg.status().message().empty()) {
      std::abort();  // every refusal must say why
    }
  }
  (void)adaptcomm::config::NcclRegistry::Parse(text, "fuzz-registry.yaml");
  return 0;
}
