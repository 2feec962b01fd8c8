"""A GGUF of a Llama-shaped config with random F16 weights, for llama.cpp's server on the GPU host.

llama.cpp has no dummy loading (vLLM's `--load-format dummy`), so the 8B shape
(scripts/gpu/llama3-8b-shape) is written as a file: noise of N(0, 0.02) in F16 (norms 1.0), views of
one shared random pool, so the ~15 GB are written at disk speed. Random weights give speed only,
never quality. The tokenizer is copied from another GGUF's `tokenizer.*` metadata (SmolLM2's, whose
vocabulary of 49152 the shape was sized for). Needs numpy and llama.cpp's gguf-py on PYTHONPATH.

  python3 random_gguf.py vocab SmolLM2-F16.gguf vocab.gguf     # tokenizer metadata only (~3 MB)
  python3 random_gguf.py model config.json vocab.gguf out.gguf  # the random-weight model
"""

from __future__ import annotations

import json
import sys

import numpy as np
from gguf import GGUFReader, GGUFValueType, GGUFWriter


def copy_tokenizer(source: str, writer: GGUFWriter) -> None:
    for field in GGUFReader(source).fields.values():
        if not field.name.startswith("tokenizer."):
            continue
        kind = field.types[0]
        if kind == GGUFValueType.ARRAY:
            writer.add_key_value(field.name, field.contents(), kind, sub_type=field.types[-1])
        else:
            writer.add_key_value(field.name, field.contents(), kind)


def vocab(source: str, out: str) -> None:
    writer = GGUFWriter(out, "llama")
    copy_tokenizer(source, writer)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def model(config_path: str, vocab_path: str, out: str) -> None:
    c = json.load(open(config_path))
    hidden, ffn, layers = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"]
    heads, kv_heads, n_vocab = c["num_attention_heads"], c["num_key_value_heads"], c["vocab_size"]
    head_dim = c.get("head_dim", hidden // heads)
    w = GGUFWriter(out, "llama")
    w.add_name("llama3-8b-shape (random weights)")
    w.add_context_length(c["max_position_embeddings"])
    w.add_embedding_length(hidden)
    w.add_block_count(layers)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_freq_base(c["rope_theta"])
    w.add_layer_norm_rms_eps(c["rms_norm_eps"])
    w.add_rope_dimension_count(head_dim)
    w.add_vocab_size(n_vocab)
    w.add_file_type(1)  # LLAMA_FTYPE_MOSTLY_F16
    copy_tokenizer(vocab_path, w)
    rng = np.random.default_rng(0)
    pool = (rng.standard_normal(max(n_vocab, ffn) * hidden + (1 << 20), dtype=np.float32) * 0.02).astype(np.float16)
    ones = np.ones(max(hidden, ffn), dtype=np.float32)

    def noise(*shape: int) -> np.ndarray:
        n = int(np.prod(shape))
        start = int(rng.integers(0, pool.size - n + 1))
        return pool[start:start + n].reshape(shape)

    w.add_tensor("token_embd.weight", noise(n_vocab, hidden))
    for i in range(layers):
        b = f"blk.{i}."
        w.add_tensor(b + "attn_norm.weight", ones[:hidden])
        w.add_tensor(b + "attn_q.weight", noise(heads * head_dim, hidden))
        w.add_tensor(b + "attn_k.weight", noise(kv_heads * head_dim, hidden))
        w.add_tensor(b + "attn_v.weight", noise(kv_heads * head_dim, hidden))
        w.add_tensor(b + "attn_output.weight", noise(hidden, heads * head_dim))
        w.add_tensor(b + "ffn_norm.weight", ones[:hidden])
        w.add_tensor(b + "ffn_gate.weight", noise(ffn, hidden))
        w.add_tensor(b + "ffn_up.weight", noise(ffn, hidden))
        w.add_tensor(b + "ffn_down.weight", noise(hidden, ffn))
    w.add_tensor("output_norm.weight", ones[:hidden])
    w.add_tensor("output.weight", noise(n_vocab, hidden))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    {"vocab": vocab, "model": model}[sys.argv[1]](*sys.argv[2:])
