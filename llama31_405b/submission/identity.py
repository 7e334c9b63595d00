"""One system per submission: the `submission_*` events of a package's logs agree with each other,
with the config the runs used (`--config`) and with the system description (`--system-desc`).

The compliance checker reads one log at a time and the package checker does not compare these
values between logs, so result files of two organisations, platforms or divisions would pass
both; `submission package` refuses them here, naming the key, both values and the files.

What each key is compared with:

| logged key             | --config                        | --system-desc                       |
|------------------------|---------------------------------|-------------------------------------|
| submission_benchmark   | the config's benchmark          | (not in the description)            |
| submission_org         | run.org                         | submitter                           |
| submission_platform    | run.platform, else derived      | (no such field: system_name is free text) |
| submission_division    | run.division                    | division                            |
| submission_status      | run.status                      | status, in its long form            |

A logged value holding "PLACEHOLDER" (the published v5.1 logs log `SUBMISSION_ORG_PLACEHOLDER`
and `32xSUBMISSION_PLATFORM_PLACEHOLDER`; their submitter left the logging script's defaults) is
still compared between the logs, but not with the config or the description: a warning says so.
"""
from __future__ import annotations

from pathlib import Path

from ..mlperf.log import RunLog

KEYS = ("submission_benchmark", "submission_org", "submission_platform", "submission_division",
        "submission_status")
PLACEHOLDER = "PLACEHOLDER"


class SystemMismatch(ValueError):
    """The logs are not one system's runs; the message names the key, the values and the files."""


def _files(runs: list[RunLog]) -> str:
    return ", ".join(r.path for r in runs)


def between_logs(runs: list[RunLog]) -> None:
    """Every submission_* key has one value across the logs (a key no log has is left to the
    compliance checker, which requires it)."""
    for key in KEYS:
        by_value: dict[str, list[RunLog]] = {}
        for r in runs:
            by_value.setdefault(repr(r.value(key)), []).append(r)
        if len(by_value) > 1:
            parts = "; ".join(f"{v} in {_files(rs)}" for v, rs in by_value.items())
            raise SystemMismatch(f"the logs disagree on {key}: {parts}: one submission is the runs "
                                 "of one system; package each system's logs apart")


def expected(cfg=None, desc: dict | None = None, desc_path: str | Path | None = None,
             status_words: dict[str, str] | None = None) -> list[tuple[str, str, object, dict]]:
    """(key, source, value, words) for every value the logs must match; `words` translates a
    logged value into the source's words ({} when the source logs them as the logs do)."""
    out: list[tuple[str, str, object, dict]] = []
    if cfg is not None:
        d = cfg.derived
        src = f"config {cfg.source}"
        derived = "" if cfg.run.platform else ", derived from the system and node count"
        out += [("submission_benchmark", f"{src} (its benchmark)", d.rules.name, {}),
                ("submission_org", f"{src} (run.org)", cfg.run.org, {}),
                ("submission_platform", f"{src} (run.platform{derived})", d.platform, {}),
                ("submission_division", f"{src} (run.division)", cfg.run.division, {}),
                ("submission_status", f"{src} (run.status)", cfg.run.status, {})]
    if desc is not None:
        src = f"system description {desc_path}" if desc_path else "the system description"
        out += [("submission_org", f"{src} (submitter)", desc.get("submitter"), {}),
                ("submission_division", f"{src} (division)", desc.get("division"), {}),
                ("submission_status", f"{src} (status)", desc.get("status"), status_words or {})]
    return out


def against(runs: list[RunLog], cfg=None, desc: dict | None = None,
            desc_path: str | Path | None = None,
            status_words: dict[str, str] | None = None) -> list[str]:
    """Compare the logs with each other, then with the config and the description. Returns
    warnings for placeholders; SystemMismatch for a value that differs."""
    between_logs(runs)
    warnings = []
    for key, source, want, words in expected(cfg, desc, desc_path, status_words):
        got = runs[0].value(key)
        if got is None or want is None:
            continue
        if PLACEHOLDER in str(got):
            warnings.append(f"{key} {got!r} in {_files(runs)} is a placeholder: not compared with "
                            f"{source}'s {want!r}")
            continue
        said = words.get(got, got) if isinstance(got, str) else got
        if said != want:
            shown = f"{got!r}" + (f" ({said!r})" if said != got else "")
            opts = "--logs, --config, --org" if key == "submission_org" else "--logs, --config"
            raise SystemMismatch(f"{key}: the logs say {shown} ({_files(runs)}), {source} says "
                                 f"{want!r}: wrong {opts} or --system-desc")
    return warnings
