// openmla_sanitize: small GPU cases of every kernel family, run under compute-sanitizer (memcheck,
// racecheck, synccheck) by tools/gpu_check.sh. Plain program, no GoogleTest: the sanitizer's report is
// then about our kernels only, and the run stays short.
//
// Contract for each kernel family <family> (kv_cache, dense_decode, sparse_decode, ...): a file
// tests/gpu/sanitize_<family>.cpp defines, in the global namespace,
//
//     int run_<family>_sanitize_cases();   // launches small cases, returns the number that failed
//
// printing one line per failed case. It may check results, but its job is to exercise every code path
// (all page sizes, split and unsplit requests, tails) so that the sanitizer sees them.
//
// Usage: openmla_sanitize [family ...]   (no argument: every family that is linked in)
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>

// Weak references: a family whose file is absent, or compiled out by its CMake option, leaves the
// symbol null and is reported as skipped instead of breaking the link.
extern int run_kv_cache_sanitize_cases() __attribute__((weak));
extern int run_dense_decode_sanitize_cases() __attribute__((weak));
extern int run_sparse_decode_sanitize_cases() __attribute__((weak));
extern int run_sparse_prefill_sanitize_cases() __attribute__((weak));
extern int run_sparse_prefill_fp8_sanitize_cases() __attribute__((weak));
extern int run_faults_sanitize_cases() __attribute__((weak));
extern int run_mha_prefill_sanitize_cases() __attribute__((weak));
extern int run_mha_prefill_bwd_sanitize_cases() __attribute__((weak));
extern int run_merge_states_sanitize_cases() __attribute__((weak));
extern int run_dense_decode_fp8_sanitize_cases() __attribute__((weak));
extern int run_decode_varlen_q_sanitize_cases() __attribute__((weak));

namespace {

struct Family {
  const char* name;
  int (*run)();
};

bool selected(const char* name, int argc, char** argv) {
  if (argc <= 1) return true;
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return true;
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    std::printf("openmla_sanitize: no CUDA device (%s): nothing to run\n",
                err == cudaSuccess ? "0 devices" : cudaGetErrorString(err));
    return 0;
  }
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) {
    std::printf("openmla_sanitize: cannot read the properties of device 0\n");
    return 1;
  }
  if (prop.major != 9 || prop.minor != 0) {
    std::printf("openmla_sanitize: device 0 (%s) is sm_%d%d, the kernels need sm_90a: nothing to run\n", prop.name,
                prop.major, prop.minor);
    return 0;
  }

  const Family families[] = {
      {"kv_cache", run_kv_cache_sanitize_cases},
      {"dense_decode", run_dense_decode_sanitize_cases},
      {"sparse_decode", run_sparse_decode_sanitize_cases},
      {"sparse_prefill", run_sparse_prefill_sanitize_cases},
      {"sparse_prefill_fp8", run_sparse_prefill_fp8_sanitize_cases},
      {"faults", run_faults_sanitize_cases},  // garbage inputs of every decode and codec call (checked mode too)
      {"mha_prefill", run_mha_prefill_sanitize_cases},
      {"mha_prefill_bwd", run_mha_prefill_bwd_sanitize_cases},
      {"merge_states", run_merge_states_sanitize_cases},
      {"dense_decode_fp8", run_dense_decode_fp8_sanitize_cases},
      {"decode_varlen_q", run_decode_varlen_q_sanitize_cases},  // per-request query lengths, dense and sparse
  };

  int failed_families = 0;
  int ran = 0;
  for (const Family& f : families) {
    if (!selected(f.name, argc, argv)) continue;
    if (f.run == nullptr) {
      std::printf("[ SKIPPED ] %s: no sanitize cases linked (tests/gpu/sanitize_%s.cpp absent or compiled out)\n",
                  f.name, f.name);
      continue;
    }
    std::printf("[ RUN     ] %s\n", f.name);
    std::fflush(stdout);
    const int failures = f.run();
    // Surface asynchronous kernel faults here, attributed to this family, rather than in the next one.
    const cudaError_t sync_err = cudaDeviceSynchronize();
    const cudaError_t last_err = cudaGetLastError();
    ++ran;
    if (failures != 0 || sync_err != cudaSuccess || last_err != cudaSuccess) {
      ++failed_families;
      std::printf("[  FAILED ] %s: %d failed case(s)%s%s\n", f.name, failures,
                  sync_err != cudaSuccess ? ", CUDA error: " : "",
                  sync_err != cudaSuccess ? cudaGetErrorString(sync_err) : "");
      if (sync_err != cudaSuccess) break;  // a sticky error poisons the context: later families cannot run
    } else {
      std::printf("[      OK ] %s\n", f.name);
    }
    std::fflush(stdout);
  }
  std::printf("openmla_sanitize: %d famil%s run, %d failed\n", ran, ran == 1 ? "y" : "ies", failed_families);
  return failed_families == 0 ? 0 : 1;
}
