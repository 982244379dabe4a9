"""Router mode, llama-server's: `edgeinfer serve --models-dir DIR` serves every GGUF file of
DIR (and the pulled models), each in its own worker process started on demand
(`workers.Pool`), behind one address (`app.create_router_app`)."""

from __future__ import annotations

from pathlib import Path


def serve_router(models_dir: Path | None, worker_args: list[str], settings,
                 models_max: int, keep_alive: float) -> None:
    """Serve until interrupted (blocking)."""
    import uvicorn

    from edgeinfer.errors import EdgeInferError
    from edgeinfer.pull import models_dir as pulled_dir
    from edgeinfer.server import _bind_all, _setup_logging, _url, access_policy, log
    from edgeinfer.server.router.app import create_router_app
    from edgeinfer.server.router.workers import Pool, find_models

    if models_dir is not None and not models_dir.is_dir():
        raise EdgeInferError(f"--models-dir {models_dir}: not a directory")
    models = find_models(models_dir, (pulled_dir(),))
    if not models:
        raise EdgeInferError(f"no .gguf files in {models_dir or pulled_dir()}")
    if models_max < 1:
        raise EdgeInferError(f"--models-max must be >= 1, got {models_max}")
    _setup_logging(settings.verbose)
    socks = _bind_all(settings.hosts, settings.port)
    pool = Pool(models, worker_args, models_max, keep_alive)
    app = create_router_app(pool, settings.api_keys, settings.ui, access_policy(settings))
    log.info("listening on %s (router: %d models, at most %d loaded)",
             ", ".join(_url(s) for s in socks), len(models), models_max)
    config = uvicorn.Config(app, log_level="warning", timeout_keep_alive=30, loop="asyncio",
                            http="h11")
    uvicorn.Server(config).run(sockets=socks)
