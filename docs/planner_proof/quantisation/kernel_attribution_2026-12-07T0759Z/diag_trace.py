"""Per rank of a profile: the self time of NVFP4LinearFunction* events (host in the analysis) per
step window, against the analysis' host gap per step."""
import json, sys
from pathlib import Path
from llama31_405b.profile import trace as tr
from llama31_405b.profile.analysis import walk, STEP_PREFIXES
from llama31_405b.profile.intervals import measure, clip

def main():
    prof = Path(sys.argv[1])
    an = json.loads((prof / "analysis.json").read_text())
    for tf in sorted((prof / "traces").glob("*.trace.json.gz")):
        meta = json.loads(Path(str(tf).replace(".trace.json.gz", ".meta.json")).read_text())
        t = tr.load(tf)
        main_tid = meta["main_tid"]
        evs = [e for e in t.events if e.tid == main_tid]
        wins = [(e.ts, e.end) for e in evs if e.name.startswith(STEP_PREFIXES)]
        sel = {}
        def visit(e, ctx, selfs):
            if not e.name.startswith("aten::") and not e.name.startswith(("profile_step", "role:")):
                key = e.name.split(":")[0][:40]
                sel.setdefault(e.name[:50], []).extend(selfs)
        walk(evs, {}, visit)
        n = len(wins)
        tot = {k: sum(measure(clip(v, lo, hi)) for lo, hi in wins) / n / 1e3 for k, v in sel.items()}
        top = sorted(tot.items(), key=lambda kv: -kv[1])[:6]
        print(tf.name, f"steps {n}", ", ".join(f"{k} {v:.1f} ms" for k, v in top))

if __name__ == "__main__":
    main()
