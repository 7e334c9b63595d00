"""The parts of `make typecheck` that can be tested without running mypy (CI runs the check
itself, seeded faults included: scripts/typecheck.py, docs/typecheck.md):

- scripts/fetch_te_sources.py keeps only the `.py` files of transformer_engine/, refuses a
  wheel whose SHA-256 or file count differs or whose member leaves the folder (leaving no
  partial folder), and does nothing when the sources are cached;
- the seeds land where SEEDS say, each once in today's sources, and a seed missing from mypy's
  output (other line, other code) is reported as missing;
- mypy.ini excludes nothing blanket: its per-module exclusions name single project modules,
  disable only error codes (never call-arg, never ignore_errors), and its TE path is the
  fetch script's version.
"""
import configparser
import importlib.util
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
    project = [s for s in cfg.sections() if s.startswith("mypy-llama31_405b")]
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
