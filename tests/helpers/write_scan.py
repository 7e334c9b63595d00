"""Find the writes that bypass llama31_405b.outputs (the one owner of writing a result), read
from the source with `ast` (Python) or line by line (shell): each finding is keyed by file,
function and call text, never by line number, so an allow-list entry survives edits around it.

Python: `open(..., "w"/"wb"/"a"/"x"/"+")`, `os.open` with O_CREAT, `.write_text`, `.write_bytes`,
`shutil.copy*` / `copytree` / `move` / `rmtree`, `.unlink`, `os.remove`, `os.replace`,
`os.rename`, `Path.rename` / `Path.replace` (one argument; `str.replace` takes two), `np.save*`,
`torch.save`, `.savefig`, `.tofile`. Shell: `>` and `>>` redirects to a file (not /dev/null, not
a descriptor), and `tee`."""
from __future__ import annotations

import ast
import re
from pathlib import Path

ATTR_CALLS = {"write_text", "write_bytes", "unlink", "rmtree", "copy", "copy2", "copyfile",
              "copytree", "move", "savefig", "tofile", "savez", "savez_compressed", "rmdir"}
OS_CALLS = {"remove", "removedirs", "replace", "rename", "unlink", "truncate"}
SAVE_OWNERS = {"np", "numpy", "torch"}


_MODE = re.compile(r"[rwxabt+]+(:\w*)?")


def _mode(call: ast.Call) -> str | None:
    """The mode of an open: `open(path, mode)`, `tarfile.open(path, mode)`, and `Path.open(mode)`
    (a method: the mode is its first argument)."""
    f = call.func
    if (isinstance(f, ast.Attribute) and call.args and isinstance(call.args[0], ast.Constant)
            and isinstance(call.args[0].value, str) and _MODE.fullmatch(call.args[0].value)):
        return call.args[0].value
    if len(call.args) >= 2 and isinstance(call.args[1], ast.Constant):
        return str(call.args[1].value)
    for kw in call.keywords:
        if kw.arg == "mode" and isinstance(kw.value, ast.Constant):
            return str(kw.value.value)
    return None


def _is_write(call: ast.Call) -> bool:
    f = call.func
    if isinstance(f, ast.Name) and f.id == "open" or isinstance(f, ast.Attribute) and f.attr == "open" \
            and not (isinstance(f.value, ast.Name) and f.value.id == "os"):
        m = _mode(call)
        if m is None and isinstance(f, ast.Attribute) and call.args and not isinstance(
                call.args[0], ast.Constant):
            m = None
        return m is not None and any(c in m for c in "wax+")
    if not isinstance(f, ast.Attribute):
        return False
    owner = f.value.id if isinstance(f.value, ast.Name) else None
    if f.attr == "open" and owner == "os":
        return "O_CREAT" in ast.unparse(call)
    if f.attr in ATTR_CALLS or owner == "os" and f.attr in OS_CALLS:
        return True
    if f.attr == "save" and owner in SAVE_OWNERS:
        return True
    if f.attr in ("replace", "rename"):
        if owner == "os":
            return True
        return len(call.args) + len(call.keywords) == 1   # Path.replace(target), not str.replace
    return False


def scan_python(source: str, filename: str = "<source>") -> list[tuple[str, str]]:
    """(function qualname, call text) of every write in `source` that bypasses the module."""
    tree = ast.parse(source, filename)
    found: list[tuple[str, str]] = []

    def visit(node: ast.AST, scope: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                visit(child, f"{scope}.{child.name}" if scope else child.name)
                continue
            if isinstance(child, ast.Call) and _is_write(child):
                found.append((scope or "<module>", _text(child)))
            visit(child, scope)
    visit(tree, "")
    return found


def _text(call: ast.Call) -> str:
    """The call's head: the callee and its first argument (enough to tell the write apart)."""
    head = ast.unparse(call.func)
    arg = ast.unparse(call.args[0]) if call.args else ""
    return f"{head}({arg[:60]})"


_FUNC = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*\(\)\s*\{")
_REDIR = re.compile(r"(?<![<>&0-9=-])(?:[0-9])?(>>?)\s*(?![&>(=])(\"[^\"]*\"|'[^']*'|[^\s;|&)]+)")


_TEE = re.compile(r"\btee\s+((?:-[a-z]+\s+)*(?:\"[^\"]*\"|\S+))")


def scan_shell(source: str) -> list[tuple[str, str]]:
    """(shell function or <top>, redirect text) of every redirect to a file. Comments, and the
    text of single-quoted awk or sed programs, are left out."""
    found = []
    scope = "<top>"
    for line in source.splitlines():
        m = _FUNC.match(line)
        if m:
            scope = m.group(1)
        code = re.sub(r"(^|\s)#.*$", "", line)          # comments
        code = re.sub(r"'[^']*'", "''", code)          # single-quoted programs and strings
        code = re.sub(r'"[^"]*"', lambda q: q.group(0) if q.string[:q.start()].rstrip()
                      .endswith((">", "tee", "-p", "-a")) else '""', code)  # text, not targets
        code = re.sub(r"\[\[?[^\]]*\]\]?", "", code)     # test expressions ([ a -gt b ])
        code = re.sub(r"\$\(\([^)]*\)\)", "", code)     # arithmetic
        for op, target in _REDIR.findall(code):
            if target.startswith("/dev/null") or target.startswith("/proc/"):
                continue
            found.append((scope, f"{op} {target}"))
        for target in _TEE.findall(code):
            found.append((scope, f"tee {target}"))
        if line.startswith("}") or m and code.rstrip().endswith("}"):
            scope = "<top>"
    return found


def scan_tree(root: Path, shell_files: list[Path]) -> dict[tuple[str, str, str], int]:
    """(file relative to root's parent, function, call text) -> how many such calls."""
    out: dict[tuple[str, str, str], int] = {}
    base = root.parent
    for p in sorted(root.rglob("*.py")):
        rel = str(p.relative_to(base))
        if rel == "llama31_405b/outputs.py":
            continue
        for func, text in scan_python(p.read_text(), rel):
            out[(rel, func, text)] = out.get((rel, func, text), 0) + 1
    for p in shell_files:
        rel = str(p.relative_to(base))
        for func, text in scan_shell(p.read_text()):
            out[(rel, func, text)] = out.get((rel, func, text), 0) + 1
    return out
