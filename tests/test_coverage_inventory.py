"""The inventory of what no test executes (docs/coverage.md, scripts/coverage_inventory.py): every
never-executed block and statement of the last `make coverage` (docs/coverage_snapshot.json) is
on the page, every entry of the page is still in the code, a function or branch block added since
that run is listed or fails here, code added inside a listed block fails here, and every check a
row names exists. Static: reads the snapshot and the code, runs no coverage. The statement, the
"checked instead" and the conditional-expression checks: tests/test_coverage_inventory_rows.py."""
from __future__ import annotations

import importlib.util
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _script():
    name = "coverage_inventory"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[name]


ci = _script()


def test_the_page_lists_every_never_executed_block_of_the_package():
    bad = ci.check_all()
    assert not bad, ("\n".join(bad) + "\n\n`.venv/bin/python scripts/coverage_inventory.py "
                     "--check` prints the rows to fill in")


# --- the check itself, on a small package of its own --------------------------------------------

MOD = '''\
"""A module."""
import os


def used(x):
    if x > 0:
        return 1
    return 0


def gpu_only(x):
    """Never called."""
    if x:
        return 2
    return 3


class Box:
    def open(self, path):
        try:
            return os.stat(path)
        except OSError as e:
            raise ValueError(path) from e
'''


def _package(tmp_path: Path, text: str = MOD) -> dict:
    (tmp_path / "pkg").mkdir(exist_ok=True)
    (tmp_path / "pkg" / "m.py").write_text(text)
    return ci.package_units(tmp_path, "pkg")


def _snapshot(units: dict, dead: list[str]) -> dict:
    return {"known": sorted(units), "never_executed": {k: 1 for k in dead}}


DEAD = ["pkg/m.py::gpu_only", "pkg/m.py::Box.open › except OSError as e:"]
PAGE = """\
### `pkg/m.py`

| never executed | why | checked instead |
|---|---|---|
| `gpu_only` | GPU only: CUDA | `make typecheck` |
| `Box.open` › `except OSError as e:` | error path | nothing yet |
"""


def test_units_are_functions_and_branch_blocks_keyed_without_line_numbers(tmp_path):
    units = _package(tmp_path)
    assert set(units) == {
        "pkg/m.py::<module>", "pkg/m.py::used", "pkg/m.py::used › if x > 0:",
        "pkg/m.py::gpu_only", "pkg/m.py::gpu_only › if x:", "pkg/m.py::Box.open",
        "pkg/m.py::Box.open › except OSError as e:"}
    moved = _package(tmp_path, "import sys\n\n\n" + MOD)          # lines shift: same keys
    assert set(moved) == set(units)


def test_only_the_outermost_never_executed_unit_is_reported(tmp_path):
    units = _package(tmp_path)
    text = MOD.splitlines()
    ran = {i + 1 for i, ln in enumerate(text)
           if not ln.startswith("    ") or "if x > 0" in ln or "return 1" in ln
           or "return os.stat" in ln or "try:" in ln}
    statements = {i + 1 for i, ln in enumerate(text)
                  if ln.strip() and not ln.strip().startswith(('"""', "#"))}
    dead = ci.never_executed(units, {"pkg/m.py": (statements, ran & statements)})
    # gpu_only's `if x:` is inside gpu_only: not reported on its own
    assert set(dead) == set(DEAD)


def test_all_listed_passes(tmp_path):
    units = _package(tmp_path)
    assert ci.problems(units, _snapshot(units, DEAD), ci.read_page(PAGE)) == []


def test_a_never_executed_block_missing_from_the_page_fails(tmp_path):
    units = _package(tmp_path)
    page = "\n".join(ln for ln in PAGE.splitlines() if "except" not in ln)
    bad = ci.problems(units, _snapshot(units, DEAD), ci.read_page(page))
    assert bad == ["never executed and not listed in docs/coverage.md: "
                   "pkg/m.py::Box.open › except OSError as e: "
                   "(scripts/coverage_inventory.py --check prints its row)"]


def test_a_new_unlisted_function_fails_naming_it_and_the_refresh(tmp_path):
    units = _package(tmp_path)
    snap = _snapshot(units, DEAD)
    now = _package(tmp_path, MOD + "\n\ndef added():\n    return 4\n")
    bad = ci.problems(now, snap, ci.read_page(PAGE))
    assert len(bad) == 1 and "pkg/m.py::added" in bad[0], bad
    assert "run `make coverage`" in bad[0] and "list it in docs/coverage.md" in bad[0]
    # listed on the page: passes without a refresh
    page = PAGE + "| `added` | GPU only: NCCL | first-contact `nccl` |\n"
    assert ci.problems(now, snap, ci.read_page(page)) == []


def test_a_new_block_fails_but_a_body_edit_does_not(tmp_path):
    units = _package(tmp_path)
    snap = _snapshot(units, DEAD)
    edited = MOD.replace("        return 1\n", "        y = x * 2\n        return y // 2\n")
    assert ci.problems(_package(tmp_path, edited), snap, ci.read_page(PAGE)) == []
    branched = MOD.replace("    return 0\n", "    if x < -5:\n        raise ValueError(x)\n"
                           "    else:\n        return 0\n")
    bad = ci.problems(_package(tmp_path, branched), snap, ci.read_page(PAGE))
    assert sorted(b.split(": ", 1)[1].split(": run")[0] for b in bad) == [
        "pkg/m.py::used › else of if x < -5:", "pkg/m.py::used › if x < -5:"], bad


def test_a_stale_page_entry_fails(tmp_path):
    units = _package(tmp_path)
    page = PAGE + "| `removed_long_ago` | GPU only: CUDA graphs | `make typecheck` |\n"
    bad = ci.problems(units, _snapshot(units, DEAD), ci.read_page(page))
    assert bad == ["stale entry in docs/coverage.md: pkg/m.py::removed_long_ago is no longer in "
                   "the code (remove the row, or rename it after the code)"]


def test_an_entry_without_its_reason_fails(tmp_path):
    units = _package(tmp_path)
    page = PAGE.replace("| GPU only: CUDA | `make typecheck` |", "| TODO | TODO |")
    bad = ci.problems(units, _snapshot(units, DEAD), ci.read_page(page))
    assert bad == ["docs/coverage.md: pkg/m.py::gpu_only: give the reason and what checks it "
                   "instead"]


def test_rows_printed_for_pasting_read_back_as_the_same_keys(tmp_path):
    text = ("def f(a, b):\n    if a | b:\n        return 1\n    if a | b:\n        return 2\n"
            "    if a:\n        pass\n    elif b:\n        pass\n    else:\n        pass\n")
    units = _package(tmp_path, text)
    rows = ci.unlisted_rows(list(units), units, guesses=False).replace("TODO", "x")
    assert set(ci.read_page(rows)) == set(units)
    assert "pkg/m.py::f › if a | b: #2" in units
    assert "pkg/m.py::f › else of elif b:" in units


def test_guessed_reasons_name_the_library_or_leave_todo(tmp_path):
    text = ("def gpu(cfg):\n    import transformer_engine.pytorch as te\n    return te.Linear\n\n\n"
            "def load(p):\n    try:\n        return open(p)\n    except OSError as e:\n"
            "        raise ValueError(p) from e\n\n\ndef plain():\n    return 1\n")
    units = _package(tmp_path, text)
    why = {k: ci.guess(u, tmp_path)[0] for k, u in units.items()}
    assert why["pkg/m.py::gpu"] == "GPU only: Transformer Engine"
    assert why["pkg/m.py::load › except OSError as e:"] == "error path no test provokes"
    assert why["pkg/m.py::plain"] == "TODO"
