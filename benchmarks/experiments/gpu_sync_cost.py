"""Host-sync cost of EP's one count read (2*ep int64 -> host), for the solver's assumed 20 us (docs/solver.md).

Run on a GPU machine: `python benchmarks/experiments/gpu_sync_cost.py` (writes $OUT/sync_cost.json).
Result of 2026-11-27, H100, torch 2.11: median 14-17 us, p90 16-29 us for ep 2..64 (benchmarks/results/gpu_sync_cost.json).
"""
import time, torch, json, os
d = torch.device("cuda")
res = {}
for ep in (2, 8, 64):
    counts = torch.randint(0, 100, (2 * ep,), device=d)
    x = torch.randn(4096, 2048, device=d)
    for _ in range(50):
        y = x * 2; counts.cpu()
    torch.cuda.synchronize()
    n = 500
    # (a) after a small kernel: the read waits for it, then copies
    t = []
    for _ in range(n):
        torch.cuda.synchronize(); c2 = counts + 1
        s = time.perf_counter(); c2.cpu().tolist(); t.append(time.perf_counter() - s)
    t.sort()
    res[f"ep{ep}_read_after_tiny_kernel_us"] = dict(median=1e6 * t[n // 2], p10=1e6 * t[n // 10], p90=1e6 * t[9 * n // 10])
    # (b) an idle device: the bare round trip
    t = []
    for _ in range(n):
        torch.cuda.synchronize()
        s = time.perf_counter(); counts.cpu(); t.append(time.perf_counter() - s)
    t.sort()
    res[f"ep{ep}_read_idle_us"] = dict(median=1e6 * t[n // 2], p10=1e6 * t[n // 10], p90=1e6 * t[9 * n // 10])
res["device"] = torch.cuda.get_device_name(); res["torch"] = torch.__version__
print(json.dumps(res, indent=1))
json.dump(res, open(os.path.join(os.environ.get("OUT", "/tmp"), "sync_cost.json"), "w"), indent=1)
