// Which instruction-set level the kernels run at (see dispatch.h), and its Python bindings.
#include <c10/util/Exception.h>
#include <torch/extension.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include <ATen/native/CPUBlas.h>
#include <cpuid.h>

#include "convolution/kernel_table.h"
#include "dispatch.h"
#include "kernels/elementwise_kernels.h"

namespace fuel {
namespace {

struct Level {
  Capability capability;
  const char* name;
  bool built;
  // The CPU features the level's code may use: exactly its -m flags in setup.py.
  std::vector<const char*> features;
};

const std::vector<Level>& levels() {
  static const std::vector<Level> table = {
      {Capability::DEFAULT, "DEFAULT", true, {}},
#ifdef FUEL_HAVE_AVX2
      {Capability::AVX2, "AVX2", true, {"avx2", "fma", "f16c"}},
#else
      {Capability::AVX2, "AVX2", false, {"avx2", "fma", "f16c"}},
#endif
#ifdef FUEL_HAVE_AVX512
      {Capability::AVX512, "AVX512", true, {"avx512f", "avx512bw", "avx512vl", "avx512dq", "fma", "f16c"}},
#else
      {Capability::AVX512, "AVX512", false, {"avx512f", "avx512bw", "avx512vl", "avx512dq", "fma", "f16c"}},
#endif
  };
  return table;
}

// __builtin_cpu_supports takes a string literal only, hence the table. libgcc's detection also
// checks that the OS saves the ymm/zmm registers (XGETBV), as cpuinfo does for ATen.
bool cpu_has(const std::string& feature) {
  __builtin_cpu_init();
#define FUEL_FEATURE(name) \
  if (feature == #name) return __builtin_cpu_supports(#name);
  FUEL_FEATURE(avx2)
  FUEL_FEATURE(fma)
  FUEL_FEATURE(f16c)
  FUEL_FEATURE(avx512f)
  FUEL_FEATURE(avx512bw)
  FUEL_FEATURE(avx512vl)
  FUEL_FEATURE(avx512dq)
#undef FUEL_FEATURE
  return false;
}

std::vector<std::string> missing_features(const Level& level) {
  std::vector<std::string> missing;
  for (const char* feature : level.features) {
    if (!cpu_has(feature)) missing.emplace_back(feature);
  }
  return missing;
}

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : ", ") + item;
  return out;
}

constexpr int kUnchosen = -1;
std::atomic<int> chosen{kUnchosen};
std::mutex choosing;

}  // namespace

const char* capability_name(Capability level) { return levels()[static_cast<int>(level)].name; }

std::vector<std::string> built_capabilities() {
  std::vector<std::string> names;
  for (const Level& level : levels()) {
    if (level.built) names.emplace_back(level.name);
  }
  return names;
}

std::vector<std::string> cpu_capabilities() {
  std::vector<std::string> names;
  for (const Level& level : levels()) {
    if (level.built && missing_features(level).empty()) names.emplace_back(level.name);
  }
  return names;
}

Capability choose_capability() {
  std::lock_guard<std::mutex> lock(choosing);
  const char* env = std::getenv("FUEL_CPU_CAPABILITY");
  std::string wanted = env ? env : "";
  std::transform(wanted.begin(), wanted.end(), wanted.begin(), [](unsigned char c) { return std::toupper(c); });
  const std::vector<std::string> usable = cpu_capabilities();
  Capability result = Capability::DEFAULT;
  if (wanted.empty()) {
    for (const Level& level : levels()) {
      if (std::find(usable.begin(), usable.end(), level.name) != usable.end()) result = level.capability;
    }
  } else {
    auto it = std::find_if(levels().begin(), levels().end(), [&](const Level& l) { return wanted == l.name; });
    TORCH_CHECK(it != levels().end(), "fuel_torch: FUEL_CPU_CAPABILITY=", env,
                " is not a level; use one of DEFAULT, AVX2, AVX512, or unset it to use the best level this CPU "
                "supports (here: ", usable.back(), ")");
    TORCH_CHECK(it->built, "fuel_torch: FUEL_CPU_CAPABILITY=", env, " asks for ", it->name,
                " kernels, which this build does not have (the compiler that built it could not target ",
                it->name, "); levels built: ", join(built_capabilities()),
                ". Unset FUEL_CPU_CAPABILITY or choose one of: ", join(usable));
    const std::vector<std::string> missing = missing_features(*it);
    TORCH_CHECK(missing.empty(), "fuel_torch: FUEL_CPU_CAPABILITY=", env, " asks for ", it->name,
                " kernels, but this CPU lacks ", join(missing),
                " (running them would crash with an illegal instruction). Levels this CPU supports: ", join(usable),
                ". Unset FUEL_CPU_CAPABILITY or choose one of those.");
    result = it->capability;
  }
  chosen.store(static_cast<int>(result));
  return result;
}

Capability capability() {
  const int level = chosen.load(std::memory_order_relaxed);
  return level == kUnchosen ? choose_capability() : static_cast<Capability>(level);
}

// AMX-BF16 and AMX-TILE (CPUID leaf 7, EDX bits 22 and 24). Linux hands a process the tile state
// only on request (arch_prctl); oneDNN, behind torch's brgemm, makes it.
bool cpu_has_amx_bf16() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
  return (edx >> 22 & 1) && (edx >> 24 & 1);
}

// AVX512_BF16 (CPUID leaf 7 subleaf 1, EAX bit 5): vdpbf16ps, the bfloat16 pair dot product that
// oneDNN's brgemm runs on where there is no tile unit (AMD Zen 4 and 5, Intel Cooper Lake).
bool cpu_has_avx512_bf16() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx)) return false;
  return eax >> 5 & 1;
}

// Whether torch's brgemm takes bfloat16 in the paired (VNNI) layout: it raises where oneDNN runs
// below AVX-512 (ONEDNN_MAX_CPU_ISA can hold it there on any CPU). One 1 x 16 x 2 product says.
bool paired_brgemm_runs() {
  const std::vector<at::BFloat16> a(2, at::BFloat16(1.f)), b(32, at::BFloat16(1.f));
  std::vector<float> c(16);
  try {
    at::native::cpublas::brgemm(1, 16, 2, 2, 16, 16, false, a.data(), b.data(), c.data(), true);
    at::native::cpublas::brgemm_release(true);
  } catch (const c10::Error&) {
    return false;
  }
  return true;
}

// The unit is fixed per process (the CPU, FUEL_BF16_BRGEMM read once, and whether torch's brgemm
// takes the paired layout, tried the first time it may); torch's mkldnn switch is checked per
// call, as torch's brgemm checks it: with mkldnn off, a paired bfloat16 brgemm raises instead of
// falling back.
Bf16Unit bfloat16_brgemm_unit() {
  static const Bf16Unit unit = [] {
    const char* env = std::getenv("FUEL_BF16_BRGEMM");
    if (env && std::string(env) == "0") return Bf16Unit::none;
    if (cpu_has_amx_bf16() && at::native::cpublas::could_pack(at::kBFloat16)) return Bf16Unit::tiles;
    return cpu_has_avx512_bf16() ? Bf16Unit::dot_products : Bf16Unit::none;
  }();
  if (unit == Bf16Unit::none || capability() != Capability::AVX512 || !at::globalContext().userEnabledMkldnn()) {
    return Bf16Unit::none;
  }
  static const bool runs = paired_brgemm_runs();
  return runs ? unit : Bf16Unit::none;
}

// torch's float32 brgemm runs oneDNN's kernel only while torch's mkldnn switch is on (otherwise it
// falls back to a BLAS gemm, whose threads and blocking are not ours to fix); checked per call, as
// torch checks it.
bool float_brgemm_enabled() {
  static const bool allowed = [] {
    const char* env = std::getenv("FUEL_BRGEMM");
    return !(env && std::string(env) == "0");
  }();
  return allowed && capability() != Capability::DEFAULT && at::globalContext().userEnabledMkldnn();
}

namespace {
// The CPU's vendor string (CPUID leaf 0), or "" where there is none.
std::string cpu_vendor() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid(0, &eax, &ebx, &ecx, &edx)) return "";
  char name[12];
  std::memcpy(name, &ebx, 4);
  std::memcpy(name + 4, &edx, 4);
  std::memcpy(name + 8, &ecx, 4);
  return std::string(name, 12);
}

// AMD family 19h: Zen 3 and Zen 4, of which only Zen 4 runs the AVX512 level.
bool cpu_is_amd_family_19h() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (cpu_vendor() != "AuthenticAMD" || !__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return false;
  const unsigned base = eax >> 8 & 0xf, extended = eax >> 20 & 0xff;
  return (base == 0xf ? base + extended : base) == 0x19;
}
}  // namespace

bool cpu_is_intel() { return cpu_vendor() == "GenuineIntel"; }

// The reciprocal was measured faster than the divider on Zen 5 (float16 div at 64K elements: 1.01
// -> 0.91-0.95 of torch's time). On Zen 4 the divider wins: the reciprocal's special-value check and
// estimate cost more there than the divider's two 256-bit halves (in-process A/B, float16 div,
// fuel/torch at 1 / 2 threads: 64K 1.07 / 0.90 -> 0.87 / 0.77, 4M 0.98 / 1.01 -> 0.86 / 0.83).
// FUEL_FLOAT16_DIVISION=reciprocal|divider overrides the CPU's choice (read once), for tests and
// for measuring.
bool float16_division_by_reciprocal() {
  static const bool reciprocal = [] {
    const char* env = std::getenv("FUEL_FLOAT16_DIVISION");
    if (env && *env) {
      const std::string choice(env);
      TORCH_CHECK(choice == "reciprocal" || choice == "divider", "fuel: FUEL_FLOAT16_DIVISION='", choice,
                  "' names no way to divide float16: use 'reciprocal' or 'divider', or unset it to let the CPU ",
                  "choose.");
      return choice == "reciprocal";
    }
    return !cpu_is_amd_family_19h();
  }();
  return reciprocal;
}

// Read per call, so that one process can compare the patch path with the per-tap one.
bool patch_brgemm_allowed() {
  const char* env = std::getenv("FUEL_PATCH");
  return !(env && std::string(env) == "0");
}

PathCounts& path_counts() {
  static PathCounts counts;
  return counts;
}

void bind_cpu_capability(pybind11::module_& m) {
  m.def("path_counts", [] {
    const PathCounts& c = path_counts();
    return std::map<std::string, int64_t>{{"bfloat16_brgemm_images", c.bfloat16_brgemm_images.load()},
                                          {"float_brgemm_images", c.float_brgemm_images.load()},
                                          {"patch_brgemm_images", c.patch_brgemm_images.load()},
                                          {"patch_x_in_place_images", c.patch_x_in_place_images.load()},
                                          {"plane_brgemm_images", c.plane_brgemm_images.load()},
                                          {"plane_staged_images", c.plane_staged_images.load()},
                                          {"wide_brgemm_calls", c.wide_brgemm_calls.load()},
                                          {"pointwise_brgemm_images", c.pointwise_brgemm_images.load()},
                                          {"depthwise_channels_last_calls", c.depthwise_channels_last_calls.load()},
                                          {"depthwise_in_place_calls", c.depthwise_in_place_calls.load()},
                                          {"depthwise_weight_grad_calls", c.depthwise_weight_grad_calls.load()}};
  }, "How many images the bfloat16 and float32 per-tap brgemm paths and the patch path, and how many calls the "
     "wide-kernel brgemm path, the channels_last depthwise kernel, the NCHW depthwise kernel reading x in place (without lines) and the depthwise weight gradient read in place have computed since import (float_brgemm_images "
     "includes pointwise_brgemm_images, the float32 1x1 channels_last calls read in place; patch_brgemm_images "
     "includes patch_x_in_place_images, the calls whose patches were read from x without staging, and "
     "plane_brgemm_images, float32 calls of the input's size computed on x and the output in place, which "
     "includes plane_staged_images, those NCHW calls whose planes crowd L1's sets, x copied per block).");
  m.def("bfloat16_brgemm", [] {
    switch (bfloat16_brgemm_unit()) {
      case Bf16Unit::tiles: return std::string("AMX");
      case Bf16Unit::dot_products: return std::string("AVX512_BF16");
      default: return std::string();
    }
  }, "The unit bfloat16 convolutions run on through torch's brgemm: AMX (the tile unit), AVX512_BF16 (vdpbf16ps "
     "dot products), or empty: neither in this CPU, kernels below AVX512, torch.backends.mkldnn off, or "
     "FUEL_BF16_BRGEMM=0.");
  m.def("float_brgemm", &float_brgemm_enabled,
        "Whether float32 weight-gradient-shaped convolutions run on torch's brgemm (oneDNN): kernels above DEFAULT, "
        "torch.backends.mkldnn enabled and FUEL_BRGEMM is not 0.");
  m.def("patch_brgemm", &patch_brgemm_allowed,
        "Whether brgemm convolutions with a kernel larger than 1x1 reduce over whole patches (patch_brgemm.h): "
        "FUEL_PATCH is not 0 (read per call).");
  m.def("float16_division", [] {
    const bool reciprocal = float16_division_by_reciprocal();  // first: it checks FUEL_FLOAT16_DIVISION at any level
    return std::string(reciprocal && capability() == Capability::AVX512 ? "reciprocal" : "divider");
  }, "How float16 div runs: 'reciprocal' (a reciprocal estimate and one correction, at the AVX512 level on CPUs "
     "where that beats the divider) or 'divider'; FUEL_FLOAT16_DIVISION overrides the CPU's choice (read once; "
     "raises if it names neither).");
  m.def("init_cpu_capability", [] { return std::string(capability_name(choose_capability())); },
        "Chooses the kernels' instruction-set level from the CPU and FUEL_CPU_CAPABILITY; raises if the "
        "variable asks for a level that is unknown, not built or beyond this CPU.");
  m.def("cpu_capability", [] { return std::string(capability_name(capability())); },
        "The instruction-set level the kernels run at.");
  m.def("built_capabilities", &built_capabilities, "Levels compiled into this build.");
  m.def("cpu_capabilities", &cpu_capabilities, "Levels this build has and this CPU supports.");
}

}  // namespace fuel
