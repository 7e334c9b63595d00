"""The page docs/coverage.md as data: its per-file rows (units, and statements after ` » `),
the conditional expressions on the device, the list of reading-only rows; and the rows the
script prints for pasting (scripts/coverage_inventory.py)."""
from __future__ import annotations

import re
from dataclasses import dataclass

from coverage_units import SEP, STMT_SEP, Unit

READING_LIST = "## Checked only by reading"
IFEXP_SECTION = "## Conditional expressions on the device"

# --- the page ----------------------------------------------------------------------------------

_FILE = re.compile(r"^#+\s+`([^`]+\.py)`\s*$")
_ROW = re.compile(r"^\|\s*`([^`]+)`(?:\s*›\s*`([^`]+)`( #\d+)?)?"
                  r"(?:\s*»\s*((?:`[^`]+`(?: #\d+)?\s*·?\s*)+))?\s*\|(.*)$")
_IFEXP_ROW = re.compile(r"^\|\s*`([^`]+\.py::[^`]+)`\s*»\s*`([^`]+)`( #\d+)?\s*\|(.*)$")
_STMT = re.compile(r"`([^`]+)`( #\d+)?")
_LIST = re.compile(r"^-\s+`([^`]+)`\s*$")


@dataclass
class Entry:
    key: str
    why: str
    checked: str
    row: str = ""          # the row's key: the unit's, or for statements the unit's + " »"


def _cells(rest: str) -> list[str]:
    return [c.strip() for c in re.split(r"(?<!\\)\|", rest)]


def read_page(text: str) -> dict[str, Entry]:
    """The page's entries: a `### `path.py`` heading, then table rows whose first cell is
    `Qual.name` or `Qual.name` › `header` (` #n` after it for the n-th same header), followed
    for never-executed statements by » `statement` · `statement` ... (one entry each)."""
    out: dict[str, Entry] = {}
    file = None
    for line in text.splitlines():
        m = _FILE.match(line)
        if m or line.startswith("#"):
            file = m.group(1) if m else None
            continue
        m = _ROW.match(line)
        if not (m and file):
            continue
        qual, block, n, stmts, rest = m.groups()
        cells = _cells(rest)
        unit = f"{file}::{qual}" + (SEP + block.replace("\\|", "|") + (n or "") if block else "")
        why, checked = (cells[0] if cells else ""), (cells[1] if len(cells) > 1 else "")
        if not stmts:
            out[unit] = Entry(unit, why, checked, unit)
            continue
        for text_, k in _STMT.findall(stmts):
            key = unit + STMT_SEP + text_.replace("\\|", "|") + k
            out[key] = Entry(key, why, checked, unit + STMT_SEP.rstrip())
    return out


def read_section(text: str, heading: str) -> list[str]:
    lines = text.splitlines()
    if heading not in lines:
        return []
    body = []
    for line in lines[lines.index(heading) + 1:]:
        if line.startswith("## "):
            break
        body.append(line)
    return body


def read_reading_list(text: str) -> list[str]:
    """The keys under READING_LIST: the rows whose only checks are readings."""
    return [m.group(1) for ln in read_section(text, READING_LIST) if (m := _LIST.match(ln))]


def read_ifexps(text: str) -> dict[str, Entry]:
    out = {}
    for ln in read_section(text, IFEXP_SECTION):
        m = _IFEXP_ROW.match(ln)
        if m:
            key = m.group(1) + STMT_SEP + m.group(2).replace("\\|", "|") + (m.group(3) or "")
            cells = _cells(m.group(4))
            out[key] = Entry(key, cells[0] if cells else "",
                             cells[1] if len(cells) > 1 else "", key)
    return out


def row(u: Unit, why: str = "", checked: str = "") -> str:
    label = u.label().replace("|", "\\|")         # a pipe in a header would end the cell
    return f"| {label} | {why} | {checked} |"


def stmt_row(u: Unit, texts: list[str], why: str = "", checked: str = "") -> str:
    items = []
    for t in texts:
        m = re.fullmatch(r"(.*?)( #\d+)?", t)
        assert m
        items.append(f"`{m.group(1)}`{m.group(2) or ''}".replace("|", "\\|"))
    return f"| {u.label().replace('|', chr(92) + '|')}{STMT_SEP}{' · '.join(items)} | {why} | {checked} |"


def ifexp_row(key: str, why: str = "", checked: str = "") -> str:
    where, text = key.split(STMT_SEP, 1)
    m = re.fullmatch(r"(.*?)( #\d+)?", text)
    assert m
    expr = m.group(1).replace("|", "\\|")
    return f"| `{where}`{STMT_SEP}`{expr}`{m.group(2) or ''} | {why} | {checked} |"
