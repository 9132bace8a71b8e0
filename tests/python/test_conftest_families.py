"""The GPU tests' family map in conftest.py (a GPU test of a compiled-out family skips with the capability's reason):
every test file with GPU tests is in it, with features query_capability knows, and the reason text it looks for is the
one the library writes."""
import os
import re

import conftest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
FEATURES = ("kv_cache_quantize", "dense_decode", "sparse_decode", "sparse_prefill", "dense_prefill",
            "merge_attn_states", "decode_batch_invariant", "dense_decode_fp8", "dense_prefill_fp8",
            "dense_decode_any_page_size", "decode_varlen_q", "sparse_prefill_fp8")


def test_every_gpu_test_file_names_its_families():
    gpu_files = sorted(f for f in os.listdir(HERE) if f.startswith("test_") and f.endswith(".py")
                       and re.search(r"pytest\.mark\.gpu", open(os.path.join(HERE, f)).read()))
    # test_build_options.py checks the compiled-out answers itself.
    missing = [f for f in gpu_files if f not in conftest.FAMILIES_BY_FILE and f != "test_build_options.py"]
    assert not missing, f"GPU test files without an entry in conftest.FAMILIES_BY_FILE: {missing}"
    for f, features in conftest.FAMILIES_BY_FILE.items():
        assert os.path.exists(os.path.join(HERE, f)), f
        assert features and set(features) <= set(FEATURES), (f, features)


def test_the_reason_conftest_looks_for_is_the_librarys():
    text = open(os.path.join(ROOT, "src", "api", "capability.cpp")).read()
    assert '": compiled out ("' in text
