"""What llama.cpp's vocabulary loader knows, for `edgeinfer.tokenizer`: its tables and the rules
of `llama_vocab::impl::load` that turn GGUF metadata into token attributes, special ids and
flags (`read_vocab`). Transcribed from llama.cpp as vendored in llama-cpp-python 0.3.36 (commit
0c1e570): `src/llama-vocab.cpp` (pre-tokenizer names, regex lists, flags, special-token text
heuristics) and `include/llama.h` (token attributes).

The regex strings are llama.cpp's own, C-unescaped and machine-extracted; non-ASCII literals are
written as escapes so no editor or formatter can NFC-normalize them (docs/tokenizer.md,
"Encoding": a normalized copy of the deepseek class silently matched half of Unicode). They are
applied in order, each one re-splitting the pieces of the previous one, like HF `Split(...,
"isolated")`. llama.cpp runs most of them through `std::regex` over a text where each non-ASCII
code point is collapsed to one byte for its category, so `\\p{Lu}` there means any letter; none
of the regexes kept here depends on that difference.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntFlag
from typing import Any

import numpy as np

from edgeinfer.errors import EdgeInferError, printable


class Attr(IntFlag):
    """`LLAMA_TOKEN_ATTR_*` (include/llama.h): per-token bit flags."""

    UNDEFINED = 0
    UNKNOWN = 1 << 0
    UNUSED = 1 << 1
    NORMAL = 1 << 2
    CONTROL = 1 << 3
    USER_DEFINED = 1 << 4
    BYTE = 1 << 5
    NORMALIZED = 1 << 6
    LSTRIP = 1 << 7
    RSTRIP = 1 << 8
    SINGLE_WORD = 1 << 9


# GGUF `tokenizer.ggml.token_type` value (LLAMA_TOKEN_TYPE_*) -> attribute bits; anything out of
# range is UNDEFINED, as in `llama_vocab::impl::load`.
TOKEN_TYPE_TO_ATTR = np.array(
    [
        Attr.UNDEFINED,  # 0 undefined
        Attr.NORMAL,  # 1 normal
        Attr.UNKNOWN,  # 2 unknown
        Attr.CONTROL,  # 3 control
        Attr.USER_DEFINED,  # 4 user defined
        Attr.UNUSED,  # 5 unused
        Attr.BYTE,  # 6 byte
    ],
    dtype=np.int32,
)

# Tokens the special-token partition splits out of raw text (`cache_special_tokens`).
SPECIAL_CACHE_ATTRS = Attr.CONTROL | Attr.USER_DEFINED | Attr.UNKNOWN
# Tokens hidden by token_to_piece unless `special` is set, and skipped by the partition when
# parse_special is off.
PARSE_SPECIAL_ATTRS = Attr.CONTROL | Attr.UNKNOWN

# Regex lists by llama.cpp pre-tokenizer type (`llm_tokenizer_bpe` constructor).
PRE_REGEXES: dict[str, tuple[str, ...]] = {
    "GPT2": ("'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",),
    "LLAMA3": (
        (
            "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|"
            "[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
            "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
        ),
    ),
    "QWEN2": (
        (
            "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|"
            "[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
            "\\s+(?!\\S)|\\s+"
        ),
    ),
    "QWEN35": (
        (
            "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|"
            "[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|"
            "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
        ),
    ),
    "JAIS2": (
        (
            "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|"
            "[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
            "\\s*[\\r\\n]+|\\s{512}(?!\\S)|\\s{256}(?!\\S)|\\s{128}(?!\\S)|\\s{64}(?!\\S)|"
            "\\s{32}(?!\\S)|\\s{16}(?!\\S)|\\s{8}(?!\\S)|\\s{4}(?!\\S)|\\s{1,2}(?!\\S)|\\s{1}"
        ),
    ),
    "DEEPSEEK_LLM": (
        "[\r\n]",
        (
            "\\s?[A-Za-z\xb5\xc0-\xd6\xd8-\xf6\xf8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-"
            "\u02af\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-"
            "\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-"
            "\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-"
            "\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59"
            "\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-"
            "\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102"
            "\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134"
            "\u2139\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb"
            "-\u2cee\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-"
            "\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-"
            "\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb\U00010c80-\U00010cb2"
            "\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943]+"
        ),
        "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+",
        "\\s+$",
        "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+",
        "\\p{N}+",
    ),
    "DEEPSEEK3": (
        "\\p{N}{1,3}",
        "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
        (
            "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|"
            "[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|"
            "\\s+(?!\\S)|\\s+"
        ),
    ),
    "SPARK2_5": (
        "\\p{N}{1,3}",
        "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
        (
            "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|"
            "[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+|[\r\n]|\\s+(?!\\S)|"
            "\\s+"
        ),
        "\\p{N}",
    ),
    "DEEPSEEK_CODER": (
        "[\r\n]",
        "\\s?\\p{L}+",
        "\\s?\\p{P}+",
        "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+",
        "\\p{N}",
    ),
    "FALCON": (
        "[\\p{P}\\$\\+<=>\\^~\\|`]+",
        "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
        "[0-9][0-9][0-9]",
    ),
    "STARCODER": (
        "\\p{N}",
        "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
    ),
    "PORO": (" ?[^(\\s|.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c)]+",),
    "VIKING": (
        " ?[^(\\s|.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c)]+",
        "\\p{N}",
    ),
    "TEKKEN": (
        (
            "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+|"
            "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*|\\p{N}|"
            " ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
        ),
    ),
    "CHAMELEON": (
        "<sentinel:[0-9]+>",
        "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z",
        "([\\t\\n]|    |  )",
        "\\p{N}",
        "[\\p{P}!-/:-@\\[-`{-~]",
        "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
    ),
    "GPT4O": (
        (
            "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+(?:'[sS]|"
            "'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|"
            "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*(?:'[sS]|"
            "'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}{1,3}|"
            " ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
        ),
    ),
    "GRANITE_EMB_MULTI": (
        (
            "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}\\p{M}])([^a-z]))*((?=[\\p{L}\\p{M}])([^A-Z]))+(?"
            ":'[sS]|"
            "'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|"
            "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}\\p{M}])([^a-z]))+((?=[\\p{L}\\p{M}])([^A-Z]))*(?"
            ":'[sS]|"
            "'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}{1,3}|"
            " ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
        ),
    ),
    "BAILINGMOE": (
        (
            "'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}|"
            " ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+"
        ),
    ),
    "SEED_CODER": (
        (
            "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|"
            "[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}| ?[^\\s\\p{L}\\p{N}\\r\\n]+|\\s*[\\r\\n]+|"
            "\\s+(?!\\S)|\\s+"
        ),
    ),
    "UFAKZEKA": (
        (
            "[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
            "\\s+(?!\\S)|\\s+"
        ),
    ),
    "LAGUNA": (
        "[^\\n]+|[\\n]+",
        (
            "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|"
            "[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
            "\\s+(?!\\S)|\\s+"
        ),
    ),
    "EXAONE_MOE": (
        (
            "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|"
            "[^\\r\\n\\p{L}\\p{N}]?(?:\\p{L}\\p{M}*(?: \\p{L}\\p{M}*)*)+|\\p{N}|"
            " ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]?|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+"
        ),
    ),
    "MINICPM5": (
        "\\p{N}{1,3}",
        (
            "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|"
            "[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}+| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
            "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
        ),
    ),
    "DEFAULT": (
        "[\\p{P}\\$\\+<=>\\^~\\|]+",
        "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
        "\\p{N}+",
        "[0-9][0-9][0-9]",
    ),
}


@dataclass(frozen=True)
class PreSpec:
    """What a `tokenizer.ggml.pre` name selects in `llama_vocab::impl::load`."""

    regexes: str  # key into PRE_REGEXES
    ignore_merges: bool = False  # a piece that is already a token is emitted whole
    add_bos: bool = False  # default before the GGUF add_bos_token key
    clean_spaces: bool = True  # detokenize's HF-style " ." / " 's" clean-up
    no_bos: bool = False  # the pre branch clears the default BOS id (chatglm, glm4)


def _group(names: str, spec: PreSpec) -> dict[str, PreSpec]:
    return {name: spec for name in names.split()}


_NO_CLEAN = {"clean_spaces": False}

# Every name accepted here was mapped from llama.cpp's `load()` chain. Names that need a custom
# C++ splitter (kimi-k2, afmoe, superbpe, tiny_aya, youtu) or a non-byte-level BPE
# (whitespace, sarvam-moe) are left out and rejected with the list below. Checked against
# llama.cpp 0c1e570: its conformance data for llama-bpe, qwen2, qwen35, gpt-2, starcoder,
# falcon, deepseek-llm, deepseek-coder, command-r, refact, mpt (tests/test_tokenizer_vocabs.py),
# and every regex group below by differential fuzzing against libllama on a byte-level vocab.
PRE_TYPES: dict[str, PreSpec] = {
    **_group("default", PreSpec("DEFAULT")),
    **_group("minicpm5", PreSpec("MINICPM5", ignore_merges=True)),
    **_group(
        "llama3 llama-v3 llama-bpe falcon3 falcon-h1 pixtral midm-2.0 lfm2 jina-v5-nano",
        PreSpec("LLAMA3", ignore_merges=True, add_bos=True),
    ),
    **_group("dbrx smaug-bpe", PreSpec("LLAMA3")),
    **_group("chatglm-bpe", PreSpec("LLAMA3", no_bos=True)),
    **_group("glm4 glm5", PreSpec("LLAMA3", ignore_merges=True, no_bos=True)),
    **_group("deepseek-llm", PreSpec("DEEPSEEK_LLM", **_NO_CLEAN)),
    **_group("deepseek-coder", PreSpec("DEEPSEEK_CODER", **_NO_CLEAN)),
    **_group("deepseek-v3 hunyuan-dense hy_v4 joyai-llm", PreSpec("DEEPSEEK3", **_NO_CLEAN)),
    **_group("spark2_5", PreSpec("SPARK2_5", **_NO_CLEAN)),
    **_group("falcon", PreSpec("FALCON")),
    **_group(
        "gpt-2 phi-2 mpt olmo jais exaone4 jina-es jina-de gigachat jina-v2-es jina-v2-de "
        "a.x-4.0 mellum modern-bert jina-v1-en jina-v2-code roberta-bpe",
        PreSpec("GPT2"),
    ),
    **_group("trillion granite-docling", PreSpec("GPT2", **_NO_CLEAN)),
    **_group("starcoder refact codeshell exaone minerva-7b mellum2", PreSpec("STARCODER")),
    **_group("command-r smollm", PreSpec("STARCODER", **_NO_CLEAN)),
    **_group("stablelm2 megrez", PreSpec("QWEN2")),
    **_group(
        "qwen2 deepseek-r1-qwen kormo f2llmv2 hunyuan grok-2 solar-open",
        PreSpec("QWEN2", **_NO_CLEAN),
    ),
    **_group("qwen35", PreSpec("QWEN35", **_NO_CLEAN)),
    **_group("jais-2", PreSpec("JAIS2")),
    **_group("poro-chat", PreSpec("PORO", **_NO_CLEAN)),
    **_group("bloom gpt3-finnish", PreSpec("PORO")),
    **_group("viking", PreSpec("VIKING", **_NO_CLEAN)),
    **_group("tekken", PreSpec("TEKKEN", ignore_merges=True, add_bos=True, clean_spaces=False)),
    **_group("chameleon", PreSpec("CHAMELEON", add_bos=True, clean_spaces=False)),
    **_group("gpt-4o llama4 kanana2 talkie minimax-m2", PreSpec("GPT4O", **_NO_CLEAN)),
    **_group(
        "granite-embed-multi-97m",
        PreSpec("GRANITE_EMB_MULTI", ignore_merges=True, clean_spaces=False),
    ),
    **_group("bailingmoe bailingmoe2 llada-moe", PreSpec("BAILINGMOE", **_NO_CLEAN)),
    **_group("seed-coder", PreSpec("SEED_CODER", **_NO_CLEAN)),
    **_group("ufakzeka", PreSpec("UFAKZEKA", **_NO_CLEAN)),
    **_group("laguna", PreSpec("LAGUNA", **_NO_CLEAN)),
    **_group("exaone-moe", PreSpec("EXAONE_MOE")),
}

# `tokenizer.ggml.model` values. gemma4 is a BPE over raw UTF-8 with SPM-style `▁` spaces.
SPM_MODELS = frozenset({"llama"})
BPE_MODELS = frozenset({"gpt2"})
RAW_BPE_MODELS = frozenset({"gemma4"})
SUPPORTED_MODELS = ("llama", "gpt2", "gemma4")

# Default special ids per vocab kind, before the GGUF keys override them.
DEFAULT_SPECIAL_IDS: dict[str, dict[str, int]] = {
    "spm": {"bos": 1, "eos": 2, "unk": 0},
    "bpe": {"bos": 11, "eos": 11},
    "raw_bpe": {},
}

# Special-id GGUF keys in llama.cpp's order; a later key for the same id wins (the deprecated
# prefix/suffix/middle keys come last).
SPECIAL_ID_KEYS: tuple[tuple[str, str], ...] = (
    ("bos", "tokenizer.ggml.bos_token_id"),
    ("eos", "tokenizer.ggml.eos_token_id"),
    ("eot", "tokenizer.ggml.eot_token_id"),
    ("eom", "tokenizer.ggml.eom_token_id"),
    ("unk", "tokenizer.ggml.unknown_token_id"),
    ("sep", "tokenizer.ggml.seperator_token_id"),
    ("pad", "tokenizer.ggml.padding_token_id"),
    ("mask", "tokenizer.ggml.mask_token_id"),
    ("fim_pre", "tokenizer.ggml.fim_pre_token_id"),
    ("fim_suf", "tokenizer.ggml.fim_suf_token_id"),
    ("fim_mid", "tokenizer.ggml.fim_mid_token_id"),
    ("fim_pad", "tokenizer.ggml.fim_pad_token_id"),
    ("fim_rep", "tokenizer.ggml.fim_rep_token_id"),
    ("fim_sep", "tokenizer.ggml.fim_sep_token_id"),
    ("fim_pre", "tokenizer.ggml.prefix_token_id"),
    ("fim_suf", "tokenizer.ggml.suffix_token_id"),
    ("fim_mid", "tokenizer.ggml.middle_token_id"),
)

# Text heuristics of `load()`: when the GGUF does not set an id, the first token with one of
# these texts becomes that id and gets the CONTROL bit.
SPECIAL_ID_TEXTS: dict[str, tuple[str, ...]] = {
    "eot": (
        "<|eot_id|>",
        "<|im_end|>",
        "<|end|>",
        "<end_of_turn>",
        "<|endoftext|>",
        "<|end_of_text|>",
        "<EOT>",
        "_<EOT>",
        "[EOT]",
        "<\uff5cend\u2581of\u2581sentence\uff5c>",
        "<end_of_utterance>",
    ),
    "eom": ("<|eom_id|>",),
    "fim_pre": (
        "<|fim_prefix|>",
        "<fim-prefix>",
        "<fim_prefix>",
        "<\uff5cfim\u2581begin\uff5c>",
        "<PRE>",
        "\u2581<PRE>",
        "<|code_prefix|>",
        "<|prefix|>",
    ),
    "fim_suf": (
        "<|fim_suffix|>",
        "<fim-suffix>",
        "<fim_suffix>",
        "<\uff5cfim\u2581hole\uff5c>",
        "<SUF>",
        "\u2581<SUF>",
        "<|code_suffix|>",
        "<|suffix|>",
    ),
    "fim_mid": (
        "<|fim_middle|>",
        "<fim-middle>",
        "<fim_middle>",
        "<\uff5cfim\u2581end\uff5c>",
        "<MID>",
        "\u2581<MID>",
        "<|code_middle|>",
        "<|middle|>",
    ),
    "fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep": ("<|file_sep|>",),
}

# Every token with one of these texts ends generation and gets the CONTROL bit.
EOG_TEXTS: tuple[str, ...] = (
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<\uff5cend\u2581of\u2581sentence\uff5c>",
    "[e~[",
)

# gpt-oss: always rendered, so forced to USER_DEFINED whatever the GGUF says.
FORCED_USER_DEFINED_TEXTS = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")


# ---------------------------------------------------------------------------------------------
# Metadata -> Vocab (llama_vocab::impl::load)
# ---------------------------------------------------------------------------------------------


@dataclass
class Vocab:
    """Everything llama.cpp's `load()` derives from the tokenizer metadata; built by
    `read_vocab`."""

    kind: str  # "spm", "bpe" or "raw_bpe"
    pre: str  # pre-tokenizer name ("" for SPM)
    spec: PreSpec | None  # None for SPM
    tokens: list[str]
    index: dict[str, int]  # token text -> id
    scores: np.ndarray | None  # (n_vocab,) float32, SPM only
    merges: list[str] | None  # BPE only
    attrs: np.ndarray  # (n_vocab,) int32 Attr bits, after the text fix-ups
    ids: dict[str, int | None]  # bos, eos, eot, unk, fim_* ...
    eog_ids: frozenset[int]
    add_bos: bool
    add_eos: bool
    add_space_prefix: bool
    clean_spaces: bool
    escape_whitespaces: bool


def _vocab_kind(meta: dict) -> tuple[str, str, PreSpec | None]:
    model = meta.get("tokenizer.ggml.model")
    if model is None:
        raise EdgeInferError("GGUF has no tokenizer (tokenizer.ggml.model is missing)")
    if model in SPM_MODELS:
        return "spm", "", None
    if model in RAW_BPE_MODELS:
        return "raw_bpe", "gemma4", None
    if model not in BPE_MODELS:
        raise EdgeInferError(
            f"unsupported tokenizer model '{printable(model, 40)}' "
            f"(supported: {', '.join(SUPPORTED_MODELS)})"
        )
    pre = meta.get("tokenizer.ggml.pre") or "default"  # llama.cpp: missing pre means default
    if pre not in PRE_TYPES:
        raise EdgeInferError(
            f"unsupported pre-tokenizer '{printable(pre, 40)}' "
            f"(supported: {', '.join(sorted(PRE_TYPES))})"
        )
    return "bpe", pre, PRE_TYPES[pre]


def _read_tokens(meta: dict) -> list[str]:
    tokens = meta.get("tokenizer.ggml.tokens")
    if not tokens:
        raise EdgeInferError("GGUF has no tokenizer vocabulary (tokenizer.ggml.tokens)")
    if all(tokens):  # the metadata's own list: a copy is 2 MB on a 262k vocabulary
        return tokens
    return [t if t else f"[EMPTY_{i}]" for i, t in enumerate(tokens)]


def _token_index(tokens: list[str]) -> dict[str, int]:
    index = dict(zip(tokens, range(len(tokens))))
    if len(index) != len(tokens):
        dup = next(t for i, t in enumerate(tokens) if index[t] != i)
        raise EdgeInferError(f"corrupt tokenizer vocabulary: duplicate token '{printable(dup)}'")
    return index


def _base_attrs(meta: dict, n_vocab: int) -> np.ndarray:
    types = meta.get("tokenizer.ggml.token_type")
    if types is None:
        return np.full(n_vocab, int(Attr.NORMAL), dtype=np.int32)
    types = np.asarray(types, dtype=np.int64)[:n_vocab]
    if len(types) < n_vocab:
        raise EdgeInferError("corrupt tokenizer metadata: fewer token types than tokens")
    in_range = (types >= 0) & (types < len(TOKEN_TYPE_TO_ATTR))
    return np.where(in_range, TOKEN_TYPE_TO_ATTR[np.clip(types, 0, 6)], 0).astype(np.int32)


def _special_ids(meta: dict, kind: str, spec: PreSpec | None, n_vocab: int) -> dict:
    ids: dict[str, int | None] = {key: None for key, _ in SPECIAL_ID_KEYS}
    ids.update(DEFAULT_SPECIAL_IDS[kind])
    if spec is not None and spec.no_bos:
        ids["bos"] = None
    # A default outside the vocabulary is disabled.
    ids = {key: None if tid is not None and tid >= n_vocab else tid for key, tid in ids.items()}
    for key, gguf_key in SPECIAL_ID_KEYS:
        value = meta.get(gguf_key)
        if value is not None and 0 <= int(value) < n_vocab:  # out of range: keep the default
            ids[key] = int(value)
    return ids


def _detect_special_ids(index: dict[str, int], attrs: np.ndarray, ids: dict) -> None:
    """EOT/EOM/FIM ids the GGUF does not set are found by text and made CONTROL.

    llama.cpp walks an unordered_map, so with several candidates the winner is unspecified;
    we take the lowest id."""
    for key, texts in SPECIAL_ID_TEXTS.items():
        if ids[key] is not None:
            continue
        found = [index[t] for t in texts if t in index]
        if found:
            ids[key] = min(found)
            attrs[ids[key]] |= Attr.CONTROL


def _mark_unused(tokens: list[str], attrs: np.ndarray) -> None:
    for tid in np.flatnonzero(attrs & Attr.CONTROL).tolist():
        if "unused" in tokens[tid]:
            attrs[tid] |= Attr.UNUSED


def _eog_ids(tokens: list[str], index: dict, attrs: np.ndarray, ids: dict) -> frozenset[int]:
    eog = {ids[k] for k in ("fim_pad", "fim_rep", "fim_sep") if ids[k] is not None}
    for text in EOG_TEXTS:
        if text in index:
            eog.add(index[text])
            attrs[index[text]] |= Attr.CONTROL
    for text in FORCED_USER_DEFINED_TEXTS:
        if text in index:
            attrs[index[text]] = Attr.USER_DEFINED
    eog |= {ids[k] for k in ("eos", "eot", "eom") if ids[k] is not None}
    by_text = {tokens[t]: t for t in eog}
    # o200k_harmony / solar-open: <|end|> ends a message, not the generation.
    has_call = "<|call|>" in by_text or "<|calls|>" in by_text
    if "<|end|>" in by_text and has_call and ("<|return|>" in by_text or "<|flush|>" in by_text):
        end = by_text["<|end|>"]
        eog.discard(end)
        attrs[end] = Attr.USER_DEFINED
    # gemma4 and plamo have an ordinary </s>, unlike paddleocr.
    if "</s>" in by_text and ("<|tool_response>" in by_text or "<|plamo:eos|>" in by_text):
        eog.discard(by_text["</s>"])
        attrs[by_text["</s>"]] = Attr.NORMAL
    return frozenset(eog)


def _apply_strip_attrs(meta: dict, index: dict, attrs: np.ndarray) -> None:
    """Per-model LSTRIP/RSTRIP that llama.cpp sets by model or tokenizer name."""
    name = str(meta.get("general.name", "")).lower()
    pre = str(meta.get("tokenizer.ggml.pre", ""))
    arch = str(meta.get("general.architecture", ""))
    if any(p in pre for p in ("jina-v2-de", "jina-v2-es", "jina-v2-code")) or any(
        a in arch for a in ("nomic-bert-moe", "jina-bert-v3")
    ):
        if "<mask>" in index:
            attrs[index["<mask>"]] |= Attr.LSTRIP
    elif "phi-3" in name or "phi3" in name:
        attrs[(attrs & SPECIAL_CACHE_ATTRS) != 0] |= Attr.RSTRIP
        if "</s>" in index:
            attrs[index["</s>"]] |= Attr.RSTRIP
        for text in ("<unk>", "<s>", "<|endoftext|>"):
            if text in index:
                attrs[index[text]] &= ~int(Attr.RSTRIP)
    elif "modern-bert" in name and "[MASK]" in index:
        attrs[index["[MASK]"]] |= Attr.LSTRIP


def _add_flags(meta: dict, kind: str, spec: PreSpec | None) -> tuple[bool, bool]:
    add_bos = kind == "spm" or (spec is not None and spec.add_bos)
    add_eos = False
    if meta.get("tokenizer.ggml.add_bos_token") is not None:
        add_bos = bool(meta["tokenizer.ggml.add_bos_token"])
    if meta.get("tokenizer.ggml.add_eos_token") is not None:
        add_eos = bool(meta["tokenizer.ggml.add_eos_token"])
    if kind == "raw_bpe":
        add_bos = True  # llama.cpp forces BOS for Gemma 4
    return add_bos, add_eos


def read_vocab(meta: dict) -> Vocab:
    kind, pre, spec = _vocab_kind(meta)
    tokens = _read_tokens(meta)
    index = _token_index(tokens)
    n_vocab = len(tokens)
    attrs = _base_attrs(meta, n_vocab)
    ids = _special_ids(meta, kind, spec, n_vocab)
    _detect_special_ids(index, attrs, ids)
    _mark_unused(tokens, attrs)
    eog = _eog_ids(tokens, index, attrs, ids)
    _apply_strip_attrs(meta, index, attrs)
    add_bos, add_eos = _add_flags(meta, kind, spec)
    scores = meta.get("tokenizer.ggml.scores")
    merges = meta.get("tokenizer.ggml.merges")
    if kind != "spm" and merges is None:
        raise EdgeInferError("GGUF BPE tokenizer has no merges (tokenizer.ggml.merges)")
    return Vocab(
        kind=kind,
        pre=pre,
        spec=spec,
        tokens=tokens,
        index=index,
        scores=_scores(scores, n_vocab) if kind == "spm" else None,
        merges=list(merges) if kind != "spm" else None,
        attrs=attrs,
        ids=ids,
        eog_ids=eog,
        add_bos=add_bos,
        add_eos=add_eos,
        add_space_prefix=bool(meta.get("tokenizer.ggml.add_space_prefix", kind == "spm")),
        clean_spaces=spec.clean_spaces if spec is not None else kind == "raw_bpe",
        escape_whitespaces=kind == "raw_bpe",
    )


def _scores(scores: Any, n_vocab: int) -> np.ndarray:
    if scores is None:
        return np.zeros(n_vocab, dtype=np.float32)
    scores = np.asarray(scores, dtype=np.float32)
    if len(scores) < n_vocab:
        raise EdgeInferError("corrupt tokenizer metadata: fewer scores than tokens")
    return scores[:n_vocab]
