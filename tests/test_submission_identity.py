"""One system per submission: `submission package` refuses logs whose submission_* events differ
from each other, from --config or from --system-desc, naming the key, both values and the files;
and it reports the reason an aborted run's run_stop carries."""
from __future__ import annotations

import json

import pytest
from mlperf_logs import ORG, SYSTEM_JSON, copy_logs, need_fixture, set_last_value, set_value

from llama31_405b.config import load_config
from llama31_405b.mlperf.log import load_run
from llama31_405b.submission import identity
from llama31_405b.submission.package import STATUS, PackageError, package, validate_runs

DGXB200 = "configs/config_DGXB200_32x8x144xtp4pp8cp2.toml"   # GBS 576, as the published runs


def _refusal(tmp_path, org_=ORG, **kw) -> str:
    kw.setdefault("system_desc", SYSTEM_JSON)
    with pytest.raises(PackageError) as e:
        package(tmp_path / "logs", out=tmp_path / "out", org=org_, ruleset="5.1.0", **kw)
    assert not (tmp_path / "out" / org_).exists()      # refused before anything is assembled
    return str(e.value)


@pytest.mark.parametrize("key, value", [("submission_platform", "16xGB200-NVL72"),
                                        ("submission_org", "Another-Org"),
                                        ("submission_division", "open"),
                                        ("submission_status", "cloud")])
def test_logs_of_two_systems_are_refused_naming_key_values_and_files(key, value, tmp_path):
    need_fixture()
    logs = copy_logs(tmp_path / "logs")
    before = repr(load_run(logs[1]).value(key))
    set_value(logs[1], key, value)
    msg = _refusal(tmp_path)
    assert msg.startswith(f"the logs disagree on {key}: ")
    assert f"{before} in {logs[0]}, {logs[2]}" in msg and f"{value!r} in {logs[1]}" in msg


def test_logs_of_another_org_than_the_system_description_are_refused(tmp_path):
    need_fixture()
    logs = copy_logs(tmp_path / "logs")
    for log in logs:
        set_value(log, "submission_org", "Another-Org")
    msg = _refusal(tmp_path)
    assert msg == (f"submission_org: the logs say 'Another-Org' ({', '.join(map(str, logs))}), "
                   f"system description {SYSTEM_JSON} (submitter) says 'University-of-Florida': "
                   "wrong --logs, --config, --org or --system-desc")


def test_a_status_is_compared_in_the_description_s_words(tmp_path):
    need_fixture()
    copy_logs(tmp_path / "logs")
    desc = json.loads(SYSTEM_JSON.read_text())
    desc["status"] = "Preview"
    path = tmp_path / "preview.json"
    path.write_text(json.dumps(desc))
    msg = _refusal(tmp_path, system_desc=path)
    assert msg.startswith("submission_status: the logs say 'onprem' ('Available on-premise')")
    assert f"system description {path} (status) says 'Preview'" in msg


def test_logs_of_another_platform_than_the_config_are_refused(tmp_path):
    """The published runs (GBS 576, like the DGX B200 config) logged 'onprem' and placeholders
    for org and platform; with real values of another platform the config refuses them."""
    need_fixture()
    logs = copy_logs(tmp_path / "logs")
    cfg = load_config(DGXB200)
    assert "submission_status: the logs say 'onprem'" in _refusal(tmp_path, cfg=cfg,
                                                                   system_desc=None)
    for log in logs:
        set_value(log, "submission_status", "cloud")
        set_value(log, "submission_org", "reference")
        set_value(log, "submission_platform", "16xGB200-NVL72")
    msg = _refusal(tmp_path, cfg=cfg, system_desc=None)
    assert msg.startswith("submission_platform: the logs say '16xGB200-NVL72' (")
    assert (f"config {cfg.source} (run.platform, derived from the system and node count) says "
            "'32xDGX-B200'") in msg


def test_published_logs_match_their_system_description_with_placeholders_named():
    need_fixture()
    from mlperf_logs import LOGS
    runs = [load_run(p) for p in LOGS]
    warnings = identity.against(runs, None, json.loads(SYSTEM_JSON.read_text()), SYSTEM_JSON,
                                STATUS)
    assert warnings == [f"submission_org 'SUBMISSION_ORG_PLACEHOLDER' in "
                        f"{', '.join(map(str, LOGS))} is a placeholder: not compared with system "
                        f"description {SYSTEM_JSON} (submitter)'s 'University-of-Florida'"]


def test_the_package_reports_the_logged_reason_of_an_aborted_run(tmp_path):
    """Whatever reason run_stop's metadata carries (train.failure names a lost rank there) is what
    the package says about that run."""
    need_fixture()
    logs = copy_logs(tmp_path / "logs")
    reason = "rank 3 (host gb-r001-n02) lost: its process ended with signal 9 (SIGKILL)"
    set_last_value(logs[1], "run_stop", None, status="aborted", reason=reason)
    _, warnings = validate_runs([load_run(p) for p in logs])
    assert warnings == [f"{logs[1]}: aborted ({reason}) (tolerated: one of 3 runs may fail)"]
    set_last_value(logs[2], "run_stop", None, status="aborted", reason="received SIGTERM")
    msg = _refusal(tmp_path)
    assert f"{logs[1]}: aborted ({reason})" in msg and f"{logs[2]}: aborted (received SIGTERM)" in msg


def test_an_org_other_than_the_config_s_is_refused_naming_org(tmp_path):
    """The generated system description's submitter is --org; logs written under the config's
    run.org ('reference') do not match another --org."""
    from llama31_405b.mlperf import header_events
    from llama31_405b.submission.precheck import log_lines
    cfg = load_config("configs/tiny_cpu.toml")
    (tmp_path / "logs").mkdir()
    for i in range(3):
        (tmp_path / "logs" / f"result_{i}.txt").write_text(
            "\n".join(log_lines(header_events(cfg, seed=i + 1), cfg)) + "\n")
    msg = _refusal(tmp_path, cfg=cfg, system_desc=None, org_="MyOrg")
    assert msg.startswith("submission_org: the logs say 'reference' (")
    assert msg.endswith("system description generated from --config and --org (submitter) says "
                        "'MyOrg': wrong --logs, --config, --org or --system-desc")
