"""Run the browser sidecar: ``python -m sidecars.browser_cdp`` (persistent or oneshot protocol)."""

from sidecars.browser_cdp import app

if __name__ == "__main__":
    app.run()
