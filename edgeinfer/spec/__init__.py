"""Speculative decoding (issue 39): drafts of the next tokens, checked by the target model in
one forward pass.

  params.py  SpecParams: the type and its sizes (llama.cpp's --spec-* flags)
  ngram.py   NgramSimple: drafts by prompt lookup, llama.cpp's `ngram-simple`
  length.py  DraftLength: the draft length, adapted to how much of the drafts is accepted

A drafter proposes tokens; the generation loop (generate.generate_step) runs the last sampled
token and the draft as one batch, samples each position in order as plain decoding would,
and keeps the draft up to the first token the sample disagrees with: with a drafter that
proposes one token for certain, that is the rejection rule of Leviathan et al., so the output
is what plain decoding gives, token for token under the same seed.
"""

from edgeinfer.spec.length import DraftLength
from edgeinfer.spec.ngram import NgramSimple
from edgeinfer.spec.params import SPEC_TYPES, SpecParams, make_drafter

__all__ = ["SPEC_TYPES", "DraftLength", "NgramSimple", "SpecParams", "make_drafter"]
