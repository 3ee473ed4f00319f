#!/usr/bin/python3
"""torch.distributed gloo allreduce bandwidth: the torch peer of `l3d bench comm allreduce` in
bench/compare_comm.sh, the same measurement as bench/peers/mpi_allreduce.c.

Usage: /usr/bin/python3 gloo_allreduce.py [--nranks N] [--iters 20] [--warmup 5] [SIZE_BYTES...]
Starts N processes (two Popen'd copies of this script, rendezvous on tcp://127.0.0.1:PORT with a
free port). For each size: warmup calls, a barrier, iters timed dist.all_reduce(SUM) on a float32
tensor (gloo reduces in place, so the out-of-place form of the others costs one copy more there,
which we do not add); time = the slowest rank's elapsed / iters. Rank 0 prints `SIZE BUSBW_GBs`,
busbw = SIZE / time * 2(n-1)/n in 1e9 bytes/s.
"""
import argparse
import os
import signal
import socket
import subprocess
import sys
import time

DEFAULT_SIZES = [1 << 20, 4 << 20, 16 << 20, 64 << 20]


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(args):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    rank, n = args.rank, args.nranks
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % args.port,
                            rank=rank, world_size=n)
    sizes = args.sizes or DEFAULT_SIZES
    bad = False
    for nbytes in sizes:
        count = nbytes // 4
        idx = torch.arange(count, dtype=torch.int64)
        src = ((idx + rank) % 7).to(torch.float32)
        t = src.clone()
        for _ in range(args.warmup):
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(args.iters):
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
        el = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        dist.all_reduce(el, op=dist.ReduceOp.MAX)
        # Sanity check on fresh inputs, outside the timed loop.
        t.copy_(src)
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        want = sum(((idx[:1024] + r) % 7).to(torch.float32) for r in range(n))
        if not torch.equal(t[:1024], want):
            bad = True
        if rank == 0:
            busbw = nbytes / (el.item() / args.iters) * 2.0 * (n - 1) / n / 1e9
            print("%d %.4f" % (nbytes, busbw), flush=True)
    dist.destroy_process_group()
    if bad:
        print("gloo_allreduce: wrong results on rank %d" % rank, file=sys.stderr)
    return 1 if bad else 0


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--nranks", type=int, default=2)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--rank", type=int, default=-1, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("sizes", type=int, nargs="*")
    args = p.parse_args()
    if args.rank >= 0:
        return worker(args)
    # SIGTERM (compare_comm.sh's cleanup, timeout) unwinds through the finally below, so the
    # rank processes do not outlive this one.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    port = free_port()
    base = [sys.executable, os.path.abspath(__file__), "--nranks", str(args.nranks),
            "--iters", str(args.iters), "--warmup", str(args.warmup), "--port", str(port)]
    base += [str(s) for s in args.sizes]
    procs = [subprocess.Popen(base + ["--rank", str(r)]) for r in range(args.nranks)]
    try:
        rcs = [pr.wait(timeout=600) for pr in procs]
    finally:
        for pr in procs:
            if pr.poll() is None:
                pr.kill()
    return max(rcs) if all(rc >= 0 for rc in rcs) else 1


if __name__ == "__main__":
    sys.exit(main())
