import sys, time, torch
torch.set_num_threads(1)
from torch.profiler import profile, ProfilerActivity
from llama31_405b.config.load import load_config
from llama31_405b.profile import probe

def main():
    sh = [int(x) for x in sys.argv[1].split(",")]
    shapes = {"real": sh, "tiny": [16, 16, 16]}
    for name, s in shapes.items():
        fns = {"fp32": probe._linear(torch, torch.float32, s, False),
               "bf16": probe._linear(torch, torch.bfloat16, s, False),
               "nvfp4": probe._linear(torch, torch.bfloat16, s, True)}
        for k, fn in fns.items():
            for _ in range(3): fn()
            best = min(probe._time(fn) for _ in range(15))
            # under the profiler: wall and op self-time over N calls
            N = 10
            with profile(activities=[ProfilerActivity.CPU]) as p:
                t0 = time.perf_counter()
                for _ in range(N): fn()
                wall = (time.perf_counter() - t0) / N
            ev = p.key_averages()
            ops = sum(e.self_cpu_time_total for e in ev if e.key.startswith(("aten::", "kernel::"))) / 1e6 / N
            cnt = sum(e.count for e in ev) / N
            print(f"{name} {s} {k}: best {best*1e3:.3f} ms; profiled wall {wall*1e3:.3f} ops {ops*1e3:.3f} gap {(wall-ops)*1e3:.3f} ops/call {cnt:.0f}")

if __name__ == "__main__":
    main()
