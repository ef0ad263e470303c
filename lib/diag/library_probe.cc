#include "lib/diag/library_probe.h"

#include <dlfcn.h>
#include <link.h>

#include <cstdlib>
#include <initializer_list>
#include <string>

#include "absl/strings/str_cat.h"

namespace adaptcomm::diag {
namespace {

// The first of `names` that dlopen accepts (the loader's search path first, then the CUDA
// toolkit's usual location, where images often keep NCCL without an ld.so.conf entry).
void* OpenFirst(std::initializer_list<const char*> names, std::string& tried) {
  for (const char* name : names) {
    for (const std::string& candidate :
         {std::string(name), std::string("/usr/local/cuda/lib64/") + name}) {
      if (void* h = dlopen(candidate.c_str(), RTLD_NOW | RTLD_LOCAL); h != nullptr) return h;
      absl::StrAppend(&tried, tried.empty() ? "" : ", ", candidate);
    }
  }
  return nullptr;
}

std::string LoadedPath(void* handle, void* symbol) {
  link_map* map = nullptr;
  if (dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map != nullptr && map->l_name != nullptr &&
      *map->l_name != '\0') {
    return map->l_name;
  }
  Dl_info info{};
  if (symbol != nullptr && dladdr(symbol, &info) != 0 && info.dli_fname != nullptr) {
    return info.dli_fname;
  }
  return "";
}

LibraryVersion Probe(const char* library, std::initializer_list<const char*> names,
                     const char* symbol, bool nccl) {
  LibraryVersion v;
  v.library = library;
  std::string tried;
  void* h = OpenFirst(names, tried);
  if (h == nullptr) {
    v.error = absl::StrCat("not found (tried ", tried, ")");
    return v;
  }
  using GetVersion = int (*)(int*);
  auto fn = reinterpret_cast<GetVersion>(dlsym(h, symbol));
  v.path = LoadedPath(h, reinterpret_cast<void*>(fn));
  if (fn == nullptr) {
    v.error = absl::StrCat(v.path, " has no ", symbol);
    return v;
  }
  int code = 0;
  if (int rc = fn(&code); rc != 0) {
    v.error = absl::StrCat(symbol, " returned error ", rc);
    return v;
  }
  v.found = true;
  v.code = code;
  v.version = nccl ? NcclVersionTextFromCode(code) : CudaVersionText(code);
  // Kept loaded: NCCL and the CUDA libraries do not support being unloaded and reloaded.
  return v;
}

}  // namespace

std::string CudaVersionText(int code) { return absl::StrCat(code / 1000, ".", (code % 1000) / 10); }

std::string NcclVersionTextFromCode(int code) {
  if (code >= 10000) {
    return absl::StrCat(code / 10000, ".", (code % 10000) / 100, ".", code % 100);
  }
  return absl::StrCat(code / 1000, ".", (code % 1000) / 100, ".", code % 100);  // before 2.9
}

LibraryVersion ProbeCudaDriver() {
  return Probe("CUDA driver", {"libcuda.so.1"}, "cuDriverGetVersion", false);
}

LibraryVersion ProbeCudaRuntime() {
  return Probe("CUDA runtime",
               {"libcudart.so", "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0"},
               "cudaRuntimeGetVersion", false);
}

LibraryVersion ProbeNccl() {
  // The backend loads $ADAPTCOMM_NCCL_LIBRARY when set: report that file, not the default one.
  if (const char* env = std::getenv("ADAPTCOMM_NCCL_LIBRARY"); env != nullptr && *env != '\0') {
    LibraryVersion v = Probe("NCCL", {env}, "ncclGetVersion", true);
    if (!v.found) v.error = absl::StrCat("ADAPTCOMM_NCCL_LIBRARY=", env, ": ", v.error);
    return v;
  }
  return Probe("NCCL", {"libnccl.so.2"}, "ncclGetVersion", true);
}

}  // namespace adaptcomm::diag
