"""The parts of `make typecheck` that can be tested without running mypy (CI runs the check
itself, seeded faults included: scripts/typecheck.py, docs/typecheck.md):

- scripts/fetch_te_sources.py keeps only the `.py` files of transformer_engine/, refuses a
  wheel whose SHA-256 or file count differs or whose member leaves the folder (leaving no
  partial folder), and does nothing when the sources are cached;
- the seeds land where SEEDS say, each once in today's sources, and a seed missing from mypy's
  output (other line, other code) is reported as missing;
- mypy.ini excludes nothing blanket: its per-module exclusions name single project modules,
  disable only error codes (never call-arg, never ignore_errors), and its TE path is the
  fetch script's version; its strict section names the GPU path scripts/any_share.py bounds;
- the Any share (scripts/any_share.py) fails a GPU-path module above its limit, by name, and
  only those; seeds of one file go into one copy, each at its own line.

One test (marked stress: `make test-stress`) runs mypy: the seed on what model.builder returns goes unreported once
build_model's return annotation is gone (it is found because the builder is typed).
"""
import configparser
import importlib.util
import os
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod          # dataclasses look their module up while the class is made
    spec.loader.exec_module(mod)
    return mod


fetch = _load("fetch_te_sources")
share = _load("any_share")
tc = _load("typecheck")


def _wheel(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    return path


MEMBERS = {"transformer_engine/__init__.py": b"x = 1\n",
           "transformer_engine/pytorch/module/base.py": b"def initialize_ub(shape): ...\n",
           "transformer_engine/pytorch/lib.so": b"\x7fELF",
           "transformer_engine-2.20.2.dist-info/METADATA": b"Name: transformer_engine\n",
           "other/setup.py": b""}


def test_only_the_py_files_of_transformer_engine_are_kept(tmp_path):
    wheel = _wheel(tmp_path / "te.whl", MEMBERS)
    dest = tmp_path / "cache" / "te-2.20.2"
    digest = fetch.sha256(wheel)
    assert fetch.extract_py(wheel, dest, digest, expected_files=2) == 2
    kept = sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file())
    assert kept == ["SOURCE", "transformer_engine/__init__.py",
                    "transformer_engine/pytorch/module/base.py"]
    assert fetch.is_complete(dest, digest)
    assert not fetch.is_complete(dest, "0" * 64)
    assert [p.name for p in dest.parent.iterdir()] == ["te-2.20.2"]


@pytest.mark.parametrize("fault", ["digest", "count", "escape"])
def test_a_wrong_wheel_is_refused_and_leaves_nothing(tmp_path, fault):
    members = dict(MEMBERS)
    if fault == "escape":
        members["transformer_engine/../../evil.py"] = b""
    wheel = _wheel(tmp_path / "te.whl", members)
    digest = "0" * 64 if fault == "digest" else fetch.sha256(wheel)
    count = 5 if fault == "count" else 3
    dest = tmp_path / "cache" / "te-2.20.2"
    with pytest.raises(fetch.FetchError) as e:
        fetch.extract_py(wheel, dest, digest, expected_files=count)
    assert str(wheel) in str(e.value)
    assert {"digest": "SHA-256", "count": "PY_FILES", "escape": "leaves"}[fault] in str(e.value)
    assert not dest.exists()
    assert not any(dest.parent.iterdir()) if dest.parent.exists() else True
    assert not (tmp_path / "evil.py").exists()


def test_cached_sources_are_not_fetched_again(tmp_path, monkeypatch):
    dest = tmp_path / "te-2.20.2"
    dest.mkdir()
    (dest / "SOURCE").write_text(f"{fetch.WHEEL}\nsha256 {fetch.WHEEL_SHA256}\nfiles 222\n")

    def no_download(into):
        raise AssertionError("downloaded although cached")
    monkeypatch.setattr(fetch, "download", no_download)
    assert "cached" in fetch.fetch(dest)


def test_a_failed_download_is_one_error_line(monkeypatch, capsys, tmp_path):
    def fail(into):
        raise fetch.FetchError("pip could not download it; check that PyPI is reachable")
    monkeypatch.setattr(fetch, "download", fail)
    assert fetch.main(["--dest", str(tmp_path / "te")]) == 2
    assert capsys.readouterr().err.startswith("error: pip could not download")


CALL = "def f():\n    g = Wrapper(\n        fn, warmup_steps=1,\n        pool=True)\n"


def test_a_seed_names_the_line_mypy_reports():
    kw = tc.Seed("a wrong keyword", "x.py", "warmup_steps=1", "warmup_iters=1", "Wrapper(",
                 "Unexpected keyword", "call-arg")
    text, line = kw.apply(CALL)
    assert "warmup_iters=1" in text and line == 2          # the line the call starts on
    ins = tc.Seed("an inserted call", "x.py", "def f():\n", "def f():\n    te.Linear(1, bais=0)\n",
                  "te.Linear(", "bais", "call-arg")
    text, line = ins.apply(CALL)
    assert text.splitlines()[line - 1] == "    te.Linear(1, bais=0)"
    assert ins.unexclude() == '\n# mypy: ignore-errors=False, enable-error-code="call-arg"\n'


@pytest.mark.parametrize("text,found", [("", "0 times"), (CALL + CALL, "2 times")])
def test_a_seed_that_no_longer_applies_says_so(text, found):
    s = tc.Seed("a wrong keyword", "llama31_405b/x.py", "warmup_steps=1", "warmup_iters=1",
                "Wrapper(", "m", "call-arg")
    with pytest.raises(tc.SeedError) as e:
        s.apply(text)
    assert "llama31_405b/x.py" in str(e.value) and found in str(e.value)
    assert "SEEDS" in str(e.value)


def test_every_seed_applies_to_todays_sources():
    for s in tc.SEEDS:
        text, line = s.apply((REPO / s.file).read_text())
        assert s.at in text.splitlines()[line - 1], s.what


def test_a_seed_counts_only_at_its_line_and_code():
    s = tc.Seed("a wrong keyword", "llama31_405b/x.py", "a", "b", "b",
                r'Unexpected keyword argument "b"', "call-arg")
    out = ('llama31_405b/x.py:7: error: Unexpected keyword argument "b" for "f"  [call-arg]\n'
           'llama31_405b/x.py:7: note: "f" defined here\n'
           "Found 1 error in 1 file (checked 1 source file)\n")
    found = tc.errors(out)
    assert found == [("llama31_405b/x.py", 7,
                      'Unexpected keyword argument "b" for "f"  [call-arg]')]
    assert tc.unreported([s], {s: 7}, found) == []
    assert "x.py:8: a wrong keyword was not reported" in tc.unreported([s], {s: 8}, found)[0]
    other_code = [(f, ln, m.replace("call-arg", "misc")) for f, ln, m in found]
    assert tc.unreported([s], {s: 7}, other_code)


def test_the_configuration_excludes_nothing_blanket():
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "mypy.ini")
    main = cfg["mypy"]
    assert main.getboolean("check_untyped_defs")
    assert main["mypy_path"] == f"$MYPY_CONFIG_FILE_DIR/.cache/te-{fetch.VERSION}"
    project = [s for s in cfg.sections() if s.startswith("mypy-llama31_405b")
               and s != STRICT_SECTION]
    for section in project:
        module = section.removeprefix("mypy-")
        assert "*" not in module and "," not in module, section
        assert (REPO / (module.replace(".", "/") + ".py")).is_file(), f"{section}: no such module"
        assert set(cfg[section]) == {"disable_error_code"}, section
        assert "call-arg" not in cfg[section]["disable_error_code"], section
    text = (REPO / "mypy.ini").read_text()
    assert "owned by a concurrent change" in text or not project
    for section in cfg.sections():
        assert not cfg[section].getboolean("ignore_errors", fallback=False), section


STRICT_SECTION = ("mypy-" + ",".join(f"{m}.*" if m != "llama31_405b.parallel.setup" else m
                                     for m in share.GPU_PATH)
                  + ",gpu_layer,h200_first_contact")


def test_the_gpu_path_refuses_untyped_definitions():
    """The strict section names exactly the modules whose Any share is bounded (and the two GPU
    programs), and only makes annotations mandatory; both programs are among mypy's files."""
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "mypy.ini")
    assert STRICT_SECTION in cfg.sections()
    strict = cfg[STRICT_SECTION]
    assert set(strict) == {"disallow_untyped_defs", "disallow_incomplete_defs"}
    assert strict.getboolean("disallow_untyped_defs") and strict.getboolean("disallow_incomplete_defs")
    files = [f.strip() for f in cfg["mypy"]["files"].split(",")]
    assert files == ["llama31_405b", "bench/gpu_layer.py", "scripts/h200_first_contact.py"]
    assert all((REPO / f).exists() for f in files)


REPORT = """                                        Name   Anys   Exprs   Coverage
----------------------------------------------------------------------
                         llama31_405b.config      3      10     70.00%
                  llama31_405b.first_contact      0     187    100.00%
            llama31_405b.first_contact.layer      6     100     94.00%
llama31_405b.planner.calibrate.first_contact     48     100     52.00%
                  llama31_405b.model.builder      5     100     95.00%
                 llama31_405b.parallel.setup      0     245    100.00%
           llama31_405b.parallel.setup_other     50     100     50.00%
               llama31_405b.precision.linear      1     709     99.86%
                   llama31_405b.train.graphs      3     134     97.76%
----------------------------------------------------------------------
                                       Total    116    1785     93.50%
"""


def test_a_gpu_path_module_above_its_limit_fails_by_name():
    rows = share.parse(REPORT)
    assert share.Share("llama31_405b.first_contact.layer", 100, 6) in rows
    assert "Total" not in {r.module for r in rows}
    table, failures = share.check(rows)
    # 6 % > 5 %: named with its share and the limit; 5 % exactly passes; modules off the GPU
    # path (config, planner.calibrate.first_contact, parallel.setup_other) are not judged
    assert failures == ["llama31_405b.first_contact.layer: 6.0 % of its 100 expressions are Any "
                        "(6), above its limit of 5 %"]
    assert any(line.startswith("llama31_405b.first_contact.layer") and line.endswith("ABOVE")
               for line in table)
    assert not any("planner" in line or "config" in line or "setup_other" in line
                   for line in table)
    assert table[-1].split()[-3:] == ["1475", "15", "1.0"]     # the GPU path as a whole


def test_a_per_module_limit_lets_its_module_through_and_must_be_used(monkeypatch):
    monkeypatch.setitem(share.LIMITS, "llama31_405b.first_contact.layer", (7.0, "a reason"))
    assert share.check(share.parse(REPORT))[1] == []
    monkeypatch.setitem(share.LIMITS, "llama31_405b.train.gone", (7.0, "a reason"))
    assert share.check(share.parse(REPORT))[1] == [
        "llama31_405b.train.gone: has a limit in scripts/any_share.py LIMITS but no row in the "
        "report: delete the entry"]


def test_each_limit_above_the_default_gives_its_reason():
    for module, (limit, reason) in share.LIMITS.items():
        assert share.on_gpu_path(module) and limit > share.DEFAULT_LIMIT, module
        assert len(reason.split()) >= 5, module


def test_a_gpu_path_package_missing_from_the_report_fails():
    rows = [r for r in share.parse(REPORT) if not r.module.startswith("llama31_405b.train")]
    assert share.check(rows)[1][1:] == [
        "llama31_405b.train: not in mypy's any-exprs report (is it still checked?)"]
    assert len(share.check([])[1]) == len(share.GPU_PATH)


def test_seeds_of_one_file_go_into_one_copy_each_at_its_line():
    text = "a = 1\nb = 2\nc = 3\n"
    low = tc.Seed("low", "f.py", "c = 3\n", "c = 4\n", "c = 4", "m", "misc")
    high = tc.Seed("high", "f.py", "a = 1\n", "a = 1\nx.y\n", "x.y", "m", "attr-defined")
    other = tc.Seed("other", "g.py", "z", "w", "w", "m", "misc")
    texts, expected = tc.seeded_texts([low, high, other], read=lambda f: text if f == "f.py"
                                      else "z\n")
    assert set(texts) == {"f.py", "g.py"}
    lines = texts["f.py"].splitlines()
    # the inserted line above moves `low` down by one: its line is counted after both seeds
    assert lines[:4] == ["a = 1", "x.y", "b = 2", "c = 4"]
    assert expected == {high: 2, low: 4, other: 1}
    assert texts["f.py"].count("# mypy: ignore-errors=False") == 2


@pytest.mark.slow
@pytest.mark.stress     # two cold mypy runs, about 3 minutes of CPU: `make test-stress`
def test_the_builder_seed_is_found_only_because_the_builder_is_typed(tmp_path):
    """mypy, twice without a cache (a module mypy finds fresh in a cache is not checked again,
    whatever shadows it): the seed on build_model's result in train/loop.py is reported with the
    builder as it is, and not with build_model's return annotation gone."""
    s = next(s for s in tc.SEEDS if "model.builder" in s.what)
    texts, expected = tc.seeded_texts([s])
    seeded = tmp_path / "loop.py"
    seeded.write_text(texts[s.file])
    builder = "llama31_405b/model/builder.py"
    source = (REPO / builder).read_text()
    annotation = ",\n                device: Device | None = None) -> list[GPTModel]:"
    assert source.count(annotation) == 1
    untyped = tmp_path / "builder.py"
    untyped.write_text(source.replace(annotation, ",\n                device: Device | None = None):"))
    shadow = ["--cache-dir", os.devnull, "--shadow-file", s.file, str(seeded)]
    found = tc.errors(tc.mypy(*shadow).stdout)
    assert tc.unreported([s], expected, found) == []
    found = tc.errors(tc.mypy(*shadow, "--shadow-file", builder, str(untyped)).stdout)
    assert tc.unreported([s], expected, found) != []
