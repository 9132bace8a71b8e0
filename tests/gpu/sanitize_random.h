// The openmla_sanitize cases' input generator: a 32-bit linear congruential state, 24-bit draws, uniform values in
// [-0.5, 0.5). Reproducible across machines (the cases' seeds fix their inputs).
#pragma once

#include <cstdint>

namespace openmla_sanitize {

inline uint32_t next(uint32_t& state) {
  state = state * 1664525u + 1013904223u;
  return state >> 8;
}
inline float uniform(uint32_t& state) { return static_cast<float>(next(state)) / 16777216.0f - 0.5f; }

}  // namespace openmla_sanitize
