#!/usr/bin/env python3
"""The reference all-reduce (../shared/bench/torch_allreduce.py) at the sizes allreduce_bench measures, without
a copy of it: reads the reference, replaces its one size list (1 MiB .. 1 GiB, powers of 4) with --sizes, and
runs it, so its method (torch.distributed NCCL, fp32, 5 warm-up, 20 timed, wall clock to
torch.cuda.synchronize) and its JSON lines stay the reference's own. The default sizes are allreduce_bench's:
the reference's plus the engine's default gradient bucket (25 MiB).

  NCCL_NVLS_ENABLE=0 torchrun --nproc_per_node 4 tests/bench/torch_allreduce_sizes.py \\
      --ref .gpu/ref/torch_allreduce.py [--sizes 1048576,26214400]

Fails, naming what it looked for, when the reference no longer holds that size list.
"""
import argparse, os, sys

SIZE_LIST = "[1 << p for p in range(20, 31, 2)]"  # the reference's, verbatim
DEFAULT_SIZES = sorted({1 << p for p in range(20, 31, 2)} | {25 << 20})


def parse_sizes(text):
    sizes = []
    for item in text.split(","):
        if not item.strip().isdigit() or int(item) < 4 or int(item) % 4:
            sys.exit(f"torch_allreduce_sizes: --sizes item {item!r}: expected bytes, a multiple of 4 (fp32)")
        sizes.append(int(item))
    return sizes


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ref", required=True, help="path of torch_allreduce.py (a copy of ../shared/bench's)")
    ap.add_argument("--sizes", default=",".join(map(str, DEFAULT_SIZES)), help="bytes, comma-separated")
    ap.add_argument("--dry-run", action="store_true", help="check the reference and print the sizes; no torch")
    a = ap.parse_args()
    sizes = parse_sizes(a.sizes)
    try:
        src = open(a.ref).read()
    except OSError as e:
        sys.exit(f"torch_allreduce_sizes: --ref {a.ref}: {e.strerror}")
    if src.count(SIZE_LIST) != 1:
        sys.exit(f"torch_allreduce_sizes: {a.ref} does not hold the size list {SIZE_LIST} exactly once; "
                 "the wrapper needs the reference's loop over it")
    src = src.replace(SIZE_LIST, repr(sizes))
    if a.dry_run:
        print(f"would run {a.ref} at sizes {sizes} (rank {os.environ.get('RANK', '-')})")
        return
    code = compile(src, os.path.abspath(a.ref), "exec")
    exec(code, {"__name__": "__main__", "__file__": os.path.abspath(a.ref)})


if __name__ == "__main__":
    main()
