"""Run the computer.native sidecar: ``python -m sidecars.computer``."""

from sidecars.computer.tools import app

if __name__ == "__main__":
    app.run()
