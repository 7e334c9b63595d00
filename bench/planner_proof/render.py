"""The derived table (derive.py) as markdown, ready for docs/planner.md: per section, per layout
the measured / predicted ratio of the step and of each component (predicted ms in brackets),
the exposed time the compared ranks spent waiting for a slower peer (measured, every
dimension; from run 2026-12-06T0459Z on: profile/waits.py), each round's step ratio, the load
average while it was profiled, the machine's speed around it
(its reference GEMM's fastest and slowest time over the run's median; runs from 2026-12-06 on)
and the profiler's overhead;
a judged part outside its tolerance is marked "miss", one under the proof's share of the step
"~" (not judged)."""
from __future__ import annotations

HEAD = (("step", "step"), ("compute", "compute"), ("TP exposed", "TP"), ("PP + bubble", "PP"),
        ("DP exposed", "DP"), ("host + other + optimizer", "host"))


def _cell(row: dict, k: str) -> str:
    m, p, v = row["measured"][k], row["predicted"][k], row["verdict"].get(k, "")
    mark = {"miss": " miss", "negligible": " ~"}.get(v, "")
    if p > 1e-4:
        return f"{m / p:.2f} ({p * 1e3:.0f}){mark}"
    return ("-" if m < 1e-3 else f"- ({m * 1e3:.0f} measured)") + mark


def rows_table(rows: list[dict]) -> list[str]:
    machine = any(r.get("machine") for r in rows)   # no column for the runs without a record
    wait = any("waiting" in r["measured"] for r in rows)   # nor for those without the split
    head = ["layout", *(c for c, _ in HEAD), *(["waiting for peers (ms)"] if wait else []),
            "step per round", "load avg", *(["machine"] if machine else []), "prof. ovh"]
    out = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in rows:
        cells = [_cell(r, k) for _, k in HEAD]
        per = ", ".join(f"{x:.2f}" for x in r["rounds"])
        load = f"{r['load'][0]:.1f}-{r['load'][1]:.1f}" if r["load"] else "-"
        speed = r.get("machine")
        label = r["label"] + (" (fit)" if r["role"] == "fit" else "")
        waited = r["measured"].get("waiting")
        cells += ([f"{waited * 1e3:.0f}" if waited is not None else "-"] if wait else [])
        out.append("| " + " | ".join([label, *cells, per, load,
                                      *([f"{speed[0]:.2f}-{speed[1]:.2f}" if speed else "-"]
                                        if machine else []),
                                      f"{r['measured']['overhead_ratio']:.2f}"]) + " |")
    return out


def retry_lines(rows: list[dict]) -> list[str]:
    """The profiles taken again because the machine was slow around an attempt (none before
    run 2026-12-06T0424Z: no line)."""
    again = [f"{r['layout']} round {a['round']} ({a['slowed']:.2f})" for r in rows
             for a in r.get("retried", [])]
    if not again:
        return []
    return [f"Profiled again, the machine slow around the attempt (its reference GEMM over the "
            f"run's baseline; the attempt kept in the work folder, the table from the next): "
            f"{', '.join(again)}.", ""]


def verdict_lines(v: dict, tol: dict, what: str = "unseen") -> list[str]:
    comps = ", ".join(tol["components"])
    out = [f"Steps within {tol['step']:.0%}: {v['steps_within']} of {v['layouts']} {what} "
           f"layouts. Step and every component ({comps}) within tolerance ({tol['component']:.0%}"
           f"; parts under {tol['negligible']:.0%} of the step not judged): {v['all_within']} of "
           f"{v['layouts']}."]
    for n, ks in v["misses"].items():
        out.append(f"Misses: {n}: {', '.join(ks)}.")
    out.append(f"Ranked by measured step: {' < '.join(v['order_measured'])}; by predicted: "
               f"{' < '.join(v['order_predicted'])} ("
               f"{'the measured order' if v['ranked_as_measured'] else 'not the measured order'}).")
    return out


def markdown(t: dict) -> str:
    tol = t["tolerance"]
    out = [f"Proof of {t['proof_date']} ({t['rounds']} rounds of {t['steps']} profiled steps; "
           "per layout the median over the rounds, measured / predicted, predicted ms in "
           "brackets).", ""]
    for s in t["sections"]:
        out += [f"#### {s['title']} (fit: {', '.join(s['fit'])})", ""]
        if s.get("calibration") is None:
            refused = " ".join(s["refused"].split())
            out += [f"Not derived: the calibration refused the fit: {refused}", ""]
            continue
        out += (rows_table(s["rows"]) + [""] + retry_lines(s["rows"])
                + verdict_lines(s["verdict"], tol) + [""])
    cs = t.get("core_share")
    if cs:
        out += [f"#### Core sharing: compute at 4 ranks / at 2 ranks (predicted with "
                f"{cs['calibration']}'s calibration)", ""]
        if cs.get("refused"):
            out += [f"Not derived: {cs['refused']}.", ""]
        else:
            out += ["| pair | measured | predicted | measured / predicted | model's core share "
                    "at 4 ranks |", "| --- | --- | --- | --- | --- |"]
            out += [f"| {p['two']} -> {p['four']}{' (fit)' if p.get('fit') else ''} | "
                    f"{p['measured']:.2f} | {p['predicted']:.2f} | "
                    f"{p['ratio']:.2f}{' miss' if p['verdict'] == 'miss' else ''} | "
                    f"{p['model_core_share']:.2f} |" for p in cs["pairs"]]
            out.append("")
    return "\n".join(out)


def extra_markdown(t: dict) -> str:
    """Layouts outside the proof, predicted from a given calibration: reported apart."""
    where = (f"profiled in the rounds of proof run {t['beside']}, beside its layouts, and "
             f"predicted from its calibration {t['calibration']}" if t.get("beside")
             else f"predicted from {t['calibration']}")
    return "\n".join([f"Not part of the published proof: layouts of {t['layouts_file']}, "
                      f"{where} ({t['rounds']} rounds).", "",
                      *rows_table(t["rows"]), "", *retry_lines(t["rows"]),
                      *verdict_lines(t["verdict"], t["tolerance"],
                                                                 "extra"), ""])
