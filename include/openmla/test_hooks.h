// OpenMLA: test hooks. NOT a stable API: engines never need these; the library's own tests and the Python
// binding's test hooks use them. The library keeps no hidden state for them: every knob here is an explicit
// argument of one call, and the production entry points (openmla/decode.h) are these with the defaults.
#pragma once

#include <cuda_runtime.h>

#include "openmla/decode.h"
#include "openmla/status.h"

namespace openmla::test_hooks {

// Knobs of dense decode that only tests turn.
struct DenseDecodeOptions {
  // Every split chunk publishes its partial before it may merge (it never takes the "the other chunk is already
  // done" path), so a test reaches the merge by the last publisher, which otherwise happens only when two chunks
  // finish at the same moment (docs/dense-decode.md, "Split requests").
  bool merge_publish_always = false;
};

// dense_decode() with options; identical to it with DenseDecodeOptions{}.
Status dense_decode(const DenseDecodeProblem& problem, const DenseDecodeArgs& args, const DenseDecodeOptions& options,
                    cudaStream_t stream);
Status dense_decode(const DecodeProblem& problem, const DenseDecodeArgs& args, const DenseDecodeOptions& options,
                    cudaStream_t stream);  // compatibility form

}  // namespace openmla::test_hooks
