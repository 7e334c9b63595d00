"""megatron-core's keywords passed in dicts (issue 44, point 2): every key the package can put
into a dict it hands megatron-core 0.19.2 as `**kw` (TransformerConfig, DistributedDataParallel-
Config, initialize_model_parallel, and any other megatron or TE callable called that way), in
every branch, GPU-only ones included, is a field or parameter of the installed callee. Read from
the source with `ast` (tests/helpers/megatron_kwargs.py), so no model is built and no branch
needs to run. mypy cannot see these keys: the dicts are typed `dict`.

The seeded tests put a misspelled key into a GPU-only branch of a copy of each builder and check
that it is reported with its file, its function, the key and the field meant."""
import ast

import pytest

from helpers import megatron_kwargs as mk
from helpers.source_index import project_tree


@pytest.fixture(scope="module")
def sites():
    found, unlisted = mk.call_sites(project_tree())
    assert unlisted == []
    return found


def test_every_key_passed_to_megatron_in_a_dict_is_accepted(sites):
    targets = {s.target for s in sites}
    assert {"megatron.core.transformer.TransformerConfig",
            "megatron.core.distributed.DistributedDataParallelConfig",
            "megatron.core.parallel_state.initialize_model_parallel"} <= targets
    assert mk.problems(sites) == []


def test_each_keyword_builder_gives_keys(sites):
    """A builder the collector no longer follows would leave the check empty: it fails."""
    assert mk.silent_producers(sites) == []
    keys = {k.name for s in sites for k in s.keys}
    # GPU-only keys (transformer_config's `if gpu:` and the precision package's fp8/nvfp4
    # branches) are among those checked
    assert {"fp4_recipe", "fp8_recipe", "use_te_rng_tracker", "cuda_graph_warmup_steps",
            "num_layers_at_end_in_bf16", "recompute_num_layers", "bucket_size",
            "nccl_communicator_config_path"} <= keys


def _seed(text: str, function: str, branch: str, statement: str) -> str:
    """`text` with `statement` first in the body of the `if` of `function` whose test reads
    `branch` (as ast.unparse writes it)."""
    tree = ast.parse(text)
    fn = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == function)
    hits = [n for n in ast.walk(fn) if isinstance(n, ast.If) and ast.unparse(n.test) == branch]
    assert len(hits) == 1, f"{function}: no single `if {branch}:` to seed; update the seed"
    hits[0].body.insert(0, ast.parse(statement).body[0])
    return ast.unparse(tree)


SEEDS = [
    # (file, function, branch, seeded statement, misspelled key, the field meant, callee)
    ("llama31_405b/model/builder.py", "transformer_config", "gpu",
     "kw['fp8_parm'] = perf.fp8_param_gather", "fp8_parm", "fp8_param", "TransformerConfig"),
    ("llama31_405b/precision/te_recipe.py", "transformer_config_kwargs",
     "pr.compute == 'nvfp4'", "kw['fp4_recipie'] = 'nvfp4'", "fp4_recipie", "fp4_recipe",
     "TransformerConfig"),
    ("llama31_405b/model/builder.py", "_recompute_kwargs", "mode == 'full'",
     "return {'recompute_granularity': 'full', 'recompute_metod': 'uniform'}",
     "recompute_metod", "recompute_method", "TransformerConfig"),
    ("llama31_405b/model/builder.py", "ddp_config", "perf.ddp_bucket_size is not None",
     "kw.update(bucket_sise=perf.ddp_bucket_size)", "bucket_sise", "bucket_size",
     "DistributedDataParallelConfig"),
    ("llama31_405b/parallel/setup.py", "megatron_parallel_kwargs", "comm",
     "kw['nccl_comunicator_config_path'] = comm", "nccl_comunicator_config_path",
     "nccl_communicator_config_path", "initialize_model_parallel"),
]


@pytest.mark.parametrize("file,function,branch,statement,key,meant,callee", SEEDS,
                         ids=[s[4] for s in SEEDS])
def test_a_misspelled_key_in_a_gpu_only_branch_is_reported(file, function, branch, statement,
                                                           key, meant, callee):
    tree = project_tree()
    text = _seed((tree.root / file).read_text(), function, branch, statement)
    sites, _ = mk.call_sites(project_tree({file: text}))
    found = [p for p in mk.problems(sites) if f"'{key}'" in p]
    assert found, f"the seeded key {key!r} in {file} {function} was not reported"
    assert all(p.startswith(f"{file}:") and f": {function}: '{key}' is not " in p
               and callee in p and p.endswith(f"did you mean '{meant}'?") for p in found), found


SYNTHETIC = '''
from megatron.core.transformer import TransformerConfig
import dataclasses


def build(gpu, extra):
    kw = dict(num_layers=2, hidden_size=8)
    if gpu:
        kw["fp4_recipie"] = "nvfp4"
    return TransformerConfig(**kw)


def passed_in(extra):
    return TransformerConfig(num_layers=2, **extra)


def from_a_loop(pairs):
    kw = {}
    for k, v in pairs:
        kw[k] = v
    return TransformerConfig(**kw)


def replaced(cfg, kw):
    return dataclasses.replace(cfg, **kw)
'''


def test_the_collector_on_a_source_string():
    """The check itself, on a module of its own: the GPU-only typo is reported, and keys it
    cannot follow (a parameter, a loop variable) are reported as such, not skipped; a
    `dataclasses.replace(..., **kw)` not in REPLACE_TARGETS is refused."""
    rel = "llama31_405b/_seeded_keywords.py"
    sites, unlisted = mk.call_sites(project_tree({rel: SYNTHETIC}))
    ours = [s for s in sites if s.file == rel]
    assert [s.function for s in ours] == ["build", "passed_in", "from_a_loop"]
    out = mk.problems(ours)
    assert out[0] == (f"{rel}:9: build: 'fp4_recipie' is not a field of "
                      "megatron.core.transformer.TransformerConfig (megatron-core 0.19.2), "
                      f"passed at {rel}:10 (build); did you mean 'fp4_recipe'?")
    assert any(f"{rel}:14: passed_in: cannot follow the keys of the name `extra`" in p
               for p in out)
    assert any(f"{rel}:20: from_a_loop: cannot follow the keys of a subscript `kw[k]`" in p
               for p in out)
    assert len(out) == 3
    assert len(unlisted) == 1 and unlisted[0].startswith(f"{rel}:25: replaced:")
    # a builder that no longer gives keys is named
    assert mk.silent_producers(ours, producers=((rel, "build"), (rel, "gone"))) == [
        f"{rel}: gone: the collector found no keyword it passes to megatron-core; the code "
        "changed shape: make tests/helpers/megatron_kwargs.py follow it, or update PRODUCERS"]
