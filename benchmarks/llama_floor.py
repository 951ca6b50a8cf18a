"""How fast a bfloat16 one-row decoding step of the Llama shape could be without the library's
structure: Hugging Face's ``LlamaForCausalLM.generate``, attnkit's ``generate`` and a bare step
in plain torch operators, in one run, sides taking turns.

The bare step reads the Hugging Face model's weights (the Llama shape of
``benchmarks/llama.py``: width 512, 8 layers, 8 query and 2 key/value heads, vocabulary
32,000, ``torch.manual_seed(0)``) and does what attnkit's step does on a CPU without native
bfloat16, with nothing else: RMSNorm through LayerNorm over [x, -x], one query/key/value
product, the half-split rotation, a preallocated cache, torch's attention kernel on the queries
grouped per key/value head (widened to float32 where the CPU has no AMX, as attnkit widens),
the output product, and the feed-forward and output layers through FBGEMM's float16-weight
product where attnkit uses it (weights of 1,024 or more on a side); no modules, no input
checks, no NaN check of the attention result. Its prompt runs token by token (16 steps more
than the other sides' one prefill call), so its tokens/s is, if anything, low. It is a
measuring stick, not a model (its float16 weights are not scaled into float16's range as
attnkit's copies are); the last column says whether a side's greedy tokens are Hugging Face's
(bfloat16 rounds differently on each side, so they may part at a near-tie). ``--compile``
adds the bare step with each layer's two halves under ``torch.compile(dynamic=True)``.

    python benchmarks/llama_floor.py --rounds 5
    python benchmarks/llama_floor.py --rounds 3 --compile
"""

from __future__ import annotations

import tempfile

import torch
import torch.nn.functional as F
from generate import (  # benchmarks/generate.py (it keeps transformers offline)
    attnkit_side,
    check_context,
    hf_side,
    machine_info,
    same_tokens,
    summary,
    time_sides,
)
from llama import HF_SHAPE, build_llama, make_prompts
from machine import argument_parser, positive_int, thread_count

from attnkit.generation.packed import HALF_MIN_SIDE, float16_available, pack_float16
from attnkit.hardware import cpu_attention_has_amx
from attnkit.modules.norm import _rms_norm_by_layer_norm


class BareLlama:
    """The Hugging Face model's weights as plain tensors, and one decoding step over them."""

    def __init__(self, hf, max_len: int, *, compile_layers: bool = False) -> None:
        c = hf.config
        self.d, self.heads, self.kv_heads = (
            c.hidden_size,
            c.num_attention_heads,
            c.num_key_value_heads,
        )
        self.hd = self.d // self.heads
        self.eps = c.rms_norm_eps
        self.dtype = hf.model.embed_tokens.weight.dtype
        self.half = self.dtype == torch.bfloat16 and float16_available()
        self.widen = not cpu_attention_has_amx(self.dtype)
        self.embed = hf.model.embed_tokens.weight.detach()
        self.layers = []
        for layer in hf.model.layers:
            a, m = layer.self_attn, layer.mlp
            qkv = torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]).detach()
            gate_up = torch.cat([m.gate_proj.weight, m.up_proj.weight]).detach()
            self.layers.append(
                (
                    layer.input_layernorm.weight.detach(),
                    self._product(qkv),
                    self._product(a.o_proj.weight.detach()),
                    layer.post_attention_layernorm.weight.detach(),
                    self._product(gate_up),
                    self._product(m.down_proj.weight.detach()),
                )
            )
        self.final = hf.model.norm.weight.detach()
        self.head = self._product(hf.lm_head.weight.detach())
        theta = getattr(c, "rope_theta", None) or c.rope_parameters["rope_theta"]
        self.inv_freq = 1.0 / theta ** (torch.arange(0, self.hd, 2).float() / self.hd)
        shape = (len(self.layers), 1, self.kv_heads, max_len, self.hd)
        self.keys = torch.zeros(shape, dtype=self.dtype)
        self.values = torch.zeros(shape, dtype=self.dtype)
        self.attend_half = self._attend_half
        self.feed_forward_half = self._feed_forward_half
        if compile_layers:
            self.attend_half = torch.compile(self._attend_half, dynamic=True)
            self.feed_forward_half = torch.compile(self._feed_forward_half, dynamic=True)

    def _product(self, weight):
        """(packed float16 weight, True) where attnkit's one-row product uses FBGEMM, else
        (the weight, False)."""
        if self.half and max(weight.shape) >= HALF_MIN_SIDE:
            return pack_float16(weight.float(), None), True
        return weight, False

    def _linear(self, x, product):
        weight, fbgemm = product
        if fbgemm:
            flat = x.reshape(1, -1).float()
            out = torch.ops.quantized.linear_dynamic_fp16(flat, weight)
            return out.to(self.dtype).view(*x.shape[:-1], -1)
        return F.linear(x, weight)

    def _norm(self, x, weight):
        return _rms_norm_by_layer_norm(x, weight, self.eps)  # attnkit's RMSNorm in inference

    def _attend_half(self, x, norm_w, qkv_w, out_w, keys, values, pos: int, cos, sin):
        h, kv, hd = self.heads, self.kv_heads, self.hd
        qkv = self._linear(self._norm(x, norm_w), qkv_w).view(1, 1, h + 2 * kv, hd)
        qk = qkv[:, :, : h + kv]
        qk = qk * cos + torch.roll(qk, hd // 2, dims=-1) * sin  # (1, 1, H + H_kv, hd)
        keys[:, :, pos] = qk[0, :, h:]
        values[:, :, pos] = qkv[0, :, h + kv :]
        q = qk[:, :, :h].reshape(1, kv, h // kv, hd)  # the queries of a key/value head: a row
        k, v = keys[:, :, : pos + 1], values[:, :, : pos + 1]
        if self.widen:
            q, k, v = q.float(), k.float(), v.float()
        out = F.scaled_dot_product_attention(q, k, v).to(self.dtype).reshape(1, 1, self.d)
        return x + self._linear(out, out_w)

    def _feed_forward_half(self, x, norm_w, gate_up_w, down_w):
        gate, up = self._linear(self._norm(x, norm_w), gate_up_w).chunk(2, dim=-1)
        return x + self._linear(F.silu(gate) * up, down_w)

    def step(self, token: int, pos: int) -> int:
        """The next token after ``token`` at position ``pos`` (greedy)."""
        x = self.embed[token].view(1, 1, self.d)
        angles = pos * self.inv_freq  # (hd/2,)
        cos = torch.cat([angles.cos(), angles.cos()]).to(self.dtype)
        sin = torch.cat([-angles.sin(), angles.sin()]).to(self.dtype)
        for i, (g1, qkv_w, out_w, g2, gate_up_w, down_w) in enumerate(self.layers):
            x = self.attend_half(x, g1, qkv_w, out_w, self.keys[i], self.values[i], pos, cos, sin)
            x = self.feed_forward_half(x, g2, gate_up_w, down_w)
        logits = self._linear(self._norm(x, self.final), self.head)  # (1, 1, V)
        return int(logits.float().argmax())


def bare_side(bare: BareLlama, prompt: list[int], new_tokens: int):
    def run() -> list[list[int]]:
        with torch.inference_mode():
            for pos, token in enumerate(prompt[:-1]):
                bare.step(token, pos)
            token, out = prompt[-1], []
            for pos in range(len(prompt) - 1, len(prompt) - 1 + new_tokens):
                token = bare.step(token, pos)
                out.append(token)
        return [out]

    return run


def main() -> None:
    parser = argument_parser(__doc__)
    parser.add_argument("--rounds", type=positive_int, default=5, help="timed calls per side")
    parser.add_argument("--new-tokens", type=positive_int, default=128, help="new tokens per call")
    parser.add_argument("--threads", type=thread_count, default=1, help="torch.set_num_threads")
    parser.add_argument("--compile", action="store_true", help="add the compiled bare step")
    args = parser.parse_args()
    check_context(parser, args.new_tokens, (1,), HF_SHAPE["max_position_embeddings"])
    torch.set_num_threads(args.threads)
    print(machine_info())
    prompts = make_prompts(1)
    with tempfile.TemporaryDirectory() as folder:
        hf, gpt = build_llama(torch.bfloat16, folder)
        max_len = len(prompts[0]) + args.new_tokens
        sides = {
            "Hugging Face generate": hf_side(hf, prompts, args.new_tokens, "greedy"),
            "attnkit generate": attnkit_side(gpt, prompts, args.new_tokens, "greedy"),
            "bare step": bare_side(BareLlama(hf, max_len), prompts[0], args.new_tokens),
        }
        if args.compile:
            compiled = BareLlama(hf, max_len, compile_layers=True)
            sides["bare step, compiled"] = bare_side(compiled, prompts[0], args.new_tokens)
        # attnkit's float16 copies are made after 256 single rows: two warm-up calls of it
        warm = {**sides, "attnkit again": sides["attnkit generate"]}
        results = time_sides(sides, warm, args.rounds)
    shape = ", ".join(f"{k}={v}" for k, v in HF_SHAPE.items())
    print(f"\nLlamaForCausalLM({shape}), bfloat16, one row, {args.new_tokens} greedy tokens\n")
    print(
        "| side | tokens/s | ms a token | vs Hugging Face (median of per-round ratios) | "
        "Hugging Face's greedy tokens |"
    )
    print("| --- | --- | --- | --- | --- |")
    theirs = results["Hugging Face generate"][-1][3]
    for name in results:
        tokens, _, ratio, _ = summary(results, name, "Hugging Face generate")
        same = same_tokens(results[name][-1][3], theirs)
        print(f"| {name} | {tokens:.1f} | {1e3 / tokens:.2f} | {ratio:.2f}x | {same} |")


if __name__ == "__main__":
    main()
