"""The folders a job reads, checked before it starts anything that costs (run_and_time.sh, via
`launch env --check-dirs`): the data folder, the config's tokenizer under it, and the checkpoint
folder. One problem is reported, as one line naming the variable (DATADIR, CKPTDIR) when the
job's environment set it, else the config key, the path, and what to do.

The log folder (LOGDIR) is checked by run_and_time.sh itself, before this: it is the one folder
the job writes, and the script checks it in every mode (with a container, before any srun).
"""
from __future__ import annotations

import os
from pathlib import Path


def _label(var: str, key: str, path: Path, environ) -> str:
    """`VAR=path` when the job's variable VAR gave this path, else `key=path`."""
    given = environ.get(var, "")
    if given and Path(given).absolute() == path:
        return f"{var}={given}"
    return f"{key}={path}"


def _readable_dir(path: Path) -> str:
    if not path.exists():
        return "no such directory"
    if not path.is_dir():
        return "not a directory"
    if not os.access(path, os.R_OK | os.X_OK):
        return "not readable (permission denied)"
    return ""


def check_job_dirs(cfg, environ=None) -> str:
    """'' when the data folder, the tokenizer and the checkpoint folder of `cfg` are readable;
    else one line naming the first that is not."""
    environ = os.environ if environ is None else environ
    data = Path(cfg.data.data_dir).absolute()
    ckpt = Path(cfg.checkpoint.ckpt_dir).absolute()
    data_label = _label("DATADIR", "data.data_dir", data, environ)
    why = _readable_dir(data)
    if why:
        return (f"{data_label}: {why}; set DATADIR (or data.data_dir) to the dataset's folder "
                "(docs/data.md)")
    tok = data / cfg.data.tokenizer
    if not tok.is_file():
        why = "not a file" if tok.exists() else "not found"
    elif not os.access(tok, os.R_OK):
        why = "not readable (permission denied)"
    else:
        why = ""
    if why:
        return (f"data.tokenizer={cfg.data.tokenizer} under {data_label}: {tok} {why}; put the "
                "tokenizer there, or set data.tokenizer to its path under the data folder")
    why = _readable_dir(ckpt)
    if why:
        return (f"{_label('CKPTDIR', 'checkpoint.ckpt_dir', ckpt, environ)}: {why}; set CKPTDIR "
                "(or checkpoint.ckpt_dir) to the folder of the initial checkpoint "
                "(docs/checkpoint.md)")
    return ""
