"""nn.SyncBatchNorm beside fusejit's synchronized statistics (Problem::stat_ranks), one process
per GPU under torch.distributed (NCCL, torch.multiprocessing.spawn).

    python3 bench/sync_bn_torch.py --compare DIR [--precision float64|float32]
    python3 bench/sync_bn_torch.py --bench [--shapes 1024x8192x8192,16384x4096x4096] [--world N]

--compare DIR: DIR is what tests/multi/sync_stats_test.cpp writes with FUSEJIT_SYNC_DUMP_DIR=DIR
(manifest.json and raw little-endian arrays: every rank's rows of x and of fusejit's y, the
layer, the running stats before, and every rank's running and saved stats after). Each rank
runs F.linear(x, W, b) * scale -> nn.SyncBatchNorm on its rows of the same rounded inputs in
float64 (default) and prints the relative error (2-norm of the difference over the 2-norm of
PyTorch's value, summed over ranks) of fusejit's y, running stats and saved stats. Exits 1 when
one is above its threshold:
  y:     fp32 2e-5, tf32 2e-3, fp16/bf16 1e-2. fusejit stores y in the data type, so a 16-bit
         y carries its rounding (2^-9 relative for bf16, 2^-11 for fp16, per element); these
         are also the C++ tests' thresholds (sweep_threshold).
  stats: 1e-4, or 2e-3 for tf32 data (the GEMM rounds x and W to 10 bits) and 16-bit
         parameter storage (running stats stored with 11 bits). Otherwise the statistics are
         fp32 sums of exact products of the same rounded inputs: their error is fp32 rounding
         (~1e-6 here), far below 1e-4; a wrong merge or unbiasing shows as >= 1e-3.
With --precision float32 PyTorch's own rounding adds ~1e-6 to every figure.
Exit 77 (skipped) when there are fewer GPUs than the dump's ranks.

--bench: per step time of F.linear + * scale + nn.SyncBatchNorm (train mode, forward only under
torch.no_grad(), bf16 model as in bench/torch_layer.py) on each rank's M / world rows, beside
the same layer with nn.BatchNorm1d (no synchronization). CUDA events around 10 back-to-back
steps, 5 warm-up steps, median of --runs samples; the slowest rank's median is printed.
"""
import os

# Before torch (and so NCCL) reads them: NVLink multicast stays off on these machines.
os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import socket  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from timing import median_ms  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

STORAGE = {"fp32": torch.float32, "tf32": torch.float32, "fp16": torch.float16,
           "bf16": torch.bfloat16}
Y_THRESHOLD = {"fp32": 2e-5, "tf32": 2e-3, "fp16": 1e-2, "bf16": 1e-2}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init(rank, world, port):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world,
                            device_id=torch.device("cuda", rank))


def load(directory, manifest, key, dtype, shape):
    path = os.path.join(directory, manifest["files"][key])
    with open(path, "rb") as f:
        data = bytearray(f.read())
    count = math.prod(shape)
    itemsize = torch.empty((), dtype=dtype).element_size()
    if len(data) != count * itemsize:
        raise ValueError(f"{path}: {len(data)} bytes, expected {count * itemsize}")
    if count == 0:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(data, dtype=dtype).reshape(shape).clone()


# ---- --compare ---------------------------------------------------------------------------------

def compare_worker(rank, world, port, directory, precision, out_path):
    init(rank, world, port)
    dev = torch.device("cuda", rank)
    with open(os.path.join(directory, "manifest.json")) as f:
        m = json.load(f)
    N, K = m["N"], m["K"]
    rows = m["rows"][rank]
    data_t, par_t = STORAGE[m["storage_dtype"]], STORAGE[m["param_dtype"]]
    ct = torch.float64 if precision == "float64" else torch.float32

    def param(key):
        return load(directory, m, key, par_t, (N,)).to(dev, ct)

    x = load(directory, m, f"x{rank}", data_t, (rows, K)).to(dev, ct)
    w = load(directory, m, "w", data_t, (N, K)).to(dev, ct)
    if m["dtype"] == "tf32":
        # fusejit's tf32 GEMM multiplies operands rounded to 10 mantissa bits (ties away from
        # zero); the reference takes the same operands, so the error measured is the kernel's.
        def tf32(t):
            b = t.to(torch.float32).contiguous().view(torch.int32)
            return ((b + 0x1000) & ~0x1FFF).view(torch.float32).to(ct)
        x, w = tf32(x), tf32(w)
    bn = nn.SyncBatchNorm(N, eps=m["eps"], momentum=m["momentum"]).to(dev, ct)
    with torch.no_grad():
        bn.weight.copy_(param("gamma"))
        bn.bias.copy_(param("beta"))
        bn.running_mean.copy_(param("running_mean_in"))
        bn.running_var.copy_(param("running_var_in"))
        bn.num_batches_tracked.fill_(m["num_batches_tracked_in"])
        z = F.linear(x, w, param("bias")) * param("scale")
        y = bn.train()(z)
        # The global batch's mean and 1/sqrt(biased var + eps): fusejit's save_mean/save_invstd.
        total = torch.tensor([float(rows)], device=dev, dtype=ct)
        dist.all_reduce(total)
        s1 = z.sum(0)
        dist.all_reduce(s1)
        mean = s1 / total
        s2 = ((z - mean) ** 2).sum(0)
        dist.all_reduce(s2)
        invstd = 1.0 / torch.sqrt(s2 / total + m["eps"])

    def ours(key, dtype, shape):
        return load(directory, m, key, dtype, shape).to(dev, ct)

    # Squared error and squared reference, summed over ranks for y, per rank for the stats
    # (every rank holds all N of them).
    figures = {}

    def add(name, got, ref, over_ranks):
        sums = torch.stack([((got - ref) ** 2).sum(), (ref ** 2).sum(),
                            (~torch.isfinite(got)).sum().to(ct)])
        if over_ranks:
            dist.all_reduce(sums)
        figures[name] = [float(v) for v in sums]

    add("y", ours(f"y{rank}", data_t, (rows, N)), y, True)
    add("running_mean", ours(f"running_mean{rank}", par_t, (N,)), bn.running_mean, False)
    add("running_var", ours(f"running_var{rank}", par_t, (N,)), bn.running_var, False)
    add("save_mean", ours(f"save_mean{rank}", torch.float32, (N,)), mean, False)
    add("save_invstd", ours(f"save_invstd{rank}", torch.float32, (N,)), invstd, False)
    every = [None] * world
    dist.all_gather_object(every, figures)
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump({"figures": every,
                       "torch_num_batches_tracked": int(bn.num_batches_tracked)}, f)
    dist.destroy_process_group()


def compare(directory, precision):
    with open(os.path.join(directory, "manifest.json")) as f:
        m = json.load(f)
    world = m["world"]
    if torch.cuda.device_count() < world:
        print(f"SKIPPED: the dump has {world} ranks, this machine {torch.cuda.device_count()} "
              "GPU(s)")
        return 77
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.json")
        mp.spawn(compare_worker, args=(world, free_port(), directory, precision, out),
                 nprocs=world, join=True)
        with open(out) as f:
            result = json.load(f)
    stats_thr = 2e-3 if m["dtype"] == "tf32" or m["param_dtype"] != "fp32" else 1e-4
    print(f"fusejit vs nn.SyncBatchNorm ({precision}, torch {torch.__version__}): {m['case']}")
    print(f"  {m['M']}x{m['N']}x{m['K']} {m['dtype']}, params {m['param_dtype']}, "
          f"momentum {m['momentum']}, {world} ranks with rows {m['rows']}, config {m['config']}")
    ok = True
    print(f"  {'what':<14}{'rank':>6}{'rel. error':>12}{'threshold':>11}")
    for name in ("y", "running_mean", "running_var", "save_mean", "save_invstd"):
        thr = Y_THRESHOLD[m["dtype"]] if name == "y" else stats_thr
        ranks = [0] if name == "y" else range(world)  # y's sums are over all ranks already
        for r in ranks:
            err2, ref2, bad = result["figures"][r][name]
            rel = math.sqrt(err2 / ref2) if ref2 > 0 else math.sqrt(err2)
            good = bad == 0 and rel < thr
            ok = ok and good
            print(f"  {name:<14}{'all' if name == 'y' else r:>6}{rel:>12.2e}{thr:>11.0e}"
                  f"{'' if good else '  FAILED' + (' (non-finite)' if bad else '')}")
    nbt = result["torch_num_batches_tracked"]
    if nbt != m["num_batches_tracked_out"]:
        print(f"  num_batches_tracked: fusejit {m['num_batches_tracked_out']}, torch {nbt}  FAILED")
        ok = False
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


# ---- --bench -----------------------------------------------------------------------------------

class Layer(nn.Module):  # Linear -> * scale -> BatchNorm (synchronized or not)
    def __init__(self, k, n, sync):
        super().__init__()
        self.gemm = nn.Linear(k, n)
        self.scale = nn.Parameter(torch.randn(n) * 0.02 + 1.0)
        self.bn = nn.SyncBatchNorm(n) if sync else nn.BatchNorm1d(n)

    def forward(self, x):
        return self.bn(F.linear(x, self.gemm.weight, self.gemm.bias) * self.scale)


def bench_worker(rank, world, port, shapes, runs, out_path):
    init(rank, world, port)
    dev = torch.device("cuda", rank)
    rows = []
    for shape in shapes:
        M, N, K = (int(v) for v in shape.split("x"))
        m = M // world
        torch.manual_seed(0)
        sync = Layer(K, N, True).to(dev, torch.bfloat16).train()
        torch.manual_seed(0)
        local = Layer(K, N, False).to(dev, torch.bfloat16).train()
        torch.manual_seed(1 + rank)
        x = torch.randn(m, K, device=dev, dtype=torch.bfloat16)
        with torch.no_grad():
            try:
                sync(x)
            except RuntimeError as e:
                # Kept for PyTorch builds whose SyncBatchNorm kernels take no 16-bit running
                # stats: fp32 BatchNorm parameters under bf16 activations (autocast's layout).
                # Every rank takes the same path, so the collectives stay matched.
                if rank == 0:
                    print(f"note: bf16 SyncBatchNorm failed ({e}); BatchNorm parameters in fp32")
                sync.bn.float()
                local.bn.float()
            # Every rank runs the same number of synchronized steps: each is a collective.
            t_sync = median_ms(lambda: sync(x), runs)
            t_local = median_ms(lambda: local(x), runs)
        both = torch.tensor([t_sync, t_local], device=dev, dtype=torch.float64)
        dist.all_reduce(both, op=dist.ReduceOp.MAX)  # a step is as slow as its slowest rank
        rows.append([shape, world, m, float(both[1]), float(both[0])])
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(rows, f)
    dist.destroy_process_group()


def bench(shapes, world, runs):
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "bench.json")
        mp.spawn(bench_worker, args=(world, free_port(), shapes, runs, out), nprocs=world,
                 join=True)
        with open(out) as f:
            rows = json.load(f)
    print(f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, bf16, train forward "
          f"(no grad); per figure: the slowest rank's median of {runs} samples, each the mean of "
          "10 back-to-back steps between CUDA events, after 5 warm-ups")
    print(f"{'shape':<18}{'world':>6}{'rank M':>8}{'BatchNorm1d ms':>16}{'SyncBatchNorm ms':>18}"
          f"{'ratio':>8}")
    for shape, w, m, t_local, t_sync in rows:
        print(f"{shape:<18}{w:>6}{m:>8}{t_local:>16.4f}{t_sync:>18.4f}{t_sync / t_local:>8.3f}")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    what = ap.add_mutually_exclusive_group(required=True)
    what.add_argument("--compare", metavar="DIR", help="a dump of tests/multi/sync_stats_test")
    what.add_argument("--bench", action="store_true")
    ap.add_argument("--precision", choices=("float64", "float32"), default="float64")
    ap.add_argument("--shapes", default="1024x8192x8192,16384x4096x4096")
    ap.add_argument("--world", type=int, default=0, help="ranks for --bench (default: every GPU)")
    ap.add_argument("--runs", type=int, default=20)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("SKIPPED: no CUDA device")
        return 77
    if a.compare:
        return compare(a.compare, a.precision)
    world = a.world or torch.cuda.device_count()
    if world < 2 or world > torch.cuda.device_count():
        print(f"SKIPPED: --bench needs 2..{torch.cuda.device_count()} ranks, asked for {world}")
        return 77
    return bench([s for s in a.shapes.split(",") if s], world, a.runs)


if __name__ == "__main__":
    sys.exit(main())
