// OpenMLA: checked mode. Opt-in validation of the device-side inputs an entry cannot see from the host without a
// synchronisation: block-table entries, cache_seqlens, sparse indices and top-k lengths, append slots, the attention
// sink, and whether the schedule was planned for the call's lengths.
//
// Off by default, and free when off: an entry then reads one flag and launches exactly what it launches without this
// header. On, every entry launches one small check kernel before its main kernel, on the caller's stream: no host
// synchronisation, no allocation, so a checked call can still be captured in a CUDA graph. The check kernel records
// the FIRST violation on the device (the earliest call, then the first argument in the entry's argument order, then
// the lowest position), and checked_mode_status() reports it.
//
// What checked mode reports (every value the contracts tolerate but do not define; the kernels never fault on any of
// them and give the valid requests their results either way; docs/contracts.md, "Garbage inputs"):
//   dense_decode   block_table[i, j] outside [0, num_blocks) for a page request i uses (j < ceil(L_i / 64));
//                  cache_seqlens[i] outside [0, max_blocks_per_seq * page_block_size] (negative, or past the block table);
//                  a schedule whose records or split counts do not match the call's lengths (planned for another
//                  call, or never planned).
//   sparse_decode  indices / extra_indices slots used (j < topk_length) holding neither -1 nor a token of the cache
//                  [0, num_blocks * page_size) (flash_mla documents only -1 as "unused"; the kernel skips any other
//                  out-of-range value too); topk_length / extra_topk_length outside [0, topk] / [0, extra_topk]; NaN in
//                  attn_sink (+-inf are allowed); the schedule, as for dense decode (not for small batches without
//                  lengths, which never read it).
//   plan_decode    cache_seqlens negative or past problem.max_blocks_per_seq * page_block_size (when given); topk_length /
//                  extra_topk_length outside their ranges.
//   append_kv_cache  slots at or past num_blocks * page_size (negative slots skip a row: allowed).
//   sparse_prefill indices used (j < topk_length[t]) holding neither -1 nor a row of kv [0, s_kv); topk_length
//                  outside [0, topk]; NaN in attn_sink.
//   quantize_kv_cache / dequantize_kv_cache have no device-side argument to check.
#pragma once

#include "openmla/status.h"

namespace openmla {

// Turns checked mode on or off for the whole process, for the calls made after it returns (a call in progress on
// another thread keeps the setting it read). Without a call, checked mode is on when the environment variable
// OPENMLA_CHECK is set to anything but "" or "0" (read once, at the first entry or query).
//
// A process-wide switch, not a per-call option: the environment variable is process-wide, the violation record is
// per device, and a per-call option would have to reach every Args struct and binding.
void set_checked_mode(bool enabled);
bool checked_mode();

// The first violation found on CUDA device `device_id` (-1: the current device) since the last call, as a
// kInvalidArgument Status that names the entry, the argument, the position (request / row / slot) and the value;
// ok when none. Synchronises that device (it waits for every checked call already launched), then clears the record.
// Not for use inside CUDA-graph capture. A kCudaError Status when the synchronisation fails.
Status checked_mode_status(int device_id = -1);

}  // namespace openmla
