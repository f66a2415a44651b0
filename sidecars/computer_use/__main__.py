"""Run the computer.use facade: ``python -m sidecars.computer_use``."""

from sidecars.computer_use import app

if __name__ == "__main__":
    app.run()
