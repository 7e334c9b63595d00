"""The Transformer Engine blocks docs/coverage.md lists "GPU only" that CPU code reaches, run
against Transformer Engine 2.20.2's own Python where it runs here:

- `transformer_engine.common.recipe` is TE 2.20.2's module itself, imported from the fetched
  sources (.cache/te-2.20.2, tests/helpers/source_index.py `te_tree`): it needs only pydantic
  and reads its NVFP4 defaults from the environment when imported, as on a GPU. The package
  above it (`transformer_engine`, whose `__init__` loads TE's CUDA library) is a stand-in
  carrying a version; so is `transformer_engine.pytorch.module.base` (its userbuffers are
  CUDA), whose `UserBufferQuantizationMode` is TE's class, executed from its source;
- TE's attention-backend record is the dict TE 2.20.2's dot_product_attention module starts
  with (read from its source), updated as its `DotProductAttention.forward` does;
- first-contact's checks on a pretend GPU (tests/test_first_contact.py's stand-ins for the
  device queries) with that TE: its version check, the recipe check, the Apex check, a GPU
  without a quantized recipe, the layer phase's dispatch."""
from __future__ import annotations

import ast
import os
import sys
import types

import pytest

from conftest import REPO
from helpers.source_index import TE_ROOT, te_tree

GB200 = REPO / "configs" / "config_GB200_128x4x144xtp4pp8cp2.toml"
H200 = REPO / "configs" / "config_H200_128x8x56xtp4pp8cp2.toml"
DPA_MODULE = "transformer_engine.pytorch.attention.dot_product_attention.dot_product_attention"
DPA_SOURCE = ("transformer_engine/pytorch/attention/dot_product_attention/"
              "dot_product_attention.py")


def _te_source(rel: str) -> str:
    te_tree()                                  # fetched when this clone lacks them, never skipped
    return (TE_ROOT / rel).read_text()


@pytest.fixture
def te(monkeypatch):
    """Transformer Engine importable: `transformer_engine` a stand-in with a version (set
    `.__version__` to change it), `transformer_engine.common.recipe` TE 2.20.2's own module,
    imported afresh (its class defaults read the environment of that moment) by the first
    import after the test starts. Everything is taken out of sys.modules afterwards."""
    import llama31_405b.model.builder  # noqa: F401  megatron imported before TE is "there"
    te_tree()
    before = {k for k in sys.modules if k.startswith("transformer_engine")}
    pkg = types.ModuleType("transformer_engine")
    pkg.__path__ = []                           # a package, but nothing imports from its folder
    pkg.__version__ = "2.20.2"
    common = types.ModuleType("transformer_engine.common")
    common.__path__ = [str(TE_ROOT / "transformer_engine" / "common")]
    monkeypatch.setitem(sys.modules, "transformer_engine", pkg)
    monkeypatch.setitem(sys.modules, "transformer_engine.common", common)
    monkeypatch.delitem(sys.modules, "transformer_engine.common.recipe", raising=False)
    monkeypatch.setattr(os, "environ", dict(os.environ))   # run_checks exports launch_env
    yield pkg
    for k in [k for k in sys.modules if k.startswith("transformer_engine") and k not in before]:
        del sys.modules[k]


# -- precision/te_recipe.py --------------------------------------------------------------------
def test_the_recipe_te_builds_is_checked_against_the_config(te):
    """verify_te_recipe against TE 2.20.2's NVFP4BlockScaling: imported with the config's
    launch environment its defaults are the config's; imported before it (TE's defaults: RHT,
    stochastic rounding and 2D quantization on) it is refused naming the three."""
    from llama31_405b.config import launch_env, load_config
    from llama31_405b.precision.te_recipe import RecipeEnvError, verify_te_recipe
    cfg = load_config(GB200)
    assert not (cfg.precision.nvfp4_rht or cfg.precision.nvfp4_stochastic_rounding
                or cfg.precision.nvfp4_2d_weights)
    for k in [k for k in os.environ if k.startswith("NVTE_")]:
        del os.environ[k]
    with pytest.raises(RecipeEnvError, match="TE was imported before the recipe environment") \
            as e:
        verify_te_recipe(cfg)
    for name in ("disable_rht", "disable_stochastic_rounding", "disable_2d_quantization"):
        assert f"'{name}': False" in str(e.value) and f"'{name}': True" in str(e.value)
    del sys.modules["transformer_engine.common.recipe"]       # a process started right
    os.environ.update(launch_env(cfg))
    verify_te_recipe(cfg)
    from transformer_engine.common.recipe import NVFP4BlockScaling
    assert NVFP4BlockScaling.__module__ == "transformer_engine.common.recipe"
    assert NVFP4BlockScaling().disable_rht is True


def _backends(**chosen):
    """TE 2.20.2's `_attention_backends` as its module starts it, then what
    DotProductAttention.forward stores after choosing a backend."""
    tree = ast.parse(_te_source(DPA_SOURCE))
    node = next(n for n in tree.body if isinstance(n, ast.Assign)
                and any(getattr(t, "id", None) == "_attention_backends" for t in n.targets))
    backends = ast.literal_eval(node.value)
    assert set(chosen) <= set(backends), set(chosen) - set(backends)
    backends.update(attention_params=object(), **chosen)
    return backends


@pytest.mark.parametrize("chosen,want", [
    (dict(use_flash_attention=True, flash_attention_backend="2.8.3", use_fused_attention=False,
          use_unfused_attention=True), "FlashAttention (version 2.8.3)"),
    (dict(use_flash_attention=False, use_fused_attention=False, use_unfused_attention=True),
     "UnfusedDotProductAttention"),
    (dict(use_flash_attention=False, use_fused_attention=False, use_unfused_attention=False),
     "none available"),
], ids=["flash", "unfused", "none"])
def test_the_attention_backend_te_chose(monkeypatch, chosen, want):
    from packaging.version import Version

    from llama31_405b.precision.te_recipe import te_attention_backend, te_kernel_line, \
        te_kernel_record
    if "flash_attention_backend" in chosen:     # TE keeps FlashAttentionUtils.version: a Version
        chosen = dict(chosen, flash_attention_backend=Version(chosen["flash_attention_backend"]))
    mod = types.ModuleType(DPA_MODULE)
    mod._attention_backends = _backends(**chosen)
    monkeypatch.setitem(sys.modules, DPA_MODULE, mod)
    assert te_attention_backend() == want
    assert te_kernel_line(te_kernel_record({})).startswith(
        f"Transformer Engine kernels: attention backend {want}, ")


def test_tp_communication_overlap_sets_up_te_userbuffers(monkeypatch):
    """Run._init_tp_comm_overlap: one communicator set per quantization mode (TE's
    UserBufferQuantizationMode), for activations of [sequence / CP x MBS, hidden], with
    initialize_ub's own parameter names (TE 2.20.2 module/base.py)."""
    import enum

    import torch

    from llama31_405b.config import load_config
    from llama31_405b.train.loop import Run
    src = _te_source("transformer_engine/pytorch/module/base.py")
    tree = ast.parse(src)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef)
               and n.name == "UserBufferQuantizationMode")
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef)
              and n.name == "initialize_ub")
    params = [a.arg for a in fn.args.args]
    base = types.ModuleType("transformer_engine.pytorch.module.base")
    exec(compile(ast.Module([cls], []), "te-2.20.2 module/base.py", "exec"),
         {"Enum": enum.Enum}, base.__dict__)
    calls = []

    def initialize_ub(**kw):
        assert set(kw) <= set(params), set(kw) - set(params)
        calls.append(kw)
    base.initialize_ub = initialize_ub
    module = types.ModuleType("transformer_engine.pytorch.module")
    module.base = base
    pytorch = types.ModuleType("transformer_engine.pytorch")
    pytorch.module = module
    for name, m in (("transformer_engine.pytorch", pytorch),
                    ("transformer_engine.pytorch.module", module),
                    ("transformer_engine.pytorch.module.base", base)):
        monkeypatch.setitem(sys.modules, name, m)
    for edges, modes in ((0, ["FP8"]), (2, ["FP8", "NONE"])):
        cfg = load_config(H200, overrides={"performance": {"tp_comm_overlap": True},
                                           "precision": {"bf16_layers_at_start": edges}})
        calls.clear()
        Run._init_tp_comm_overlap(types.SimpleNamespace(cfg=cfg))
        (kw,) = calls
        assert kw["shape"] == [8192 * 1 // 2, 16384] and kw["tp_size"] == 4
        assert [m.name for m in kw["quantization_modes"]] == modes
        assert all(type(m) is base.UserBufferQuantizationMode for m in kw["quantization_modes"])
        assert kw["dtype"] == torch.bfloat16 and kw["bootstrap_backend"] == "nccl"


# -- first_contact/checks.py on a pretend GPU with TE -------------------------------------------
def _pretend_gpu(monkeypatch, name: str, cap: tuple[int, int], *, apex: bool):
    import torch

    import llama31_405b.systems.device as device
    from llama31_405b.model import builder
    monkeypatch.setattr(device, "cuda_visible", lambda: True)
    props = types.SimpleNamespace(name=name, major=cap[0], minor=cap[1],
                                  total_memory=186 * 2**30)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(builder, "_has_module",
                        lambda m: apex and m == builder.GRAD_ACCUM_FUSION_MODULE)


def _checks(rep):
    return {n: (c.status, c.detail) for n, c in rep.checks.items()}


def test_first_contact_checks_te_its_recipe_and_apex_on_a_gb200(te, monkeypatch):
    from llama31_405b import first_contact as fc
    _pretend_gpu(monkeypatch, "NVIDIA GB200", (10, 0), apex=True)
    got = _checks(fc.run_checks(GB200, phases=()))
    assert got["gpu"][0] == "passed" and "compute capability 10.0" in got["gpu"][1]
    assert got["transformer_engine"] == ("passed", "version 2.20.2")
    status, detail = got["recipe"]
    assert status == "passed", detail
    assert detail.startswith("the configured NVFP4 recipe (compute capability 10.0); "
                             "TransformerConfig fp4=e2m1, fp4_recipe=nvfp4")
    assert got["gradient_accumulation_fusion"][0] == "passed"
    assert "importable" in got["gradient_accumulation_fusion"][1]
    assert os.environ["NVTE_NVFP4_DISABLE_RHT"] == "1"       # exported before TE's import


def test_first_contact_refuses_another_te_series_and_a_missing_apex(te, monkeypatch):
    from llama31_405b import first_contact as fc
    te.__version__ = "2.8.0"
    _pretend_gpu(monkeypatch, "NVIDIA H200", (9, 0), apex=False)
    got = _checks(fc.run_checks(GB200, phases=()))
    assert got["transformer_engine"] == ("failed", "version 2.8.0; the project is verified "
                                                   "against 2.20.x (Dockerfile)")
    assert got["recipe"][0] == "passed" and "fp8=hybrid" in got["recipe"][1]
    status, detail = got["gradient_accumulation_fusion"]
    assert status == "failed" and "(Apex) is not importable" in detail


def test_first_contact_with_the_fusion_off_in_the_config(te, monkeypatch, tmp_path):
    from llama31_405b import first_contact as fc
    _pretend_gpu(monkeypatch, "NVIDIA H200", (9, 0), apex=False)
    off = tmp_path / "h200_no_fusion.toml"
    off.write_text(f'base = "{H200}"\n\n[performance]\ngradient_accumulation_fusion = false\n')
    got = _checks(fc.run_checks(off, phases=()))
    assert got["gradient_accumulation_fusion"] == ("passed", "off in the config")


def test_a_gpu_without_fp8_or_nvfp4_runs_no_slice(te, monkeypatch):
    from llama31_405b import first_contact as fc
    _pretend_gpu(monkeypatch, "NVIDIA A100-SXM4-80GB", (8, 0), apex=True)
    rep = fc.run_checks(GB200, phases=("slice", "dp2"))
    got = _checks(rep)
    why = "no NVFP4 or FP8 hardware (compute capability 8.0 < 8.9)"
    assert got["transformer_engine"][0] == "passed"
    assert got["recipe"] == ("not run", why)
    for name in fc.PHASES["slice"] + fc.PHASES["dp2"] + ("gradient_accumulation_fusion",):
        assert got[name] == ("not run", f"needs a quantized recipe: {why}"), name


def test_the_layer_phase_runs_on_the_gpu_named_by_the_device(te, monkeypatch):
    from llama31_405b import first_contact as fc
    from llama31_405b.first_contact import layer
    _pretend_gpu(monkeypatch, "NVIDIA H200", (9, 0), apex=True)
    seen = []
    monkeypatch.setattr(layer, "run_layer_phase",
                        lambda rep, cfg, *, system: seen.append((cfg.source, system)))
    rep = fc.run_checks(GB200, phases=("layer",))
    assert seen == [(str(GB200), "h200-sxm")]
    assert all(rep.checks[n].status == "not run" for n in fc.PHASES["slice"])
