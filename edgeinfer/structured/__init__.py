"""Structured output: constrained decoding with llguidance (GBNF, Lark, JSON schema, regex).

The optional extra `structured` installs llguidance; it is imported on first use, so
`import edgeinfer.structured` works without it and a constraint then fails with a one-line
EdgeInferError saying what to install.

    compiled = compile_constraint(model.tokenizer, Constraint.json_schema(schema))
    seq = compiled.start()                 # one per sequence
    seq.apply(logits)                      # disallowed tokens -> -inf
    seq.accept(token)

`bridge` turns our tokenizer into llguidance's, `compile` turns constraints into grammars and
caches them, `sequence` holds each sequence's state and fills a batch's masks in parallel.
"""

from edgeinfer.structured.bridge import ll_tokenizer
from edgeinfer.structured.compile import (
    JSON_DEFAULTS,
    KINDS,
    CompiledConstraint,
    Constraint,
    compile_constraint,
)
from edgeinfer.structured.sequence import (
    MaskBatch,
    SequenceConstraint,
    apply_bitmask,
    apply_bitmasks,
    mask_allows,
    mask_words,
)

__all__ = [
    "JSON_DEFAULTS",
    "KINDS",
    "CompiledConstraint",
    "Constraint",
    "MaskBatch",
    "SequenceConstraint",
    "apply_bitmask",
    "apply_bitmasks",
    "compile_constraint",
    "ll_tokenizer",
    "mask_allows",
    "mask_words",
]
