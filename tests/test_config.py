"""Config loading and validation: strict keys, inheritance, cross-field rules, clear errors."""
import ast
import dataclasses
import inspect
import textwrap

import pytest

from llama31_405b.config import ConfigError, load_config, schema
from llama31_405b.config.env import launch_env

GB200_BASE = """
base = "{base}"
[system]
racks = {racks}
[batch]
minibs = {minibs}
"""


def write(tmp_path, text, name="c.toml"):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


@pytest.fixture
def gb200(tmp_path, repo_root):
    base = repo_root / "configs" / "base" / "gb200_405b.toml"

    def make(racks=8, minibs=144, extra=""):
        return write(tmp_path, GB200_BASE.format(base=base, racks=racks, minibs=minibs) + extra)
    return make


def test_valid_gb200_config_derives_layout(gb200):
    cfg = load_config(gb200(racks=128, minibs=8))
    d = cfg.derived
    assert (d.dp, d.gbs, d.nodes, d.world_size) == (128, 1024, 2048, 8192)
    assert d.gradient_accumulation_steps == 8 and d.first_eval_step == 270
    assert d.layers_per_virtual_stage == 2.0
    assert d.model_flops_per_sequence == pytest.approx(21508e12, rel=1e-4)


def test_misspelled_key_names_file_and_key(gb200):
    path = gb200(extra="[parallel]\ntensor_parallel = 4\n")
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert str(path) in str(e.value) and "parallel.tensor_parallel" in str(e.value)


def test_misspelled_section_suggests(tmp_path, gb200):
    path = gb200(extra="[optimiser]\ndistributed = true\n")
    with pytest.raises(ConfigError, match=r"unknown key 'optimiser'.*did you mean 'optimizer'"):
        load_config(path)


def test_wrong_type_names_key(gb200):
    with pytest.raises(ConfigError, match=r"batch.minibs: expected an integer"):
        load_config(gb200(minibs='"eight"'))


def test_mp_group_not_dividing_rack(gb200):
    # TP4 x PP8 x CP3 = 96 does not divide 64 GPUs per rack
    with pytest.raises(ConfigError, match=r"TP\*PP\*CP = 4\*8\*3 = 96 does not divide the 64 GPUs"):
        load_config(gb200(extra="[parallel]\ncp = 3\n"))


def test_minibs_not_multiple_of_pp(gb200):
    with pytest.raises(ConfigError, match=r"12 microbatches must be >= PP \(8\) and a multiple"):
        load_config(gb200(racks=8, minibs=12))


@pytest.mark.parametrize("racks,minibs,gbs", [(110, 32, 3520), (100, 48, 4800)])
def test_rejected_gbs(tmp_path, gb200, racks, minibs, gbs):
    with pytest.raises(ConfigError, match=f"GBS {gbs}"):
        load_config(gb200(racks=racks, minibs=minibs))


def test_closed_division_cannot_override_rules(gb200):
    with pytest.raises(ConfigError, match=r"optimizer.lr.*closed division derives"):
        load_config(gb200(extra="[optimizer]\nlr = 1e-4\n"))


def test_open_division_may_override(gb200):
    cfg = load_config(gb200(extra="[optimizer]\nlr = 1e-4\n[run]\ndivision = \"open\"\n"))
    assert cfg.derived.lr == 1e-4


def test_pipeline_split_rule(gb200):
    with pytest.raises(ConfigError, match=r"126 layers \+ embedding = 127 slots"):
        load_config(gb200(extra="[performance]\naccount_for_loss_in_pipeline_split = false\n"))


def test_nvfp4_on_hopper_fails_at_check(tmp_path, repo_root):
    base = repo_root / "configs" / "base" / "gb200_405b.toml"
    path = write(tmp_path, f"""
        base = "{base}"
        [parallel]
        tp = 4
        pp = 2
        vp = 1
        cp = 1
        [performance]
        account_for_embedding_in_pipeline_split = false
        account_for_loss_in_pipeline_split = false
        [system]
        id = "h100-sxm"
        racks = 16
        [batch]
        minibs = 72
        """)
    with pytest.raises(ConfigError, match=r"nvfp4 needs a Blackwell GPU: HGX H100 SXM has no NVFP4"):
        load_config(path)


def test_inheritance_cycle(tmp_path):
    write(tmp_path, 'base = "b.toml"\n', "a.toml")
    write(tmp_path, 'base = "a.toml"\n', "b.toml")
    with pytest.raises(ConfigError, match="inheritance cycle"):
        load_config(tmp_path / "a.toml")


def test_cpu_rejects_gpu_only_settings(repo_root):
    with pytest.raises(ConfigError, match="sequence_parallel needs Transformer Engine"):
        load_config(repo_root / "configs" / "tiny_cpu.toml",
                    overrides={"parallel": {"sequence_parallel": True}})


def test_launch_env_is_data_from_config(repo_root):
    cfg = load_config(repo_root / "configs" / "config_GB200_2048x4x8xtp4pp8cp2.toml")
    env = launch_env(cfg)
    assert env["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
    assert env["NVTE_NVFP4_DISABLE_RHT"] == "1"          # vanilla recipe of the submissions
    assert env["NVTE_NVFP4_DISABLE_2D_QUANTIZATION"] == "1"
    assert env["NVTE_DPA_FP8_RECIPE"] == "F16"              # BF16 attention
    fp8_attn = load_config(repo_root / "configs" / "config_GB200_2048x4x8xtp4pp8cp2.toml",
                           overrides={"precision": {"attention": "fp8"}})
    env = launch_env(fp8_attn)
    assert (env["NVTE_DPA_FP8_RECIPE"], env["NVTE_DPA_FP8_FORMAT"]) == ("Float8CurrentScaling", "HYBRID")


def test_every_schema_field_has_a_docstring():
    tree = ast.parse(inspect.getsource(schema))
    missing = []
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        body = node.body
        for i, stmt in enumerate(body):
            if isinstance(stmt, ast.AnnAssign):
                nxt = body[i + 1] if i + 1 < len(body) else None
                if not (isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                        and isinstance(nxt.value.value, str)):
                    missing.append(f"{node.name}.{stmt.target.id}")
    assert not missing, missing


def test_sections_are_kw_only_slotted_dataclasses():
    for cls in (schema.Config, schema.ModelConfig, schema.ParallelConfig, schema.BatchConfig):
        assert dataclasses.is_dataclass(cls) and hasattr(cls, "__slots__")
        with pytest.raises(TypeError):
            cls(1)
