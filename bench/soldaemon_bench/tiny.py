"""Random-weight Qwen2 models with a real byte-level BPE tokenizer carrying Qwen2.5-Coder's FIM
tokens, built in code with no download: gibberish text, but every code path runs on them as on
the real model."""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any, Callable

QWEN_SPECIALS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>",
    "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>",
]


def _corpus() -> list[str]:
    """Real Python source from the standard library, read at build time."""
    import argparse
    import json as json_mod
    import textwrap

    return [inspect.getsource(m) for m in (argparse, json_mod, textwrap)]


def build_tokenizer(vocab_size: int = 2048):
    """A byte-level BPE fast tokenizer whose special tokens are Qwen2.5-Coder's."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=QWEN_SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>",
        additional_special_tokens=QWEN_SPECIALS[1:],
    )


def _build(path: str | Path, marker_name: str, stamp: dict[str, Any], make: Callable[[Any], Any]) -> Path:
    """Write ``make(tokenizer)``'s model and the tokenizer to ``path`` unless marked ``stamp``."""
    out = Path(path)
    marker = out / marker_name
    if marker.exists() and json.loads(marker.read_text()) == stamp:
        return out
    out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer()
    model = make(tok)
    model.save_pretrained(str(out))
    tok.save_pretrained(str(out))
    marker.write_text(json.dumps(stamp))
    return out


def build_tiny_model(path: str | Path, *, layers: int = 4, hidden: int = 64, heads: int = 4,
                     kv_heads: int = 2, seed: int = 0) -> Path:
    """Write a tiny Qwen2 model + tokenizer to ``path`` (idempotent, deterministic); return it."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    def make(tok: Any) -> Any:
        config = Qwen2Config(
            vocab_size=len(tok), hidden_size=hidden, intermediate_size=hidden * 3,
            num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
            max_position_embeddings=8192, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
            tie_word_embeddings=False,
            bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.eos_token_id,
        )
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
        # random init gives near-uniform logits: scaled, greedy decoding is decisive (no float ties)
        with torch.no_grad():
            for p in model.parameters():
                if p.dim() == 2:
                    p.mul_(4.0)
        return model

    stamp = {"layers": layers, "hidden": hidden, "heads": heads, "kv_heads": kv_heads, "seed": seed}
    return _build(path, "tiny.json", stamp, make)


# Qwen2.5-Coder's shapes (the released config.json), for GPU runs where real weights cannot go.
SHAPES: dict[str, dict[str, int]] = {
    "0.5b": {"hidden": 896, "intermediate": 4864, "layers": 24, "heads": 14, "kv_heads": 2},
    "1.5b": {"hidden": 1536, "intermediate": 8960, "layers": 28, "heads": 12, "kv_heads": 2},
}
SHAPE_VOCAB = 151936
SHAPE_SCALE = 4.0     # the tiny model's factor on every matrix


def build_shaped_model(path: str | Path, shape: str, *, layers: int | None = None, dtype: str = "bfloat16",
                       seed: int = 0) -> Path:
    """Write a random-weight model of ``shape`` (a :data:`SHAPES` key; ``layers`` overrides its
    depth) with the tiny tokenizer to ``path`` (idempotent) and return it: matrices scaled by
    SHAPE_SCALE, tied embeddings, ``dtype``, so a decode step reads the real model's bytes."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    s = dict(SHAPES[shape])
    if layers is not None:
        s["layers"] = layers

    def make(tok: Any) -> Any:
        config = Qwen2Config(
            vocab_size=SHAPE_VOCAB, hidden_size=s["hidden"], intermediate_size=s["intermediate"],
            num_hidden_layers=s["layers"], num_attention_heads=s["heads"], num_key_value_heads=s["kv_heads"],
            max_position_embeddings=32768, rms_norm_eps=1e-6, tie_word_embeddings=True,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
            bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.eos_token_id,
        )
        torch.manual_seed(seed)
        device = "cuda" if torch.cuda.is_available() else "cpu"
        with torch.device(device):                 # initializing 1.5B weights is seconds on a GPU
            model = Qwen2ForCausalLM(config)
            # as the tiny model: unscaled, the top two logits often tie within bfloat16's rounding
            with torch.no_grad():
                for p in model.parameters():
                    if p.dim() == 2:
                        p.mul_(SHAPE_SCALE)
            return model.to(getattr(torch, dtype))

    return _build(path, "shaped.json", {"shape": shape, **s, "dtype": dtype, "seed": seed, "scale": SHAPE_SCALE},
                  make)


if __name__ == "__main__":  # python -m soldaemon_bench.tiny DIR
    import sys

    print(build_tiny_model(sys.argv[1] if len(sys.argv) > 1 else "tiny-model"))
