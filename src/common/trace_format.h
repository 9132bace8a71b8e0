// The one trace format of every traced kernel (trace builds: CMake -DOPENMLA_TRACE=ON; docs/architecture.md, "Trace
// builds"). Constants and index arithmetic only, for host and device: each kernel's config.h describes its trace as a
// Format of Tracks, common/trace.cuh stamps it, common/trace_symbols.cuh copies it out (api/trace.h), and
// tools/diag/kernel_trace.py parses it. A production build uses the constants of this file and nothing else.
//
// A copied trace is a flat array of 64-bit values:
//
//   header       kHeaderValues: HeaderField (magic "OMLTRACE", version, kernel, variant, CTA slots, values per CTA
//                header, tracks, total values)
//   track table  kTrackValues per track: TrackField (CTAs, roles, steps, events, clock, offset of its records)
//   CTA headers  one per CTA slot (linear CTA id < the header's CTA slots), CtaField: smid | 1 << 63 (0: the slot
//                was never stamped), the block index, start and end clock64 and %globaltimer, a value of the kernel's
//                (e.g. the tiles it ran), a scratch value
//   records      per track, [cta][role][step][event], cta = the linear CTA id; 0 = never stamped
//
// The header and the track table are constants of the kernel's layout, written by the host reader; the kernel's
// __device__ array (Format::kDeviceValues) holds the CTA headers and the records. A track's clock says what its
// stamps count: clock64 cycles of the CTA's SM or %globaltimer nanoseconds (one clock for all SMs); each kernel's
// event table (config.h; the tool's copy) says which of its events are values rather than times.
#pragma once

#include <cstddef>
#include <cstdint>

namespace openmla::trace {

// Which kernel wrote a trace (HeaderField::kHeadKernel).
enum class Kernel : int { kDenseDecode = 1, kSparseDecode = 2, kSparsePrefill = 3, kMhaPrefill = 4 };
// What a track's stamps count (TrackField::kTrackClock).
enum class Clock : int { kCycles = 0, kNanoseconds = 1 };

inline constexpr unsigned long long kMagic = 0x45434152544c4d4full;  // "OMLTRACE" read as a little-endian uint64
inline constexpr unsigned long long kVersion = 1;
inline constexpr int kHeaderValues = 8, kTrackValues = 6, kCtaValues = 8;
inline constexpr int kMaxTracks = 4;
inline constexpr int kMaxTableValues = kHeaderValues + kMaxTracks * kTrackValues;

enum HeaderField : int {
  kHeadMagic = 0,
  kHeadVersion = 1,
  kHeadKernel = 2,     // Kernel
  kHeadVariant = 3,    // the kernel's variant code (its launcher: e.g. the head dimension, the dtype)
  kHeadCtas = 4,       // CTA header slots
  kHeadCtaValues = 5,  // values per CTA header (kCtaValues)
  kHeadTracks = 6,
  kHeadValues = 7,  // values of the whole copied trace
};
enum TrackField : int {
  kTrackCtas = 0,
  kTrackRoles = 1,
  kTrackSteps = 2,
  kTrackEvents = 3,
  kTrackClock = 4,   // Clock
  kTrackOffset = 5,  // index of the track's first record in the copied trace
};
enum CtaField : int {
  kCtaSmid = 0,        // %smid | 1 << 63
  kCtaBlock = 1,       // blockIdx.x | blockIdx.y << 32 | blockIdx.z << 48
  kCtaStartClock = 2,  // clock64 at the CTA's start (the kernel's trace section says which point)
  kCtaStartTimer = 3,  // %globaltimer then
  kCtaEndClock = 4,    // clock64 at its end
  kCtaEndTimer = 5,    // %globaltimer then
  kCtaValue = 6,       // the kernel's value stamped with the end (e.g. the tiles the CTA ran)
  kCtaScratch = 7,     // the last value a stamp_after waited for (no meaning of its own)
};

// One track: `kCtas` CTAs (linear id) x `kRoles` x `kSteps` x `kEvents` stamps counted by `kClock`.
template <int kCtas_, int kRoles_, int kSteps_, int kEvents_, Clock kClock_ = Clock::kCycles>
struct Track {
  static constexpr int kCtas = kCtas_, kRoles = kRoles_, kSteps = kSteps_, kEvents = kEvents_;
  static constexpr Clock kClock = kClock_;
  static constexpr size_t kValues = size_t{kCtas} * kRoles * kSteps * kEvents;
  static_assert(kCtas > 0 && kRoles > 0 && kSteps > 0 && kEvents > 0, "a track has at least one stamp");
  // Index of event `ev` of `role`'s step `step` of CTA `cta` within the track's records.
  static constexpr size_t index(unsigned cta, int role, uint32_t step, int ev) {
    return ((size_t{cta} * kRoles + role) * kSteps + step) * kEvents + ev;
  }
};

namespace format_detail {
template <int i, class First, class... Rest>
struct NthTrack {
  using type = typename NthTrack<i - 1, Rest...>::type;
};
template <class First, class... Rest>
struct NthTrack<0, First, Rest...> {
  using type = First;
};
}  // namespace format_detail

// A kernel's trace: its tracks, in order; the CTA header slots cover the largest track's CTAs.
template <class... Tracks>
struct Format {
  static constexpr int kTracks = sizeof...(Tracks);
  static_assert(kTracks >= 1 && kTracks <= kMaxTracks, "1 to kMaxTracks tracks");
  static constexpr int kCtas = [] {
    int n = 0;
    ((n = Tracks::kCtas > n ? Tracks::kCtas : n), ...);
    return n;
  }();
  static constexpr size_t kTableValues = kHeaderValues + size_t{kTracks} * kTrackValues;         // written by the host
  static constexpr size_t kDeviceValues = size_t{kCtas} * kCtaValues + (Tracks::kValues + ...);  // the kernel's array
  static constexpr size_t kValues = kTableValues + kDeviceValues;                                // a copied trace

  template <int i>
  using TrackAt = typename format_detail::NthTrack<i, Tracks...>::type;

  // Index of track `i`'s first record in the kernel's array (after the CTA headers and the tracks before it).
  template <int i>
  static constexpr size_t device_offset() {
    size_t offset = size_t{kCtas} * kCtaValues;
    int j = 0;
    ((offset += j++ < i ? Tracks::kValues : 0), ...);
    return offset;
  }

  // The header and the track table of a copied trace: host[0, kTableValues).
  static constexpr void write_table(unsigned long long* host, Kernel kernel, unsigned long long variant) {
    const unsigned long long header[kHeaderValues] = {
        kMagic, kVersion, static_cast<unsigned long long>(kernel), variant, kCtas, kCtaValues, kTracks, kValues};
    for (int i = 0; i < kHeaderValues; ++i) host[i] = header[i];
    unsigned long long* row = host + kHeaderValues;
    size_t offset = kTableValues + size_t{kCtas} * kCtaValues;
    (
        [&] {
          row[kTrackCtas] = Tracks::kCtas;
          row[kTrackRoles] = Tracks::kRoles;
          row[kTrackSteps] = Tracks::kSteps;
          row[kTrackEvents] = Tracks::kEvents;
          row[kTrackClock] = static_cast<unsigned long long>(Tracks::kClock);
          row[kTrackOffset] = offset;
          offset += Tracks::kValues;
          row += kTrackValues;
        }(),
        ...);
  }
};

}  // namespace openmla::trace
