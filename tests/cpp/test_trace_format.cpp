// The one trace format (src/common/trace_format.h) on the CPU: the header and track table the host reader writes, the
// offsets of the tracks, and every kernel's format (its config.h, struct Trace). tests/python/test_kernel_trace_tool.py
// checks the Python writer against the same golden table, so the tool and the library agree.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "common/trace_format.h"
#include "kernels/dense_decode/config.h"
#include "kernels/mha_prefill/config.h"
#include "kernels/sparse_decode/config.h"
#include "kernels/sparse_prefill/config.h"

namespace openmla {
namespace {

using trace::Clock;
using trace::Format;
using trace::Kernel;
using trace::Track;

using Example = Format<Track<2, 4, 256, 6>, Track<1024, 1, 1, 12, Clock::kNanoseconds>>;

TEST(TraceFormat, TableOfAnExample) {
  static_assert(Example::kCtas == 1024 && Example::kTracks == 2);
  static_assert(Example::device_offset<0>() == 1024 * trace::kCtaValues);
  static_assert(Example::device_offset<1>() == 1024 * trace::kCtaValues + 2 * 4 * 256 * 6);
  static_assert(Example::kDeviceValues == 1024 * trace::kCtaValues + 2 * 4 * 256 * 6 + 1024 * 12);
  static_assert(Example::TrackAt<1>::kEvents == 12 && Example::TrackAt<0>::kClock == Clock::kCycles);
  static_assert(Example::TrackAt<0>::index(1, 2, 3, 4) == ((1 * 4 + 2) * 256 + 3) * 6 + 4);
  std::vector<unsigned long long> table(Example::kTableValues);
  Example::write_table(table.data(), Kernel::kSparseDecode, 3);
  // The golden table of tests/python/test_kernel_trace_tool.py (GOLDEN_TABLE).
  const std::vector<unsigned long long> golden = {
      0x45434152544C4D4Full, 1, 2, 3, 1024, 8, 2, 32788, 2, 4, 256, 6, 0, 8212, 1024, 1, 1, 12, 1, 20500};
  EXPECT_EQ(table, golden);
  EXPECT_EQ(table[trace::kHeadValues], Example::kValues);
  char magic[9] = {};
  std::memcpy(magic, &trace::kMagic, 8);
  EXPECT_STREQ(magic, "OMLTRACE");
}

// Each kernel's format: the tracks its stamps address, and a copied trace that the table describes.
template <class F>
void expect_consistent(Kernel kernel) {
  std::vector<unsigned long long> table(F::kTableValues);
  F::write_table(table.data(), kernel, 0);
  EXPECT_EQ(table[trace::kHeadKernel], static_cast<unsigned long long>(kernel));
  EXPECT_EQ(table[trace::kHeadValues], F::kValues);
  EXPECT_EQ(table[trace::kHeadTracks], static_cast<unsigned long long>(F::kTracks));
  // The last track ends where the trace does.
  const unsigned long long* last = &table[trace::kHeaderValues + (F::kTracks - 1) * trace::kTrackValues];
  EXPECT_EQ(last[trace::kTrackOffset] + last[trace::kTrackCtas] * last[trace::kTrackRoles] * last[trace::kTrackSteps] *
                                            last[trace::kTrackEvents],
            F::kValues);
  EXPECT_LT(F::kDeviceValues, size_t{1} << 31);  // common/trace.cuh indexes in 32 bits
}

TEST(TraceFormat, EveryKernelsFormat) {
  {
    using T = kernels::dense_decode::Trace;
    static_assert(T::Format::kTracks == 1 && T::Format::TrackAt<0>::kClock == Clock::kNanoseconds);
    static_assert(T::kBlocks < T::kEvents);
    expect_consistent<T::Format>(Kernel::kDenseDecode);
  }
  {
    using T = kernels::sparse_decode::Trace;
    static_assert(T::Format::kTracks == 2 && T::Format::kCtas == T::kTimelineCtas);
    static_assert(T::kRoleSwitch < T::kRoles && T::kSwitches <= T::kIters && T::kSwQBarrier < T::kEvents);
    static_assert(T::kProdFirstSent < T::kTimelineEvents && T::kProdRound1 < T::kEvents);
    expect_consistent<T::Format>(Kernel::kSparseDecode);
  }
  {
    using T = kernels::sparse_prefill::Trace;
    static_assert(T::Format::kTracks == 1 && T::Format::TrackAt<0>::kSteps == T::kPairs);
    static_assert(T::kWg0Epilogue < T::kEvents && T::kProdPrefetch < T::kEvents);
    expect_consistent<T::Format>(Kernel::kSparsePrefill);
  }
  {
    using T = kernels::mha_prefill::Trace;
    static_assert(T::Format::TrackAt<0>::kEvents == T::kFixedEvents + T::kMaxBlocks * T::kBlockEvents);
    static_assert(T::kStoresDone < T::kFixedEvents && T::kMetaCoord < T::kFixedEvents);
    expect_consistent<T::Format>(Kernel::kMhaPrefill);
  }
}

}  // namespace
}  // namespace openmla
