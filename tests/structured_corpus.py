"""Scoring the constraint core on the JSON-schema corpus (shared/structured, see its README):
235 schemas from JSONSchemaBench's MaskBench with valid and invalid instances.

For one tokenizer, every schema is compiled (approximately where llguidance must ignore a
keyword, so both kinds are counted) and every instance is serialized compactly, tokenized with
our tokenizer and fed token by token: each token the mask allows must be accepted by the
matcher, and the end must be accepting exactly when end-of-generation is allowed. A valid
instance must get through the masks to an accepting end; an invalid one must be stopped
somewhere (a token refused by the mask, or an end that is not accepting).

Used by tests/test_structured_corpus.py and scripts/structured_corpus.py.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import jsonschema
import numpy as np

from edgeinfer.errors import EdgeInferError
from edgeinfer.structured import Constraint, compile_constraint, mask_allows, mask_words
from edgeinfer.structured.bridge import eog_order

CORPUS = Path(__file__).resolve().parents[2] / "shared" / "structured"
LIMITS = Path(__file__).resolve().parent / "data" / "structured_limits.json"


@dataclass
class InstanceResult:
    valid: bool  # the corpus's verdict
    accepted: bool  # ours: every token allowed and an accepting end
    n_tokens: int
    stopped_at: int | None  # the index of the first token refused, if one was
    mismatch: str | None  # a mask that disagreed with the matcher, if one did
    reference: bool | None = None  # jsonschema's verdict (formats checked), None if it failed


@dataclass
class SchemaResult:
    name: str
    status: str  # "exact", "approximate" (keywords ignored) or "error" (not compiled)
    reason: str  # the compile error, or the warnings of an approximate compile
    compile_s: float = 0.0
    first_mask_s: float = 0.0
    instances: list[InstanceResult] = field(default_factory=list)

    @property
    def wrong(self) -> list[InstanceResult]:
        return [r for r in self.instances if r.accepted != r.valid or r.mismatch]

    @property
    def accepted_invalid(self) -> list[InstanceResult]:
        """Instances we accept that the independent reference finds invalid."""
        return [r for r in self.instances if r.accepted and r.reference is False]


def load_corpus(directory: Path = CORPUS) -> list[tuple[str, dict]]:
    """(file stem, {"schema", "tests", ...}) for every schema file, by name."""
    return [(p.stem, json.loads(p.read_text(encoding="utf-8")))
            for p in sorted(directory.glob("*.json"))]


def serialize(value) -> str:
    """Compact JSON: fits any whitespace rule (llguidance needs none), key order as given (the
    corpus lists properties in llguidance's order)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def feed(tokenizer, seq, text: str, row: np.ndarray) -> InstanceResult:
    """Feed `text`'s tokens one by one as generation would: a token the mask refuses stops the
    instance; one it allows must be accepted (else the mask is unsound: a mismatch). The
    converse does not hold: where the grammar forces text, the mask allows only the canonical
    tokenization of it while the matcher would accept any."""
    tokens = tokenizer.encode(text, add_special=False, parse_special=False)
    eog = eog_order(tokenizer)
    for i, token in enumerate(tokens):
        seq.fill_mask(row)
        allowed = mask_allows(row, token)
        if not allowed:
            return InstanceResult(False, False, len(tokens), i, None)
        if not seq.accept(token):
            return InstanceResult(False, False, len(tokens), i,
                                  f"token {i} ({token}) allowed by the mask, refused: {seq.error}")
    seq.fill_mask(row)
    accepting = seq.is_accepting()
    mismatch = None
    if any(mask_allows(row, t) != accepting for t in eog):
        mismatch = f"end: accepting is {accepting} but the end-of-generation mask differs"
    return InstanceResult(False, accepting, len(tokens), None, mismatch)


def score_schema(tokenizer, name: str, case: dict) -> SchemaResult:
    try:
        compiled = compile_constraint(tokenizer, Constraint.json_schema(case["schema"]),
                                      approximate=True)
    except EdgeInferError as exc:
        return SchemaResult(name, "error", str(exc))
    status = "exact" if compiled.exact else "approximate"
    result = SchemaResult(name, status, "; ".join(compiled.warnings), compiled.seconds)
    row = np.zeros(mask_words(tokenizer.n_vocab), dtype=np.int32)
    started = time.perf_counter()
    compiled.start().fill_mask(row)
    result.first_mask_s = time.perf_counter() - started
    validator = reference_validator(case["schema"])
    for test in case["tests"]:
        instance = feed(tokenizer, compiled.start(), serialize(test["data"]), row)
        instance.valid = test["valid"]
        instance.reference = reference_verdict(validator, test["data"])
        result.instances.append(instance)
    return result


def reference_validator(schema: dict):
    """jsonschema's validator for the schema's draft (2020-12 if it names none), with the
    format checks it has; None if jsonschema cannot take the schema."""
    try:
        cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        return cls(schema, format_checker=cls.FORMAT_CHECKER)
    except Exception:  # any failure of the reference means "no verdict"
        return None


def reference_verdict(validator, instance) -> bool | None:
    if validator is None:
        return None
    try:
        return validator.is_valid(instance)
    except Exception:  # an unresolvable $ref, a regex Python cannot compile
        return None


def score_corpus(tokenizer, cases: list[tuple[str, dict]]) -> list[SchemaResult]:
    return [score_schema(tokenizer, name, case) for name, case in cases]


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else 0.0


def summarize(results: list[SchemaResult]) -> dict:
    """The figures: coverage, correctness (split by exact and approximate), compile times."""
    compiled = [r for r in results if r.status != "error"]
    exact = [r for r in compiled if r.status == "exact"]

    def correctness(group: list[SchemaResult]) -> dict:
        instances = [i for r in group for i in r.instances]
        right = [i for i in instances if i.accepted == i.valid and not i.mismatch]
        return {"instances": len(instances), "right": len(right),
                "valid": sum(i.valid for i in instances),
                "valid_accepted": sum(i.valid and i.accepted for i in right),
                "invalid_stopped": sum(not i.valid and not i.accepted for i in right),
                "mismatches": sum(bool(i.mismatch) for i in instances),
                "accepted_invalid_by_jsonschema": sum(i.accepted and i.reference is False
                                                      for i in instances),
                "no_jsonschema_verdict": sum(i.reference is None for i in instances)}

    compile_ms = [1e3 * r.compile_s for r in compiled]
    mask_ms = [1e3 * r.first_mask_s for r in compiled]
    return {
        "schemas": len(results),
        "compiled": len(compiled),
        "compiled_exact": len(exact),
        "coverage": len(compiled) / len(results),
        "coverage_exact": len(exact) / len(results),
        "correctness_exact": correctness(exact),
        "correctness_approximate": correctness([r for r in compiled if r.status != "exact"]),
        "compile_ms": {"p50": percentile(compile_ms, 50), "p99": percentile(compile_ms, 99),
                       "max": max(compile_ms, default=0.0)},
        "first_mask_ms": {"p50": percentile(mask_ms, 50), "p99": percentile(mask_ms, 99)},
        "not_compiled": {r.name: r.reason for r in results if r.status == "error"},
        "approximate": {r.name: r.reason for r in compiled if r.status != "exact"},
        "wrong": {r.name: [asdict(i) for i in r.wrong] for r in compiled if r.wrong},
    }
