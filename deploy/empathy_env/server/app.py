"""``empathy-gym serve`` as OpenEnv's tooling runs it: ``server.app:app`` (openenv.yaml,
uvicorn), ``python -m server.app`` (the Dockerfile), ``uv run server`` (pyproject.toml).

Its options are ``empathy-gym serve``'s, read from the ``EMPATHY_GYM_SERVE_*`` variables
(``empathy-gym serve --help`` lists them; a Space sets them as variables and secrets).
"""

from empathy_gym.cli import serve_app_from_environ
from empathy_gym.integrations.openenv import run_server

try:
    app, run = serve_app_from_environ()
except (ValueError, KeyError, OSError, ImportError) as error:  # a bad variable: its message, not a traceback
    raise SystemExit(f"error: {error.args[0] if isinstance(error, KeyError) else error}") from None


def main() -> None:
    """Serve ``app`` until SIGINT or SIGTERM (a second one ends it at once)."""
    run_server(app, **run)


if __name__ == "__main__":
    main()
