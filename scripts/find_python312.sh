#!/usr/bin/env bash
# Prints the path of a Python 3.12 interpreter: python3.12 on PATH, else one under pyenv.
# megatron-core 0.19 ships cp312 wheels only, so no other version will do.
set -euo pipefail
ok() { "$1" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null; }
for cand in "$(command -v python3.12 2>/dev/null || true)" \
            "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12*/bin/python3.12; do
  if [ -n "$cand" ] && [ -x "$cand" ] && ok "$cand"; then echo "$cand"; exit 0; fi
done
if command -v pyenv >/dev/null 2>&1; then
  root=$(pyenv root)
  for cand in "$root"/versions/3.12*/bin/python3.12; do
    if [ -x "$cand" ] && ok "$cand"; then echo "$cand"; exit 0; fi
  done
fi
echo "error: Python 3.12 not found (megatron-core 0.19 needs exactly 3.12)." >&2
echo "Install it, e.g. 'pyenv install 3.12' or 'apt-get install python3.12 python3.12-venv'," >&2
echo "or put a python3.12 on PATH, then run 'make setup' again." >&2
exit 1
