"""The plain PyTorch Llama of bench/tiny_train.py: the tiny model written directly in PyTorch (SDPA
attention, F.cross_entropy), loading Megatron's local-spec weights, for the framework-overhead
comparison. Not used by the project itself."""
import torch
import torch.nn.functional as F


class RMSNorm(torch.nn.Module):
    def __init__(self, h, eps):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(h))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate(x, cos, sin):
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class Block(torch.nn.Module):
    def __init__(self, m):
        super().__init__()
        self.nq, self.nkv, self.d = m.num_attention_heads, m.num_query_groups, m.kv_channels
        h = m.hidden_size
        self.ln1, self.ln2 = RMSNorm(h, m.norm_epsilon), RMSNorm(h, m.norm_epsilon)
        # fused QKV in Megatron's grouped layout: per KV group [q heads..., k, v]
        self.qkv = torch.nn.Linear(h, (self.nq + 2 * self.nkv) * self.d, bias=False)
        self.proj = torch.nn.Linear(self.nq * self.d, h, bias=False)
        self.fc1 = torch.nn.Linear(h, 2 * m.ffn_hidden_size, bias=False)   # [gate; up]
        self.fc2 = torch.nn.Linear(m.ffn_hidden_size, h, bias=False)

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        per = self.nq // self.nkv
        qkv = self.qkv(self.ln1(x)).view(b, s, self.nkv, per + 2, self.d)
        q = qkv[:, :, :, :per].reshape(b, s, self.nq, self.d).transpose(1, 2)
        k = qkv[:, :, :, per].transpose(1, 2)
        v = qkv[:, :, :, per + 1].transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        k = k.repeat_interleave(per, dim=1)
        v = v.repeat_interleave(per, dim=1)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, self.nq * self.d))
        g, u = self.fc1(self.ln2(x)).chunk(2, dim=-1)
        return x + self.fc2(F.silu(g) * u)


class PlainLlama(torch.nn.Module):
    def __init__(self, m, vocab, inv_freq):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, m.hidden_size)
        self.blocks = torch.nn.ModuleList(Block(m) for _ in range(m.num_layers))
        self.norm = RMSNorm(m.hidden_size, m.norm_epsilon)
        self.out = torch.nn.Linear(m.hidden_size, vocab, bias=False)
        freqs = torch.outer(torch.arange(m.seq_length, dtype=torch.float32), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", emb.cos()[None, None], persistent=False)
        self.register_buffer("sin", emb.sin()[None, None], persistent=False)

    def forward(self, tokens, labels):
        x = self.emb(tokens)
        for blk in self.blocks:
            x = blk(x, self.cos, self.sin)
        logits = self.out(self.norm(x)).float()
        return F.cross_entropy(logits.view(-1, logits.size(-1)), labels.reshape(-1),
                               reduction="none").view(labels.shape)

    def load_megatron(self, sd):
        """Copy a Megatron local-spec GPTModel state dict (same layout, other names)."""
        own = {"emb.weight": "embedding.word_embeddings.weight", "norm.weight":
               "decoder.final_layernorm.weight", "out.weight": "output_layer.weight"}
        for i in range(len(self.blocks)):
            p = f"decoder.layers.{i}."
            own.update({f"blocks.{i}.ln1.weight": p + "input_layernorm.weight",
                        f"blocks.{i}.ln2.weight": p + "pre_mlp_layernorm.weight",
                        f"blocks.{i}.qkv.weight": p + "self_attention.linear_qkv.weight",
                        f"blocks.{i}.proj.weight": p + "self_attention.linear_proj.weight",
                        f"blocks.{i}.fc1.weight": p + "mlp.linear_fc1.weight",
                        f"blocks.{i}.fc2.weight": p + "mlp.linear_fc2.weight"})
        self.load_state_dict({k: sd[v].clone() for k, v in own.items()}, strict=True)
