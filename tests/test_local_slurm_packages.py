"""scripts/local_slurm_cluster.sh decides which Debian packages to install by their dpkg status:
a package removed without --purge keeps its config files and `dpkg -s` still succeeds for it, so
a machine whose Slurm packages were removed must count them missing (a fresh clone's `make test`
on such a machine once installed slurm-client alone and then found no slurmctld). A fake
dpkg-query on PATH answers each package's status; nothing is installed."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "local_slurm_cluster.sh"
NEEDED = ["slurmctld", "slurmd", "slurm-client", "munge"]


def missing(tmp_path: Path, status: dict[str, str]) -> list[str]:
    fake = tmp_path / "bin"
    fake.mkdir(exist_ok=True)
    table = "\n".join(f'  {name}) printf %s "{st}" ;;' for name, st in status.items())
    (fake / "dpkg-query").write_text(
        '#!/bin/bash\n# dpkg-query -W -f=${Status} NAME\ncase "${@: -1}" in\n'
        f'{table}\n  *) echo "dpkg-query: no packages found" >&2; exit 1 ;;\nesac\n')
    (fake / "dpkg-query").chmod(0o755)
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}"}
    out = subprocess.run([str(SCRIPT), "missing"], env=env, capture_output=True, text=True,
                         check=True, timeout=30)
    return out.stdout.split()


def test_installed_packages_are_not_missing(tmp_path):
    assert missing(tmp_path, {p: "install ok installed" for p in NEEDED}) == []


def test_removed_unknown_and_half_installed_packages_are_missing(tmp_path):
    status = {"slurmctld": "deinstall ok config-files",     # apt-get remove, not purge
              "slurmd": "install ok unpacked",              # unpacked, not configured
              "munge": "install ok installed"}               # slurm-client: never installed
    assert missing(tmp_path, status) == ["slurmctld", "slurmd", "slurm-client"]
