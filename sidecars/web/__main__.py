"""Run the web sidecar: ``python -m sidecars.web`` (persistent or oneshot protocol)."""

from sidecars.web.server import app

if __name__ == "__main__":
    app.run()
