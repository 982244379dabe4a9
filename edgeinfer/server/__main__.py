"""`python -m edgeinfer.server [MODEL] [flags]`: the same flags as `edgeinfer serve`."""

from __future__ import annotations

import sys

from edgeinfer.errors import EdgeInferError


def main(argv: list[str] | None = None, prog: str = "python -m edgeinfer.server") -> int:
    """Parse the flags (options.py), resolve the model and serve; errors are one line."""
    from edgeinfer.server.options import build_parser, settings_from_args, worker_args

    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(prog).parse_args(argv)
    try:
        from edgeinfer.pull import resolve_model

        settings = settings_from_args(args)
        try:
            from edgeinfer.server import serve
        except ImportError:
            raise EdgeInferError(
                "the server needs the 'serve' extra: pip install 'edgeinfer[serve]'") from None
        if args.model is None and args.models_dir is not None:  # router mode
            from edgeinfer.server.router import serve_router

            serve_router(args.models_dir, worker_args(argv), settings, args.models_max,
                         args.keep_alive)
        else:
            serve(resolve_model(args.model), settings)
    except EdgeInferError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
