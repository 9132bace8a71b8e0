"""Question: what does Nsight Compute see in one sparse-decode case? Runs it for ncu.

One sparse-decode configuration, called twice (warm-up, then the call to profile), for ncu:

    ncu --clock-control none -k regex:sparse_decode_kernel --launch-skip 1 --launch-count 1 \
        --section SpeedOfLight --section WarpStateStats python3 tools/diag/profile_sparse_decode.py --b 128 --h-q 128

Inputs come from benchmarks/bench_sparse_decode.make_inputs (the benchmark's own generator)."""
import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tools/diag/ -> the repository
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))


def add_case_arguments(ap):
    """The configuration options (kernel_trace.py sparse-decode has the same ones)."""
    ap.add_argument("--b", type=int, default=128)
    ap.add_argument("--s-q", type=int, default=2)
    ap.add_argument("--h-q", type=int, default=128)
    ap.add_argument("--topk", type=int, default=2048)
    ap.add_argument("--s-k", type=int, default=32768)
    ap.add_argument("--peer", action="store_true", help="call FlashMLA (flash_mla) instead of openmla, same inputs")


def run_case(args, calls, flush_last=False):
    """Builds the benchmark's inputs for `args` and calls the sparse decode `calls` times, then synchronises.
    flush_last: the L2 is flushed before the last call (as the benchmark does before each timed call)."""
    import torch

    import bench_sparse_decode as bsd
    import openmla

    q, k_cache, indices, sink, _, _ = bsd.make_inputs(args.b, args.s_q, args.h_q, args.topk, args.s_k)
    mod = openmla
    if getattr(args, "peer", False):
        import flash_mla as mod
    meta, _ = mod.get_mla_metadata()
    for i in range(calls):
        if flush_last and i == calls - 1:
            torch.cuda.synchronize()
            torch.empty(256 << 20, dtype=torch.uint8, device="cuda").zero_()
        mod.flash_mla_with_kvcache(q, k_cache, None, None, 512, meta, is_fp8_kvcache=True, indices=indices,
                                       attn_sink=sink)
    torch.cuda.synchronize()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_case_arguments(ap)
    args = ap.parse_args()
    run_case(args, calls=2)
    print("profiled: b=%d s_q=%d h_q=%d topk=%d" % (args.b, args.s_q, args.h_q, args.topk))


if __name__ == "__main__":
    main()
