"""Run the media sidecar: ``python -m sidecars.media`` (persistent or oneshot protocol)."""

from sidecars.media.server import app

if __name__ == "__main__":
    app.run()
