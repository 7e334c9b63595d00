"""The attention-backend switches megatron-core writes into the environment at every model build.

megatron-core 0.19.2 `LanguageModule.__init__` (so every `GPTModel`) calls
`LanguageModule._set_attention_backend`, which puts Transformer Engine's opt-out switches
`NVTE_FLASH_ATTN`, `NVTE_FUSED_ATTN` and `NVTE_UNFUSED_ATTN` into `os.environ` according to
`TransformerConfig.attention_backend` (`check_and_set_env_variable`: it asserts that a value
already there is the one it would write, then writes it):

- `AttnBackend.auto` (TransformerConfig's default): all three "1" (TE 2.20.2's own defaults in
  `get_attention_backend`: TE chooses);
- `AttnBackend.flash` / `fused` / `unfused`: "1" for that backend's switch, "0" for the other two;
- `AttnBackend.local`: all three "0" (megatron's own attention, TE's unused);
- with `TransformerConfig.flash_attention_version` set, also `NVTE_FLASH_ATTN_V<n>` = "0" for each
  FlashAttention generation n in (2, 3, 4) other than the chosen one.

So after the first model build of a process (and in every process it starts afterwards, which
inherits the environment) these variables carry megatron's values: `te_recipe.require_te_env`
accepts exactly those, or none, and refuses any other value naming the variable (megatron would
stop at the next model build anyway, with an AssertionError).

`megatron_attention_env` states the rule over the backend's *name*, without importing megatron:
`require_te_env` runs before the first `import megatron.core`, which imports TE, whose recipe
defaults are read from the environment at import. `tests/test_megatron_attention_env.py` runs
megatron's own `_set_attention_backend` for every `AttnBackend` member and FlashAttention version
and compares; it also checks that the builder's TransformerConfig has `ATTENTION_BACKEND`.
"""
from __future__ import annotations

ATTENTION_BACKEND = "auto"
"""The `AttnBackend` member name of the TransformerConfig that `model.builder.transformer_config`
builds: it leaves `attention_backend` at megatron-core 0.19.2's default, `AttnBackend.auto`, and
`flash_attention_version` at None."""

FLASH_ATTENTION_VERSION: int | None = None
"""`TransformerConfig.flash_attention_version` as the builder leaves it (megatron's default)."""

# the AttnBackend members with a Transformer Engine switch of their own, and its variable
_TE_SWITCH = {"flash": "NVTE_FLASH_ATTN", "fused": "NVTE_FUSED_ATTN",
              "unfused": "NVTE_UNFUSED_ATTN"}
MEGATRON_ATTENTION_KNOBS = tuple(_TE_SWITCH.values())
"""The variables megatron-core 0.19.2 writes at every model build, whatever the backend."""

_CHOICES = (*_TE_SWITCH, "local", "auto")


def megatron_attention_env(backend: str = ATTENTION_BACKEND,
                           flash_attention_version: int | None = FLASH_ATTENTION_VERSION
                           ) -> dict[str, str]:
    """What megatron-core 0.19.2 `LanguageModule._set_attention_backend` writes into the
    environment for `TransformerConfig.attention_backend` named `backend` (an `AttnBackend`
    member name) and `flash_attention_version`: variable -> value."""
    if backend not in _CHOICES:
        raise ValueError(f"attention backend {backend!r}: megatron-core 0.19.2's AttnBackend "
                         f"has {', '.join(_CHOICES)}")
    env = {var: "1" if backend in (name, "auto") else "0" for name, var in _TE_SWITCH.items()}
    if flash_attention_version is not None:
        env.update({f"NVTE_FLASH_ATTN_V{v}": "0" for v in (2, 3, 4)
                    if v != flash_attention_version})
    return env
