"""Tiny transformers hybrid models and their cache <-> SGLang host pool mapping, shared by
tests/test_hybrid_exactness.py (the live side) and tests/hybrid_restore.py (the restore side, run
as a fresh process). Import-only.

Models are transformers' pure-torch implementations, random-init from local configs (nothing is
downloaded), float32 on CPU, seeded. In transformers 5.19 every model keeps its whole state in a
`DynamicCache(config=model.config)` whose layers are of three types; each has one small adapter:

| cache layer type                       | components                        | goes to            |
|----------------------------------------|-----------------------------------|--------------------|
| `DynamicLayer`                         | keys, values `[1, H, T, D]`       | KV pool            |
| `LinearAttentionLayer`                 | conv_states[i], recurrent_states  | Mamba pool         |
| `LinearAttentionAndFullAttentionLayer` | both of the above                 | both pools         |

The KV pool is SGLang's `MHATokenToKVPoolHost` (page size P, one layer per attention layer, in
model order), the recurrent state SGLang's `MambaPoolHost` over a `MambaStateBufferInfo` of
plain tensors: one slot holds the state of every recurrent layer (in model order), temporal =
`recurrent_states[0]` and conv component i = `conv_states[i]`, batch axis dropped, shapes and
dtypes exactly the model's. Both pools use the page_first layout (the Mamba pool asserts it), so
a token's KV is `kv_buffer[0 or 1, slot, layer]` and a state is
`temporal_buffer[slot, layer, 0]` / `conv_buffer[i][slot, layer, 0]`.

Lfm2's short-conv layers have a conv state and no recurrent state. SGLang models that as a
zero-element temporal state (`configs/lfm2.py`: `state_size=0`, temporal shape
`(1, hidden, 0)`); MambaPoolHost allocates an empty temporal buffer and its flat page holds the
conv bytes only. The same is done here: temporal shape `(1, conv_channels, 0)`.

Mamba2 has no attention layer at all, so no KV: an MHATokenToKVPoolHost of 0 layers cannot be
built (see `NoKVPoolHost`); its page keys go to a stand-in KV pool whose pages are 0 bytes.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable
from dataclasses import dataclass

import torch
import transformers as tf
from sglang.srt.mem_cache.device_pool_info import MambaStateBufferInfo
from sglang.srt.mem_cache.hicache_storage import PoolHitPolicy, PoolName, PoolTransfer
from sglang.srt.mem_cache.pool_host.mamba import MambaPoolHost
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
from transformers import DynamicCache
from transformers.cache_utils import (
    DynamicLayer,
    LinearAttentionAndFullAttentionLayer,
    LinearAttentionLayer,
)

from .sglang_pools import create_galahad, mha_pool

VOCAB = 100
NUM_DECODE = 3
DTYPE = torch.float32
LAYOUT = "page_first"
MAMBA_PLACEHOLDER = "__placeholder__"

# ----------------------------------------------------------------------------- models


def _configs() -> dict[str, Callable[[], object]]:
    mamba2_ssm = dict(mamba_n_heads=8, mamba_d_head=8, mamba_d_state=16, mamba_n_groups=1)
    mamba2_ssm |= dict(mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=8)
    attention = dict(num_attention_heads=4, num_key_value_heads=2)
    common = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64)
    return {
        "llama": lambda: tf.LlamaConfig(**common, num_hidden_layers=2, **attention),
        "qwen3_next": lambda: tf.Qwen3NextConfig(
            **common, num_hidden_layers=4, **attention, head_dim=8,
            layer_types=["linear_attention"] * 3 + ["full_attention"],
            linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=8,
            linear_value_head_dim=8, linear_conv_kernel_dim=4, num_experts=4,
            num_experts_per_tok=2, moe_intermediate_size=16, shared_expert_intermediate_size=16,
        ),
        "mamba2": lambda: tf.Mamba2Config(
            vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_heads=8, head_dim=8,
            state_size=16, n_groups=1, expand=2, conv_kernel=4, chunk_size=8,
        ),
        "falcon_h1": lambda: tf.FalconH1Config(
            **common, num_hidden_layers=2, **attention, head_dim=8, mamba_d_ssm=64,
            mamba_n_heads=8, mamba_d_head=8, mamba_d_state=16, mamba_n_groups=1,
            mamba_d_conv=4, mamba_chunk_size=8,
        ),
        "zamba2": lambda: tf.Zamba2Config(
            **common, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4,
            attention_head_dim=16, mamba_d_state=16, mamba_d_conv=4, mamba_expand=2,
            mamba_ngroups=1, mamba_headdim=8, n_mamba_heads=8, chunk_size=8,
            layers_block_type=["mamba", "hybrid", "mamba", "hybrid"], hybrid_layer_ids=[1, 3],
            num_mem_blocks=1, adapter_rank=4,
        ),
        "jamba": lambda: tf.JambaConfig(
            **common, num_hidden_layers=4, **attention, num_experts=2, num_experts_per_tok=1,
            expert_layer_period=2, expert_layer_offset=1, attn_layer_period=2,
            attn_layer_offset=1, mamba_d_state=8, mamba_d_conv=4, mamba_expand=2,
            mamba_dt_rank=4,
        ),
        "granitemoehybrid": lambda: tf.GraniteMoeHybridConfig(
            **common, num_hidden_layers=4, **attention,
            layer_types=["mamba", "attention", "mamba", "attention"], **mamba2_ssm,
            num_local_experts=2, num_experts_per_tok=1, shared_intermediate_size=32,
        ),
        "lfm2": lambda: tf.Lfm2Config(
            **common, num_hidden_layers=4, **attention,
            layer_types=["conv", "full_attention", "conv", "full_attention"], conv_L_cache=3,
        ),
        "bamba": lambda: tf.BambaConfig(
            **common, num_hidden_layers=4, **attention, attn_layer_indices=[1, 3], **mamba2_ssm,
        ),
    }  # fmt: skip


MODEL_CONFIGS = _configs()
MODELS = tuple(MODEL_CONFIGS)
RECURRENT_MODELS = tuple(name for name in MODELS if name != "llama")


def model_seed(name: str) -> int:
    return 1000 + MODELS.index(name)


def fingerprint(name: str) -> str:
    return f"tiny-{name}-seed{model_seed(name)}"


def build_model(name: str):
    """The tiny random model, float32, eval mode; the same weights in every process."""
    torch.manual_seed(model_seed(name))
    model = tf.AutoModelForCausalLM.from_config(MODEL_CONFIGS[name]()).to(DTYPE).eval()
    return model


def weights_digest(model) -> str:
    digest = hashlib.sha256()
    for key, value in sorted(model.state_dict().items()):
        digest.update(key.encode())
        digest.update(value.detach().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def forward(model, tokens: list[int], cache):
    """One forward over `tokens` continuing `cache` (updated in place); returns logits [T, V]."""
    cache_kw = "cache_params" if isinstance(model, tf.Mamba2ForCausalLM) else "past_key_values"
    ids = torch.tensor([tokens], dtype=torch.long)
    with torch.no_grad():
        out = model(input_ids=ids, use_cache=True, **{cache_kw: cache})
    return out.logits[0].clone()


def fresh_cache(model) -> DynamicCache:
    return DynamicCache(config=model.config)


# ----------------------------------------------------------------------------- cache adapters


class KVAdapter:
    """`DynamicLayer` keys / values [1, H, T, D]."""

    @staticmethod
    def read(layer) -> tuple[torch.Tensor, torch.Tensor]:
        return layer.keys, layer.values

    @staticmethod
    def write(layer, keys: torch.Tensor, values: torch.Tensor) -> None:
        DynamicLayer.update(layer, keys.clone(), values.clone())


class RecurrentAdapter:
    """`LinearAttentionLayer` conv_states[i] [1, ...] and recurrent_states[0] [1, ...]."""

    @staticmethod
    def conv(layer) -> list[torch.Tensor]:
        return [layer.conv_states[i] for i in range(layer.number_of_states)]

    @staticmethod
    def recurrent(layer) -> torch.Tensor | None:
        # MambaStateBufferInfo has one temporal component: a second one must not be dropped.
        extra = [i for i, state in layer.recurrent_states.items() if i and state is not None]
        assert not extra, f"recurrent states {extra} beyond the first"
        return layer.recurrent_states[0]

    @staticmethod
    def write(layer, conv: list[torch.Tensor], recurrent: torch.Tensor | None) -> None:
        # transformers 5.19 restore (sglang-on-cpu.md section 5): lazy_initialization,
        # copy, and mark the conv state as continuing a previous prefill.
        for index, state in enumerate(conv):
            layer.lazy_initialization(conv_states=state, state_idx=index)
            layer.conv_states[index].copy_(state)
            layer.has_previous_state[index] = True
        if recurrent is not None:
            layer.lazy_initialization(recurrent_states=recurrent)
            layer.recurrent_states[0].copy_(recurrent)


# Exact types: a new layer type (sliding window, static, ...) must fail loudly, not half-save.
LAYER_ADAPTERS: dict[type, tuple[type, ...]] = {
    DynamicLayer: (KVAdapter,),
    LinearAttentionLayer: (RecurrentAdapter,),
    LinearAttentionAndFullAttentionLayer: (RecurrentAdapter, KVAdapter),
}


def adapters_of(layer) -> tuple[type, ...]:
    try:
        return LAYER_ADAPTERS[type(layer)]
    except KeyError:
        raise TypeError(
            f"no host-pool adapter for cache layer type {type(layer).__name__}"
        ) from None


@dataclass(frozen=True)
class StateLayout:
    """Which cache layers go to which pool, with the pools' geometry."""

    attention_layers: tuple[int, ...]
    recurrent_layers: tuple[int, ...]
    kv_heads: int
    head_dim: int
    temporal_shape: tuple[int, ...]
    temporal_dtype: torch.dtype
    conv_shapes: tuple[tuple[int, ...], ...]
    conv_dtype: torch.dtype | None

    @property
    def has_recurrent_state(self) -> bool:
        return bool(self.recurrent_layers)


def probe_layout(model) -> StateLayout:
    """The layout, read off the cache of a 2-token forward."""
    cache = fresh_cache(model)
    forward(model, [1, 2], cache)
    attention, recurrent = [], []
    kv_geometry, temporal, conv = set(), set(), set()
    for index, layer in enumerate(cache.layers):
        adapters = adapters_of(layer)
        if KVAdapter in adapters:
            attention.append(index)
            keys, values = KVAdapter.read(layer)
            assert keys.shape == values.shape and keys.shape[0] == 1, keys.shape
            kv_geometry.add((keys.shape[1], keys.shape[3], keys.dtype))
        if RecurrentAdapter in adapters:
            recurrent.append(index)
            states = RecurrentAdapter.conv(layer)
            state = RecurrentAdapter.recurrent(layer)
            conv.add(tuple((tuple(s.shape[1:]), s.dtype) for s in states))
            if state is None:  # conv-only (Lfm2): SGLang's zero-element temporal state
                temporal.add(((1, states[0].shape[1], 0), states[0].dtype))
            else:
                temporal.add((tuple(state.shape[1:]), state.dtype))
    # One pool geometry per kind: every layer of a kind must agree.
    assert len(kv_geometry) <= 1 and len(temporal) <= 1 and len(conv) <= 1, (
        kv_geometry,
        temporal,
        conv,
    )
    heads, head_dim, kv_dtype = kv_geometry.pop() if kv_geometry else (0, 0, DTYPE)
    assert kv_dtype == DTYPE
    temporal_shape, temporal_dtype = temporal.pop() if temporal else ((), DTYPE)
    conv_specs = conv.pop() if conv else ()
    conv_dtypes = {dtype for _, dtype in conv_specs}
    assert len(conv_dtypes) <= 1, "MambaStateBufferInfo requires one conv dtype"
    return StateLayout(
        attention_layers=tuple(attention),
        recurrent_layers=tuple(recurrent),
        kv_heads=heads,
        head_dim=head_dim,
        temporal_shape=temporal_shape,
        temporal_dtype=temporal_dtype,
        conv_shapes=tuple(shape for shape, _ in conv_specs),
        conv_dtype=conv_dtypes.pop() if conv_dtypes else None,
    )


# ----------------------------------------------------------------------------- host pools


class NoKVPoolHost:
    """The KV pool of a model without attention layers (Mamba2): pages of zero bytes.

    SGLang's MHATokenToKVPoolHost cannot express it (0 layers: its mmap of 0 bytes fails with
    EINVAL; SGLang sets head_dim = 0 for pure SSM models, which divides by zero in
    MHATokenToKVPool's buffer info). The radix tree still pages the prompt and keys every page,
    and the backend still anchors restorable prefixes on the run of KV page keys present, so
    the keys are stored with their right page size: 0 bytes. Slots are handed out page-aligned,
    as the host allocator does."""

    layout = LAYOUT
    dtype = DTYPE
    layer_num = 0

    def __init__(self, page_size: int, size: int = 512):
        self.page_size, self.size = page_size, size
        self.kv_buffer = torch.empty(2, size, 0, dtype=DTYPE)
        self._next_slot = 0

    def get_dummy_flat_data_page(self) -> torch.Tensor:
        return torch.empty(0, dtype=DTYPE)

    def get_data_page(self, index: int, flat: bool = True) -> torch.Tensor:
        page = self.kv_buffer[:, index : index + self.page_size]
        return page.flatten() if flat else page

    def set_from_flat_data_page(self, index: int, data_page: torch.Tensor) -> None:
        assert data_page.numel() == 0

    def alloc(self, need_size: int) -> torch.Tensor:
        assert need_size % self.page_size == 0
        start, self._next_slot = self._next_slot, (self._next_slot + need_size) % self.size
        return torch.arange(start, start + need_size) % self.size

    def free(self, indices: torch.Tensor) -> int:
        return indices.numel()


def kv_pool(layout: StateLayout, page_size: int, tokens: int = 256):
    """SGLang's MHA host pool for the attention layers (NoKVPoolHost without any)."""
    layers = len(layout.attention_layers)
    if layers == 0:
        return NoKVPoolHost(page_size)
    return mha_pool(
        LAYOUT,
        DTYPE,
        page_size=page_size,
        tokens=tokens,
        heads=layout.kv_heads,
        head_dim=layout.head_dim,
        layers=layers,
        seed=None,
    )


def mamba_pool(layout: StateLayout, slots: int = 8) -> MambaPoolHost:
    layers = len(layout.recurrent_layers)
    info = MambaStateBufferInfo(
        temporal=torch.zeros(layers, slots, *layout.temporal_shape, dtype=layout.temporal_dtype),
        conv=tuple(
            torch.zeros(layers, slots, *shape, dtype=layout.conv_dtype)
            for shape in layout.conv_shapes
        ),
    )
    return MambaPoolHost(info, 2.0, 0, device_capacity=slots, pin_memory=False, layout=LAYOUT)


def scribble(pool) -> None:
    """NaN bytes everywhere: a slot the store failed to fill cannot pass for a restored one."""
    buffers = [pool.kv_buffer] if isinstance(pool, MHATokenToKVPoolHost) else []
    if isinstance(pool, MambaPoolHost):
        buffers = [pool.temporal_buffer, *pool.conv_buffer]
    for buffer in buffers:
        buffer.view(torch.uint8).fill_(0xFF)


def kv_to_pool(cache, layout: StateLayout, pool, slots: torch.Tensor, start: int) -> None:
    """Tokens [start, start + len(slots)) of every attention layer into the given host slots."""
    assert pool.layout == LAYOUT
    end = start + slots.numel()
    for pool_layer, index in enumerate(layout.attention_layers):
        keys, values = KVAdapter.read(cache.layers[index])
        assert keys.shape[2] >= end, (keys.shape, end)
        for kv, tensor in enumerate((keys, values)):
            # [1, H, T, D] -> [T, H, D]; page_first kv_buffer is [2, size, L, H, D].
            pool.kv_buffer[kv, slots, pool_layer] = tensor[0, :, start:end].transpose(0, 1)


def kv_from_pool(layout: StateLayout, pool, slots: torch.Tensor) -> list[tuple]:
    """Per attention layer, keys and values [1, H, T, D] read from the host slots."""
    return [
        tuple(
            pool.kv_buffer[kv, slots, pool_layer].transpose(0, 1).unsqueeze(0).contiguous()
            for kv in (0, 1)
        )
        for pool_layer in range(len(layout.attention_layers))
    ]


def state_to_pool(cache, layout: StateLayout, pool: MambaPoolHost, slot: int) -> None:
    """The recurrent state of every recurrent layer into one Mamba host slot."""
    for pool_layer, index in enumerate(layout.recurrent_layers):
        layer = cache.layers[index]
        recurrent = RecurrentAdapter.recurrent(layer)
        if recurrent is not None:
            pool.temporal_buffer[slot, pool_layer, 0] = recurrent[0]
        for component, conv in enumerate(RecurrentAdapter.conv(layer)):
            pool.conv_buffer[component][slot, pool_layer, 0] = conv[0]


def state_from_pool(layout: StateLayout, pool: MambaPoolHost, slot: int) -> list[tuple]:
    """Per recurrent layer, (conv states, recurrent state or None) [1, ...] from one slot."""
    states = []
    for pool_layer in range(len(layout.recurrent_layers)):
        conv = [buffer[slot, pool_layer].clone() for buffer in pool.conv_buffer]
        temporal = pool.temporal_buffer[slot, pool_layer]
        states.append((conv, temporal.clone() if temporal.numel() else None))
    return states


def packed_state(cache, layout: StateLayout) -> torch.Tensor:
    """The flat uint8 page SGLang's MambaPoolHost.get_data_page gives for this cache's state,
    assembled independently: [temporal (all layers), conv_0 (all layers), ...]."""

    def raw(tensor):
        return tensor.contiguous().view(torch.uint8).reshape(-1)

    layers = [cache.layers[index] for index in layout.recurrent_layers]
    states = [RecurrentAdapter.recurrent(layer) for layer in layers]
    parts = [raw(state) for state in states if state is not None]
    for component in range(len(layout.conv_shapes)):
        parts += [raw(RecurrentAdapter.conv(layer)[component]) for layer in layers]
    return torch.cat(parts)


def build_cache(
    model, layout: StateLayout, kv: list[tuple], num_tokens: int, states
) -> DynamicCache:
    """A fresh `DynamicCache(config=model.config)` holding the first `num_tokens` tokens of `kv`
    and the recurrent `states` (from `state_from_pool`)."""
    cache = fresh_cache(model)
    if num_tokens == 0:  # nothing restored: recompute everything
        assert states is None
        return cache
    for (keys, values), index in zip(kv, layout.attention_layers, strict=True):
        KVAdapter.write(cache.layers[index], keys[:, :, :num_tokens], values[:, :, :num_tokens])
    for (conv, recurrent), index in zip(states or [], layout.recurrent_layers, strict=True):
        RecurrentAdapter.write(cache.layers[index], conv, recurrent)
    return cache


# ----------------------------------------------------------------------------- store


def open_store(root: str, name: str, kv, mamba):
    """GalahadStorage from SGLang's dynamic factory, pools registered as a hybrid server does."""
    backend = create_galahad(
        root, fingerprint=fingerprint(name), config={"model_name": f"tiny-{name}"}
    )
    # HybridCacheController.attach_storage_backend: the anchor (KV) pool, then every entry of
    # the host pool group through v2, then the end of the burst.
    backend.register_mem_pool_host(kv)
    backend.register_mem_host_pool_v2(kv, PoolName.KV)
    if mamba is not None:
        backend.register_mem_host_pool_v2(mamba, PoolName.MAMBA)
    backend.on_host_pools_registered()
    return backend


@contextlib.contextmanager
def pools_and_store(root: str, name: str, layout: StateLayout, page_size: int, scribbled=False):
    """(kv, mamba or None, backend): the host pools of one page size and a store over them,
    closed at exit. `scribbled`: the pools hold NaN bytes first (see `scribble`)."""
    kv = kv_pool(layout, page_size)
    mamba = mamba_pool(layout) if layout.has_recurrent_state else None
    if scribbled:
        for pool in (kv, mamba):
            if pool is not None:
                scribble(pool)
    backend = open_store(root, name, kv, mamba)
    try:
        yield kv, mamba, backend
    finally:
        backend.close()


def kv_transfer(keys: list[str], slots: torch.Tensor) -> PoolTransfer:
    return PoolTransfer(name=PoolName.KV, host_indices=slots, keys=list(keys))


def state_transfer(key: str, slot: int | None = None) -> PoolTransfer:
    indices = None if slot is None else torch.tensor([slot], dtype=torch.int64)
    return PoolTransfer(
        name=PoolName.MAMBA,
        host_indices=indices,
        keys=[key],
        hit_policy=PoolHitPolicy.TRAILING_PAGES,
    )


def exists(backend, keys: list[str], with_state: bool):
    """batch_exists_v2 as HiMambaRadixCache asks it: all page keys plus one placeholder
    TRAILING_PAGES key for the Mamba pool."""
    transfers = [state_transfer(MAMBA_PLACEHOLDER)] if with_state else []
    return backend.batch_exists_v2(keys, transfers)
