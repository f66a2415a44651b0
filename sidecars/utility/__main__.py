"""Run the utility sidecar: ``python -m sidecars.utility`` (persistent or oneshot protocol)."""

from sidecars.utility import app

if __name__ == "__main__":
    app.run()
