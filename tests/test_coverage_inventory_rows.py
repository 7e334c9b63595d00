"""The inventory's statement level, its "checked instead" column and its conditional expressions
(docs/coverage.md, scripts/coverage_inventory.py), on a small package of their own: a
never-executed statement inside an executed block must be listed, code added inside a listed
block fails, a row must name a check that exists, and a conditional expression on the device
must be listed."""
from __future__ import annotations

from pathlib import Path

from test_coverage_inventory import REPO, ci  # the script, loaded once by the page test

MOD = '''\
def pick(xs, gpu):
    for x in xs:
        if x < 0:
            continue
        if x > 9:
            raise ValueError(x)
    kind = "cuda" if gpu else "cpu"
    return kind


def first(xs):
    for x in xs:
        return x
    raise AssertionError("unreachable")


def never():
    return 0
'''
# what ran: pick with non-negative xs below 10, first with a non-empty list; never() is not called
RAN = {1, 2, 3, 5, 7, 8, 11, 12, 13, 17}
STATEMENTS = {1, 2, 3, 4, 5, 6, 7, 8, 11, 12, 13, 14, 17, 18}

IF_NEG = "pkg/m.py::pick › if x < 0:"
IF_BIG = "pkg/m.py::pick › if x > 9:"
UNREACHABLE = "pkg/m.py::first » raise AssertionError('unreachable')"
NEVER = "pkg/m.py::never"
IFEXP = "pkg/m.py::pick » 'cuda' if gpu else 'cpu'"

PAGE = """\
### `pkg/m.py`

| never executed | why | checked instead |
|---|---|---|
| `pick` › `if x < 0:` | input no test gives | nothing yet |
| `pick` › `if x > 9:` | error path | `tests/test_coverage_inventory.py::test_all_listed_passes` |
| `first` » `raise AssertionError('unreachable')` | unreachable | reading: the loop returns |
| `never` | dead code | nothing yet |

## Checked only by reading

- `pkg/m.py::first »`

## Conditional expressions on the device

| expression | arm | checked instead |
|---|---|---|
| `pkg/m.py::pick` » `'cuda' if gpu else 'cpu'` | GPU arm | first-contact `gpu` |
"""


def _package(tmp_path: Path, text: str = MOD):
    (tmp_path / "pkg").mkdir(exist_ok=True)
    (tmp_path / "pkg" / "m.py").write_text(text)
    return ci.package_walk(tmp_path, "pkg")


def _measured(units, stmts):
    lines = {"pkg/m.py": (STATEMENTS, RAN)}
    dead = ci.never_executed(units, lines)
    dead_stmts, unexplained = ci.never_executed_statements(units, stmts, lines, dead)
    return dead, dead_stmts, unexplained


def _snapshot(tmp_path: Path) -> dict:
    units, stmts = _package(tmp_path)
    dead, dead_stmts, _ = _measured(units, stmts)
    return ci.snapshot_of(units, dead, {}, stmts, dead_stmts)


def _problems(tmp_path: Path, snap: dict, page: str = PAGE, text: str = MOD) -> list[str]:
    units, stmts = _package(tmp_path, text)
    return ci.problems(units, snap, ci.read_page(page), stmts, ci.Known(REPO),
                       ci.read_reading_list(page),
                       (ci.device_ifexps(tmp_path, "pkg"), ci.read_ifexps(page)), tmp_path)


def test_a_statement_that_never_ran_in_a_block_that_did_is_found_and_keyed_without_lines(
        tmp_path):
    units, stmts = _package(tmp_path)
    dead, dead_stmts, unexplained = _measured(units, stmts)
    assert set(dead) == {IF_NEG, IF_BIG, NEVER}
    # the `continue` and `raise` lie in listed blocks; the `if` lines ran
    assert dead_stmts == {UNREACHABLE: 1} and unexplained == {}
    _, moved = _package(tmp_path, "# lines move\n\n\n" + MOD)
    assert set(moved) == set(stmts)


def test_the_statements_of_one_block_share_a_row_that_reads_back_as_their_keys(tmp_path):
    units, stmts = _package(tmp_path)
    keys = [k for k in stmts if k.startswith("pkg/m.py::pick » ")]
    rows = ci.unlisted_rows(keys, units, guesses=False, stmts=stmts).replace("TODO", "x")
    assert rows.count("» ") == 1 and set(ci.read_page(rows)) == set(keys)


def test_all_listed_passes(tmp_path):
    assert _problems(tmp_path, _snapshot(tmp_path)) == []


def test_an_unlisted_never_executed_statement_fails(tmp_path):
    page = PAGE.replace("| `first` » `raise AssertionError('unreachable')` | unreachable | "
                        "reading: the loop returns |\n", "").replace("- `pkg/m.py::first »`", "")
    assert _problems(tmp_path, _snapshot(tmp_path), page) == [
        f"never-executed statement not listed in docs/coverage.md: {UNREACHABLE} "
        "(scripts/coverage_inventory.py --check prints its row)"]


def test_each_unlisted_never_executed_function_block_or_statement_fails(tmp_path):
    snap = _snapshot(tmp_path)
    for key, line in ((NEVER, "| `never` |"), (IF_BIG, "| `pick` › `if x > 9:` |"),
                      (UNREACHABLE, "| `first` » ")):
        page = "\n".join(ln for ln in PAGE.splitlines() if not ln.startswith(line))
        page = page.replace("- `pkg/m.py::first »`", "") if key == UNREACHABLE else page
        bad = _problems(tmp_path, snap, page)
        assert len(bad) == 1 and bad[0].startswith("never") and f": {key} (" in bad[0], bad


def test_code_added_inside_a_listed_block_fails_and_removal_passes(tmp_path):
    snap = _snapshot(tmp_path)
    added = MOD.replace('            raise ValueError(x)\n',
                        '            print(x)\n            raise ValueError(x)\n')
    bad = _problems(tmp_path, snap, text=added)
    assert len(bad) == 1 and bad[0].startswith(
        f"code added inside a listed block: {IF_BIG} holds 2 statements, 1 when measured"), bad
    # in a block that holds a listed statement
    added = MOD.replace('    raise AssertionError', '    x = 1\n    raise AssertionError')
    bad = _problems(tmp_path, snap, text=added)
    assert len(bad) == 1 and "pkg/m.py::first holds 4 statements, 3 when" in bad[0], bad
    # code added elsewhere, or removed from a listed block: no refresh
    assert _problems(tmp_path, snap, text=MOD + "\n\nX = 1\n") == []
    removed = MOD.replace("        if x < 0:\n            continue\n", "")
    page = PAGE.replace("| `pick` › `if x < 0:` | input no test gives | nothing yet |\n", "")
    assert _problems(tmp_path, snap, page, removed) == []


def _with_check(checked: str, reading: bool = False) -> str:
    page = PAGE.replace("| error path | `tests/test_coverage_inventory.py::test_all_listed_passes` |",
                        f"| error path | {checked} |")
    return page.replace("- `pkg/m.py::first »`", "- `pkg/m.py::first »`\n- `pkg/m.py::pick › "
                        "if x > 9:`") if reading else page


def test_a_row_naming_a_check_that_does_not_exist_fails(tmp_path):
    snap = _snapshot(tmp_path)
    cases = {
        "`tests/test_coverage_inventory.py::test_no_such_test`": "no test test_no_such_test",
        "`tests/test_no_such_file.py::test_x`": "no test file tests/test_no_such_file.py",
        "first-contact `no_such_check`": "first-contact has no check no_such_check",
        "`make typecheck`": "needs a seed inside the block",
        "`make typecheck` on `LayerNormLinear`": "`LayerNormLinear` does not occur in the block",
        "`make typecheck` seed `train/loop.py`": "lies outside this block",
        "`make typecheck` seed `no/such.py`": "no seed of scripts/typecheck.py SEEDS",
        "make typecheck (against TE 2.20.2's sources)": "not a check",
        "nothing yet; first-contact `gpu`": "`nothing yet` stands alone",
    }
    for checked, why in cases.items():
        bad = _problems(tmp_path, snap, _with_check(checked))
        assert len(bad) == 1 and f"{IF_BIG}: checked instead: " in bad[0] and why in bad[0], (
            checked, bad)


def test_checks_that_exist_pass(tmp_path):
    snap = _snapshot(tmp_path)
    for checked in ("`tests/test_coverage_inventory.py` (the whole file)",
                    "`make typecheck` on `ValueError`; first-contact `steps`, `dp2` on a GPU",
                    "first-contact `recipe`; `tests/test_coverage_inventory.py::test_all_listed_passes`"):
        assert _problems(tmp_path, snap, _with_check(checked)) == [], checked


def test_the_type_check_seed_must_lie_in_the_block(tmp_path):
    seeded = MOD.replace("raise ValueError(x)",
                         "raise ValueError(recipe.disable_stochastic_rounding)")
    units, stmts = _package(tmp_path, seeded)
    dead, dead_stmts, _ = _measured(units, stmts)
    snap = ci.snapshot_of(units, dead, {}, stmts, dead_stmts)
    page = _with_check("`make typecheck` seed `precision/te_recipe.py`")
    assert _problems(tmp_path, snap, page, seeded) == []


def test_reading_only_rows_and_the_list_agree(tmp_path):
    snap = _snapshot(tmp_path)
    bad = _problems(tmp_path, snap, _with_check("reading: against the sources"))
    assert bad == ['checked only by reading, missing from "Checked only by reading": ' + IF_BIG]
    assert _problems(tmp_path, snap, _with_check("reading: against the sources", True)) == []
    bad = _problems(tmp_path, snap, PAGE.replace("- `pkg/m.py::first »`",
                                                 "- `pkg/m.py::first »`\n- `pkg/m.py::pick`"))
    assert bad == ['under "Checked only by reading" but not a reading-only row: pkg/m.py::pick']


def test_a_conditional_expression_on_the_device_must_be_listed(tmp_path):
    snap = _snapshot(tmp_path)
    page = PAGE.replace("| `pkg/m.py::pick` » `'cuda' if gpu else 'cpu'` | GPU arm | "
                        "first-contact `gpu` |\n", "")
    bad = _problems(tmp_path, snap, page)
    assert len(bad) == 1 and bad[0].startswith("conditional expression on the device not listed")
    assert bad[0].endswith(IFEXP)
    renamed = MOD.replace("if gpu else", "if use_gpu else").replace("def pick(xs, gpu)",
                                                                   "def pick(xs, use_gpu)")
    bad = _problems(tmp_path, snap, PAGE, renamed)
    assert any(b.startswith("stale entry under") and IFEXP in b for b in bad), bad
    # a test that does not name the device is not listed
    _package(tmp_path)
    assert ci.device_ifexps(tmp_path, "pkg") == {IFEXP: 7}
    _package(tmp_path, MOD.replace("if gpu else", "if xs else"))
    assert ci.device_ifexps(tmp_path, "pkg") == {}
