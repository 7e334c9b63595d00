"""The per-communicator NCCL options shipped with the configs (configs/nccl/gb200_communicators.yaml)
are in the format megatron-core 0.19.2 reads, name only groups it creates, and reach
`parallel_state.initialize_model_parallel(nccl_communicator_config_path=...)` through the
project's own setup_parallel (real call, one gloo rank: Megatron reads the file on CPU too)."""
from __future__ import annotations

import inspect
import re
import socket
from pathlib import Path

import pytest
import yaml

from llama31_405b.config import ConfigError, load_config
from llama31_405b.parallel.setup import megatron_parallel_kwargs

REPO = Path(__file__).resolve().parents[1]
YAML = REPO / "configs" / "nccl" / "gb200_communicators.yaml"
GB200 = sorted((REPO / "configs").glob("config_GB200_*.toml"))

# group -> (cga_cluster_size, min_ctas, max_ctas): the converged GB200 runs' values
EXPECTED = {g: (4, 1, 8) for g in ("dp", "tp", "dp_cp")}
EXPECTED |= {g: (2, 1, 2) for g in ("pp", "mp", "embd")}
EXPECTED |= {g: (1, 1, 1) for g in ("cp", "tp_dp_cp", "tp_dp")}


def _megatron_names() -> tuple[set[str], set[str]]:
    """(group names initialize_model_parallel asks get_nccl_options for, option keys that
    get_nccl_options reads), from the installed megatron-core's source."""
    from megatron.core import parallel_state as ps
    src = inspect.getsource(ps)
    groups = set(re.findall(r"get_nccl_options\(\s*[\"'](\w+)[\"']", src))
    opts = inspect.getsource(ps.get_nccl_options)
    keys = set(re.findall(r"nccl_comm_cfgs\[pg_name\]\[\"(\w+)\"\]", opts))
    keys |= set(re.findall(r"nccl_comm_cfgs\[pg_name\]\.get\(\s*\"(\w+)\"", opts))
    return groups, keys


def test_yaml_parses_into_groups_megatron_knows():
    cfgs = yaml.safe_load(YAML.read_text())
    groups, keys = _megatron_names()
    assert {"dp", "tp", "pp", "cp", "dp_cp", "mp", "embd", "tp_dp", "tp_dp_cp"} <= groups
    assert set(cfgs) <= groups, set(cfgs) - groups
    assert {"cga_cluster_size", "min_ctas", "max_ctas"} <= keys
    for name, opts in cfgs.items():
        assert set(opts) <= keys, (name, set(opts) - keys)
    got = {g: (o["cga_cluster_size"], o["min_ctas"], o["max_ctas"]) for g, o in cfgs.items()}
    assert got == EXPECTED


def test_every_gb200_config_passes_the_yaml_to_megatron(tmp_path, monkeypatch):
    for path in GB200:
        kw = megatron_parallel_kwargs(load_config(path))
        assert Path(kw["nccl_communicator_config_path"]) == YAML.resolve(), path.name
    # also from another working directory (the container runs from the image's WORKDIR)
    monkeypatch.chdir(tmp_path)
    assert Path(megatron_parallel_kwargs(load_config(GB200[0]))["nccl_communicator_config_path"]
                ).is_file()
    tiny = load_config(REPO / "configs" / "tiny_cpu.toml")
    assert "nccl_communicator_config_path" not in megatron_parallel_kwargs(tiny)
    missing = load_config(GB200[0], overrides={
        "performance": {"nccl_communicator_config": "nccl/none.yaml"}})
    with pytest.raises(ConfigError, match=r"performance.nccl_communicator_config = "
                                          r"'nccl/none.yaml': no such file"):
        megatron_parallel_kwargs(missing)


def test_launch_env_refuses_a_missing_yaml_before_the_job_starts():
    from llama31_405b.launch import launch_plan
    cfg = load_config(GB200[0], overrides={"performance": {"nccl_communicator_config": "x.yaml"}})
    with pytest.raises(ConfigError, match="nccl_communicator_config"):
        launch_plan(cfg)


def test_setup_parallel_hands_the_yaml_to_initialize_model_parallel(monkeypatch):
    """setup_parallel -> initialize_model_parallel(**megatron_parallel_kwargs(cfg)) on a 1-rank
    gloo world: Megatron reads the YAML and builds each listed group's NCCL options from it."""
    from megatron.core import parallel_state as ps

    from llama31_405b.parallel.distributed import DistEnv
    from llama31_405b.parallel.setup import setup_parallel, teardown_parallel
    seen: dict[str, object] = {}
    real = ps.get_nccl_options

    def recorder(pg_name, nccl_comm_cfgs):
        seen[pg_name] = real(pg_name, nccl_comm_cfgs)
        return seen[pg_name]
    monkeypatch.setattr(ps, "get_nccl_options", recorder)
    cfg = load_config(REPO / "configs" / "tiny_cpu.toml", overrides={
        "performance": {"nccl_communicator_config": "nccl/gb200_communicators.yaml"}})
    de = DistEnv(rank=0, world_size=1, local_rank=0, master_addr="127.0.0.1", master_port=1,
                 hostname=socket.gethostname(), launcher="single")
    setup_parallel(cfg, de, timeout_s=60)
    teardown_parallel()
    got = {g: (o.config.cga_cluster_size, o.config.min_ctas, o.config.max_ctas)
           for g, o in seen.items() if o is not None}
    assert got == EXPECTED
