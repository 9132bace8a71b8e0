// Launch plan of dense MHA prefill: the grid, the tile hand-out and the workspace, as pure host functions of the
// problem (no CUDA call), unit-tested on the CPU (tests/cpp/test_mha_prefill_api.cpp). The tile order itself is in
// kernels/mha_prefill/config.h (the tile) and common/varlen.h (its arithmetic), shared with the kernel.
//
// Each choice names the measurement it rests on (docs/mha-prefill.md, "Decisions").
#pragma once

#include <cstddef>
#include <cstdint>

#include "openmla/prefill.h"

namespace openmla::heuristics {

// The workspace holds the tile counter of the dynamic hand-out (one int32, zeroed before each launch), padded to 16
// bytes.
inline constexpr size_t kMhaPrefillWorkspaceBytes = 16;

// An upper bound on the tiles (query head x 128-row query block) of a call: sum_i ceil(s_q,i / 128) <=
// (total_q + 127 batch) / 128 over any split of total_q rows into `batch` sequences, and <= batch *
// ceil(max_seqlen_qo / 128) when the caller gives a bound (max_seqlen_qo > 0); times h_q.
int64_t mha_prefill_max_tiles(int64_t batch, int64_t total_q, int64_t h_q, int64_t max_seqlen_qo);

struct MhaPrefillLaunchPlan {
  int64_t max_tiles = 0;  // mha_prefill_max_tiles
  int grid = 0;           // persistent CTAs: min(num_sms, max_tiles); 0 when there is nothing to do
  // Tiles are taken from an atomic counter (in the workspace) rather than round-robin when their costs differ: under
  // causal (a tile's cost grows with its query block) or with several sequences (their lengths are only known on the
  // device). Round-robin over tiles of unequal cost leaves CTAs idle at the end: with b = 2, s = 4096, causal, 132
  // CTAs, CTA c would take query blocks 31 - (c + 4 k) mod 32, a fifth more work for some CTAs than for others.
  bool dynamic_tiles = false;
  // O leaves through shared memory and TMA stores (the staged kernel) when problem.epilogue says so, or, with kAuto,
  // when the sequences are short: total_q <= kMhaPrefillStagedRows * batch. There the epilogue, in which both consumer
  // warpgroups store while the tensor cores idle, is a large part of a tile (b 16 x s 1024: +3 to +3.5 %); on long
  // sequences the staged kernel measured 1.3-1.5 % slower than the direct stores (docs/mha-prefill.md, decision
  // mha-v0.14).
  bool staged_out = false;
};

inline constexpr int64_t kMhaPrefillStagedRows = 2048;

// `total_q`: rows of q; `num_sms` > 0: the SMs to run on.
MhaPrefillLaunchPlan plan_mha_prefill_launch(const MhaPrefillProblem& problem, int64_t total_q, int num_sms);

// The FP8 forward's key block (decision fp8-d5, docs/fp8-prefill-design.md): 128 or 192 keys, a kernel each in every
// build. 192 spreads the consumer step's per-block fixed part (stage tests, row-max shuffles, O's rescale) over 1.5x
// the keys; 128 wastes fewer keys on the causal diagonal (a 192-key block there holds up to 191 keys past the tile's
// last row against 127). Default 192: predicted faster on the s >= 4096 rows (the design note's estimate; not yet
// measured on a GPU). The environment variable OPENMLA_FP8_BLOCK_N (128 or 192) overrides it, read once per process
// (the first FP8 call); the Python layer's _set_mha_prefill_fp8_block_n(n) overrides both for later calls (A/Bs in
// one process: the benchmark, the tests).
inline constexpr int kMhaPrefillFp8BlockN = 192;
inline constexpr const char* kMhaPrefillFp8BlockNEnv = "OPENMLA_FP8_BLOCK_N";
// The value of OPENMLA_FP8_BLOCK_N: null or empty -> the default; "128" / "192" -> that; anything else -> 0 (the FP8
// call then fails with a message naming the variable, rather than timing a kernel nobody asked for).
int parse_mha_prefill_fp8_block_n(const char* env);
// The key block later FP8 calls launch: the setter's value if set, else the environment's (read once), else the
// default; 0 when the environment's value is not 128 or 192.
int mha_prefill_fp8_block_n();
// 128 or 192: later calls use it; any other value (the Python layer's None) clears the override.
void set_mha_prefill_fp8_block_n(int block_n);

}  // namespace openmla::heuristics
