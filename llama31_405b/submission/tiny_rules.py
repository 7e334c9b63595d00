"""The compliance checker's rule file for the project's tiny benchmark, generated from rules.py.

The MLPerf chain for a closed llama31_405b log is common.yaml -> closed_common.yaml ->
closed_llama31_405b.yaml, each enqueued by the previous one (submission_division and
submission_benchmark POST hooks). The tiny chain keeps the first two (read from the installed
mlperf-logging, ruleset 6.0.0) with two changes: submission_division no longer enqueues the
package's closed_common (which would enqueue `closed_tiny_llama31.yaml`, a file the package does
not have) and submission_benchmark must be "tiny_llama31". The benchmark part is
`benchmark_records(rules)`: the closed_llama31_405b.yaml checks as formulas of a `BenchmarkRules`;
with LLAMA31_405B it reproduces the package's file (a test compares them expression by
expression), with TINY_LLAMA31 it gives the tiny values.

An open-division tiny run gets `compliance/tiny_llama31_open.yaml`, made the same way from
common.yaml, open_common.yaml and the open_llama31_405b.yaml checks (`open_benchmark_records`):
the closed file requires submission_division "closed", so an open run would always fail it.

The checker runs one rule file per pass and cannot enqueue a file outside its own package by a
relative name, so the three parts are merged into ONE self-contained file; where two parts define
the same key, its checks are combined (both must hold), as they are in the real chain.
"""
from __future__ import annotations

import json
from pathlib import Path

from ..config.rules import TINY_LLAMA31, BenchmarkRules
from ..mlperf.checker import COMPLIANCE_DIR, DIVISIONS, RULESET, project_rules_name
TINY_RULES_FILE = COMPLIANCE_DIR / project_rules_name(TINY_LLAMA31.name)
TINY_RULES_FILES = {d: COMPLIANCE_DIR / project_rules_name(TINY_LLAMA31.name, d)
                    for d in DIVISIONS}


def _num(x: float | int) -> str:
    return repr(x)


def benchmark_records(r: BenchmarkRules) -> list[dict]:
    """closed_<benchmark>.yaml as KEY records: the llama31_405b formulas with r's constants."""
    ex1 = "EXACTLY_ONE"
    return [
        {"NAME": "global_batch_size", "REQ": ex1, "POST": "s['global_batch_size'] = v['value']"},
        {"NAME": "max_sequence_length", "REQ": ex1, "CHECK": f"v['value'] == {r.seq_length}"},
        {"NAME": "opt_name", "REQ": ex1, "CHECK": "v['value'] == 'adamw'"},
        {"NAME": "opt_base_learning_rate", "REQ": ex1,
         "CHECK": f"v['value'] * {r.ref_gbs} == s['global_batch_size'] * {_num(r.base_lr)}"},
        {"NAME": "opt_end_learning_rate", "REQ": ex1},
        {"NAME": "opt_learning_rate_warmup_steps", "REQ": ex1,
         "POST": f"s['opt_learning_rate_warmup_steps'] = math.ceil({r.warmup_ref_steps} * "
                 f"{r.ref_gbs} / s['global_batch_size'] )"},
        {"NAME": "opt_learning_rate_decay_steps", "REQ": ex1,
         "CHECK": f"v['value'] == math.ceil({r.total_ref_steps} * {r.ref_gbs} / "
                  "s['global_batch_size'] ) - s['opt_learning_rate_warmup_steps']"},
        {"NAME": "opt_learning_rate_decay_schedule", "REQ": ex1,
         "CHECK": f"v['value'] == {r.decay_schedule!r}"},
        {"NAME": "opt_adamw_beta_1", "REQ": ex1, "CHECK": f"v['value'] == {_num(r.adam_beta1)}"},
        {"NAME": "opt_adamw_beta_2", "REQ": ex1, "CHECK": f"v['value'] == {_num(r.adam_beta2)}"},
        {"NAME": "opt_adamw_epsilon", "REQ": ex1, "CHECK": f"v['value'] == {_num(r.adam_eps)}"},
        {"NAME": "opt_adamw_weight_decay", "REQ": ex1,
         "CHECK": f"v['value'] == {_num(r.weight_decay)}"},
        {"NAME": "opt_gradient_clip_norm", "REQ": ex1, "CHECK": f"v['value'] == {_num(r.clip_grad)}"},
        {"NAME": "gradient_accumulation_steps", "REQ": ex1, "CHECK": "v['value'] > 0"},
        {"NAME": "eval_samples", "REQ": ex1, "CHECK": f"v['value'] == {r.eval_samples}"},
        {"NAME": "eval_accuracy", "REQ": "AT_LEAST_ONE", "CHECK": ["'samples_count' in v['metadata']"],
         "ATLEAST_ONE_CHECK": f"(v['value'] <= {_num(r.target)}) and v['value'] > 0.0"},
        {"NAME": "init_checkpoint_step", "REQ": ex1, "CHECK": "v['value'] == 0"},
    ]


def open_benchmark_records(r: BenchmarkRules) -> list[dict]:
    """open_<benchmark>.yaml as KEY records: the open division fixes the sequence length, the
    optimizer's name, the evaluation, the target and the start; the rest is only required."""
    ex1 = "EXACTLY_ONE"
    closed = {x["NAME"]: x for x in benchmark_records(r)}
    keep = {"global_batch_size", "max_sequence_length", "opt_name", "gradient_accumulation_steps",
            "eval_samples", "eval_accuracy", "init_checkpoint_step"}
    return [closed[n] if n in keep else {"NAME": n, "REQ": ex1} for n in closed]


def package_rules(name: str) -> list[dict]:
    """A rule file of the installed mlperf-logging (ruleset 6.0.0) as loaded by the checker."""
    import yaml
    from mlperf_logging.compliance_checker import mlp_compliance
    path = Path(mlp_compliance.__file__).parent / f"training_{RULESET}" / name
    with path.open() as f:
        return yaml.load(f, Loader=yaml.BaseLoader)


def _checks(rec: dict, key: str) -> list[str]:
    v = rec.get(key)
    if v is None:
        return []
    return [c.strip() for c in (v if isinstance(v, list) else [v])]


def _merge(records: list[dict]) -> list[dict]:
    """Combine records of the same KEY: checks of both, POST code of both, one REQ."""
    out: dict[str, dict] = {}
    for rec in records:
        name = rec["NAME"]
        if name not in out:
            out[name] = {k: v for k, v in rec.items()}
            for k in ("CHECK",):
                if k in rec:
                    out[name][k] = _checks(rec, k)
            continue
        cur = out[name]
        if rec.get("REQ") and cur.get("REQ") and rec["REQ"] != cur["REQ"]:
            raise ValueError(f"rule {name}: REQ {cur['REQ']} vs {rec['REQ']}")
        cur.setdefault("REQ", rec.get("REQ"))
        cur["CHECK"] = cur.get("CHECK", []) + [c for c in _checks(rec, "CHECK")
                                               if c not in cur.get("CHECK", [])]
        if rec.get("POST"):
            cur["POST"] = "\n".join(p for p in (cur.get("POST", "").strip(), rec["POST"].strip()) if p)
        if rec.get("ATLEAST_ONE_CHECK"):
            if cur.get("ATLEAST_ONE_CHECK", rec["ATLEAST_ONE_CHECK"]) != rec["ATLEAST_ONE_CHECK"]:
                raise ValueError(f"rule {name}: two ATLEAST_ONE_CHECKs")
            cur["ATLEAST_ONE_CHECK"] = rec["ATLEAST_ONE_CHECK"]
        if not cur["CHECK"]:
            del cur["CHECK"]
    return list(out.values())


def tiny_records(r: BenchmarkRules = TINY_LLAMA31,
                 division: str = "closed") -> tuple[str, list[dict]]:
    """(BEGIN code, merged KEY records) of the tiny chain of `division`."""
    common = package_rules("common.yaml")
    second = package_rules(f"{division}_common.yaml")
    begin = next(x["BEGIN"]["CODE"] for x in common if "BEGIN" in x)
    recs: list[dict] = []
    for part in (common, second):
        for item in part:
            if "KEY" not in item:
                continue
            rec = dict(item["KEY"])
            if rec["NAME"] == "submission_division":
                # the package's hook enqueues training_6.0.0/<division>_common.yaml, whose
                # benchmark hook enqueues a <division>_<benchmark>.yaml the package does not
                # have; each tiny file is one division's rules and carries those checks itself
                rec["CHECK"] = _checks(rec, "CHECK") + [f"v['value'] == {division!r}"]
                rec["POST"] = "s['compile_time_mins'] = 240 if v['value'] == 'open' else 30"
            if rec["NAME"] == "submission_benchmark":
                rec["CHECK"] = [f"v['value'] == {r.name!r}"]
                rec.pop("POST", None)
            recs.append(rec)
    recs += benchmark_records(r) if division == "closed" else open_benchmark_records(r)
    return begin, _merge(recs)


def _q(s: str) -> str:
    return json.dumps(s)   # a JSON string is a valid YAML double-quoted scalar


def render_tiny_rules(r: BenchmarkRules = TINY_LLAMA31, division: str = "closed") -> str:
    """The text of compliance/tiny_llama31.yaml (closed) or tiny_llama31_open.yaml (open)."""
    import mlperf_logging
    version = getattr(mlperf_logging, "__version__", None)
    if version is None:
        from importlib.metadata import version as _v
        version = _v("mlperf-logging")
    begin, recs = tiny_records(r, division)
    name = TINY_RULES_FILES[division].name
    known = {"NAME", "REQ", "PRE", "CHECK", "POST", "ATLEAST_ONE_CHECK"}
    for rec in recs:
        if set(rec) - known:   # a field this renderer would silently drop
            raise ValueError(f"rule {rec['NAME']}: unsupported fields {sorted(set(rec) - known)}")
    lines = [
        f"# Compliance rules of the project's {r.name} benchmark (CPU), for",
        "#   python -m mlperf_logging.compliance_checker --usage training --ruleset 6.0.0 \\",
        f"#       --config \"$PWD/compliance/{name}\" LOG",
        "# (the checker joins --config onto its own package directory: give an ABSOLUTE path).",
        "# GENERATED by `python -m llama31_405b compliance tiny-rules --write` from",
        f"# llama31_405b/config/rules.py ({r.name}) and mlperf-logging {version} training_{RULESET}/"
        f"{{common,{division}_common}}.yaml; do not edit (tests/test_compliance_rules.py checks it is "
        "current).",
        f"# One self-contained file: common + {division}_common without the enqueue of "
        f"{division}_<benchmark>,",
        f"# plus the {division}_llama31_405b {'formulas' if division == 'closed' else 'checks'} "
        f"with {r.name}'s constants: seq {r.seq_length}, "
        f"LR {r.base_lr!r} at GBS {r.ref_gbs},",
        f"# warmup {r.warmup_ref_steps} / total {r.total_ref_steps} steps at GBS {r.ref_gbs}, "
        f"eval_samples {r.eval_samples}, target {r.target!r}.",
        "",
        "- BEGIN:",
        f"    CODE: {_q(begin.strip())}",
    ]
    for rec in recs:
        lines += ["", "- KEY:", f"    NAME:  {rec['NAME']}"]
        if rec.get("REQ"):
            lines.append(f"    REQ:   {rec['REQ']}")
        for k in ("PRE",):
            if rec.get(k):
                lines.append(f"    {k}:   {_q(rec[k].strip())}")
        if rec.get("CHECK"):
            lines.append("    CHECK:")
            lines += [f"        - {_q(c)}" for c in rec["CHECK"]]
        if rec.get("POST"):
            lines.append(f"    POST:  {_q(rec['POST'].strip())}")
        if rec.get("ATLEAST_ONE_CHECK"):
            lines.append(f"    ATLEAST_ONE_CHECK: {_q(rec['ATLEAST_ONE_CHECK'].strip())}")
    return "\n".join(lines) + "\n"


def write_tiny_rules(division: str = "closed", path: Path | None = None) -> Path:
    path = path or TINY_RULES_FILES[division]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_tiny_rules(division=division))
    return path
