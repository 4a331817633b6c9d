"""``specrt serve``: an OpenAI-compatible HTTP server over one loaded bundle (the ``[serve]`` extra).

    import specrt
    from specrt.serve import ServeConfig, run
    run(specrt.load("bundle/"), ServeConfig(port=8000, api_key="..."))

Only the CLI's ``serve`` imports this package: the runtime itself needs neither Starlette nor uvicorn.
"""

from __future__ import annotations

from .app import ServeConfig, create_app, model_id, run

__all__ = ["ServeConfig", "create_app", "model_id", "run"]
