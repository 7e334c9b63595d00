"""Config loading and validation: strict keys, inheritance, cross-field rules, clear errors."""
import ast
import dataclasses
import inspect
import textwrap

import pytest

from llama31_405b.config import ConfigError, load_config, schema
from llama31_405b.config.env import launch_env
from llama31_405b.config.rcp import max_steps_for

GB200_BASE = """
base = "{base}"
[system]
racks = {racks}
[batch]
minibs = {minibs}
[run]
max_steps = {max_steps}
{run}
"""


def write(tmp_path, text, name="c.toml"):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


@pytest.fixture
def gb200(tmp_path, repo_root):
    base = repo_root / "configs" / "base" / "gb200_405b.toml"

    def make(racks=8, minibs=144, extra="", run=""):
        # TP4-PP8-CP2 on 64 GPUs per rack: DP = racks
        steps = max_steps_for("llama31_405b", racks * minibs) if isinstance(minibs, int) else 500
        return write(tmp_path, GB200_BASE.format(base=base, racks=racks, minibs=minibs,
                                                 max_steps=steps, run=run) + extra)
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


@pytest.mark.parametrize("manifest", ['""', '"/scratch/llama/"', '"/scratch/llama"'])
def test_data_manifest_must_name_a_json_file(gb200, manifest):
    with pytest.raises(ConfigError, match=r"data.manifest = .*ending in .json"):
        load_config(gb200(extra=f"[data]\nmanifest = {manifest}\n"))
    load_config(gb200(extra='[data]\nmanifest = "/scratch/llama/manifest.json"\n'))


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


def test_closed_division_cannot_override_rules(tmp_path, gb200):
    """Each rule field the config sets is named with the file that sets it (a base file, or
    --set) and the value the rules give: the LR and step counts from GBS, the rest fixed."""
    base = gb200(extra="[optimizer]\nlr = 1e-4\n[eval]\ntarget = 5.5\n")  # GBS 8 x 144 = 1152
    child = write(tmp_path, f'base = "{base}"\n', name="child.toml")
    with pytest.raises(ConfigError) as e:
        load_config(child, overrides={"optimizer": {"warmup_steps": 10}})
    msg = str(e.value)
    assert (f"optimizer.lr is set in {base}, but in the closed division it is derived from the "
            "global batch size (8e-05 at GBS 1152) by the llama31_405b rules (config/rules.py): "
            'remove it, or set run.division = "open"') in msg
    assert (f"eval.target is set in {base}, but in the closed division it is fixed at 5.6 "
            "by the llama31_405b rules") in msg
    assert ("optimizer.warmup_steps is set by --set, but in the closed division it is derived "
            "from the global batch size (8000 at GBS 1152)") in msg


def test_open_division_may_override(gb200):
    cfg = load_config(gb200(extra="[optimizer]\nlr = 1e-4\n", run='division = "open"'))
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


# --- issue 13: the GB200 run's settings as rules ----------------------------------------------

def test_nvfp4_param_gather_needs_2d_weights(gb200):
    """TE 2.20.2 quantize_master_weights casts master weights into NVFP4 parameters only with 2D
    weight blocks (megatron's fp4_param path reaches it after every optimizer step)."""
    with pytest.raises(ConfigError, match=r"fp4_param_gather needs precision.nvfp4_2d_weights"):
        load_config(gb200(extra="[performance]\nfp4_param_gather = true\n"))
    cfg = load_config(gb200(extra="[performance]\nfp4_param_gather = true\n"
                                  "[precision]\nnvfp4_2d_weights = true\n"))
    assert cfg.performance.fp4_param_gather and cfg.precision.nvfp4_2d_weights
    assert not load_config(gb200()).performance.fp4_param_gather     # the base gathers in BF16


def test_unset_max_steps_asks_the_whole_schedule_and_is_refused(tmp_path, repo_root):
    base = repo_root / "configs" / "base" / "gb200_405b.toml"
    path = write(tmp_path, f'base = "{base}"\n[system]\nracks = 8\n[batch]\nminibs = 144\n')
    with pytest.raises(ConfigError) as e:
        load_config(path)
    msg = str(e.value)
    assert "run.max_steps unset (the whole LR schedule, 1,200,000 steps)" in msg
    assert "1,382,400,000 samples" in msg and "626,688" in msg
    assert "mlperf_logging/rcp_checker/training_6.0.0/rcps_llama31_405b.json" in msg
    assert "Set run.max_steps = 500" in msg
    # the open division may change the rules, so the RCP says nothing about it: not bounded
    open_ = load_config(path, overrides={"run": {"division": "open"}})
    assert open_.derived.max_steps == 1_200_000


def test_max_steps_bound_is_twice_the_rcp_mean(gb200):
    # GBS 1152: RCP mean 313,344 samples; 2x = 626,688 = 544 steps
    assert load_config(gb200()).derived.max_steps == 500
    ok = load_config(gb200(), overrides={"run": {"max_steps": 544}})
    assert ok.derived.max_steps * ok.derived.gbs <= 2 * 313_344
    with pytest.raises(ConfigError, match=r"run.max_steps = 545 asks the dataset for 627,840"):
        load_config(gb200(), overrides={"run": {"max_steps": 545}})
    with pytest.raises(ConfigError, match=r"ends the run before its first evaluation \(step 240"):
        load_config(gb200(), overrides={"run": {"max_steps": 200}})
    with pytest.raises(ConfigError, match=r"run.max_steps must be >= 1"):
        load_config(gb200(), overrides={"run": {"max_steps": 0}})


def test_tiny_bound_names_the_project_rcp_file(repo_root):
    tiny = repo_root / "configs" / "tiny_cpu.toml"
    with pytest.raises(ConfigError, match=r"compliance/tiny_llama31_rcps.json.*Set run.max_steps = 350"):
        load_config(tiny, overrides={"run": {"max_steps": 351}})


def test_the_cap_only_ends_the_run(gb200):
    """max_steps stops the run; warm-up, decay and evaluation stay the rules' values."""
    from llama31_405b.config.rules import LLAMA31_405B, hparams
    d = load_config(gb200()).derived
    hp = hparams(LLAMA31_405B, 1152)
    assert d.max_steps == 500
    assert (d.warmup_steps, d.decay_steps, d.lr) == (hp.warmup_steps, hp.decay_steps, hp.lr)
    assert (d.eval_interval_steps, d.first_eval_step) == (hp.eval_interval_steps, 240)


def test_full_iteration_graphs_are_the_gb200_default_and_per_layer_graphs_stay(gb200):
    assert load_config(gb200()).performance.cuda_graphs == "full_iteration"
    layers = load_config(gb200(extra='[performance]\ncuda_graphs = "layers"\n'))
    assert layers.performance.cuda_graphs == "layers"


def test_cuda_graph_rules_follow_megatron(gb200):
    # TransformerConfig.__post_init__: full recompute only with full-iteration graphs
    with pytest.raises(ConfigError, match=r'recompute = "full" with cuda_graphs = "layers"'):
        load_config(gb200(extra='[performance]\ncuda_graphs = "layers"\nrecompute = "full"\n'))
    assert load_config(gb200(extra='[performance]\nrecompute = "full"\n')).performance.recompute == "full"
    # the captured training iteration follows an eager one, both before run_start
    with pytest.raises(ConfigError, match=r"run.warmup_iters >= 2"):
        load_config(gb200(run="warmup_iters = 1\n"))
    # the non-interleaved pipeline's batched P2P synchronises the device inside the capture
    with pytest.raises(ConfigError, match=r"PP > 1 and VP = 1"):
        load_config(gb200(extra="[parallel]\nvp = 1\n"))
    # expandable segments need NCCL_GRAPH_REGISTER=0 with CUDA graphs (validate_args)
    # (set by hand in [env], without performance.expandable_segments, which adds the register
    # switch itself)
    env = '[env]\nPYTORCH_CUDA_ALLOC_CONF = "expandable_segments:True"\n'
    manual = '[performance]\nexpandable_segments = false\n'
    with pytest.raises(ConfigError, match="NCCL_GRAPH_REGISTER=0"):
        load_config(gb200(extra=manual + env))
    assert load_config(gb200(extra=manual + env + 'NCCL_GRAPH_REGISTER = "0"\n')).env
    none = load_config(gb200(extra=manual + 'cuda_graphs = "none"\n' + env))
    assert none.performance.cuda_graphs == "none"


def test_proven_performance_fields(gb200):
    perf = load_config(gb200()).performance
    assert perf.gradient_accumulation_fusion and perf.ddp_bucket_size == 134_217_728
    assert perf.manual_gc and perf.manual_gc_interval == 1000
    assert not load_config(gb200()).precision.grad_reduce_in_fp32
    with pytest.raises(ConfigError, match="ddp_bucket_size must be >= 1"):
        load_config(gb200(extra="[performance]\nddp_bucket_size = 0\n"))


def test_gradient_accumulation_fusion_is_gpu_only(repo_root):
    with pytest.raises(ConfigError, match="gradient_accumulation_fusion: GPU-only"):
        load_config(repo_root / "configs" / "tiny_cpu.toml",
                    overrides={"performance": {"gradient_accumulation_fusion": True}})
    assert not schema.PerformanceConfig().gradient_accumulation_fusion


# --- issue 17: derived values once per config, no import cycles, small rule functions ---------

def test_derived_is_computed_once_and_follows_replace(gb200):
    cfg = load_config(gb200(racks=128, minibs=8))
    assert cfg.derived is cfg.derived
    assert "_derived" not in dataclasses.asdict(cfg)
    bigger = dataclasses.replace(cfg, system=dataclasses.replace(cfg.system, racks=64))
    assert (bigger.derived.dp, bigger.derived.gbs) == (64, 512)
    assert (cfg.derived.dp, cfg.derived.gbs) == (128, 1024)
    assert bigger != cfg and dataclasses.replace(cfg) == cfg


def _config_imports() -> dict[str, set[str]]:
    from pathlib import Path
    pkg = Path(schema.__file__).parent
    graph = {}
    for f in pkg.glob("*.py"):
        tree = ast.parse(f.read_text())
        deps = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                deps |= {node.module} if node.module else {a.name for a in node.names}
        graph[f.stem] = deps - {"__init__"}
    return graph


def test_config_package_has_no_import_cycle():
    graph = _config_imports()
    assert "schema" not in graph["derived"] and "load" not in graph["validate"]
    from llama31_405b.config import errors, load
    assert ConfigError is errors.ConfigError is load.ConfigError   # the old import path still works
    state: dict[str, int] = {}

    def visit(n, path):
        assert state.get(n) != 1, f"import cycle: {' -> '.join(path + [n])}"
        if state.get(n) == 2:
            return
        state[n] = 1
        for m in graph.get(n, ()):
            visit(m, path + [n])
        state[n] = 2
    for n in graph:
        visit(n, [])


def test_rule_functions_are_small():
    from llama31_405b.config import validate as v, validate_gpu as vg
    for mod in (v, vg):
        for name, fn in inspect.getmembers(mod, inspect.isfunction):
            if fn.__module__ == mod.__name__:
                lines = len(inspect.getsource(fn).splitlines())
                assert lines <= 45, f"{mod.__name__}.{name}: {lines} lines"


def test_test_only_delays_are_refused_on_a_gpu_system(gb200, repo_root):
    with pytest.raises(ConfigError, match=r"\[testing\] step_delay_s"):
        load_config(gb200(extra="[testing]\nstep_delay_s = 1.0\n"))
    tiny = load_config(repo_root / "configs" / "tiny_cpu.toml",
                       overrides={"testing": {"step_delay_s": 1.0}})
    assert tiny.testing.step_delay_s == 1.0
