"""`edgeinfer-server`: llama-server's command line in front of `edgeinfer serve`.

Scripts (and llama.cpp's own server tests, through LLAMA_SERVER_BIN_PATH) that start
`llama-server` can start `edgeinfer-server` with the same flags. Each flag is one row of
FLAGS (names and value as common/arg.cpp spells them); the ones edgeinfer has come from the
settings table (settings.py: each setting's `llama` spellings):

- `serve` names the `edgeinfer serve` option it becomes; some values are translated, as
  llama-server means them (`-c` is the context of all slots together, `-fa` takes
  on/off/auto and their synonyms);
- `same`: accepted silently, because edgeinfer already does what the flag asks (`--offline`:
  edgeinfer never downloads a model; `--cont-batching`: it always batches);
- otherwise the feature is missing here: the flag is accepted, and one warning line on stderr
  names every such flag of the command line.

An unknown flag is one error line and exit code 2. Nothing heavy is imported before the
command line is read, so `--help` is instant.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from edgeinfer.settings import SERVE, SETTINGS

PROG = "edgeinfer-server"


@dataclass(frozen=True)
class Flag:
    """One llama-server flag: its spellings, its value's name if it takes one, and what it
    becomes here (`serve`: the `edgeinfer serve` option; `same`: nothing, already so)."""

    names: tuple[str, ...]
    value: str | None = None
    serve: str | None = None
    same: bool = False
    help: str = ""


# What edgeinfer-server says of a flag where it means more than `edgeinfer serve`'s help.
NOTES = {
    "ctx_size": "all slots together: split across -np as llama-server does",
    "parallel": "slots (-1: auto, 4)",
    "models_dir": "router mode (no -m): every GGUF file in PATH, loaded on demand",
    "gpu_layers": "layers on a CUDA GPU (the cuda extra); without one, the CPU",
    "cache_ram": "MiB (-1: no limit, 0: off)",
}


def _forwarded() -> tuple[Flag, ...]:
    """-m, and each setting llama-server has, under its spellings there (settings.py); a
    switch's --no- spellings are a row of their own."""
    rows = [Flag(("-m", "--model"), "FNAME", "MODEL", help="GGUF file to serve")]
    for s in (s for s in SETTINGS if s.llama):
        value = None if s.switch else s.metavar or "VALUE"
        rows.append(Flag(tuple(n for n in s.llama if n not in s.off), value, s.long,
                         help=NOTES.get(s.name, s.help_for(SERVE))))
        off = tuple(n for n in s.llama if n in s.off)
        if off:
            rows.append(Flag(off, None, s.off[0], help=f"the opposite of {s.long}"))
    return tuple(rows)


def _flags() -> tuple[Flag, ...]:
    f = Flag
    return (
        *_forwarded(),
        # Already so here.
        f(("--offline",), same=True, help="edgeinfer never downloads a model"),
        f(("-cb", "--cont-batching"), same=True, help="always on"),
        f(("--slots",), same=True, help="/slots is on unless --no-slots"),
        f(("--ui", "--webui"), same=True, help="the chat page at / is on unless --no-ui"),
        f(("--no-mmproj", "--no-mmproj-auto"), same=True, help="there is no multimodal"),
        f(("--no-ui-mcp-proxy", "--no-webui-mcp-proxy"), same=True),
        f(("--no-context-shift",), same=True),
        f(("-no-kvu", "--no-kv-unified"), same=True, help="each slot has its own KV cache"),
        f(("--cache-idle-slots",), same=True, help="on unless --no-cache-idle-slots"),
        f(("--no-models-autoload",), same=True),
        # Accepted, not supported: named in the warning line.
        f(("-ub", "--ubatch-size"), "N"),
        f(("-ctk", "--cache-type-k"), "TYPE"), f(("-ctv", "--cache-type-v"), "TYPE"),
        f(("--swa-full",)),
        f(("--context-shift",)), f(("-gan", "--grp-attn-n"), "N"),
        f(("-gaw", "--grp-attn-w"), "N"),
        f(("--slot-save-path",), "PATH"), f(("--media-path",), "PATH"),
        f(("--embedding", "--embeddings")), f(("--rerank", "--reranking")),
        f(("--pooling",), "{none,mean,cls,last,rank}"), f(("--lora",), "FNAME"),
        f(("-bs", "--backend-sampling")),
        f(("-hf", "-hfr", "--hf-repo"), "<user>/<model>[:quant]"),
        f(("-hff", "--hf-file"), "FILE"), f(("-mu", "--model-url"), "MODEL_URL"),
        f(("-mmu", "--mmproj-url"), "URL"), f(("--mmproj-auto",)),
        f(("--spec-synth-len",), "L"),
        f(("--spec-synth-rates",), "P0,P1,..."),
        f(("--models-preset",), "PATH"), f(("--models-autoload",)),
        f(("--ui-mcp-proxy", "--webui-mcp-proxy")),
        f(("--tools",), "TOOL1,TOOL2,..."), f(("--tools-runtime",), "OPTION"),
        f(("--mcp-servers-config",), "PATH"), f(("--mcp-servers-json",), "JSON"),
    )


FLAGS = _flags()
BY_NAME = {name: flag for flag in FLAGS for name in flag.names}
TRUTHY, FALSEY, AUTOY = ("on", "enabled", "true", "1"), ("off", "disabled", "false", "0"), \
    ("auto", "-1")


class UsageError(Exception):
    """A command line llama-server would refuse too: one line, exit code 2."""


@dataclass
class Translation:
    """`edgeinfer serve`'s arguments for a llama-server command line, and the flags given
    that this server does not support (in the order given, each once)."""

    serve_args: list[str]
    unsupported: list[str] = field(default_factory=list)


def parse(argv: list[str]) -> list[tuple[Flag, str, str | None]]:
    """(flag, the name given, value) for each flag; `--name=value` and `--a_b` (read as
    `--a-b`, as llama-server does) are accepted."""
    parsed, i = [], 0
    while i < len(argv):
        arg, value = argv[i], None
        if arg.startswith("--"):
            arg = arg.replace("_", "-")
            if "=" in arg:
                arg, value = argv[i].split("=", 1)
                arg = arg.replace("_", "-")
        flag = BY_NAME.get(arg)
        if flag is None:
            raise UsageError(f"unknown argument: {argv[i]} (see {PROG} --help)")
        if flag.value is not None and value is None:
            if i + 1 >= len(argv):
                raise UsageError(f"{arg} needs a value ({flag.value})")
            i += 1
            value = argv[i]
        elif flag.value is None and value is not None:
            raise UsageError(f"{arg} takes no value")
        parsed.append((flag, arg, value))
        i += 1
    return parsed


def translate(argv: list[str]) -> Translation:
    """llama-server's command line -> `edgeinfer serve`'s, and the unsupported flags."""
    parsed = parse(argv)
    given = {flag.names[-1]: value for flag, _, value in parsed}
    out = Translation([])
    if "--model" not in given:
        hub = [n for n in ("--hf-repo", "--model-url") if n in given]
        if hub:
            raise UsageError(f"no model: give -m FILE ({' and '.join(hub)}: models are not "
                             f"downloaded here)")
        if "--models-dir" not in given:  # router mode over the pulled models
            from edgeinfer.pull import models_dir

            out.serve_args += ["--models-dir", str(models_dir())]
    for flag, name, value in parsed:
        if flag.serve is not None:
            _forward(out, flag, name, value, given)
        elif not flag.same and name not in out.unsupported:
            out.unsupported.append(name)
    return out


def _forward(out: Translation, flag: Flag, name: str, value: str | None, given: dict) -> None:
    option = flag.serve
    if option == "MODEL":
        out.serve_args.insert(0, value)
        return
    if flag.value is None:
        out.serve_args.append(option)
        return
    if option == "--ctx-size":
        total, per_slot = _kv_cells(_int(name, value), given)
        out.serve_args += [option, str(total)]
        if per_slot:
            out.serve_args += ["--kv-unified-per-slot", str(per_slot)]
        return
    elif option == "--flash-attn":
        value = _on_off_auto(name, value)
    elif option == "--threads" and _int(name, value) <= 0:
        return  # llama-server's -1: the default
    elif option == "--cache-ram" and _int(name, value) < 0:
        out.unsupported.append(f"{name} -1 (no limit)")
        return
    elif option in ("--port", "--parallel", "--cache-ram"):
        _int(name, value)
    out.serve_args += [option, value]


def _kv_cells(n_ctx: int, given: dict) -> tuple[int, int]:
    """(KV cells in all, a slot's limit or 0 for all of them), as llama-server sizes them:
    n_ctx rounded up to 256, split across the -np slots unless the KV cache is unified (also
    when -np is auto), each slot's share rounded up to 256 again (src/llama-context.cpp). 0
    stays 0: the model's context."""
    if n_ctx <= 0:
        return 0, 0
    n_ctx = _pad256(n_ctx)
    n_parallel = _int("--parallel", given.get("--parallel", "-1"))
    if n_parallel <= 0 or "--kv-unified" in given:
        return n_ctx, 0
    per_slot = _pad256(n_ctx // n_parallel)
    return per_slot * n_parallel, per_slot


def _pad256(n: int) -> int:
    return (n + 255) // 256 * 256


def _int(name: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise UsageError(f"{name} takes an integer, not {value!r}") from None


def _on_off_auto(name: str, value: str) -> str:
    for word, spellings in (("on", TRUTHY), ("off", FALSEY), ("auto", AUTOY)):
        if value.lower() in spellings:
            return word
    raise UsageError(f"unknown value for {name}: {value!r} (on, off or auto)")


def help_text() -> str:
    lines = [f"usage: {PROG} -m FILE [llama-server flags]", "",
             "llama-server's command line in front of `edgeinfer serve`.", ""]
    for title, rows in (
        ("supported:", [f for f in FLAGS if f.serve]),
        ("accepted, already so here:", [f for f in FLAGS if f.same]),
        ("accepted with a warning, not supported yet:",
         [f for f in FLAGS if not f.serve and not f.same]),
    ):
        lines.append(title)
        for flag in rows:
            spelled = ", ".join(flag.names) + (f" {flag.value}" if flag.value else "")
            lines.append(f"  {spelled:44} {flag.help}".rstrip())
    lines += ["  -h, --help", "  --version"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    """The console script: translate, warn once, then run `edgeinfer serve`."""
    argv = sys.argv[1:] if argv is None else argv
    if any(a in ("-h", "--help") for a in argv):
        sys.stdout.write(help_text())
        raise SystemExit(0)
    if "--version" in argv:
        from edgeinfer import __version__

        print(f"{PROG} (edgeinfer {__version__})")
        raise SystemExit(0)
    try:
        translation = translate(argv)
    except UsageError as exc:
        sys.stderr.write(f"error: {exc}\n")
        raise SystemExit(2) from None
    if translation.unsupported:
        sys.stderr.write(f"warning: not supported by edgeinfer, ignored: "
                         f"{', '.join(translation.unsupported)}\n")
    from edgeinfer.server.__main__ import main as serve_main

    raise SystemExit(serve_main(translation.serve_args, prog=PROG))


if __name__ == "__main__":
    main()
