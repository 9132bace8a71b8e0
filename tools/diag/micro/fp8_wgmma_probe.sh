#!/usr/bin/env bash
# Compile-only check of the e4m3 wgmma wrappers (tools/diag/micro/fp8_wgmma_probe.cu; not built by default): nvcc for
# sm_90a, then the SASS must hold 8 QGMMA.64xNx32.F32.E4M3.E4M3 per N (4 k32 slices x SS and RS; 8-bit wgmma
# disassembles as QGMMA, 16-bit as HGMMA) and the e4m3 packs (F2FP.SATFINITE.E4M3.F32), with no local memory.
# On a Hopper GPU, run the binary it leaves (the path printed last) to check the values.
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=${1:-/tmp/fp8_wgmma_probe}
nvcc -O3 -gencode=arch=compute_90a,code=sm_90a -std=c++17 -I src -o "$out" tools/diag/micro/fp8_wgmma_probe.cu
sass=$(cuobjdump -sass "$out")
status=0
for n in 64 128 192 256; do
  count=$(grep -c "QGMMA.64x${n}x32.F32.E4M3.E4M3" <<<"$sass" || true)
  echo "QGMMA.64x${n}x32.F32.E4M3.E4M3: $count"
  [[ $count == 8 ]] || status=1
done
packs=$(grep -c "F2FP.SATFINITE.E4M3.F32" <<<"$sass" || true)
echo "F2FP.SATFINITE.E4M3.F32 (e4m3 packs): $packs"
(( packs > 0 )) || status=1
if cuobjdump -res-usage "$out" | grep -E 'LOCAL:[1-9]'; then echo "local memory used"; status=1; fi
(( status == 0 )) && echo "fp8_wgmma_probe: SASS as expected; binary $out" || echo "fp8_wgmma_probe: UNEXPECTED SASS"
exit $status
