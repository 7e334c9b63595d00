"""Names in strings checked against the pinned sources (issue 44, point 3): Transformer Engine
2.20.2's Python sources (fetched into .cache/te-2.20.2/ by scripts/fetch_te_sources.py, as
`make typecheck` does; fetched here when absent) and megatron-core 0.19.2's installed ones.

- every NVTE_* name in llama31_405b/, configs/, scripts/, bench/, run_and_time.sh and the
  Dockerfile is read by TE's PyTorch-side Python or by megatron-core, or is one of the knobs TE
  reads only in C++, named with where (CPP_ONLY);
- every TE or megatron enum member looked up by name is a member;
- every attribute reached with a literal getattr/hasattr/setattr/delattr is classified
  (tests/helpers/pinned_attributes.py), and those on TE or megatron objects are defined there;
- the keys read from TE's own dicts, and dotted `transformer_engine.*`/`megatron.*` strings,
  exist.

Each check is shown to catch a seeded misspelling, reported with its file and the name."""
import ast

import pytest

from helpers import pinned_names as pn
from helpers.pinned_attributes import ATTRIBUTES, DICT_KEYS
from helpers.source_index import (TE_ROOT, TESourcesMissing, megatron_tree, project_tree,
                                  te_tree)

TE_RECIPE = "llama31_405b/precision/te_recipe.py"


@pytest.fixture(scope="module")
def libs():
    try:
        te = te_tree()
    except TESourcesMissing as e:
        pytest.fail(str(e))
    return {"transformer_engine": te, "megatron": megatron_tree()}


@pytest.fixture(scope="module")
def read_by(libs):
    """(NVTE names in TE's PyTorch-side Python, NVTE names in megatron-core)."""
    return (pn.nvte_read_by(TE_ROOT, pn.TE_PARTS),
            pn.nvte_read_by(libs["megatron"].root / "megatron"))


def _respell(text: str, old: str, new: str, function: str | None = None) -> str:
    """`text` with the first string constant `old` (in `function`, if given) made `new`."""
    tree = ast.parse(text)
    scope = tree if function is None else next(
        n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == function)
    const = next((n for n in ast.walk(scope) if isinstance(n, ast.Constant) and n.value == old),
                 None)
    assert const is not None, f"{old!r} is gone from {function or 'the file'}: update the seed"
    const.value = new
    return ast.unparse(tree)


def _text(rel: str) -> str:
    return (project_tree().root / rel).read_text()


# -- NVTE_* -------------------------------------------------------------------------------------

def test_every_nvte_name_the_project_uses_is_read_by_te_or_megatron(read_by):
    uses = pn.nvte_uses(pn.project_texts())
    assert {"NVTE_NVFP4_DISABLE_RHT", "NVTE_FWD_LAYERNORM_SM_MARGIN", "NVTE_FLASH_ATTN",
            "NVTE_NORM_FWD_USE_CUDNN"} <= set(uses)
    assert pn.nvte_problems(uses, *read_by) == []


def test_the_knobs_te_reads_only_in_cpp_say_so_by_name(read_by):
    te, _ = read_by
    assert set(pn.CPP_ONLY) == {"NVTE_NORM_FWD_USE_CUDNN", "NVTE_NORM_BWD_USE_CUDNN"}
    for name, why in pn.CPP_ONLY.items():
        assert why.startswith("read only in C++: libtransformer_engine.so transformer_engine::")
        assert name not in te
    # an allow-listed knob that TE's Python does read is stale, and so is an unused one
    stale = pn.nvte_problems({"NVTE_FLASH_ATTN": ["x:1"]}, *read_by,
                             cpp_only={"NVTE_FLASH_ATTN": "C++", "NVTE_GONE": "C++"})
    assert stale == ["CPP_ONLY: NVTE_FLASH_ATTN is read in TE 2.20.2's Python after all: "
                     "remove it", "CPP_ONLY: NVTE_GONE is no longer used by the project: "
                     "remove it"]


@pytest.mark.parametrize("rel,old,new", [
    (TE_RECIPE, "NVTE_NVFP4_DISABLE_RHT", "NVTE_NVFP4_DISABLE_RTH"),
    ("configs/base/gb200_405b.toml", "NVTE_FWD_LAYERNORM_SM_MARGIN",
     "NVTE_FWD_LAYERNORM_SM_MARGN")])
def test_a_misspelled_nvte_name_is_reported(read_by, rel, old, new):
    texts = pn.project_texts()
    assert old in texts[rel], f"{old} is gone from {rel}: update the seed"
    texts[rel] = texts[rel].replace(old, new, 1)
    found = pn.nvte_problems(pn.nvte_uses(texts), *read_by)
    assert len(found) == 1 and found[0].startswith(f"{rel}:") and f": {new} is read by " \
        f"neither" in found[0] and found[0].endswith(f"did you mean {old}?"), found


# -- enum members -------------------------------------------------------------------------------

def test_enum_members_looked_up_by_name_exist(libs):
    sites, problems = pn.enum_lookups(project_tree(), libs)
    assert any(s.startswith("llama31_405b/train/loop.py:") and s.endswith(
        "transformer_engine.pytorch.module.base.UserBufferQuantizationMode") for s in sites)
    assert problems == []


def test_a_misspelled_enum_member_is_reported(libs):
    seeded = _respell(_text(TE_RECIPE), "NONE", "NON", function="ub_quantization_modes")
    _, problems = pn.enum_lookups(project_tree({TE_RECIPE: seeded}), libs)
    assert len(problems) >= 1 and all(
        p.startswith(f"{TE_RECIPE}:") and "'NON' is not a member of transformer_engine."
        "pytorch.module.base.UserBufferQuantizationMode" in p and "looked up at "
        "llama31_405b/train/loop.py:" in p and p.endswith("did you mean 'NONE'?")
        for p in problems), problems


SYNTHETIC = '''
from transformer_engine.pytorch.module.base import UserBufferQuantizationMode as Mode
from megatron.core.tensor_parallel.cross_entropy import VocabParallelCrossEntropy as V


def direct():
    return Mode["FP9"]


def untraced(names):
    return [Mode[m] for m in names]


def own_attribute():
    return V.__dict__["calculate_logits_maximum"]
'''


def test_lookups_the_checker_cannot_trace_are_reported(libs):
    rel = "llama31_405b/_seeded_names.py"
    _, problems = pn.enum_lookups(project_tree({rel: SYNTHETIC}), libs)
    ours = [p for p in problems if p.startswith(rel)]
    assert len(ours) == 3, problems
    assert ours[0].startswith(f"{rel}:7: 'FP9' is not a member of ")
    assert ours[1].startswith(f"{rel}:11: cannot trace the names in `names`")
    assert ours[2].startswith(f"{rel}:15: 'calculate_logits_maximum' is not defined by "
                              "megatron.core.tensor_parallel.cross_entropy."
                              "VocabParallelCrossEntropy")


# -- attributes reached by name -----------------------------------------------------------------

def test_every_attribute_reached_by_name_is_classified_and_defined(libs):
    uses = pn.attribute_uses(project_tree())
    assert {"fp8_meta", "_persistent_state_buffers", "_attention_backends"} <= set(uses)
    assert pn.attribute_problems(uses, ATTRIBUTES, libs) == []


def test_a_misspelled_attribute_is_reported(libs):
    rel = "llama31_405b/train/warmup.py"
    seeded = _respell(_text(rel), "fp8_meta", "fp8_metas", function="_te_recipe_buffers")
    uses = pn.attribute_uses(project_tree({rel: seeded}))
    found = pn.attribute_problems(uses, ATTRIBUTES, libs)
    assert any(p.startswith(f"{rel}:") and "(_te_recipe_buffers): 'fp8_metas' is reached by "
               "name but" in p and p.endswith("did you mean 'fp8_meta'?") for p in found), found
    # a classified attribute the named class does not define is reported at each use
    wrong = dict(ATTRIBUTES, fp8_meta=(pn.Pinned("transformer_engine.pytorch.quantization."
                                                 "RecipeState"),))
    found = pn.attribute_problems(pn.attribute_uses(project_tree()), wrong, libs)
    assert found and all(f": 'fp8_meta' is not defined by transformer_engine.pytorch."
                         "quantization.RecipeState" in p for p in found), found


def test_the_definition_check_follows_bases_and_torch_registration(libs):
    mc, te = libs["megatron"], libs["transformer_engine"]
    gpt = "megatron.core.models.gpt.gpt_model.GPTModel"
    assert pn.defines(mc, gpt, "compute_language_model_loss")       # LanguageModule's
    assert pn.defines(mc, "megatron.core.transformer.module.Float16Module", "module")
    assert not pn.defines(mc, gpt, "rotary_pos_embedding")
    assert not pn.defines(te, "transformer_engine.pytorch.module.base", "_high_precision_init")
    assert pn.defines(te, "transformer_engine.pytorch.no_such_module", "x") is None


# -- keys of TE's dicts, dotted paths ------------------------------------------------------------

def test_keys_read_from_te_dicts_and_dotted_paths_exist(libs):
    tree = project_tree()
    assert pn.dict_key_problems(tree, DICT_KEYS, libs) == []
    assert pn.dotted_problems(tree, libs) == []


def test_a_misspelled_te_dict_key_or_module_path_is_reported(libs):
    seeded = _respell(_text(TE_RECIPE), "use_fused_attention", "use_fused_attn",
                      function="te_attention_backend")
    found = pn.dict_key_problems(project_tree({TE_RECIPE: seeded}), DICT_KEYS, libs)
    assert len(found) == 1 and found[0].startswith(f"{TE_RECIPE}:") and (
        ": te_attention_backend: 'use_fused_attn' is no key of _attention_backends") in found[0]
    dpa = "transformer_engine.pytorch.attention.dot_product_attention.dot_product_attention"
    seeded = _respell(_text(TE_RECIPE), dpa, dpa + "s")
    found = pn.dotted_problems(project_tree({TE_RECIPE: seeded}), libs)
    assert len(found) == 1 and found[0].startswith(f"{TE_RECIPE}:") and f"'{dpa}s'" in found[0]
