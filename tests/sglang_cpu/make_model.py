# TEST HARNESS ONLY -- never shipped in the hicache_galahad package.
#
# Writes a small, randomly initialised local model plus a locally trained tokenizer, so SGLang can
# be started on CPU without downloading anything from a model hub.
#
#   python tests/sglang_cpu/make_model.py --arch llama --size tiny --out DIR
#   python tests/sglang_cpu/make_model.py --arch llama --size demo --out DIR
#   python tests/sglang_cpu/make_model.py --arch qwen3-next --size tiny --out DIR   (hybrid)
#   python tests/sglang_cpu/make_model.py --arch deepseek-mla --size tiny --out DIR (MLA)
#
# Deterministic for a given --seed: the tokenizer corpus is generated from a seeded RNG and the
# weights come from torch.manual_seed(seed). New architectures are added by writing one builder
# function and registering it in ARCHES.
"""Build a local random-init model and a locally trained byte-level BPE tokenizer."""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

BOS, EOS, PAD = "<|bos|>", "<|end|>", "<|pad|>"
ROLE_TOKENS = ["<|system|>", "<|user|>", "<|assistant|>"]
SPECIAL_TOKENS = [PAD, BOS, EOS, *ROLE_TOKENS]

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + '<|end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)

_WORDS = (  # noqa: SIM905 -- a word list is easier to read as one string
    "the a an of to in and or but is are was were be been being have has had do does did "
    "cache page pages token tokens prefix storage disk memory host device layer layers key "
    "value values model server request requests prompt response read write hit miss load "
    "save restore flush evict budget size byte bytes file files record records checksum hash "
    "chain node tree radix batch batches thread threads queue worker fast slow small large "
    "first last next previous every each some many few all none one two three four five six "
    "seven eight nine ten hundred thousand red green blue black white river mountain city "
    "garden window table chair book letter music story river forest ocean island bridge road "
    "morning evening night winter summer spring autumn rain snow wind cloud sun moon star "
    "quickly slowly quietly carefully always never often sometimes today tomorrow yesterday "
    "run walk jump think write read speak listen build break open close start stop keep "
    "python torch tensor kernel shape dtype float int bool list dict string number zero"
).split()


_SYLLABLES = (  # noqa: SIM905
    "ka ri to mu ne sa lo vi de ga pe zu ha ni ro ta me su ko ba li ya fe do wa qui "
    "str an en in on un ar er ir or ur al el il ol ul ack eck ick ock uck ing ang ong"
).split()


def corpus(seed: int, sentences: int) -> list[str]:
    """A deterministic pseudo-English corpus with digits, punctuation and code-like lines.

    Real words plus seeded pseudo-words (syllable strings), so BPE training can reach a
    vocabulary of several thousand tokens.
    """
    rng = random.Random(seed)
    pseudo = ["".join(rng.choices(_SYLLABLES, k=rng.randint(2, 4))) for _ in range(6000)]
    lines = []
    for i in range(sentences):
        words = [
            rng.choice(_WORDS) if rng.random() < 0.6 else rng.choice(pseudo)
            for _ in range(rng.randint(4, 18))
        ]
        if rng.random() < 0.2:
            words.insert(rng.randrange(len(words)), str(rng.randint(0, 99999)))
        sentence = " ".join(words)
        sentence = sentence[0].upper() + sentence[1:] + rng.choice([".", ".", "!", "?", ";"])
        if i % 7 == 0:
            sentence = f"def f_{i}(x, y={rng.randint(0, 9)}): return x * y + {rng.random():.3f}"
        lines.append(sentence)
    return lines


def train_tokenizer(vocab_size: int, seed: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(seed, 20000), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        additional_special_tokens=ROLE_TOKENS,
        model_max_length=1 << 20,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


@dataclass(frozen=True)
class LlamaSize:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    max_position_embeddings: int
    dtype: str


LLAMA_SIZES = {
    # ~50k parameters: starts in seconds; used by the e2e tests.
    "tiny": LlamaSize(512, 64, 128, 2, 4, 2, 4096, "float32"),
    # ~101M parameters, bf16 (CPU bf16 matmuls are 2-5x faster than fp32 here): prefill of a
    # 2k-token prompt takes ~3-4 s on 2 cores, 4k ~10-15 s (torch_native attention is
    # quadratic); KV is 14 KB per token, so an L3 hit is much cheaper than recompute.
    "demo": LlamaSize(8192, 768, 2048, 14, 12, 4, 16384, "bfloat16"),
}


def build_llama(size: str, out: Path, seed: int, dtype: str | None = None) -> dict:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    spec = LLAMA_SIZES[size]
    if dtype is not None:
        spec = replace(spec, dtype=dtype)
    tokenizer = train_tokenizer(spec.vocab_size, seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=spec.max_position_embeddings,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    dtype = getattr(torch, spec.dtype)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(dtype).eval()
    model.config.dtype = dtype
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    params = sum(p.numel() for p in model.parameters())
    return {"arch": "llama", "size": size, "seed": seed, "params": params, "dtype": spec.dtype}


@dataclass(frozen=True)
class Qwen3NextSize:
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    full_attention_interval: int  # every k-th layer is full attention, the others GDN
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_conv_kernel_dim: int
    num_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    shared_expert_intermediate_size: int
    max_position_embeddings: int
    dtype: str


QWEN3_NEXT_SIZES = {
    # /work/shared/reference/sglang-hybrid-on-cpu.md section 2: 4 layers (3 gated delta net + 1
    # full attention), hidden 64, attention 4 heads / 2 KV heads of 16, GDN 2 key / 4 value heads
    # of 16, conv kernel 4, MoE 4 experts top-2 of size 32 plus a shared expert of 64; fp32.
    "tiny": Qwen3NextSize(512, 64, 4, 4, 4, 2, 16, 2, 4, 16, 16, 4, 4, 2, 32, 64, 4096, "float32"),
}


def build_qwen3_next(size: str, out: Path, seed: int, dtype: str | None = None) -> dict:
    """A random-init Qwen3-Next (gated delta net + full attention + MoE), transformers' classes.

    SGLang reads its own ``Qwen3NextConfig`` from config.json and derives the layer types from
    ``full_attention_interval``, which transformers' constructor consumes without storing, and
    ``rope_theta`` / ``partial_rotary_factor``, which transformers 5 keeps inside
    ``rope_parameters``: all three are written into config.json as top-level keys as well.
    """
    import torch
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    spec = QWEN3_NEXT_SIZES[size]
    if dtype is not None:
        spec = replace(spec, dtype=dtype)
    tokenizer = train_tokenizer(spec.vocab_size, seed)
    layer_types = [
        "full_attention" if (i + 1) % spec.full_attention_interval == 0 else "linear_attention"
        for i in range(spec.num_hidden_layers)
    ]
    rope_theta, partial_rotary_factor = 10000.0, 0.25
    config = Qwen3NextConfig(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=2 * spec.hidden_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        head_dim=spec.head_dim,
        hidden_act="silu",
        max_position_embeddings=spec.max_position_embeddings,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": rope_theta,
            "partial_rotary_factor": partial_rotary_factor,
        },
        linear_conv_kernel_dim=spec.linear_conv_kernel_dim,
        linear_key_head_dim=spec.linear_key_head_dim,
        linear_value_head_dim=spec.linear_value_head_dim,
        linear_num_key_heads=spec.linear_num_key_heads,
        linear_num_value_heads=spec.linear_num_value_heads,
        decoder_sparse_step=1,
        moe_intermediate_size=spec.moe_intermediate_size,
        shared_expert_intermediate_size=spec.shared_expert_intermediate_size,
        num_experts_per_tok=spec.num_experts_per_tok,
        num_experts=spec.num_experts,
        norm_topk_prob=True,
        layer_types=layer_types,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    config.full_attention_interval = spec.full_attention_interval
    torch_dtype = getattr(torch, spec.dtype)
    torch.manual_seed(seed)
    model = Qwen3NextForCausalLM(config).to(torch_dtype).eval()
    model.config.dtype = torch_dtype
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    config_path = out / "config.json"
    saved = json.loads(config_path.read_text())
    saved.update(
        full_attention_interval=spec.full_attention_interval,
        rope_theta=rope_theta,
        partial_rotary_factor=partial_rotary_factor,
    )
    config_path.write_text(json.dumps(saved, indent=2, sort_keys=True) + "\n")
    params = sum(p.numel() for p in model.parameters())
    return {
        "arch": "qwen3-next",
        "size": size,
        "seed": seed,
        "params": params,
        "dtype": spec.dtype,
        "layer_types": layer_types,
    }


@dataclass(frozen=True)
class DeepseekMlaSize:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    max_position_embeddings: int
    dtype: str


DEEPSEEK_MLA_SIZES = {
    # 2 dense layers (first_k_dense_replace = layers: no MoE layer, so none of SGLang's MoE
    # kernels is reached), 4 heads, latent KV of 32 + a rope part of 16 per token and layer
    # (MLA: one copy shared by every TP rank), no q LoRA; fp32.
    "tiny": DeepseekMlaSize(512, 64, 128, 2, 4, 32, 16, 16, 16, 4096, "float32"),
}


def build_deepseek_mla(size: str, out: Path, seed: int, dtype: str | None = None) -> dict:
    """A random-init DeepSeek-V3 (multi-head latent attention), transformers' classes.

    SGLang's CPU rotary embedding exists only for ``deepseek_yarn`` ("Only deepseek_yarn is
    supported for CPU for now"; SGLang renames any rope scaling of a DeepSeek model to it), so
    the model carries a YaRN scaling of factor 1 (mscale 1): the same frequencies as plain
    RoPE, with SGLang's DeepseekScalingRotaryEmbedding. Every layer is dense (no MoE).
    """
    import torch
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    spec = DEEPSEEK_MLA_SIZES[size]
    if dtype is not None:
        spec = replace(spec, dtype=dtype)
    tokenizer = train_tokenizer(spec.vocab_size, seed)
    rope = {
        "rope_type": "yarn",
        "rope_theta": 10000.0,
        "factor": 1.0,
        "original_max_position_embeddings": spec.max_position_embeddings,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
    }
    config = DeepseekV3Config(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        moe_intermediate_size=spec.intermediate_size // 2,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_attention_heads,
        n_shared_experts=1,
        n_routed_experts=4,
        num_experts_per_tok=2,
        n_group=1,
        topk_group=1,
        first_k_dense_replace=spec.num_hidden_layers,
        kv_lora_rank=spec.kv_lora_rank,
        q_lora_rank=None,
        qk_nope_head_dim=spec.qk_nope_head_dim,
        qk_rope_head_dim=spec.qk_rope_head_dim,
        v_head_dim=spec.v_head_dim,
        max_position_embeddings=spec.max_position_embeddings,
        rms_norm_eps=1e-6,
        rope_parameters=rope,
        rope_interleave=True,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch_dtype = getattr(torch, spec.dtype)
    torch.manual_seed(seed)
    model = DeepseekV3ForCausalLM(config).to(torch_dtype).eval()
    model.config.dtype = torch_dtype
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    config_path = out / "config.json"
    saved = json.loads(config_path.read_text())
    saved.setdefault("rope_scaling", rope)  # also where older readers look
    saved.setdefault("rope_theta", rope["rope_theta"])
    saved.setdefault("moe_layer_freq", 1)  # SGLang reads it; transformers' config has none
    config_path.write_text(json.dumps(saved, indent=2, sort_keys=True) + "\n")
    params = sum(p.numel() for p in model.parameters())
    return {
        "arch": "deepseek-mla",
        "size": size,
        "seed": seed,
        "params": params,
        "dtype": spec.dtype,
        "kv_lora_rank": spec.kv_lora_rank,
        "qk_rope_head_dim": spec.qk_rope_head_dim,
    }


ARCHES: dict[str, tuple[Callable[..., dict], tuple[str, ...]]] = {
    "llama": (build_llama, tuple(LLAMA_SIZES)),
    "qwen3-next": (build_qwen3_next, tuple(QWEN3_NEXT_SIZES)),
    "deepseek-mla": (build_deepseek_mla, tuple(DEEPSEEK_MLA_SIZES)),
}


def make_model(
    arch: str, size: str, out: Path | str, seed: int = 0, dtype: str | None = None
) -> dict:
    """Write the model into `out` (created if missing). Returns a small summary dict.

    `dtype` ("float32", "bfloat16", ...) overrides the size's default weight dtype.
    """
    if arch not in ARCHES:
        raise ValueError(f"unknown arch {arch!r}; known: {sorted(ARCHES)}")
    builder, sizes = ARCHES[arch]
    if size not in sizes:
        raise ValueError(f"unknown size {size!r} for {arch}; known: {list(sizes)}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    summary = builder(size, out, seed, dtype)
    (out / "harness_model.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--arch", default="llama", choices=sorted(ARCHES))
    parser.add_argument("--size", default="tiny")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", default=None, help="override the size's weight dtype")
    args = parser.parse_args(argv)
    summary = make_model(args.arch, args.size, args.out, args.seed, args.dtype)
    print(json.dumps(summary, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
